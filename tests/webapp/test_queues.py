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
    from webapp.settings import service_settings

    broker_url = service_settings().broker_url
    client = redis.Redis.from_url(broker_url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Redis at {broker_url} is unreachable: {err}")
        pytest.skip(f"Redis at {broker_url} is unreachable: {err}")
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


RABBITMQ_URL = os.environ.get("ALIGNER_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def test_celery_queue_sends_a_persistent_message_to_a_durable_rabbitmq_queue():
    """The production broker keeps a queued job's message through its own restart: the queue is durable, the
    message persistent (delivery mode 2), and the broker confirmed it before enqueue returned."""
    import kombu

    try:
        kombu.Connection(RABBITMQ_URL, connect_timeout=2).ensure_connection(max_retries=1)
    except Exception as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"RabbitMQ at {RABBITMQ_URL} is unreachable: {err}")
        pytest.skip(f"RabbitMQ at {RABBITMQ_URL} is unreachable: {err}")
    queue_name = f"aligner-test-{uuid.uuid4().hex[:8]}"
    with kombu.Connection(RABBITMQ_URL) as conn:
        channel = conn.channel()
        try:
            CeleryQueue(queue=queue_name, broker_url=RABBITMQ_URL).enqueue(42)
            name, count, _ = channel.queue_declare(queue=queue_name, passive=True)  # exists after the send
            assert count == 1
            message = kombu.Queue(queue_name, channel=channel).get(no_ack=True)
            assert message.headers["task"] == "aligner.run_job" and message.headers["argsrepr"] == "[42]"
            assert message.properties["delivery_mode"] == 2
            redeclared = kombu.Queue(queue_name, durable=False, channel=channel)
            with pytest.raises(Exception, match="durable"):  # RabbitMQ refuses to redeclare it as not durable
                redeclared.declare()
        finally:
            conn.channel().queue_delete(queue_name)
