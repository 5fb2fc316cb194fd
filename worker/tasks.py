"""Celery tasks of the training service. Tasks receive ids, never ORM objects; the work is in worker/runner.py."""

from __future__ import annotations

from sqlalchemy.exc import OperationalError

from webapp.queues import RUN_JOB_TASK
from worker.celery_app import app, enqueue_job
from worker.runner import run_job as run
from worker.settings import Settings


@app.task(bind=True, name=RUN_JOB_TASK, max_retries=None)
def run_job(self, job_id: int) -> dict:
    """Run training job `job_id`: lease, launch the trainer, follow it into SQL, record the end (or stand down).

    While the database is unreachable the task is sent again later (every 5 s, doubling up to 60 s): a queued job
    never loses its message to an outage. A job left running meanwhile is resumed from its last checkpoint. A job
    that needs more GPUs than are free here is offered again after ALIGNER_DEVICE_WAIT seconds.
    """
    try:
        result = run(int(job_id), send=enqueue_job)
    except OperationalError as err:
        raise self.retry(exc=err, countdown=min(60, 5 * 2**self.request.retries)) from err
    if result["outcome"] == "waiting_for_devices":
        raise self.retry(countdown=Settings.from_env().device_wait)
    return result
