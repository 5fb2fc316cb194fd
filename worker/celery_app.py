"""The Celery application of the training service: one task, `aligner.run_job(job_id)` (worker/tasks.py).

    celery -A worker.celery_app worker --pool=prefork --loglevel=INFO

A CPU worker runs one job at a time (the trainer uses the cores; start more workers on more machines); a worker
given GPUs (`ALIGNER_WORKER_GPUS=0,1,2,3`) runs up to one job per device at once, each on the devices it leased
(worker/devices.py). The broker is `ALIGNER_BROKER_URL`, the queue `ALIGNER_QUEUE`, the database
`ALIGNER_DATABASE_URL` (their defaults: webapp/settings.py, docs/service.md "Environment variables"); the task name
and how it is sent are defined once in webapp/queues.py, whose `CeleryQueue` the API sends jobs with; the recovery
sweep here re-sends with `enqueue_job(job_id)`. No result backend is used: the job's row in the database is the result.

A stopping worker (SIGTERM, warm shutdown) hands its jobs back: worker/shutdown.py.

Delivery, as measured with Celery 5.7 and Redis:
- `task_acks_late` + `worker_prefetch_multiplier=1`: a message is acknowledged when its job ends, and a worker
  holds one message at a time. A task whose worker was SIGKILLed is delivered again, but only after the broker's
  `visibility_timeout` (default 1 hour); Redis's scan for such messages runs rarely unless
  `unacked_restore_interval` and `unacked_restore_throttle` are lowered (they are, below).
- `task_reject_on_worker_lost`: a pool process that dies puts its message back; without it the task fails with
  `WorkerLostError` when only the pool child is killed.
- Redis hands an unacknowledged message out again after `visibility_timeout`, even while its job is still
  running (a 25 s task with a 10 s timeout was started 4 times). Training jobs are long, so the timeout is long
  (12 h, `ALIGNER_VISIBILITY_TIMEOUT`), and a copy that arrives anyway finds the job's live lease in the database
  and stands down (worker/lease.py).
- Recovery from a lost worker therefore does not wait for the broker: every worker runs `requeue_stale_jobs()`
  (worker/recovery.py) when it is ready and then every `ALIGNER_SWEEP_INTERVAL` seconds in a background thread
  (Celery beat is not needed): a running job without a heartbeat for `ALIGNER_LEASE_TIMEOUT` seconds is re-queued
  and resumes from its last checkpoint; a queued job that no worker took within `ALIGNER_REQUEUE_AFTER` seconds is
  sent again (its message may have died with a broker that keeps nothing), see docs/reliability.md.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery, signals

from aligner.processes import hide_from_children
from webapp.private import private_data_dir, private_files
from webapp.queues import send_run_job, transport_options
from webapp.settings import service_settings
from worker import shutdown
from worker.recovery import sweep
from worker.settings import Settings

log = logging.getLogger(__name__)

_service = service_settings()
app = Celery("aligner", broker=_service.broker_url, include=["worker.tasks"])
app.conf.update(
    task_default_queue=_service.queue,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    # One pool process per device the worker was given (each runs one job at a time); one without devices.
    worker_concurrency=max(1, len(Settings.from_env().gpus)),
    broker_connection_retry_on_startup=True,
    # A short broker outage must not kill a training run: the job's lease in the database decides who runs it.
    worker_cancel_long_running_tasks_on_connection_loss=False,
    broker_transport_options=transport_options(_service.broker_url),
)


def enqueue_job(job_id: int, queue: str | None = None) -> None:
    """Send `aligner.run_job(job_id)`; the API calls this after it commits a queued Job row."""
    send_run_job(app, job_id, queue)


# ------------------------------------------------------------------------------------------------- recovery sweep
_sweeper_stop = threading.Event()


def _sweep_once() -> None:
    from sqlalchemy.exc import SQLAlchemyError

    try:
        done = sweep(send=enqueue_job)
        for job_id, status in done["recovered"]:
            log.warning("recovery sweep: job %d -> %s", job_id, status)
        for job_id in done["resent"]:
            log.warning("recovery sweep: queued job %d sent again", job_id)
    except SQLAlchemyError as err:  # database down or not migrated yet: one line, and try again later
        log.warning("recovery sweep failed, trying again later: %s", str(err).splitlines()[0])
    except Exception:  # nothing may end the sweeper
        log.exception("recovery sweep failed; trying again later")


def _sweeper(interval: float) -> None:
    while not _sweeper_stop.wait(interval):
        _sweep_once()


@signals.worker_init.connect
@signals.worker_process_init.connect
def _hide_from_trainers(**_kwargs) -> None:
    """The worker's processes (the main one, before its pool forks, and each pool process) are unreadable to the
    trainers they start (aligner/processes.py `hide_from_children`)."""
    hide_from_children()


@signals.worker_init.connect
def _private_files(**_kwargs) -> None:
    """Before the pool forks: the run folders this worker and its trainers write are their user's only
    (webapp/private.py; the pool processes and the trainers inherit the umask)."""
    private_files()
    private_data_dir(Settings.from_env().data_dir)


@signals.worker_shutting_down.connect
def _stop_runs(sig=None, how=None, **_kwargs) -> None:
    """Warm shutdown: the runs in this worker (solo pool) and in its pool processes hand their jobs back."""
    log.warning("worker stopping (%s, %s): running jobs go back to the queue at their next step boundary", sig, how)
    shutdown.stop_pool_processes()


@signals.worker_ready.connect
def _start_sweeper(**_kwargs) -> None:
    """At start, recover the jobs of lost workers, then keep sweeping from a daemon thread (main process)."""
    _sweep_once()
    _sweeper_stop.clear()
    interval = Settings.from_env().sweep_interval
    threading.Thread(target=_sweeper, args=(interval,), name="aligner-sweeper", daemon=True).start()


@signals.worker_shutdown.connect
def _stop_sweeper(**_kwargs) -> None:
    _sweeper_stop.set()
