"""The training service under test: a PostgreSQL schema of its own, real Celery workers as subprocesses on a queue
of their own, and the jobs they run (the fixtures of tests/worker/conftest.py build on these).

    ALIGNER_TEST_POSTGRES_URL  PostgreSQL, as for every test (tests/helpers/databases.py)
    ALIGNER_TEST_REDIS_URL  default redis://127.0.0.1:6379/11
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.helpers.catalogue import api_config
from tests.helpers.databases import POSTGRES_URL
from webapp.db import FINAL_STATUSES, Base, Job, User, make_engine, make_session_factory, session_scope
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("ALIGNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
PROMPTS = ["tell me about the cat.", "describe the dog.", "a bird", "the old river", "the sea", "a song"]


def _unavailable(what: str, err: BaseException) -> None:
    message = f"{what} is not reachable ({err})"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " and CI=true: the worker tests need it")
    pytest.skip(message)


def require_redis() -> str:
    """REDIS_URL, once Redis answers there (else the test is skipped, or failed when CI=true)."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as err:
        _unavailable(f"Redis at {REDIS_URL}", err)
    return REDIS_URL


def _pg_schema_url(schema: str) -> str:
    sep = "&" if "?" in POSTGRES_URL else "?"
    return f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"


class PgSchema:
    """A fresh schema with the service's tables; `url` selects it through the connection's search_path."""

    def __init__(self):
        self.name = "aligner_test_" + uuid.uuid4().hex[:10]
        admin = make_engine(POSTGRES_URL)
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {self.name}"))
        admin.dispose()
        self.url = _pg_schema_url(self.name)
        self.engine = make_engine(self.url)
        Base.metadata.create_all(self.engine)
        self.factory = make_session_factory(self.engine)

    def drop(self) -> None:
        self.engine.dispose()
        admin = make_engine(POSTGRES_URL)
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {self.name} CASCADE"))
        admin.dispose()


def create_job(factory, config: dict, run_dir: Path | None = None, data_dir: Path | None = None, **fields) -> int:
    """A queued job (or one with `fields` set) of the user `tester`, as the API would commit it; its id.

    `config` is aligner's (paths): what it names is registered in the catalogue and its prompt files become the
    user's datasets in `data_dir` (default: `run_dir`'s sibling `data`, the tests' Settings.data_dir)."""
    with session_scope(factory) as session:
        user = session.query(User).filter_by(name="tester").one_or_none()
        if user is None:
            user = User(name="tester")
            session.add(user)
            session.flush()
        if config:
            data_dir = data_dir or Path(run_dir).parent / "data"
            config = api_config(session, user, config, data_dir)
        job = Job(user_id=user.id, name="tiny", config=config, run_dir=str(run_dir or ""), **fields)
        session.add(job)
        session.flush()
        return job.id


def worker_settings(tmp_path: Path, **fields) -> Settings:
    """The worker's settings for a test run without Celery: data in TMP/data, a 5 s lease unless `fields` say."""
    return Settings(database_url="unused", data_dir=tmp_path / "data", **{"lease_timeout": 5.0, **fields})


def job_row(factory, job_id: int) -> Job:
    with session_scope(factory) as session:
        return session.get(Job, job_id)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """The first true value of `predicate()`, polled every `interval` seconds; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# ------------------------------------------------------------------------------------------------- Celery
class WorkerProcess:
    """`celery -A worker.celery_app worker --pool=prefork --concurrency=1 -Q <queue>` in its own process group."""

    def __init__(self, env: dict[str, str], queue: str, log_path: Path):
        self.name = f"test-{uuid.uuid4().hex[:8]}@%h"
        self.log_path = log_path
        command = [
            sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker", "--pool=prefork", "--concurrency=1",
            "-Q", queue, "-n", self.name, "--without-mingle", "--without-gossip", "--loglevel=INFO",
        ]  # fmt: skip
        self.log_file = log_path.open("ab")
        # umask 0o022, a shell's usual one, whatever this test process's is: what the worker writes is private
        # only because it makes it so itself (webapp/private.py).
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True,
            umask=0o022,
        )  # fmt: skip
        wait_for(lambda: " ready." in self.log() or self.proc.poll() is not None, 60, "the Celery worker to start")
        assert self.proc.poll() is None, f"the worker exited:\n{self.log()}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM the main process alone, as `docker stop` does, and wait for the worker to exit; its status."""
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (main process and pool child), as a crash would."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)  # warm shutdown: idle, so it returns at once
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log_file.close()


class Service:
    """A database schema, a queue and the Celery workers serving them, plus a client that submits jobs."""

    def __init__(self, schema: PgSchema, redis_url: str, folder: Path, **env: str):
        from celery import Celery

        self.schema, self.factory, self.folder = schema, schema.factory, folder
        self.queue = "aligner-test-" + uuid.uuid4().hex[:10]
        self.redis_url = redis_url
        self.env = {
            **os.environ,
            "ALIGNER_DATABASE_URL": schema.url,
            "ALIGNER_BROKER_URL": redis_url,
            "ALIGNER_QUEUE": self.queue,
            "ALIGNER_DATA_DIR": str(folder / "data"),
            "ALIGNER_LEASE_TIMEOUT": "3",
            # a look at the trainer every 0.1 s (0.5 by default): a test's cancel, stop or kill lands within a step
            # or two of the step it waited for, and a job's end is seen at once
            "ALIGNER_POLL_INTERVAL": "0.1",
            "ALIGNER_SWEEP_INTERVAL": "1",
            "ALIGNER_REQUEUE_AFTER": "3",
            "ALIGNER_CANCEL_GRACE": "20",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.client = Celery("aligner-test-client", broker=redis_url)
        self.workers: list[WorkerProcess] = []

    def start_worker(self) -> WorkerProcess:
        worker = WorkerProcess(self.env, self.queue, self.folder / f"worker{len(self.workers)}.log")
        self.workers.append(worker)
        return worker

    def submit(self, config: dict, **fields) -> int:
        """What the API does: commit a queued Job row, then send `aligner.run_job(job_id)`."""
        job_id = create_job(self.factory, config, data_dir=self.folder / "data", **fields)
        self.send(job_id)
        return job_id

    def send(self, job_id: int) -> None:
        self.client.send_task("aligner.run_job", args=[job_id], queue=self.queue)

    def job(self, job_id: int) -> Job:
        with session_scope(self.factory) as session:
            return session.get(Job, job_id)

    def wait_final(self, job_id: int, timeout: float = 90) -> Job:
        return wait_for(
            lambda: (job := self.job(job_id)).status in FINAL_STATUSES and job,
            timeout,
            f"job {job_id} to end",
            interval=0.2,
        )

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.client.close()
        _drop_queue(self.redis_url, self.queue)


def _drop_queue(redis_url: str, queue: str) -> None:
    """Remove the queue and any unacknowledged message of it (left by a killed worker) from Redis."""
    import redis

    r = redis.Redis.from_url(redis_url)
    r.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    for tag, payload in r.hgetall("unacked").items():
        if queue.encode() in payload:
            r.hdel("unacked", tag)
            r.zrem("unacked_index", tag)
    r.close()
