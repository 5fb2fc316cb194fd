"""Prompt datasets: upload a JSONL prompt file, list those you may use, share one (admin), delete one
(`/api/v1/datasets`).

An upload is checked with `aligner.data.prompts.read_prompt_file` (422 with the `file:line: reason` of each bad
line) and stored as DATA_DIR/datasets/user_<id>/<random>.jsonl. A job names it by id (or name):
`"data": {"train_dataset": 3, ...}`. Only its owner sees and uses it, unless an admin shares it. Uploads may be
up to MAX_DATASET_SIZE bytes (256 MiB), unlike other requests (MAX_CONTENT_LENGTH, 1 MiB), and a user's datasets
together up to MAX_DATASET_BYTES_PER_USER (1 GiB; webapp/limits.py check_dataset_bytes, which also says how
concurrent uploads are kept within it).

An upload is written to `.<random>.uploading`, renamed to `<random>.jsonl` once valid, then given its row: a process
killed on the way leaves a file no row names, which no one sees or counts, and which the user's next upload removes
once it is STALE_UPLOAD_S old (so never an upload still in progress). A dataset is deleted (row, then file) by its
owner or an admin, unless a queued, running or cancelling job names it (409): a job that names it and is resumed or
retried later fails at launch with "dataset not found" (the worker looks it up again).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from apiflask import APIBlueprint
from flask import current_app, request
from sqlalchemy import delete, func, select
from werkzeug.utils import secure_filename

from aligner.data.prompts import read_prompt_file
from aligner.errors import PromptDataError
from webapp.auth import auth, current_user, require_admin
from webapp.catalogue import DATASETS_DIR, dataset_file, visible_datasets
from webapp.db import Dataset, Job, column_values
from webapp.errors import abort_fields
from webapp.extensions import db
from webapp.job_config import dataset_ids
from webapp.limits import ACTIVE_STATUSES, check_dataset_bytes
from webapp.schemas import INT32_MAX, DatasetIn, DatasetOut, DatasetPage, DatasetShareIn, PageQuery

# A file's name is the dataset's default name: longer ones are cut (PostgreSQL refuses, rather than truncates).
NAME_LENGTH = Dataset.__table__.c.name.type.length
# A file in a user's dataset folder that no row names (a temporary upload, or a dataset whose process was killed before
# its row was committed) this old is left over: no upload takes an hour between writing it and committing its row.
STALE_UPLOAD_S = 3600
UPLOADING = ".uploading"

bp = APIBlueprint("datasets", __name__, url_prefix="/api/v1/datasets", tag="Datasets")


@bp.before_request
def _larger_uploads() -> None:
    if request.method == "POST":
        request.max_content_length = current_app.config["MAX_DATASET_SIZE"]


@bp.post("")
@bp.auth_required(auth)
@bp.input(DatasetIn, location="form_and_files")
@bp.output(DatasetOut, status_code=201, description="The stored dataset; use its path in a job config.")
@bp.doc(responses={413: "File too large, or the user's datasets would pass MAX_DATASET_BYTES_PER_USER"})
def upload_dataset(form_and_files_data):
    """Upload a prompt file (multipart field `file`, JSONL)"""
    upload = form_and_files_data["file"]
    shown_name = (secure_filename(upload.filename or "") or "upload.jsonl")[:NAME_LENGTH]
    data_dir = Path(current_app.config["DATA_DIR"])
    folder = data_dir / DATASETS_DIR / f"user_{current_user().id}"
    folder.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(folder, data_dir)
    stem = uuid.uuid4().hex
    tmp = folder / f".{stem}{UPLOADING}"
    path = folder / f"{stem}.jsonl"
    upload.save(tmp)
    try:
        size = tmp.stat().st_size
        check_dataset_bytes(size)  # before the file is read: a refused upload costs little
        records = read_prompt_file(tmp)
        tmp.rename(path)
    except PromptDataError as err:
        lines = [line.strip() for line in str(err).replace(str(tmp), shown_name).splitlines()]
        reasons = lines[1:] if len(lines) > 1 else lines
        abort_fields(422, f"Invalid prompt file {shown_name}", {"file": reasons})
    finally:
        tmp.unlink(missing_ok=True)  # refused or failed: no half-accepted upload stays behind
    dataset = Dataset(
        user_id=current_user().id,
        name=form_and_files_data.get("name") or shown_name,
        path=str(path.relative_to(data_dir)),
        num_prompts=len(records),
        size_bytes=size,
    )
    db.session.add(dataset)
    db.session.commit()  # the reservation: every upload checked from now on counts it
    reserved = dataset.id
    try:
        check_dataset_bytes(size, reserved=reserved)
    except Exception:  # refused (413, apiflask's HTTPError), or the check failed: the reservation goes
        db.session.rollback()
        db.session.execute(delete(Dataset).where(Dataset.id == reserved))
        db.session.commit()
        path.unlink(missing_ok=True)
        raise
    return _out(dataset)


def sweep_leftovers(folder: Path, data_dir: Path) -> None:
    """Remove the files of a user's dataset folder that no dataset row names and that are STALE_UPLOAD_S old: what a
    killed process left (a `.uploading` file, a renamed file without its row, a deleted dataset's file)."""
    named = {
        data_dir / path
        for path in db.session.scalars(
            select(Dataset.path).where(Dataset.path.like(f"{DATASETS_DIR}/{folder.name}/%"))
        )
    }
    cutoff = time.time() - STALE_UPLOAD_S
    for file in folder.iterdir():
        try:
            if file.is_file() and not file.is_symlink() and file not in named and file.stat().st_mtime < cutoff:
                file.unlink()
        except OSError:  # gone meanwhile (another request's sweep), or not ours to remove: left alone
            continue


def _out(dataset: Dataset) -> dict:
    return {**column_values(dataset), "mine": dataset.user_id == current_user().id}


@bp.get("")
@bp.auth_required(auth)
@bp.input(PageQuery, location="query")
@bp.output(DatasetPage)
def list_datasets(query_data):
    """List the datasets you may use (yours and the shared ones), newest first"""
    where = visible_datasets(current_user())
    page, per_page = query_data["page"], query_data["per_page"]
    total = db.session.scalar(select(func.count()).select_from(Dataset).where(where))
    items = db.session.scalars(
        select(Dataset).where(where).order_by(Dataset.id.desc()).offset((page - 1) * per_page).limit(per_page)
    ).all()
    return {"items": [_out(item) for item in items], "total": total, "page": page, "per_page": per_page}


@bp.patch("/<int:dataset_id>")
@bp.auth_required(auth)
@bp.input(DatasetShareIn, location="json")
@bp.output(DatasetOut)
@bp.doc(responses={403: "Not an admin", 404: "No such dataset"})
def share_dataset(dataset_id: int, json_data):
    """Share a dataset with every user, or make it its owner's again (admin)"""
    require_admin()
    dataset = db.session.get(Dataset, dataset_id) if dataset_id <= INT32_MAX else None
    if dataset is None:
        abort_fields(404, f"dataset {dataset_id} not found")
    dataset.shared = json_data["shared"]
    db.session.commit()
    return _out(dataset)


@bp.delete("/<int:dataset_id>")
@bp.auth_required(auth)
@bp.output({}, status_code=204, description="Deleted: the dataset's file and row are gone.")
@bp.doc(
    responses={
        403: "A shared dataset you do not own (only its owner or an admin may delete it)",
        404: "No such dataset (or another user's)",
        409: "A queued, running or cancelling job uses it",
    }
)
def delete_dataset(dataset_id: int):
    """Delete one of your datasets (an admin: any)

    Its file and its row are deleted. Refused (409) while a queued, running or cancelling job names it: cancel the job
    or wait for it to finish. A finished job that names it keeps its results; resumed or retried, it fails at launch.
    """
    user = current_user()
    dataset = db.session.get(Dataset, dataset_id) if dataset_id <= INT32_MAX else None
    if dataset is None or not (dataset.user_id == user.id or dataset.shared or user.is_admin):
        abort_fields(404, f"dataset {dataset_id} not found")
    if dataset.user_id != user.id and not user.is_admin:
        abort_fields(403, f"dataset {dataset_id} is shared with you: only its owner or an admin may delete it")
    active = db.session.execute(select(Job.id, Job.user_id, Job.config).where(Job.status.in_(ACTIVE_STATUSES)))
    using = [(job_id, owner) for job_id, owner, config in active if dataset.id in dataset_ids(config or {})]
    if using:
        yours = [str(job_id) for job_id, owner in using if owner == user.id or user.is_admin]
        named = f" (job{'s' if len(yours) > 1 else ''} {', '.join(yours)})" if yours else ""
        jobs, them = (
            ("1 queued or running job", "it") if len(using) == 1 else (f"{len(using)} queued or running jobs", "them")
        )
        abort_fields(409, f"dataset {dataset_id} is used by {jobs}{named}: cancel {them} or wait for {them} to finish")
    if db.session.execute(delete(Dataset).where(Dataset.id == dataset.id)).rowcount != 1:
        abort_fields(404, f"dataset {dataset_id} not found")  # another request deleted it first
    db.session.commit()
    file = dataset_file(Path(current_app.config["DATA_DIR"]), dataset)  # only ever a file under DATA_DIR/datasets
    if file is not None:  # after the commit: a process killed here leaves a file no row names, swept later
        file.unlink(missing_ok=True)
    return "", 204
