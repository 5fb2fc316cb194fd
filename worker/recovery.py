"""The recovery sweep: jobs whose worker was lost go back to the queue, and queued jobs whose message the broker
lost are sent again.

Every worker runs `sweep()` when it is ready and then every `ALIGNER_SWEEP_INTERVAL` seconds (see
worker/celery_app.py):
- `requeue_stale_jobs`: a running job whose heartbeat is older than the lease timeout lost its worker; it goes back
  to queued and `aligner.run_job` is sent again. A job that lost its worker `max_attempts` times fails instead; a
  lost job that was being cancelled is cancelled. A critic server its lost worker left running on this host is
  killed.
- `resend_queued_jobs`: a queued job that no worker took within `requeue_after` seconds of being sent is sent again
  (a broker that restarted without its messages, an API that could not reach the broker). A message that was not
  lost after all only makes a duplicate, which finds the job taken (worker/lease.py) and stands down.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from webapp.db import CANCELLED, CANCELLING, FAILED, QUEUED, Job, add_event, session_scope, transition, utcnow
from worker.lease import LEASED_STATUSES, db_utcnow, lease_is_stale
from worker.processes import kill_leftover_critic
from worker.settings import Settings, session_factory

log = logging.getLogger(__name__)


def requeue_stale_jobs(
    settings: Settings | None = None,
    factory: sessionmaker[Session] | None = None,
    *,
    send: Callable[[int], Any],
) -> list[tuple[int, str]]:
    """Recover jobs whose worker was lost (heartbeat older than the lease timeout): [(job id, new status)].

    running -> queued and `send(job_id)` (the worker passes its `enqueue_job`); after `max_attempts`
    starts -> failed; cancelling -> cancelled. Each job is claimed with a conditional UPDATE, so concurrent sweeps
    of several workers recover it once. The task is sent before the commit: if the commit fails, the task finds
    the stale lease and takes the job over anyway.
    """
    settings = settings or Settings.from_env()
    factory = factory or session_factory(settings.database_url)
    stale = lease_is_stale(settings)
    with session_scope(factory) as session:
        candidates = list(session.scalars(select(Job.id).where(Job.status.in_(LEASED_STATUSES), stale)))
    recovered = []
    for job_id in candidates:
        with session_scope(factory) as session:
            claimed = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_(LEASED_STATUSES), stale)
                .values(heartbeat_at=db_utcnow())
                .execution_options(synchronize_session=False)
            )
            if claimed.rowcount != 1:
                continue
            job = session.get(Job, job_id, populate_existing=True)
            if job.run_dir:  # a PPO job's critic server that its lost worker on this host left running
                kill_leftover_critic(Path(job.run_dir))
            lost = f"worker {job.worker} lost (no heartbeat for over {settings.lease_timeout:g} s)"
            if job.status == CANCELLING or job.cancel_requested:
                transition(session, job, CANCELLED, worker=None, devices=None)
                add_event(session, job_id, "log", {"message": f"{lost}; the job was being cancelled: cancelled"})
            elif job.attempts >= settings.max_attempts:
                transition(
                    session,
                    job,
                    FAILED,
                    worker=None,
                    devices=None,
                    error=f"{lost} after {job.attempts} attempts (ALIGNER_MAX_ATTEMPTS={settings.max_attempts}); "
                    "resume the job to try again",
                )
            else:
                transition(session, job, QUEUED, worker=None, devices=None)
                add_event(session, job_id, "log", {"message": f"{lost}; re-queued to resume from its last checkpoint"})
                send(job_id)
            recovered.append((job_id, job.status))
            log.warning("job %d: %s -> %s", job_id, lost, job.status)
    return recovered


def resend_queued_jobs(
    settings: Settings | None = None,
    factory: sessionmaker[Session] | None = None,
    *,
    send: Callable[[int], Any],
) -> list[int]:
    """Send again each queued job last sent more than `requeue_after` seconds ago: [job ids]. Each is claimed by
    moving its `queued_at` with a conditional UPDATE, so concurrent sweeps send it once; the send follows the commit
    (a failed send leaves the job for the next sweep)."""
    settings = settings or Settings.from_env()
    factory = factory or session_factory(settings.database_url)
    now = utcnow()
    overdue = or_(Job.queued_at.is_(None), Job.queued_at < now - dt.timedelta(seconds=settings.requeue_after))
    with session_scope(factory) as session:
        candidates = list(session.scalars(select(Job.id).where(Job.status == QUEUED, overdue).order_by(Job.id)))
    sent = []
    for job_id in candidates:
        with session_scope(factory) as session:
            claimed = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == QUEUED, overdue)
                .values(queued_at=now)
                .execution_options(synchronize_session=False)
            )
            if claimed.rowcount != 1:
                continue
        try:
            send(job_id)
        except Exception as err:  # the broker is still away: put the job back for the next sweep
            log.warning("job %d: could not send it again (%s)", job_id, err)
            with session_scope(factory) as session:
                session.execute(update(Job).where(Job.id == job_id, Job.queued_at == now).values(queued_at=None))
            continue
        sent.append(job_id)
        log.warning("job %d: queued but not taken for over %g s: sent again", job_id, settings.requeue_after)
    return sent


def sweep(
    settings: Settings | None = None, factory: sessionmaker[Session] | None = None, *, send: Callable[[int], Any]
) -> dict[str, list]:
    """Both recoveries: {"recovered": [(job id, new status)], "resent": [job id]}."""
    settings = settings or Settings.from_env()
    factory = factory or session_factory(settings.database_url)
    recovered = requeue_stale_jobs(settings, factory, send=send)
    return {"recovered": recovered, "resent": resend_queued_jobs(settings, factory, send=send)}
