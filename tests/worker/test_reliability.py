"""What keeps a job alive through the service's faults, run without Celery on SQLite and PostgreSQL: a queued job
whose message was lost is sent again, a stopping worker hands its job back without counting an attempt, a trainer
killed from outside is re-queued, and a job's GPUs are its own."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import func, select

from aligner.run_layout import END_FILE
from tests.helpers.service import create_job, job_row, wait_for, worker_settings
from webapp.db import Event, Metric, session_scope, utcnow
from worker import shutdown
from worker.recovery import resend_queued_jobs
from worker.runner import run_job

PACED = {"function": "tests.helpers.rewards:paced_letter_reward"}  # >= 0.1 s a step: the test acts between steps
# s between two looks of the runner at its trainer (0.5 by default): a stop or a kill then lands within a few steps
# of the one the test waited for, and a run's end is seen at once.
POLL = 0.1


def log_messages(factory, job_id) -> list[str]:
    with session_scope(factory) as session:
        payloads = session.scalars(select(Event.payload).where(Event.job_id == job_id, Event.kind == "log"))
        return [p.get("message", "") for p in payloads]


def statuses(factory, job_id) -> list[str]:
    with session_scope(factory) as session:
        stmt = select(Event.payload).where(Event.job_id == job_id, Event.kind == "status").order_by(Event.id)
        return [p["status"] for p in session.scalars(stmt)]


def metric_rows_per_step(factory, job_id, name="train_rollouts/rewards") -> dict[int, int]:
    with session_scope(factory) as session:
        rows = session.execute(
            select(Metric.step, func.count()).where(Metric.job_id == job_id, Metric.name == name).group_by(Metric.step)
        )
        return dict(rows.all())


class Background:
    """`run_job` in a thread, as a pool process would run it; `result` once it returns."""

    def __init__(self, job_id, s, factory, send=None):
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(job_id, s, factory, send), daemon=True)
        self.thread.start()

    def _run(self, job_id, s, factory, send):
        self.result = run_job(job_id, s, factory, send=send)

    def join(self, timeout=120) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the run did not end"
        return self.result


# ------------------------------------------------------------------------------------------------- durable queueing
def test_the_sweep_sends_again_a_queued_job_no_worker_took(factory, tmp_path):
    old = utcnow() - dt.timedelta(seconds=600)
    lost = create_job(factory, {}, queued_at=old)
    fresh = create_job(factory, {}, queued_at=utcnow())
    legacy = create_job(factory, {})  # queued before queued_at existed
    running = create_job(factory, {}, status="running", queued_at=old, worker="w", heartbeat_at=utcnow())
    s = worker_settings(tmp_path, requeue_after=120)
    sent = []
    assert resend_queued_jobs(s, factory, send=sent.append) == [lost, legacy] == sent
    assert resend_queued_jobs(s, factory, send=sent.append) == []  # just sent: not again before requeue_after
    assert job_row(factory, lost).queued_at > old and job_row(factory, fresh).status == "queued"
    assert job_row(factory, running).status == "running"

    def broker_down(_job_id):
        raise ConnectionError("broker down")

    again = worker_settings(tmp_path, requeue_after=0)
    assert resend_queued_jobs(again, factory, send=broker_down) == []
    assert job_row(factory, lost).queued_at is None  # the next sweep tries at once
    assert resend_queued_jobs(again, factory, send=sent.append) == [lost, fresh, legacy]


def test_a_clock_jump_on_a_worker_loses_no_healthy_lease(factory, tmp_path, monkeypatch):
    """Heartbeats are written and judged by the database's clock: a worker whose clock lags by an hour writes a
    live heartbeat, and a sweep on a worker whose clock jumped an hour ahead sees it live (bench/chaos.py's
    clock-jump fault)."""
    from worker import lease, recovery

    def shifted(seconds):
        def now():
            return dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(seconds=seconds)

        for module in (lease, recovery):  # where the worker's code reads its clock
            monkeypatch.setattr(module, "utcnow", now, raising=False)

    job_id = create_job(factory, {}, status="running")
    s = worker_settings(tmp_path, lease_timeout=5.0)
    shifted(-3600)  # the worker holding the job: its clock an hour behind
    with session_scope(factory) as session:
        assert lease.take_lease(session, job_id, "lagging:1:a", s)
    shifted(+3600)  # another worker's sweep, its clock an hour ahead
    sent = []
    assert recovery.requeue_stale_jobs(s, factory, send=sent.append) == [] == sent
    with session_scope(factory) as session:
        assert lease.renew_lease(session, job_id, "lagging:1:a") is not None
        assert not lease.take_lease(session, job_id, "ahead:2:b", s)  # the lease is live: no second run


# ------------------------------------------------------------------------------------------------- graceful stop
# SQLite only: on PostgreSQL the same hand-back (queued, no attempt counted, resumed at the stopped step, each step's
# metrics once, the same statuses and log message) is test_celery_worker.py's SIGTERM test, through a real worker.
@pytest.mark.slow
@pytest.mark.parametrize("factory", ["sqlite"], indirect=True)
def test_a_stopping_worker_hands_the_job_back_at_a_checkpoint(factory, tmp_path, job_config):
    """The worker is told to stop mid-run: the trainer checkpoints at the step boundary, the job is queued again
    with no attempt counted, and the next run resumes at exactly that step; every step's metrics exist once."""
    max_steps = 10
    config = job_config(max_steps=max_steps, save_interval=100, val_check_interval=100, reward=PACED)
    job_id = create_job(factory, config, tmp_path / "run")
    s, sent = worker_settings(tmp_path, cancel_grace=30, poll_interval=POLL), []
    try:
        run = Background(job_id, s, factory, send=sent.append)
        wait_for(lambda: job_row(factory, job_id).step >= 3, 60, "3 steps")
        shutdown.request_stop()
        result = run.join()
    finally:
        shutdown.reset()
    job = job_row(factory, job_id)
    assert result["outcome"] == "handed_back", result
    assert (job.status, job.attempts, job.worker) == ("queued", 0, None) and sent == [job_id]
    stopped_at = job.step
    assert 3 <= stopped_at < max_steps
    assert any(
        f"resumes from checkpoint step {stopped_at} (no attempt counted)" in m for m in log_messages(factory, job_id)
    )

    assert run_job(job_id, s, factory)["outcome"] == "succeeded"
    job = job_row(factory, job_id)
    assert (job.status, job.attempts, job.step) == ("succeeded", 1, max_steps)
    assert (
        f"resumed from {tmp_path / 'run'}/checkpoints/step_{stopped_at:06d} at step {stopped_at}"
        in (tmp_path / "run" / "train.log").read_text()
    )
    assert metric_rows_per_step(factory, job_id) == {step: 1 for step in range(1, max_steps + 1)}
    assert statuses(factory, job_id) == ["running", "queued", "running", "succeeded"]


# ------------------------------------------------------------------------------------------------- killed trainer
@pytest.mark.slow
def test_a_trainer_killed_from_outside_is_requeued_and_resumes(factory, tmp_path, job_config):
    max_steps = 10
    config = job_config(max_steps=max_steps, save_interval=2, val_check_interval=100, reward=PACED)
    job_id = create_job(factory, config, tmp_path / "run")
    s, sent = worker_settings(tmp_path, max_attempts=3, poll_interval=POLL), []
    run = Background(job_id, s, factory, send=sent.append)
    wait_for(lambda: job_row(factory, job_id).step >= 5, 60, "5 steps")
    os.kill(json.loads((tmp_path / "run" / "trainer.pid").read_text())["pid"], signal.SIGKILL)
    assert run.join()["outcome"] == "queued" and sent == [job_id]
    job = job_row(factory, job_id)
    assert (job.status, job.attempts) == ("queued", 1)
    assert any("killed by signal SIGKILL" in m and "re-queued to resume from checkpoint step" in m
               for m in log_messages(factory, job_id))  # fmt: skip

    assert run_job(job_id, s, factory)["outcome"] == "succeeded"
    assert (job_row(factory, job_id).attempts, job_row(factory, job_id).step) == (2, max_steps)
    assert metric_rows_per_step(factory, job_id) == {step: 1 for step in range(1, max_steps + 1)}


# ------------------------------------------------------------------------------------------------- GPU leases
def trainer_env(run_dir: Path) -> dict[str, str]:
    pid = json.loads((run_dir / "trainer.pid").read_text())["pid"]
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


# The GPU tests' trainer: a stand-in (Settings.python, the interpreter the worker runs `-m aligner.cli train` with, is
# this script). Which devices a job gets is the worker's doing, not the trainer's: a real trainer would only add its
# start-up (seconds of torch imports each, four of them here). It stays up while RUN_DIR/hold exists, so that the
# test reads its environment while it runs, then ends as a completed run does.
HOLDING_TRAINER = """\
#!{python}
import json, pathlib, sys, time
import yaml

args = sys.argv[1:]
config = yaml.safe_load(pathlib.Path(args[args.index("--config") + 1]).read_text())
run_dir = pathlib.Path(config["run_dir"])
while (run_dir / "hold").exists():
    time.sleep(0.02)
last = config["trainer"]["max_steps"]
end = {{"end": "completed", "step": last, "total_steps": last, "message": ""}}
(run_dir / "{end_file}").write_text(json.dumps(end))
"""


def test_jobs_get_gpus_of_their_own(factory, tmp_path, job_config):
    """Two fake devices: two one-GPU jobs run at once, each seeing only its device; a third waits; a CPU job sees
    none. The devices are free again when the runs end."""
    trainer = tmp_path / "holding-trainer"
    trainer.write_text(HOLDING_TRAINER.format(python=sys.executable, end_file=END_FILE))
    trainer.chmod(0o755)
    s = worker_settings(
        tmp_path, gpus=("0", "1"), device_lock_dir=tmp_path / "locks", poll_interval=POLL, python=str(trainer)
    )
    config = job_config(max_steps=3, save_interval=100, val_check_interval=100)
    first, second, third = (create_job(factory, config, tmp_path / f"run{i}", num_gpus=1) for i in range(3))
    cpu = create_job(factory, config, tmp_path / "run_cpu", num_gpus=0)
    for name in ("run0", "run1", "run_cpu"):  # these trainers run until the test has looked at them
        (tmp_path / name).mkdir()
        (tmp_path / name / "hold").touch()
    runs = [Background(first, s, factory), Background(second, s, factory)]
    for i in range(2):
        wait_for(lambda i=i: (tmp_path / f"run{i}" / "trainer.pid").exists(), 60, "both trainers")
    seen = {trainer_env(tmp_path / f"run{i}")["CUDA_VISIBLE_DEVICES"] for i in range(2)}
    assert seen == {"0", "1"}
    assert {job_row(factory, j).devices.rsplit(":", 1)[1] for j in (first, second)} == {"0", "1"}
    before = job_row(factory, third).queued_at
    waiting = run_job(third, s, factory)
    assert waiting["outcome"] == "waiting_for_devices" and job_row(factory, third).status == "queued"
    assert before is None or job_row(factory, third).queued_at > before  # offered again: the sweep leaves it
    cpu_run = Background(cpu, s, factory)
    wait_for(lambda: (tmp_path / "run_cpu" / "trainer.pid").exists(), 60, "the CPU job's trainer")
    assert trainer_env(tmp_path / "run_cpu")["CUDA_VISIBLE_DEVICES"] == ""
    for name in ("run0", "run1", "run_cpu"):
        (tmp_path / name / "hold").unlink()
    for run in (*runs, cpu_run):
        assert run.join()["outcome"] == "succeeded"
    assert job_row(factory, first).devices is None  # released with the run
    assert run_job(third, s, factory)["outcome"] == "succeeded"


def test_a_job_needing_more_gpus_than_the_worker_has_says_so_once(factory, tmp_path):
    """Offered to a worker with two devices again and again, a three-GPU job stays queued and its user reads why,
    once; a job merely waiting for busy devices says nothing (that is queueing)."""
    s = worker_settings(tmp_path, gpus=("0", "1"), device_lock_dir=tmp_path / "locks")
    job_id = create_job(factory, {}, num_gpus=3)
    for _ in range(3):
        assert run_job(job_id, s, factory)["outcome"] == "waiting_for_devices"
    messages = [m for m in log_messages(factory, job_id) if "GPU" in m]
    assert len(messages) == 1 and "needs 3 GPU(s)" in messages[0] and "waits for another" in messages[0]
    assert "has 2 (ALIGNER_WORKER_GPUS)" in messages[0]
    assert job_row(factory, job_id).status == "queued"
