"""What a job produced: metrics, samples, checkpoints (each downloadable as a zip), the final policy, and its live
event stream.

`GET /api/v1/jobs/{id}/events` is Server-Sent Events: each Event row as

    id: 42
    event: status
    created_at: 2026-11-22T19:00:00+00:00
    data: {"status": "running", "error": null, "step": 0}

(`created_at`, when the event was recorded, UTC: a field EventSource ignores, as it does every field it does not
know; the dashboard's event log shows it.)

polled from the database every SSE_POLL_INTERVAL seconds (0.25) with a fresh session each time, starting after
`Last-Event-ID` (the header a reconnecting EventSource sends) or `?last_event_id=`. The stream ends once the job is
finished and every event was sent, or after `?timeout=` seconds; a `: heartbeat` comment every
SSE_HEARTBEAT_INTERVAL seconds (15) keeps proxies from closing an idle stream. Each poll checks the token again:
once it is revoked or expired the stream ends (a `: signed out` comment) and sends nothing more. Each open stream
holds one server thread: run the API with a threaded server (gunicorn gthread, or `flask run`, which is threaded).
A user may hold MAX_EVENT_STREAMS_PER_USER (4) streams at once in each API process; one more is 429
(webapp/limits.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
import time
import zipfile
from pathlib import Path

import yaml
from apiflask import APIBlueprint
from apiflask.schemas import FileSchema
from flask import Response, current_app, request, send_file
from sqlalchemy import func, select

from aligner.run_layout import BEST_POLICY_DIR, CHECKPOINT_DIR, FINAL_POLICY_DIR
from webapp.auth import auth, request_token
from webapp.db import (
    FINAL_STATUSES,
    Checkpoint,
    Event,
    Job,
    Metric,
    Sample,
    run_dir_name,
    service_redactor,
    token_is_live,
)
from webapp.errors import abort_fields
from webapp.extensions import db
from webapp.jobs import get_job_or_404
from webapp.limits import download_slot, event_stream_slot
from webapp.schemas import (
    INT32_MAX,
    CheckpointList,
    EventsQuery,
    MetricsOut,
    MetricsQuery,
    SamplePage,
    SamplesQuery,
)

bp = APIBlueprint("results", __name__, url_prefix="/api/v1/jobs", tag="Job results")

EVENT_BATCH = 500
# A policy folder's zip, built once and kept in the run folder beside it as <folder> + ZIP_SUFFIX (a new name: one
# built before downloads were redacted is never served).
ZIP_SUFFIX = ".download.zip"
# The policy folders a user downloads whole, by what they are.
POLICY_FOLDERS = {FINAL_POLICY_DIR: "final policy", BEST_POLICY_DIR: "best policy"}
DOWNLOADS_429 = "The user has MAX_DOWNLOADS_PER_USER downloads being built or sent"


@bp.get("/<int:job_id>/metrics")
@bp.auth_required(auth)
@bp.input(MetricsQuery, location="query")
@bp.output(MetricsOut)
def get_metrics(job_id: int, query_data):
    """A job's metrics, grouped by name: {name: [[step, value], ...], ...}"""
    job = get_job_or_404(job_id)
    query = select(Metric.name, Metric.step, Metric.value).where(Metric.job_id == job.id)
    if query_data.get("name"):
        query = query.where(Metric.name.in_(query_data["name"]))
    if "since_step" in query_data:
        query = query.where(Metric.step > query_data["since_step"])
    metrics: dict[str, list[tuple[int, float]]] = {}
    for name, step, value in db.session.execute(query.order_by(Metric.name, Metric.step)):
        metrics.setdefault(name, []).append((step, value))
    return {"job_id": job.id, "metrics": metrics}


@bp.get("/<int:job_id>/samples")
@bp.auth_required(auth)
@bp.input(SamplesQuery, location="query")
@bp.output(SamplePage)
def get_samples(job_id: int, query_data):
    """A job's logged generations, by step, split and position"""
    job = get_job_or_404(job_id)
    where = [Sample.job_id == job.id]
    if "step" in query_data:
        where.append(Sample.step == query_data["step"])
    if "split" in query_data:
        where.append(Sample.split == query_data["split"])
    if "min_reward" in query_data:
        where.append(Sample.reward >= query_data["min_reward"])
    if "max_reward" in query_data:
        where.append(Sample.reward <= query_data["max_reward"])
    page, per_page = query_data["page"], query_data["per_page"]
    total = db.session.scalar(select(func.count()).select_from(Sample).where(*where))
    items = db.session.scalars(
        select(Sample)
        .where(*where)
        .order_by(Sample.step, Sample.split, Sample.index)
        .offset((page - 1) * per_page)
        .limit(per_page)
    ).all()
    return {"items": items, "total": total, "page": page, "per_page": per_page}


@bp.get("/<int:job_id>/checkpoints")
@bp.auth_required(auth)
@bp.output(CheckpointList)
def list_checkpoints(job_id: int):
    """A job's checkpoints, oldest first"""
    job = get_job_or_404(job_id)
    rows = db.session.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step)).all()
    items = [
        {
            "step": row.step,
            "size_bytes": _folder_bytes(Path(row.path)),
            "path": f"{CHECKPOINT_DIR}/{Path(row.path).name}",  # deprecated: relative, never the server's path
            "created_at": row.created_at,
        }
        for row in rows
    ]
    return {"items": items}


def _folder_bytes(folder: Path) -> int | None:
    """The bytes of a checkpoint's regular files (what its zip holds); None when the folder is gone."""
    if folder.is_symlink() or not folder.is_dir():
        return None
    return sum(path.stat().st_size for path, _ in _regular_files(folder))


def _newest_mtime(folder: Path) -> float:
    # The folder's ctime too: a folder renamed into place (best_policy/) may hold files older than a zip of the one
    # it replaced.
    found = folder.stat()
    return max([found.st_mtime, found.st_ctime, *(p.lstat().st_mtime for p in folder.rglob("*"))])


# Files of a download whose text is passed through the service's redactor (`webapp.db.service_redactor`): configs
# and logs a trainer or transformers wrote may name the server's folders and URLs. Weights are copied as they are.
TEXT_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".txt", ".md", ".log")
MAX_REDACTED_BYTES = 16 * 1024 * 1024
CONFIG_FILE = "config.yaml"  # a checkpoint's copy of the trainer's config: replaced by the job's own


def user_config(job: Job) -> dict:
    """The job's config as its user sees it: catalogue names (the stored config), its run folder's name."""
    return {**(job.config or {}), "run_dir": run_dir_name(job.run_dir)}


def _regular_files(folder: Path):
    """(path, relative name) of each regular file under `folder`, sorted; symlinks (to files or folders) are never
    followed nor listed: one planted in a run folder would otherwise put any file the API can read in a zip."""
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not (here / d).is_symlink())
        for name in sorted(filenames):
            path = here / name
            if not path.is_symlink() and path.is_file():
                yield path, path.relative_to(folder)


def _write_zip(folder: Path, f, arcname: str, redactor, config: dict | None = None) -> None:
    """Every regular file under `folder` into zip file object `f`, under `arcname`/ (weights are stored, not
    compressed); text files through `redactor`, and `config` (when given) as the top-level CONFIG_FILE instead of
    the trainer's copy, which holds the server's paths, URLs and function targets."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as archive:
        if config is not None:
            archive.writestr(f"{arcname}/{CONFIG_FILE}", yaml.safe_dump(redactor.value(config), sort_keys=False))
        for path, relative in _regular_files(folder):
            if config is not None and relative == Path(CONFIG_FILE):
                continue
            name = (Path(arcname) / relative).as_posix()
            try:  # O_NOFOLLOW: a file swapped for a symlink since it was listed is not read either
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as source:
                info = zipfile.ZipInfo.from_file(path, name)
                size = os.fstat(source.fileno()).st_size
                if path.suffix in TEXT_SUFFIXES and size <= MAX_REDACTED_BYTES:
                    text = source.read().decode("utf-8", errors="surrogateescape")
                    archive.writestr(info, redactor.text(text).encode("utf-8", errors="surrogateescape"))
                else:
                    with archive.open(info, "w", force_zip64=size > 2**31) as target:
                        shutil.copyfileobj(source, target, 1024 * 1024)


def _policy_zip(folder: Path, redactor) -> Path:
    """run_dir/<folder> + ZIP_SUFFIX, rebuilt when the folder changed since. The trainer replaces best_policy/ whole
    (a rename) while the job runs: a zip built while it did is built again from the new folder."""
    target = folder.parent / (folder.name + ZIP_SUFFIX)
    if target.is_file() and target.stat().st_mtime >= _newest_mtime(folder):
        return target
    for _attempt in range(3):
        before = folder.stat().st_ino
        fd, tmp = tempfile.mkstemp(dir=folder.parent, prefix=f".{folder.name}-", suffix=".zip")
        try:
            with os.fdopen(fd, "wb") as f:
                _write_zip(folder, f, folder.name, redactor)
            replaced = not folder.is_dir() or folder.stat().st_ino != before
            if not replaced:
                os.replace(tmp, target)  # atomic: a concurrent download sees the old zip or the new one
                return target
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        Path(tmp).unlink(missing_ok=True)
        if not folder.is_dir():
            break
    abort_fields(409, f"the {POLICY_FOLDERS.get(folder.name, 'policy')} is being replaced: try again in a moment")


def _send_policy(job: Job, name: str):
    """The zip of the job's policy folder `name` (POLICY_FOLDERS), 404 while it does not exist; the error names
    the job and what is missing, never a path."""
    folder = Path(job.run_dir) / name if job.run_dir else None
    if folder is None or folder.is_symlink() or not folder.is_dir():
        abort_fields(404, f"job {job.id} has no {POLICY_FOLDERS[name]} yet (status {job.status})")
    redactor = service_redactor(db.session, job.run_dir, current_app.config["DATA_DIR"])
    release = download_slot()
    try:
        try:
            built = _policy_zip(folder, redactor)
        except FileNotFoundError:  # the folder went (a best policy being replaced, the job deleted) as it was read
            abort_fields(409, f"the {POLICY_FOLDERS[name]} of job {job.id} is being replaced: try again in a moment")
    except BaseException:
        release()
        raise
    return _send_zip(built, f"job_{job.id}_{name}.zip", release)


def _send_zip(file, name: str, release):
    """send_file of a zip (a path or an open file), the download slot released once it is sent or abandoned."""
    try:
        response = send_file(file, mimetype="application/zip", as_attachment=True, download_name=name)
    except BaseException:
        release()
        raise
    # Passed through directly (the server's file wrapper), a body never calls the response's close callbacks: the
    # iterable is wrapped so that its close, which every WSGI server calls, releases the slot.
    response.direct_passthrough = False
    response.call_on_close(release)
    return response


@bp.get("/<int:job_id>/model")
@bp.auth_required(auth)
@bp.output(FileSchema(type="string", format="binary"), content_type="application/zip", description="A zip file.")
@bp.doc(responses={404: "No such job, or its final policy does not exist yet", 429: DOWNLOADS_429})
def download_model(job_id: int):
    """Download the aligned policy (a zip of run_dir/final_policy, a Hugging Face folder)"""
    return _send_policy(get_job_or_404(job_id), FINAL_POLICY_DIR)


@bp.get("/<int:job_id>/best_model")
@bp.auth_required(auth)
@bp.output(FileSchema(type="string", format="binary"), content_type="application/zip", description="A zip file.")
@bp.doc(
    responses={
        404: "No such job, or it has no best policy (yet): trainer.best_metric has not been validated",
        409: "The best policy is being replaced by a better one at this moment: ask again",
        429: DOWNLOADS_429,
    }
)
def download_best_model(job_id: int):
    """Download the best policy so far (a zip of run_dir/best_policy, a Hugging Face folder)

    The policy of the checkpoint with the best trainer.best_metric (val/rewards by default), written whenever a
    validation improves on it: available while the job runs, and after it ends whatever its status."""
    return _send_policy(get_job_or_404(job_id), BEST_POLICY_DIR)


@bp.get("/<int:job_id>/checkpoints/<int:step>/download")
@bp.auth_required(auth)
@bp.output(FileSchema(type="string", format="binary"), content_type="application/zip", description="A zip file.")
@bp.doc(responses={404: "No such job, or it has no checkpoint of that step (any more)", 429: DOWNLOADS_429})
def download_checkpoint(job_id: int, step: int):
    """Download a checkpoint (a zip of its folder: the policy and the state a resume reads)

    Its config.yaml is the job's config as the API shows it (catalogue names), not the trainer's copy."""
    job = get_job_or_404(job_id)
    row = None
    if step <= INT32_MAX:
        row = db.session.scalar(select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step == step))
    folder = Path(row.path).resolve() if row is not None and row.path else None
    checkpoints = (Path(job.run_dir) / CHECKPOINT_DIR).resolve() if job.run_dir else None
    # The row's path is the worker's; only a folder inside the job's own checkpoints folder is ever read.
    if folder is None or checkpoints is None or not folder.is_relative_to(checkpoints) or not folder.is_dir():
        abort_fields(404, f"job {job.id} has no checkpoint of step {step}")
    redactor = service_redactor(db.session, job.run_dir, current_app.config["DATA_DIR"])
    config = user_config(job)
    release = download_slot()
    # Not kept: checkpoints come and go with keep_checkpoints. send_file closes the file once sent.
    f = tempfile.TemporaryFile(suffix=".zip")  # noqa: SIM115
    try:
        _write_zip(folder, f, folder.name, redactor, config)
        f.seek(0)
    except BaseException:
        f.close()
        release()
        raise
    return _send_zip(f, f"job_{job.id}_{folder.name}.zip", release)


def _sse(event: Event) -> str:
    data = json.dumps(event.payload, separators=(",", ":"))
    created = event.created_at.replace(tzinfo=dt.UTC) if event.created_at.tzinfo is None else event.created_at
    return f"id: {event.id}\nevent: {event.kind}\ncreated_at: {created.isoformat()}\ndata: {data}\n\n"


SSE_EVENT = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The event's id (send it back as Last-Event-ID)."},
        "event": {"type": "string", "description": "Its kind: status, log, checkpoint or health."},
        "created_at": {"type": "string", "description": "When it was recorded: ISO 8601, UTC."},
        "data": {"type": "string", "description": "Its payload, JSON."},
    },
    "required": ["id", "event", "data"],
}


@bp.get("/<int:job_id>/events")
@bp.auth_required(auth)
@bp.input(EventsQuery, location="query")
@bp.doc(
    responses={
        200: {
            "description": "A text/event-stream of the job's events (id = event id, event = kind, data = JSON).",
            # Before OpenAPI 3.2 (itemSchema), a text/event-stream's `schema` describes each event.
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        },
        429: "The user has MAX_EVENT_STREAMS_PER_USER streams open",
    },
    extensions={"x-last-event-id-header": "Last-Event-ID: resume after this event id"},
)
def stream_events(job_id: int, query_data):
    """Stream a job's events (Server-Sent Events) until it finishes"""
    get_job_or_404(job_id)
    last_id = query_data.get("last_event_id", 0)
    header = request.headers.get("Last-Event-ID")
    if header:
        # isdigit alone lets through what int() refuses: superscripts such as "²" (Latin-1 in a header).
        if not (header.strip().isascii() and header.strip().isdigit()) or int(header) > INT32_MAX:
            reason = f"must be an integer from 0 to {INT32_MAX}"
            abort_fields(422, "Invalid Last-Event-ID", {"Last-Event-ID": [reason]})
        last_id = int(header)
    timeout = query_data.get("timeout")
    release_slot = event_stream_slot()
    poll = current_app.config["SSE_POLL_INTERVAL"]
    heartbeat = current_app.config["SSE_HEARTBEAT_INTERVAL"]
    factory = db.session_factory
    token = request_token()
    db.close_session()  # the stream polls with short sessions of its own: no connection held in between

    def generate():
        try:
            yield from follow()
        finally:  # the end of the stream, or the client went away (the server closes the generator)
            release_slot()

    def follow():
        nonlocal last_id
        start = last_output = time.monotonic()
        yield "retry: 2000\n\n"
        while True:
            with factory() as session:
                # Signed in once is not enough for a stream that may run for hours: a revoked or expired token
                # gets nothing more from the next poll on.
                if not token_is_live(session, token):
                    yield ": signed out (the token was revoked or expired)\n\n"
                    return
                # The status first: a final status read here means its event is visible to the next query.
                status = session.scalar(select(Job.status).where(Job.id == job_id))
                events = session.scalars(
                    select(Event)
                    .where(Event.job_id == job_id, Event.id > last_id)
                    .order_by(Event.id)
                    .limit(EVENT_BATCH)
                ).all()
            for event in events:
                yield _sse(event)
                last_id = event.id
            now = time.monotonic()
            final = status is None or status in FINAL_STATUSES
            if final and not events:
                return
            if timeout is not None and now - start >= timeout:
                return
            if events:
                last_output = now
                if final or len(events) == EVENT_BATCH:
                    continue  # more may be waiting: no pause
            if now - last_output >= heartbeat:
                yield ": heartbeat\n\n"
                last_output = now
            wait = poll if timeout is None else max(0.0, min(poll, start + timeout - now))
            time.sleep(wait)

    response = Response(
        generate(),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    response.call_on_close(release_slot)  # a body never started (HEAD, a client gone before the first byte)
    return response
