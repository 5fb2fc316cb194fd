"""Where the API hands new, resumed and retried jobs to the workers: `queue.enqueue(job_id)`.

The app keeps its queue in `app.extensions["aligner_queue"]` (config key JOB_QUEUE; default `CeleryQueue()`).
Messages carry only the job's id; the worker reads everything else from the database.

What both sides agree on lives here, in the service's data layer, so that the worker (worker/celery_app.py)
imports it from the API's side and the API never imports the worker: the task name, and how a message is sent to the
broker and queue of the service's settings (`broker_url`, `queue`: webapp/settings.py).
"""

from __future__ import annotations

from webapp.settings import service_settings

RUN_JOB_TASK = "aligner.run_job"


def transport_options(broker_url: str) -> dict:
    """Kombu's options for the broker: RabbitMQ confirms each published message (a send that returns was stored by
    the broker: durable queue, persistent message); Redis restores the messages of lost workers every minute."""
    if broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        return {"confirm_publish": True}
    return {
        # Redis hands an unacknowledged message out again after this long, even while its job runs (the job's lease in
        # the database makes such a copy stand down); long, since training jobs are.
        "visibility_timeout": service_settings().visibility_timeout,
        # Scan for abandoned messages every minute (default: every 10 s x throttle 10).
        "unacked_restore_interval": 60,
        "unacked_restore_throttle": 1,
    }


def send_run_job(celery_app, job_id: int, queue: str | None = None) -> None:
    """Send the task `aligner.run_job(job_id)` through `celery_app` to `queue` (default: the settings' queue)."""
    celery_app.send_task(RUN_JOB_TASK, args=[int(job_id)], queue=queue or service_settings().queue)


class CeleryQueue:
    """Sends `aligner.run_job(job_id)` to the workers' broker and queue with JSON, as the workers expect.

    Without `celery_app`, a sending-only Celery app for `broker_url` (default: the settings') is made on the first
    enqueue: the API starts, and its tests run, without a broker.
    """

    def __init__(self, celery_app=None, queue: str | None = None, broker_url: str | None = None):
        self._celery, self.queue = celery_app, queue
        self.broker_url = broker_url or service_settings().broker_url

    def enqueue(self, job_id: int) -> None:
        if self._celery is None:
            from celery import Celery

            self._celery = Celery("aligner", broker=self.broker_url, set_as_current=False)
            self._celery.conf.update(
                task_serializer="json",
                broker_connection_retry_on_startup=True,
                broker_transport_options=transport_options(self.broker_url),
            )
        send_run_job(self._celery, job_id, self.queue)


class InMemoryQueue:
    """Records enqueued job ids (tests, and runs without workers)."""

    def __init__(self):
        self.job_ids: list[int] = []

    def enqueue(self, job_id: int) -> None:
        self.job_ids.append(job_id)
