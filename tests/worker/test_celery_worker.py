"""Real Celery workers (prefork, Redis broker, PostgreSQL) running tiny training jobs end to end."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import stat
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tests.helpers.service import PgSchema, Service, create_job, wait_for
from webapp.db import Checkpoint, Event, Job, Metric, Sample, session_scope, transition, utcnow

PACED = {"function": "tests.helpers.rewards:paced_letter_reward"}  # >= 0.1 s a step: a test can act between steps


def metric_counts(factory, job_id) -> dict[tuple[int, str], int]:
    with session_scope(factory) as session:
        rows = session.execute(
            select(Metric.step, Metric.name, func.count())
            .where(Metric.job_id == job_id)
            .group_by(Metric.step, Metric.name)
        ).all()
    return {(step, name): n for step, name, n in rows}


def events(factory, job_id, kind=None) -> list[dict]:
    with session_scope(factory) as session:
        stmt = select(Event).where(Event.job_id == job_id).order_by(Event.id)
        return [e.payload for e in session.scalars(stmt if kind is None else stmt.where(Event.kind == kind))]


def sample_indices(factory, job_id) -> dict[tuple[int, str], list[int]]:
    out: dict[tuple[int, str], list[int]] = {}
    with session_scope(factory) as session:
        stmt = select(Sample.step, Sample.split, Sample.index).where(Sample.job_id == job_id).order_by(Sample.index)
        for step, split, index in session.execute(stmt):
            out.setdefault((step, split), []).append(index)
    return out


def checkpoint_steps(factory, job_id) -> list[int]:
    with session_scope(factory) as session:
        return sorted(session.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id)))


def trainer_alive(run_dir: Path) -> bool:
    """Whether any process still runs the trainer of this run directory."""
    needle = str(run_dir / "job.yaml").encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def test_a_job_runs_to_success(service, job_config, tmp_path):
    started = time.monotonic()
    job_id = service.submit(job_config(max_steps=4), run_dir=tmp_path / "run")
    job = service.wait_final(job_id)
    elapsed = time.monotonic() - started
    assert job.status == "succeeded", job.error
    assert (job.step, job.max_steps, job.attempts, job.error) == (4, 4, 1, None)
    assert job.latest_reward is not None and job.started_at and job.finished_at

    counts = metric_counts(service.factory, job_id)
    assert {step for step, _ in counts} == {0, 1, 2, 3, 4} and set(counts.values()) == {1}
    assert all((s, "train_rollouts/rewards") in counts for s in (1, 2, 3, 4))
    indices = sample_indices(service.factory, job_id)
    assert set(indices) >= {(0, "validation"), (1, "train"), (4, "train")}
    assert all(ix == list(range(len(ix))) for ix in indices.values())
    assert checkpoint_steps(service.factory, job_id) == [2, 4]

    # What the API's event stream relays, each once and in order.
    statuses = [e["status"] for e in events(service.factory, job_id, "status")]
    assert statuses == ["running", "succeeded"]
    assert [e["step"] for e in events(service.factory, job_id, "metrics")] == [0, 1, 2, 3, 4]
    assert [e["step"] for e in events(service.factory, job_id, "checkpoint")] == [2, 4]
    assert {(e["step"], e["split"]) for e in events(service.factory, job_id, "samples")} == set(indices)
    assert "final policy:" in (tmp_path / "run" / "train.log").read_text()
    assert not trainer_alive(tmp_path / "run")
    # The run folder, its checkpoints, metrics, samples and log: the worker's user's only (webapp/private.py).
    made = [tmp_path / "run", *(tmp_path / "run").rglob("*")]
    assert len(made) > 5
    assert not [p for p in made if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) & 0o077]
    print(f"\n4-step job: submitted -> succeeded in {elapsed:.1f} s")


def test_cancel_mid_run_stops_at_a_checkpoint(service, job_config, tmp_path):
    config = job_config(max_steps=500, save_interval=1000, val_check_interval=1000, reward=PACED)
    job_id = service.submit(config, run_dir=tmp_path / "run")
    wait_for(lambda: service.job(job_id).step >= 2, 60, "two training steps")
    started = time.monotonic()
    with session_scope(service.factory) as session:  # what the API's cancel does
        job = session.get(Job, job_id)
        transition(session, job, "cancelling", cancel_requested=True)
    job = service.wait_final(job_id, timeout=30)
    print(f"\ncancel -> cancelled in {time.monotonic() - started:.1f} s, at step {job.step}")
    assert job.status == "cancelled" and job.error is None
    assert 2 <= job.step < 500
    assert checkpoint_steps(service.factory, job_id) == [job.step]  # the trainer saved where it stopped
    assert [e["status"] for e in events(service.factory, job_id, "status")] == ["running", "cancelling", "cancelled"]
    assert not trainer_alive(tmp_path / "run")


def test_reward_server_down_fails_the_job_and_the_worker_stays_up(service, job_config, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    config = job_config(reward={"function": None, "server_url": url, "unavailable_timeout_s": 0.5})
    job_id = service.submit(config, run_dir=tmp_path / "run")
    job = service.wait_final(job_id)
    assert job.status == "failed"
    first_line = job.error.splitlines()[0]
    assert first_line.startswith("the trainer exited with status 2: aligner train: error: reward server")
    # The catalogue's server by its name (the job names it): the URL stays the operator's.
    assert "<server reward-server-" in first_line and url not in first_line and "cannot be reached" in first_line
    assert "--- last lines of train.log ---" in job.error
    worker = service.workers[0]
    assert worker.alive()
    assert service.client.control.ping(destination=[worker.name.replace("%h", socket.gethostname())], timeout=5)


def test_a_second_copy_of_a_leased_job_stands_down(service, job_config, tmp_path):
    heartbeat = utcnow()
    job_id = create_job(
        service.factory, job_config(), tmp_path / "run", status="running", worker="elsewhere:1:x",
        heartbeat_at=heartbeat, attempts=1,
    )  # fmt: skip
    # Keep the other worker's lease alive while the copy is delivered.
    service.send(job_id)
    worker = service.workers[0]
    wait_for(lambda: f"'job_id': {job_id}, 'outcome': 'stood_down'" in worker.log(), 20, "the copy to stand down")
    job = service.job(job_id)
    assert (job.status, job.worker, job.heartbeat_at, job.attempts) == ("running", "elsewhere:1:x", heartbeat, 1)
    assert events(service.factory, job_id) == [] and not (tmp_path / "run").exists()
    with session_scope(service.factory) as session:  # end the fake lease before the sweep would recover it
        session.get(Job, job_id).status = "failed"


def test_a_running_worker_recovers_a_lost_job_with_no_message_left(service, job_config, tmp_path):
    """A job whose worker vanished and whose message is gone (a stood-down copy acknowledged it): the periodic sweep
    of a worker that is already up re-queues it, and it runs."""
    stale = utcnow() - dt.timedelta(seconds=3)  # the ghost's last heartbeat: ALIGNER_LEASE_TIMEOUT (3 s) ago
    job_id = create_job(
        service.factory, job_config(max_steps=2), tmp_path / "run", service.folder / "data", status="running",
        worker="ghost:1:x", heartbeat_at=stale, attempts=1, started_at=stale,
    )  # fmt: skip
    job = service.wait_final(job_id)
    assert (job.status, job.attempts, job.step) == ("succeeded", 2, 2), job.error
    assert [e["status"] for e in events(service.factory, job_id, "status")] == ["queued", "running", "succeeded"]
    assert f"recovery sweep: job {job_id} -> queued" in service.workers[0].log()


@pytest.mark.slow
def test_a_sigkilled_worker_loses_nothing(pg_available, redis_url, job_config, tmp_path):
    """SIGKILL a worker mid-job; a new worker re-queues it (sweep), resumes from its last checkpoint, finishes;
    every (step, metric) is in SQL exactly once."""
    schema = PgSchema()
    service = Service(schema, redis_url, tmp_path)
    try:
        first = service.start_worker()
        max_steps = 12
        run_dir = tmp_path / "run"
        config = job_config(max_steps=max_steps, save_interval=3, val_check_interval=10, reward=PACED)
        job_id = service.submit(config, run_dir=run_dir)
        # Past step 5 the checkpoint of step 3 is complete, and steps after it are in SQL: they will be redone.
        wait_for(lambda: service.job(job_id).step >= 5, 90, "5 steps")
        trainer_pid = json.loads((run_dir / "trainer.pid").read_text())["pid"]
        first.kill()
        killed_at = time.monotonic()
        job = service.job(job_id)
        assert job.status == "running" and job.step < max_steps, "the job ended before the kill: make it longer"
        # PDEATHSIG: the trainer dies with its worker, nothing keeps the CPU.
        wait_for(lambda: not os.path.exists(f"/proc/{trainer_pid}"), 5, "the orphaned trainer to die")

        service.start_worker()
        job = service.wait_final(job_id, timeout=120)
        print(f"\nkill -> recovered and succeeded in {time.monotonic() - killed_at:.1f} s")
        assert job.status == "succeeded", job.error
        assert job.attempts == 2 and job.step == max_steps
        counts = metric_counts(service.factory, job_id)
        assert {step for step, _ in counts} == set(range(max_steps + 1)) and set(counts.values()) == {1}
        for step in range(1, max_steps + 1):
            assert (step, "train_rollouts/rewards") in counts
        assert all(ix == list(range(len(ix))) for ix in sample_indices(service.factory, job_id).values())
        log = (run_dir / "train.log").read_text()
        assert "resumed from" in log
        statuses = [e["status"] for e in events(service.factory, job_id, "status")]
        assert statuses == ["running", "queued", "running", "succeeded"]
        assert any("re-queued" in e.get("message", "") for e in events(service.factory, job_id, "log"))
        # Each step's metrics event was relayed once per run of it: none of the re-run steps is missing.
        relayed = [e["step"] for e in events(service.factory, job_id, "metrics")]
        assert set(relayed) == set(range(max_steps + 1))
    finally:
        service.close()
        schema.drop()


@pytest.mark.slow
def test_a_two_process_job_cancels_at_one_checkpoint_and_leaves_no_rank(service, job_config, tmp_path):
    """num_processes=2 under torchrun: the cancel's SIGTERM reaches both ranks through torchrun, they stop at the same
    step, rank 0 saves it; each step's metrics are in SQL once, and no process of the job is left."""
    config = job_config(max_steps=500, save_interval=1000, val_check_interval=1000, reward=PACED)
    job_id = service.submit(config, run_dir=tmp_path / "run", num_processes=2)
    wait_for(lambda: service.job(job_id).step >= 2, 90, "two training steps")
    with session_scope(service.factory) as session:
        transition(session, session.get(Job, job_id), "cancelling", cancel_requested=True)
    job = service.wait_final(job_id, timeout=60)
    assert job.status == "cancelled" and job.error is None
    assert 2 <= job.step < 500
    assert checkpoint_steps(service.factory, job_id) == [job.step]
    counts = metric_counts(service.factory, job_id)
    assert {step for step, _ in counts} == set(range(job.step + 1)) and set(counts.values()) == {1}
    assert not trainer_alive(tmp_path / "run")


def test_a_queued_job_whose_message_was_lost_is_sent_again(service, job_config, tmp_path):
    """A job committed as queued whose message never reached a worker (a broker restarted without it): a worker's
    sweep sends it again once it has waited ALIGNER_REQUEUE_AFTER (3 s here), and it runs once."""
    config = job_config(max_steps=2)
    waited = utcnow() - dt.timedelta(seconds=3)  # committed ALIGNER_REQUEUE_AFTER ago: the next sweep sends it
    job_id = create_job(service.factory, config, tmp_path / "run", service.folder / "data", queued_at=waited)
    job = service.wait_final(job_id, timeout=60)
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert f"recovery sweep: queued job {job_id} sent again" in service.workers[0].log()
    assert [e["status"] for e in events(service.factory, job_id, "status")] == ["running", "succeeded"]


@pytest.mark.slow
def test_sigterm_to_a_worker_hands_its_job_back_at_a_checkpoint(pg_available, redis_url, job_config, tmp_path):
    """`docker stop`: SIGTERM to the worker's main process only. Its pool process stops the trainer at the step
    boundary with a checkpoint, the job goes back to the queue with no attempt counted, the worker exits, and the
    next worker resumes the job at that step."""
    schema = PgSchema()
    service = Service(schema, redis_url, tmp_path)
    try:
        first = service.start_worker()
        max_steps = 12
        run_dir = tmp_path / "run"
        config = job_config(max_steps=max_steps, save_interval=100, val_check_interval=100, reward=PACED)
        job_id = service.submit(config, run_dir=run_dir)
        wait_for(lambda: service.job(job_id).step >= 3, 90, "3 steps")
        trainer_pid = json.loads((run_dir / "trainer.pid").read_text())["pid"]
        assert first.terminate(timeout=60) == 0  # a warm shutdown that waited for the hand-back
        job = service.job(job_id)
        assert (job.status, job.attempts, job.worker) == ("queued", 0, None), job.error
        stopped_at = job.step
        assert stopped_at < max_steps and checkpoint_steps(service.factory, job_id) == [stopped_at]
        assert not os.path.exists(f"/proc/{trainer_pid}")
        handed_back = f"resumes from checkpoint step {stopped_at} (no attempt counted)"
        assert any(handed_back in e.get("message", "") for e in events(service.factory, job_id, "log"))

        service.start_worker()
        job = service.wait_final(job_id, timeout=120)
        assert (job.status, job.attempts, job.step) == ("succeeded", 1, max_steps), job.error
        assert f"at step {stopped_at}" in (run_dir / "train.log").read_text().split("resumed from", 1)[1][:200]
        counts = metric_counts(service.factory, job_id)
        assert {step for step, _ in counts} == set(range(max_steps + 1)) and set(counts.values()) == {1}
        statuses = [e["status"] for e in events(service.factory, job_id, "status")]
        assert statuses == ["running", "queued", "running", "succeeded"]
    finally:
        service.close()
        schema.drop()
