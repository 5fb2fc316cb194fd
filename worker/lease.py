"""A job's lease, kept in its row: the worker running it (`Job.worker`) and that worker's heartbeat (`heartbeat_at`).

One atomic `UPDATE jobs SET worker=<me>, heartbeat_at=now, attempts=attempts+1 WHERE id=... AND (status='queued' OR
(status='running' AND heartbeat older than the lease timeout))` takes it (`take_lease`): no row updated means another
worker holds a live lease, or the job is finished or cancelled. The holder renews the heartbeat while the job is
running or cancelling and the row still names it (`renew_lease`); once the heartbeat is older than
`Settings.lease_timeout` the lease is stale: another run of the job takes it over, or the recovery sweep
(worker/recovery.py) re-queues the job.

Heartbeats are written and judged by one clock, the database server's (`db_utcnow`), never a worker's: a worker whose
clock jumps forward (NTP, a VM resumed) would otherwise see every other worker's heartbeat as stale and take their
healthy jobs over, and one whose clock lags would write heartbeats that look stale to the others (bench/chaos.py's
clock-jump fault).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator

from sqlalchemy import ColumnElement, DateTime, Float, and_, literal, or_, update
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.functions import FunctionElement

from webapp.db import CANCELLING, QUEUED, RUNNING, Job, session_scope
from worker.settings import Settings

log = logging.getLogger(__name__)

LEASED_STATUSES = (RUNNING, CANCELLING)  # a job in these has a worker, whose lease is live or stale


class db_utcnow(FunctionElement):  # noqa: N801 - an SQL function, named like one
    """SQL: the database server's UTC time (naive, as the DateTime columns hold it), plus `seconds` (may be < 0)."""

    type = DateTime()
    inherit_cache = True

    def __init__(self, seconds: float = 0.0):
        super().__init__(literal(float(seconds), Float))


@compiles(db_utcnow)
def _db_utcnow_postgresql(element, compiler, **kw) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"(timezone('utc', statement_timestamp()) + make_interval(secs => {seconds}))"


@compiles(db_utcnow, "sqlite")
def _db_utcnow_sqlite(element, compiler, **kw) -> str:
    # the text SQLAlchemy stores for a DateTime (6 fractional digits), so stored values compare as text in order
    seconds = compiler.process(element.clauses, **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f000', 'now', printf('%+.3f seconds', {seconds}))"


def lease_owner() -> str:
    """Who holds a lease: host, process and a token unique to this run of the task."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_is_stale(settings: Settings) -> ColumnElement[bool]:
    """SQL: the job's heartbeat is missing or older than the lease timeout (its worker counts as lost)."""
    return or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < db_utcnow(-settings.lease_timeout))


def runnable(settings: Settings) -> ColumnElement[bool]:
    """SQL: a worker may take the job: it is queued, or running with a stale lease (its worker was lost)."""
    return or_(Job.status == QUEUED, and_(Job.status == RUNNING, lease_is_stale(settings)))


def take_lease(session: Session, job_id: int, owner: str, settings: Settings) -> bool:
    """The atomic UPDATE above; True when `owner` now holds the job's lease (not yet committed)."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, runnable(settings))
        .values(worker=owner, heartbeat_at=db_utcnow(), attempts=Job.attempts + 1)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def renew_lease(session: Session, job_id: int, owner: str) -> Job | None:
    """Heartbeat; returns the job (fresh from the database) while `owner` holds its lease, else None."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker == owner, Job.status.in_(LEASED_STATUSES))
        .values(heartbeat_at=db_utcnow())
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        return None
    return session.get(Job, job_id, populate_existing=True)


def holds_lease(job: Job | None, owner: str) -> bool:
    """Whether `owner` still holds the lease of `job` (None: the job was deleted)."""
    return job is not None and job.worker == owner and job.status in LEASED_STATUSES


@contextlib.contextmanager
def renewing_lease(
    factory: sessionmaker[Session], job_id: int, owner: str, interval: float
) -> Iterator[dict[str, bool]]:
    """Renew the lease every `interval` seconds from a helper thread while the caller waits on something slow (a
    critic server starting or stopping); yields {"lost": the lease was lost, "cancel": a cancel was requested}."""
    state = {"lost": False, "cancel": False}
    done = threading.Event()

    def beat() -> None:
        while not done.wait(interval):
            try:
                with session_scope(factory) as session:
                    job = renew_lease(session, job_id, owner)
                    if job is None:
                        state["lost"] = True
                        return
                    state["cancel"] = job.cancel_requested or job.status == CANCELLING
            except Exception as err:  # a database hiccup: the next beat tries again
                log.warning("job %d: heartbeat failed: %s", job_id, err)

    thread = threading.Thread(target=beat, name=f"job-{job_id}-heartbeat", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        done.set()
        thread.join()
