"""Jobs: create, list, get, cancel, resume, retry, delete (`/api/v1/jobs`).

Every status change goes through `webapp.db.transition` (the state machine, which also records the event that
`GET /jobs/{id}/events` streams): one conditional UPDATE, so of two concurrent requests (two cancels, two resumes)
one applies and the other gets 409 with nothing changed. A job is queued through
`app.extensions["aligner_queue"].enqueue(job_id)` after its row is committed, so the worker always finds it; when the
broker cannot take it, the job stays queued and the workers' sweep sends it again (worker/recovery.py). Which of
cancel, resume, retry and delete apply is decided in one place, `webapp.db.refusal`: the 409s below are its reasons,
and every job the API returns lists the ones that apply as `actions`.

- cancel: queued -> cancelled at once; running -> cancelling (cancel_requested; the worker stops at the next step,
  saves a checkpoint and makes it cancelled); cancelling -> unchanged; a finished job -> 409.
- resume: a finished job (paused included) with a checkpoint -> queued; the worker continues from the newest
  checkpoint in run_dir. Metrics, samples, checkpoints, events, step and the firing alarms are kept; attempts (the
  worker's count of starts) goes back to 0. An alarm that paused the job is still firing when it resumes, so it does
  not pause it again until it has cleared and fires anew (a new episode). A succeeded job that did all its steps
  -> 409 (nothing to resume).
- retry: a failed, cancelled or paused job -> queued from scratch: its metrics, samples and checkpoints rows and its
  run folder are deleted, step and attempts go back to 0, its alarms are cleared. Its events are kept (the stream's
  ids only grow).
- delete (DELETE /jobs/{id}, 204): a finished job (paused included); a queued, running or cancelling one -> 409
  (cancel it first). Its metrics, samples and checkpoints rows and its run folder (checkpoints, logs, the final
  policy) are deleted and its config is emptied; the job row stays as a tombstone (`deleted_at` set) with its events,
  the samples' example texts taken out of them, and a last `deleted` event naming who deleted it: the audit line
  admins read (webapp/admin.py). Its owner no longer sees it (404, not listed); nothing applies to it any more.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from apiflask import APIBlueprint
from flask import current_app
from sqlalchemy import delete, func, select, update

from webapp.auth import auth, current_user
from webapp.db import (
    CANCEL,
    CANCELLED,
    CANCELLING,
    DELETE,
    QUEUED,
    RESUME,
    RETRY,
    RUNS_DIR,
    Checkpoint,
    Event,
    Job,
    Metric,
    Sample,
    User,
    add_event,
    refusal,
    run_dir_for,
    transition,
    utcnow,
)
from webapp.dry_run import dry_run
from webapp.errors import abort_fields
from webapp.extensions import db
from webapp.job_config import validate_job_config
from webapp.limits import check_active_jobs
from webapp.memory_plan import memory_check
from webapp.preflight import cheap_checks, check_errors
from webapp.schemas import INT32_MAX, DryRunQuery, JobIn, JobListQuery, JobOut, JobPage, PreflightOut

bp = APIBlueprint("jobs", __name__, url_prefix="/api/v1/jobs", tag="Jobs")


def get_job_or_404(job_id: int, lock: bool = False) -> Job:
    """The current user's job `job_id`; another user's job, and a deleted one, are 404 like a missing one. `lock`:
    SELECT FOR UPDATE."""
    if job_id > INT32_MAX:
        abort_fields(404, f"job {job_id} not found")
    query = select(Job).where(Job.id == job_id, Job.user_id == current_user().id, Job.deleted_at.is_(None))
    job = db.session.scalar(query.with_for_update() if lock else query)
    if job is None:
        abort_fields(404, f"job {job_id} not found")
    return job


def _enqueue(job: Job) -> None:
    """Hand the committed job to the workers. A broker that is down does not lose it: the job stays queued (it is in
    the database) and the workers' recovery sweep sends it again (ALIGNER_REQUEUE_AFTER); an event says so."""
    try:
        current_app.extensions["aligner_queue"].enqueue(job.id)
    except Exception as err:
        current_app.logger.warning("job %s: the broker did not take it (%s); the sweep sends it again", job.id, err)
        message = f"the job queue did not take the job ({type(err).__name__}); it stays queued and is sent again"
        add_event(db.session, job.id, "log", {"message": message, "level": "warning"})
        db.session.commit()


@bp.post("")
@bp.auth_required(auth)
@bp.input(JobIn, location="json")
@bp.input(DryRunQuery, location="query")
@bp.output(JobOut, status_code=201, description="The new job, queued.")
@bp.doc(
    responses={
        200: {
            "description": "`?dry_run=true`: no job is created; the preflight's checks.",
            "content": {"application/json": {"schema": PreflightOut}},
        },
        413: "Request body too large",
    }
)
def create_job(json_data, query_data):
    """Create a training job

    The config names catalogue entries (GET /api/v1/catalogue/..., your datasets) and is validated like `aligner
    train --config` does, within the server's limits (422 naming each bad field); the policy and tokenizer folders
    must hold a model and a tokenizer (422 on config.model.policy); a job whose estimated memory per process does not
    fit the worker's device (ALIGNER_WORKER_DEVICE_MEMORY_GB, else measured) is refused with 422 on
    config.model.backend or num_processes, with the numbers and what would fit; run_dir is set to DATA_DIR/runs/
    job_ID, and the job is queued for the workers. `config.model.backend` fsdp shards the model over
    `num_processes`. `config.algorithm` is `reinforce` (default) or `ppo`; a PPO job with
    `critic.model` gets a critic server from its worker.

    `?dry_run=true` creates nothing: it runs the full preflight (those checks, the reward on 2 prompts x 2 samples
    as POST /api/v1/rewards/try does, and an estimate of the step time scaled from that try) and answers 200 with
    each check and the memory estimate; a config that does not validate, or does not fit, is still 422.
    """
    user = current_user()
    if not query_data["dry_run"]:
        check_active_jobs()
    result = validate_job_config(
        json_data["config"],
        db.session,
        user,
        Path(current_app.config["DATA_DIR"]),
        run_dir_for(current_app.config["DATA_DIR"], 0),
        current_app.config["JOB_LIMITS"],
    )
    if isinstance(result, dict):
        abort_fields(422, "Invalid config", result)
    memory, too_big = memory_check(result.train, json_data["num_processes"])
    if too_big:
        abort_fields(422, "The job does not fit the worker's device memory", too_big)
    checks = cheap_checks(result.train, result.stored)
    if query_data["dry_run"]:
        return dry_run(result.train, result.stored, checks, memory)
    errors = check_errors(checks)
    if errors:
        abort_fields(422, "Invalid config", errors)
    config = result.stored
    job = Job(
        user_id=user.id,
        name=json_data["name"],
        algorithm=result.train.algorithm,
        status=QUEUED,
        queued_at=utcnow(),
        config=config,
        num_processes=json_data["num_processes"],
        num_gpus=json_data["num_gpus"],
        max_steps=result.train.trainer.max_steps,
    )
    db.session.add(job)
    db.session.flush()  # the id names the run folder
    job.run_dir = str(run_dir_for(current_app.config["DATA_DIR"], job.id))
    job.config = {**config, "run_dir": job.run_dir}
    add_event(db.session, job.id, "status", {"status": QUEUED, "error": None, "step": 0})
    db.session.commit()
    _enqueue(job)
    return job


@bp.get("")
@bp.auth_required(auth)
@bp.input(JobListQuery, location="query")
@bp.output(JobPage)
def list_jobs(query_data):
    """List your jobs, newest first"""
    where = [Job.user_id == current_user().id, Job.deleted_at.is_(None)]
    if "status" in query_data:
        where.append(Job.status == query_data["status"])
    if "algorithm" in query_data:
        where.append(Job.algorithm == query_data["algorithm"])
    page, per_page = query_data["page"], query_data["per_page"]
    total = db.session.scalar(select(func.count()).select_from(Job).where(*where))
    items = db.session.scalars(
        select(Job).where(*where).order_by(Job.id.desc()).offset((page - 1) * per_page).limit(per_page)
    ).all()
    return {"items": items, "total": total, "page": page, "per_page": per_page}


@bp.get("/<int:job_id>")
@bp.auth_required(auth)
@bp.output(JobOut)
def get_job(job_id: int):
    """Get a job"""
    return get_job_or_404(job_id)


@bp.post("/<int:job_id>/cancel")
@bp.auth_required(auth)
@bp.output(JobOut)
@bp.doc(responses={409: "The job has already finished, or another request changed it first"})
def cancel_job(job_id: int):
    """Cancel a job

    A queued job is cancelled at once; a running one becomes `cancelling` until its worker stops it at the next step
    boundary (with a checkpoint, so it can be resumed).
    """
    return cancel(get_job_or_404(job_id, lock=True))


def cancel(job: Job) -> Job:
    """Cancel `job` (locked by the caller) and commit: the state change of POST /jobs/{id}/cancel."""
    if job.status == CANCELLING:  # cancelled already: a second request changes nothing and is not an error
        return job
    _refuse_unless(job, CANCEL)
    transition(db.session, job, CANCELLED if job.status == QUEUED else CANCELLING, cancel_requested=True)
    db.session.commit()
    return job


def _refuse_unless(job: Job, action: str) -> None:
    """409 with the state machine's reason when `action` does not apply to `job` (webapp.db.refusal)."""
    reason = refusal(job, action)
    if reason is not None:
        abort_fields(409, reason)


@bp.post("/<int:job_id>/resume")
@bp.auth_required(auth)
@bp.output(JobOut)
@bp.doc(
    responses={
        409: "The job is not finished, did all its steps, has no checkpoint, or another request changed it first"
    }
)
def resume_job(job_id: int):
    """Resume a finished job from its newest checkpoint

    Metrics, samples and checkpoints are kept; the worker continues exactly where the checkpoint left off. A paused
    job's alarms stay firing: the alarm that paused it pauses it again only after it has cleared and fires anew.
    """
    return resume(get_job_or_404(job_id, lock=True))


def resume(job: Job) -> Job:
    """Resume `job` (locked by the caller), commit and queue it: POST /jobs/{id}/resume. The active jobs counted
    against the limit are its owner's."""
    _refuse_unless(job, RESUME)
    check_active_jobs(job.user_id)
    # A new start: the worker's count of starts (ALIGNER_MAX_ATTEMPTS) and the old lease begin afresh.
    transition(db.session, job, QUEUED, attempts=0, worker=None, heartbeat_at=None)
    db.session.commit()
    _enqueue(job)
    return job


@bp.post("/<int:job_id>/retry")
@bp.auth_required(auth)
@bp.output(JobOut)
@bp.doc(responses={409: "The job is not failed, cancelled or paused, or another request changed it first"})
def retry_job(job_id: int):
    """Run a failed, cancelled or paused job again from scratch

    Deletes its metrics, samples, checkpoints and run folder (events are kept), clears its alarms, then queues it.
    """
    return retry(get_job_or_404(job_id, lock=True))


def retry(job: Job) -> Job:
    """Queue `job` (locked by the caller) again from scratch, its results deleted, and commit: POST
    /jobs/{id}/retry. The active jobs counted against the limit are its owner's."""
    _refuse_unless(job, RETRY)
    check_active_jobs(job.user_id)
    fresh = {
        "step": 0,
        "attempts": 0,
        "latest_reward": None,
        "started_at": None,
        "worker": None,
        "heartbeat_at": None,
        "alarms": [],
    }
    transition(db.session, job, QUEUED, **fresh)  # first: a request that lost the race deletes nothing
    _delete_results(job)  # no worker has it yet: it is sent after the commit
    db.session.commit()
    _enqueue(job)
    return job


def _delete_results(job: Job) -> None:
    """Delete the job's metrics, samples and checkpoints rows (in the session) and its run folder (at once), as retry
    and delete do. The folder goes before the commit: a request that fails after it leaves the rows, and asking again
    finishes the work; the other order could leave a folder no row names."""
    for model in (Metric, Sample, Checkpoint):
        db.session.execute(delete(model).where(model.job_id == job.id))
    runs = (Path(current_app.config["DATA_DIR"]) / RUNS_DIR).resolve()
    run_dir = Path(job.run_dir).resolve() if job.run_dir else runs
    if run_dir.is_relative_to(runs) and run_dir != runs:  # only ever a folder the server made
        shutil.rmtree(run_dir, ignore_errors=True)
        if run_dir.exists():
            current_app.logger.warning("job %s: its run folder could not be removed entirely", job.id)


@bp.delete("/<int:job_id>")
@bp.auth_required(auth)
@bp.output({}, status_code=204, description="Deleted: its run folder, checkpoints, metrics and samples are gone.")
@bp.doc(
    responses={
        404: "No such job (or another user's, or deleted already)",
        409: "The job is queued, running or being cancelled (cancel it first), or another request changed it first",
    }
)
def delete_job(job_id: int):
    """Delete a finished job and its results

    A succeeded, failed, cancelled or paused job: its run folder (checkpoints, logs, the final policy), metrics,
    samples and config are deleted and it leaves your job list. A queued or running job must be cancelled first
    (409). Its events are kept for the operators' audit, ending with a `deleted` event.
    """
    delete_finished(get_job_or_404(job_id, lock=True), current_user())
    return "", 204


def delete_finished(job: Job, by: User) -> None:
    """Delete `job` (locked by the caller) for `by` and commit: the tombstone and the files of DELETE /jobs/{id}."""
    _refuse_unless(job, DELETE)
    # One conditional UPDATE, as `transition` makes: of a delete and a concurrent resume or retry, one applies.
    applied = db.session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == job.status, Job.deleted_at.is_(None))
        .values(deleted_at=utcnow(), config={})
        .execution_options(synchronize_session=False)
    )
    if applied.rowcount != 1:
        abort_fields(409, f"job {job.id} changed meanwhile; nothing was deleted")
    _delete_results(job)
    for event in db.session.scalars(select(Event).where(Event.job_id == job.id, Event.kind == "samples")):
        event.payload = _without_example(event.payload)
    add_event(db.session, job.id, "deleted", {"status": job.status, "step": job.step, "deleted_by": by.name})
    db.session.commit()


def _without_example(payload: dict[str, Any]) -> dict[str, Any]:
    """A samples event's payload without its example prompt and response: the samples' text goes with them."""
    return {key: value for key, value in payload.items() if key != "example"}
