"""PPO jobs in the worker: the critic server a job needs is started (a real `aligner serve-critic` on a tiny reward
model), its URL handed to the trainer in job.yaml, and stopped however the job ends: success, failure, cancel, the
worker stopping mid-job; a server left by a lost worker is killed; a server that does not start fails the job.

The trainer is a stand-in (Settings.python, the interpreter the worker runs `-m aligner.cli train` with, is a script
here): it checks that the critic URL answers /v2/health/ready, writes PPO metrics and ends as the test asks in the
file fake-trainer-mode beside it (succeed | fail | wait-for-cancel | hold: succeed once RUN_DIR/hold is gone), not in
an environment variable: the worker passes its trainers the minimal environment only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from aligner.run_layout import CRITIC_LOG, END_FILE
from tests.helpers.service import PgSchema, Service, create_job, job_row, wait_for
from webapp.db import Base, Event, Job, Metric, make_engine, make_session_factory, session_scope, transition
from worker.processes import group_members, kill_leftover_critic
from worker.recovery import requeue_stale_jobs
from worker.run_files import CRITIC_PID_FILE
from worker.runner import JobRun, run_job
from worker.settings import Settings

pytest.importorskip("pytriton")

FAKE_TRAINER = textwrap.dedent(
    """\
    #!{python}
    import json, os, pathlib, signal, sys, time, urllib.request
    import yaml

    args = sys.argv[1:]
    config = yaml.safe_load(pathlib.Path(args[args.index("--config") + 1]).read_text())
    run_dir = pathlib.Path(config["run_dir"])
    url = config["critic"]["server_url"]
    with urllib.request.urlopen(url + "/v2/health/ready", timeout=5) as response:
        ready = response.status
    critic = json.loads((run_dir / "critic.pid").read_text())
    report = {{"url": url, "ready": ready, "pgid": critic["pgid"], "resume": "--resume" in args, "args": args}}
    (run_dir / "fake_trainer.json").write_text(json.dumps(report))
    mode_file = pathlib.Path(sys.argv[0]).with_name("fake-trainer-mode")
    mode = mode_file.read_text() if mode_file.exists() else "succeed"
    first = 3 if "--resume" in args else 1
    last = config["trainer"]["max_steps"]

    def end(reason, n):  # how the run ended, as the real trainer says it
        record = {{"end": reason, "step": n, "total_steps": last, "message": ""}}
        (run_dir / "{end_file}").write_text(json.dumps(record))

    def step(n):
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({{"step": n, "train_rollouts/rewards": 0.1 * n, "train_rollouts/values": -0.1,
                                "train_optim/critic_loss": 1.0 / n, "train_optim/clip_fraction": 0.0,
                                "train_optim/entropy": 5.0}}) + "\\n")

    if mode == "fail":
        print("aligner train: error: the critic said no", file=sys.stderr)
        sys.exit(2)
    while mode == "hold" and (run_dir / "hold").exists():  # until the test lets it go
        time.sleep(0.05)
    if mode == "wait-for-cancel":
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        step(1)
        while not stop:
            time.sleep(0.05)
        (run_dir / "checkpoints" / "step_1").mkdir(parents=True)
        (run_dir / "checkpoints" / "step_1" / "trainer_state.pt").write_bytes(b"x")
        end("stopped", 1)
        sys.exit(0)
    for n in range(first, last + 1):
        step(n)
    (run_dir / "final_policy").mkdir()
    end("completed", last)
    """
)


@pytest.fixture
def factory(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'aligner.db'}")
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def fake_trainer(tmp_path) -> Path:
    path = tmp_path / "fake-python"
    path.write_text(FAKE_TRAINER.format(python=sys.executable, end_file=END_FILE))
    path.chmod(0o755)
    return path


def set_mode(fake_trainer: Path, mode: str) -> None:
    fake_trainer.with_name("fake-trainer-mode").write_text(mode)


@pytest.fixture
def ppo_config(job_config, reward_model_dir):
    def make(**critic):
        config = job_config(max_steps=4)
        config["algorithm"] = "ppo"
        config["critic"] = {"model_path": str(reward_model_dir), "server_overrides": ["num_threads=1"], **critic}
        return config

    return make


# s between SIGTERM and SIGKILL when a job's critic server is stopped. A PyTriton server takes 4 s or more to stop
# cleanly, so a stop ends with the SIGKILL to its group whatever grace a test could afford: the shortest wastes least.
STOP_GRACE = 0.5


def settings(tmp_path, fake_trainer, **kw) -> Settings:
    return Settings(
        database_url="unused", data_dir=tmp_path / "data", python=str(fake_trainer), poll_interval=0.1,
        critic_stop_grace=STOP_GRACE, **{"lease_timeout": 30.0, **kw},
    )  # fmt: skip


def messages(factory, job_id) -> list[str]:
    with session_scope(factory) as session:
        stmt = select(Event).where(Event.job_id == job_id, Event.kind == "log").order_by(Event.id)
        return [e.payload["message"] for e in session.scalars(stmt)]


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "fake_trainer.json").read_text())


def assert_critic_gone(run_dir: Path, pgid: int) -> None:
    assert group_members(pgid) == [], "a process of the critic server's group is still running"
    assert not (run_dir / CRITIC_PID_FILE).exists()


def release_when_logged(run_dir: Path, line: str) -> threading.Thread:
    """Let a holding fake trainer (mode `hold`, RUN_DIR/hold) go once the critic server's log has `line` (or after
    60 s without it: the test then fails on the log, not by hanging)."""

    def release() -> None:
        log = run_dir / CRITIC_LOG
        try:
            wait_for(lambda: log.exists() and line in log.read_text(errors="replace"), 60, f"{line!r} in {log}")
        finally:
            (run_dir / "hold").unlink(missing_ok=True)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


def test_a_ppo_job_gets_a_critic_server_that_stops_when_it_succeeds(factory, tmp_path, fake_trainer, ppo_config):
    run_dir = tmp_path / "run"
    job_id = create_job(factory, ppo_config(), run_dir)
    # The server says it is ready a moment after its models answer (which is what the worker waits for): the trainer
    # ends only then, so that the server is not stopped before it has written what its log is checked for below.
    set_mode(fake_trainer, "hold")
    run_dir.mkdir()
    (run_dir / "hold").touch()
    releaser = release_when_logged(run_dir, "critic server ready in")
    started = time.monotonic()
    result = run_job(job_id, settings(tmp_path, fake_trainer), factory)
    releaser.join()
    print(f"\nPPO job with its critic server: {time.monotonic() - started:.1f} s")
    assert result["outcome"] == "succeeded", result
    seen = report(run_dir)
    assert seen["ready"] == 200 and seen["url"].startswith("http://127.0.0.1:") and not seen["resume"]
    assert_critic_gone(run_dir, seen["pgid"])
    log = messages(factory, job_id)
    started_at = [m for m in log if m.startswith("critic server started at ")]
    # the event names the job's run folder, never its place on the server (webapp.db.service_redactor)
    assert started_at == [f"critic server started at {seen['url']} (log: <run folder>/{CRITIC_LOG})"]
    assert any(m.startswith(f"critic server at {seen['url']} stopped") for m in log)
    server_log = (run_dir / CRITIC_LOG).read_text()
    assert "Started HTTPService" in server_log
    assert "critic server ready in" in server_log and f"s: {seen['url']} (" in server_log  # 127.0.0.1 only
    with session_scope(factory) as session:
        names = set(session.scalars(select(Metric.name).where(Metric.job_id == job_id, Metric.step == 4)))
        # the stop is recorded before the final status, so a client following the events sees it
        kinds = [(e.kind, e.payload) for e in session.scalars(select(Event).where(Event.job_id == job_id))]
    assert {"train_optim/critic_loss", "train_rollouts/values", "train_optim/entropy"} <= names
    stop_index = next(i for i, (k, p) in enumerate(kinds) if k == "log" and "stopped" in p["message"])
    final_index = next(i for i, (k, p) in enumerate(kinds) if k == "status" and p["status"] == "succeeded")
    assert stop_index < final_index


@pytest.mark.slow
def test_the_critic_server_stops_when_the_trainer_fails(factory, tmp_path, fake_trainer, ppo_config):
    set_mode(fake_trainer, "fail")
    run_dir = tmp_path / "run"
    job_id = create_job(factory, ppo_config(), run_dir)
    result = run_job(job_id, settings(tmp_path, fake_trainer), factory)
    assert result["outcome"] == "failed"
    assert job_row(factory, job_id).error.startswith(
        "the trainer exited with status 2: aligner train: error: the critic"
    )
    assert_critic_gone(run_dir, report(run_dir)["pgid"])


@pytest.mark.slow
def test_the_critic_server_stops_when_the_job_is_cancelled(factory, tmp_path, fake_trainer, ppo_config):
    set_mode(fake_trainer, "wait-for-cancel")
    run_dir = tmp_path / "run"
    job_id = create_job(factory, ppo_config(), run_dir)

    def cancel():
        wait_for(lambda: (run_dir / "fake_trainer.json").exists(), 60, "the trainer to start")
        with session_scope(factory) as session:  # what the API's cancel does
            transition(session, session.get(Job, job_id), "cancelling", cancel_requested=True)

    canceller = threading.Thread(target=cancel)
    canceller.start()
    result = run_job(job_id, settings(tmp_path, fake_trainer), factory)
    canceller.join()
    assert result["outcome"] == "cancelled", result
    assert_critic_gone(run_dir, report(run_dir)["pgid"])
    assert any("stopped" in m for m in messages(factory, job_id))


@pytest.mark.slow
def test_a_stopped_worker_stops_the_critic_server(factory, tmp_path, fake_trainer, ppo_config, monkeypatch):
    """SystemExit / Ctrl-C in the worker mid-job: neither the trainer nor the critic server is left."""
    import worker.runner as runner

    set_mode(fake_trainer, "wait-for-cancel")
    run_dir = tmp_path / "run"
    job_id = create_job(factory, ppo_config(), run_dir)
    real_sleep = runner.time.sleep
    interrupted = []

    def sleep(seconds):  # time.sleep of every module: Ctrl-C once, in the worker's loop
        if not interrupted and (run_dir / "fake_trainer.json").exists():
            interrupted.append(1)
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(runner.time, "sleep", sleep)
    run = JobRun(job_id, settings(tmp_path, fake_trainer), factory)
    with pytest.raises(KeyboardInterrupt):
        run.run()
    monkeypatch.undo()
    assert run.proc.poll() is not None
    assert_critic_gone(run_dir, report(run_dir)["pgid"])
    assert job_row(factory, job_id).heartbeat_at is None  # released: the sweep re-queues it at once


@pytest.mark.slow
def test_a_requeued_job_kills_a_lost_workers_critic_and_restores_the_checkpoints_critic(
    factory, tmp_path, fake_trainer, ppo_config, reward_model_dir
):
    """A worker SIGKILLed mid-job leaves its critic server (and critic.pid); the job's next run kills it, starts a new
    server from the critic of the checkpoint it resumes from, and the trainer resumes."""
    from aligner.servers.critic_server import Critic, CriticServerConfig

    run_dir = tmp_path / "run"
    checkpoint = run_dir / "checkpoints" / "step_2"
    (checkpoint / "critic").mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"x")
    Critic(CriticServerConfig(model_path=str(reward_model_dir), device="cpu")).save(str(checkpoint / "critic"))
    stale = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "serve-critic", "--model", str(reward_model_dir)],
        start_new_session=True,
    )
    (run_dir / CRITIC_PID_FILE).write_text(json.dumps({"host": socket.gethostname(), "pgid": stale.pid}))
    job_id = create_job(factory, ppo_config(), run_dir)
    try:
        result = run_job(job_id, settings(tmp_path, fake_trainer), factory)
        assert stale.wait(timeout=5) == -signal.SIGKILL
    finally:
        if stale.poll() is None:
            os.killpg(stale.pid, signal.SIGKILL)
    assert result["outcome"] == "succeeded", result
    seen = report(run_dir)
    assert seen["resume"] and seen["ready"] == 200
    started = [m for m in messages(factory, job_id) if m.startswith("critic server started")]
    assert started and f"from <run folder>/{checkpoint.relative_to(run_dir) / 'critic'}" in started[0]
    assert_critic_gone(run_dir, seen["pgid"])


def test_a_critic_server_that_does_not_start_fails_the_job_naming_its_log(factory, tmp_path, fake_trainer, ppo_config):
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    run_dir = tmp_path / "run"
    job_id = create_job(factory, ppo_config(model_path=str(not_a_model)), run_dir)
    result = run_job(job_id, settings(tmp_path, fake_trainer), factory)
    assert result["outcome"] == "failed"
    error = job_row(factory, job_id).error
    first = error.splitlines()[0]
    assert first.startswith("cannot start the critic server: the critic server exited with status")
    assert f"<run folder>/{CRITIC_LOG}" in first and str(run_dir) not in error
    assert f"--- last lines of {CRITIC_LOG} ---" in error
    assert not (run_dir / "fake_trainer.json").exists() and not (run_dir / CRITIC_PID_FILE).exists()


# The operator's own critic server, as far as the stand-in trainer looks at it: HTTP 200 on /v2/health/ready. The
# worker never talks to a server it did not start, so a real one (seconds of PyTriton start-up) would add nothing.
EXTERNAL_SERVER = """\
import http.server, sys

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.end_headers()

server = http.server.HTTPServer(("127.0.0.1", 0), Ready)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_a_ppo_job_with_its_own_critic_server_url_gets_none_started(factory, tmp_path, fake_trainer, ppo_config):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", EXTERNAL_SERVER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        job_id = create_job(factory, ppo_config(server_url=url), run_dir)
        (run_dir).mkdir()
        (run_dir / CRITIC_PID_FILE).write_text(json.dumps({"host": "x", "pgid": proc.pid}))  # the fake reads it
        result = run_job(job_id, settings(tmp_path, fake_trainer), factory)
        assert result["outcome"] == "succeeded", result
        assert report(run_dir)["url"] == url and proc.poll() is None  # the external server is left alone
        assert not any("critic server" in m for m in messages(factory, job_id))
        assert not (run_dir / CRITIC_LOG).exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_real_tiny_ppo_job_runs_end_to_end(factory, tmp_path, ppo_config):
    """The real PPO trainer (aligner/trainers/ppo.py) through run_job: the worker's critic server serves and trains
    the critic, PPO's metrics reach SQL, the server is gone at the end."""
    pytest.importorskip("aligner.trainers.ppo")
    run_dir = tmp_path / "run"
    config = ppo_config()
    config["critic"]["server_overrides"] = ["lr=1e-3", "num_threads=1"]
    config["trainer"].update(max_steps=2, save_interval=2, val_check_interval=2)
    job_id = create_job(factory, config, run_dir)
    started = time.monotonic()
    s = Settings(database_url="unused", data_dir=tmp_path / "data", critic_stop_grace=STOP_GRACE, poll_interval=0.1)
    result = run_job(job_id, s, factory)
    print(f"\nreal 2-step PPO job: {time.monotonic() - started:.1f} s")
    assert result["outcome"] == "succeeded", result
    job = job_row(factory, job_id)
    assert (job.status, job.step, job.error) == ("succeeded", 2, None)
    with session_scope(factory) as session:
        names = set(session.scalars(select(Metric.name).where(Metric.job_id == job_id, Metric.step == 2)))
    assert {
        "train_rollouts/rewards", "train_rollouts/values", "train_optim/critic_loss", "train_optim/clip_fraction",
        "train_optim/entropy", "timers/critic_infer", "timers/critic_train", "val/rewards",
    } <= names  # fmt: skip
    started_at = [m for m in messages(factory, job_id) if m.startswith("critic server started at ")]
    url = started_at[0].split()[4]
    assert yaml.safe_load((run_dir / "job.yaml").read_text())["critic"]["server_url"] == url
    assert (run_dir / "checkpoints" / "step_000002" / "critic").exists()
    assert not (run_dir / CRITIC_PID_FILE).exists()
    assert "serve-critic" not in "".join(_cmdline_of_all())


def _cmdline_of_all() -> list[str]:
    """Command lines of this host's processes that mention this test's critic (none should be left)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "critic_rm" in line and "serve-critic" in line:
                out.append(line)
    return out


def _sleeper(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *args], start_new_session=True)


def test_the_recovery_sweep_kills_a_lost_workers_critic_server_and_nothing_else(factory, tmp_path):
    import datetime as dt

    from webapp.db import utcnow

    stale, unrelated, elsewhere = (
        _sleeper("serve-critic", "--model", "rm"),
        _sleeper("other"),
        _sleeper("serve-critic"),
    )
    try:
        dirs = {name: tmp_path / name for name in ("lost", "unrelated", "elsewhere")}
        hosts = (socket.gethostname(), socket.gethostname(), "other-host")
        for folder, proc, host in zip(dirs.values(), (stale, unrelated, elsewhere), hosts, strict=True):
            folder.mkdir()
            (folder / CRITIC_PID_FILE).write_text(json.dumps({"host": host, "pgid": proc.pid}))
        old = utcnow() - dt.timedelta(seconds=120)
        job_id = create_job(factory, {}, dirs["lost"], status="running", worker="w:1:a", heartbeat_at=old, attempts=1)
        s = Settings(database_url="unused", data_dir=tmp_path / "data", lease_timeout=5.0)
        assert requeue_stale_jobs(s, factory, send=lambda _id: None) == [(job_id, "queued")]
        assert stale.wait(timeout=5) == -signal.SIGKILL and not (dirs["lost"] / CRITIC_PID_FILE).exists()
        assert not kill_leftover_critic(dirs["unrelated"]) and not kill_leftover_critic(dirs["elsewhere"])
        assert unrelated.poll() is None and elsewhere.poll() is None  # not a critic server; not this host's
    finally:
        for proc in (stale, unrelated, elsewhere):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.slow(25)
def test_a_sigkilled_celery_worker_leaves_a_critic_that_the_next_worker_kills(
    pg_available, redis_url, tmp_path, fake_trainer, ppo_config
):
    """Through the service: SIGKILL the Celery worker mid-job. Its trainer dies with it (PDEATHSIG) but its critic
    server stays; a new worker's sweep re-queues the job, the new run kills that server, starts its own, succeeds."""
    schema = PgSchema()
    set_mode(fake_trainer, "hold")
    env = {"ALIGNER_TRAINER_PYTHON": str(fake_trainer), "ALIGNER_CRITIC_STOP_GRACE": str(STOP_GRACE)}
    service = Service(schema, redis_url, tmp_path, **env)
    stale_pgid = None
    try:
        first = service.start_worker()
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "hold").touch()
        job_id = service.submit(ppo_config(), run_dir=run_dir)
        wait_for(lambda: (run_dir / "fake_trainer.json").exists(), 90, "the trainer to start")
        stale_pgid = report(run_dir)["pgid"]
        first.kill()
        assert group_members(stale_pgid), "the critic server died with the worker: nothing to test"
        (run_dir / "hold").unlink()
        service.start_worker()
        job = service.wait_final(job_id, timeout=120)
        assert job.status == "succeeded", job.error
        assert job.attempts == 2
        assert group_members(stale_pgid) == []
        second = report(run_dir)
        assert second["pgid"] != stale_pgid and second["ready"] == 200
        assert_critic_gone(run_dir, second["pgid"])
        started = [m for m in messages(service.factory, job_id) if m.startswith("critic server started at")]
        assert len(started) == 2
    finally:
        if stale_pgid and group_members(stale_pgid):
            os.killpg(stale_pgid, signal.SIGKILL)
        service.close()
        schema.drop()
