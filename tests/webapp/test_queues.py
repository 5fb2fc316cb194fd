"""The job queue: CeleryQueue sends `aligner.run_job(job_id)` through the workers' Celery app to Redis."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from webapp.queues import CeleryQueue, InMemoryQueue


def test_in_memory_queue_records_ids():
    queue = InMemoryQueue()
    queue.enqueue(3)
    queue.enqueue(4)
    assert queue.job_ids == [3, 4]


def test_celery_queue_sends_the_run_job_task_to_redis():
    redis = pytest.importorskip("redis")
    from webapp.queues import BROKER_URL

    client = redis.Redis.from_url(BROKER_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Redis at {BROKER_URL} is unreachable: {err}")
        pytest.skip(f"Redis at {BROKER_URL} is unreachable: {err}")
    queue_name = f"aligner-test-{uuid.uuid4().hex[:8]}"
    try:
        CeleryQueue(queue=queue_name).enqueue(42)
        messages = client.lrange(queue_name, 0, -1)
        assert len(messages) == 1
        headers = json.loads(messages[0])["headers"]
        assert headers["task"] == "aligner.run_job" and headers["argsrepr"] == "[42]"
    finally:  # the queue and kombu's bindings of it
        for key in [queue_name, *client.scan_iter(match=f"*{queue_name}*")]:
            client.delete(key)
        client.close()
