"""Where the API hands new, resumed and retried jobs to the workers: `queue.enqueue(job_id)`.

The app keeps its queue in `app.extensions["aligner_queue"]` (config key JOB_QUEUE; default `CeleryQueue()`).
Messages carry only the job's id; the worker reads everything else from the database.
"""

from __future__ import annotations

RUN_JOB_TASK = "aligner.run_job"


class CeleryQueue:
    """Sends the task `aligner.run_job(job_id)` through the workers' own Celery app (worker/celery_app.py).

    So the API uses the workers' broker (env ALIGNER_BROKER_URL, default redis://127.0.0.1:6379/0), queue (env
    ALIGNER_QUEUE, default `aligner`) and serializer. The Celery app is imported on the first enqueue: the API starts,
    and its tests run, without a broker.
    """

    def __init__(self, celery_app=None, queue: str | None = None):
        self._celery, self.queue = celery_app, queue

    def enqueue(self, job_id: int) -> None:
        from worker.celery_app import QUEUE, app

        (self._celery or app).send_task(RUN_JOB_TASK, args=[int(job_id)], queue=self.queue or QUEUE)


class InMemoryQueue:
    """Records enqueued job ids (tests, and runs without workers)."""

    def __init__(self):
        self.job_ids: list[int] = []

    def enqueue(self, job_id: int) -> None:
        self.job_ids.append(job_id)
