"""Every user's jobs, for admins (`/api/v1/admin/jobs`): list, get, cancel, resume, retry, delete, and a job's
events. A non-admin gets 403. Each action is the owner's (webapp/jobs.py) under the same state machine
(webapp.db.refusal: 409 where it does not apply); a resume or retry counts against the owner's active jobs.

Admins see deleted jobs too (`deleted_at` set: the tombstone webapp/jobs.py `delete_finished` leaves) and their
events, the audit line that ends with the `deleted` event naming who deleted the job.
"""

from __future__ import annotations

from apiflask import APIBlueprint
from sqlalchemy import func, select

from webapp.auth import auth, current_user, require_admin
from webapp.db import Event, Job, User, column_values
from webapp.errors import abort_fields
from webapp.extensions import db
from webapp.jobs import cancel, delete_finished, resume, retry
from webapp.schemas import INT32_MAX, AdminEventPage, AdminJobListQuery, AdminJobOut, AdminJobPage, PageQuery

bp = APIBlueprint("admin", __name__, url_prefix="/api/v1/admin", tag="Admin")
ADMIN_ONLY = {403: "Not an admin"}


def _with_owner(job: Job, owner: str) -> dict:
    return {**column_values(job), "actions": job.actions, "user": owner}


def _job_or_404(job_id: int, lock: bool = False) -> tuple[Job, str]:
    if job_id > INT32_MAX:
        abort_fields(404, f"job {job_id} not found")
    query = select(Job, User.name).join(User, Job.user_id == User.id).where(Job.id == job_id)
    row = db.session.execute(query.with_for_update(of=Job) if lock else query).first()
    if row is None:
        abort_fields(404, f"job {job_id} not found")
    return row[0], row[1]


@bp.get("/jobs/<int:job_id>")
@bp.auth_required(auth)
@bp.output(AdminJobOut)
@bp.doc(responses=ADMIN_ONLY)
def get_any_job(job_id: int):
    """Get any user's job (admin)"""
    require_admin()
    return _with_owner(*_job_or_404(job_id))


@bp.get("/jobs")
@bp.auth_required(auth)
@bp.input(AdminJobListQuery, location="query")
@bp.output(AdminJobPage)
@bp.doc(responses=ADMIN_ONLY)
def list_all_jobs(query_data):
    """List every user's jobs, newest first (admin)"""
    require_admin()
    where = []
    if "status" in query_data:
        where.append(Job.status == query_data["status"])
    if "algorithm" in query_data:
        where.append(Job.algorithm == query_data["algorithm"])
    if "user" in query_data:
        where.append(User.name == query_data["user"])
    page, per_page = query_data["page"], query_data["per_page"]
    joined = select(Job, User.name).join(User, Job.user_id == User.id).where(*where)
    total = db.session.scalar(select(func.count()).select_from(joined.subquery()))
    rows = db.session.execute(joined.order_by(Job.id.desc()).offset((page - 1) * per_page).limit(per_page))
    return {
        "items": [_with_owner(job, owner) for job, owner in rows],
        "total": total,
        "page": page,
        "per_page": per_page,
    }


@bp.post("/jobs/<int:job_id>/cancel")
@bp.auth_required(auth)
@bp.output(AdminJobOut)
@bp.doc(responses={**ADMIN_ONLY, 409: "The job has already finished"})
def cancel_any_job(job_id: int):
    """Cancel any user's job (admin)"""
    require_admin()
    job, owner = _job_or_404(job_id, lock=True)
    return _with_owner(cancel(job), owner)


@bp.post("/jobs/<int:job_id>/resume")
@bp.auth_required(auth)
@bp.output(AdminJobOut)
@bp.doc(
    responses={
        **ADMIN_ONLY,
        404: "No such job",
        409: "The job is not finished, did all its steps, has no checkpoint, was deleted, or another request changed "
        "it first",
    }
)
def resume_any_job(job_id: int):
    """Resume any user's finished job from its newest checkpoint (admin)

    As POST /api/v1/jobs/{id}/resume does for its owner.
    """
    require_admin()
    job, owner = _job_or_404(job_id, lock=True)
    return _with_owner(resume(job), owner)


@bp.post("/jobs/<int:job_id>/retry")
@bp.auth_required(auth)
@bp.output(AdminJobOut)
@bp.doc(
    responses={
        **ADMIN_ONLY,
        404: "No such job",
        409: "The job is not failed, cancelled or paused, was deleted, or another request changed it first",
    }
)
def retry_any_job(job_id: int):
    """Run any user's failed, cancelled or paused job again from scratch (admin)

    As POST /api/v1/jobs/{id}/retry does for its owner: its metrics, samples, checkpoints and run folder are deleted.
    """
    require_admin()
    job, owner = _job_or_404(job_id, lock=True)
    return _with_owner(retry(job), owner)


@bp.delete("/jobs/<int:job_id>")
@bp.auth_required(auth)
@bp.output({}, status_code=204, description="Deleted: its run folder, checkpoints, metrics and samples are gone.")
@bp.doc(
    responses={
        **ADMIN_ONLY,
        404: "No such job",
        409: "The job is queued, running or being cancelled (cancel it first), or was deleted already",
    }
)
def delete_any_job(job_id: int):
    """Delete any user's finished job and its results (admin)

    As DELETE /api/v1/jobs/{id} does for its owner; the `deleted` event names the admin who deleted it.
    """
    require_admin()
    job, _owner = _job_or_404(job_id, lock=True)
    delete_finished(job, current_user())
    return "", 204


@bp.get("/jobs/<int:job_id>/events")
@bp.auth_required(auth)
@bp.input(PageQuery, location="query")
@bp.output(AdminEventPage)
@bp.doc(responses={**ADMIN_ONLY, 404: "No such job"})
def list_any_job_events(job_id: int, query_data):
    """List any user's job's events, oldest first, a deleted job's too (admin)"""
    require_admin()
    job, _owner = _job_or_404(job_id)
    page, per_page = query_data["page"], query_data["per_page"]
    total = db.session.scalar(select(func.count()).select_from(Event).where(Event.job_id == job.id))
    items = db.session.scalars(
        select(Event).where(Event.job_id == job.id).order_by(Event.id).offset((page - 1) * per_page).limit(per_page)
    ).all()
    return {"items": items, "total": total, "page": page, "per_page": per_page}
