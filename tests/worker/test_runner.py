"""The job runner without Celery: lease, stand-down, recovery sweep, commands, messages, and a whole tiny job."""

from __future__ import annotations

import datetime as dt
import json
import socket
import sys

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from aligner.run_layout import (
    CHECKPOINT_DIR,
    CRITIC_LOG,
    END_FILE,
    METRICS_FILE,
    STATE_FILE,
    RunEnd,
    checkpoint_steps,
    write_end,
)
from aligner.trainers.run_log import read_jsonl
from tests.helpers.checkpoints import FILES, tear, write_checkpoint
from tests.helpers.service import create_job, job_row, worker_settings
from webapp.db import Checkpoint, Event, Job, Metric, Sample, session_scope, utcnow
from worker import runner
from worker.lease import take_lease
from worker.recovery import requeue_stale_jobs
from worker.runner import JobRun, failure_message, run_job, trainer_command


def n_events(factory, job_id) -> int:
    with session_scope(factory) as session:
        return session.scalar(select(func.count()).select_from(Event).where(Event.job_id == job_id))


def set_fields(factory, job_id, **fields) -> None:
    with session_scope(factory) as session:
        job = session.get(Job, job_id)
        for k, v in fields.items():
            setattr(job, k, v)


def test_lease_is_taken_once_until_it_goes_stale(factory, tmp_path):
    s = worker_settings(tmp_path)
    job_id = create_job(factory, {})
    with session_scope(factory) as session:
        assert take_lease(session, job_id, "a", s)  # queued
        session.get(Job, job_id).status = "running"
    with session_scope(factory) as session:
        assert not take_lease(session, job_id, "b", s)  # running, live heartbeat
    set_fields(factory, job_id, heartbeat_at=utcnow() - dt.timedelta(seconds=10))
    with session_scope(factory) as session:
        assert take_lease(session, job_id, "b", s)  # running, stale: taken over
    assert (job_row(factory, job_id).worker, job_row(factory, job_id).attempts) == ("b", 2)
    set_fields(factory, job_id, status="succeeded", heartbeat_at=utcnow() - dt.timedelta(seconds=10))
    with session_scope(factory) as session:
        assert not take_lease(session, job_id, "c", s)  # finished


def test_a_second_copy_stands_down_without_touching_anything(factory, tmp_path):
    job_id = create_job(factory, {}, status="running", worker="other:1:x", heartbeat_at=utcnow(), attempts=1)
    before = job_row(factory, job_id)
    events = n_events(factory, job_id)
    result = run_job(job_id, worker_settings(tmp_path), factory)
    assert result["outcome"] == "stood_down"
    after = job_row(factory, job_id)
    assert (after.status, after.worker, after.heartbeat_at, after.attempts) == (
        before.status, before.worker, before.heartbeat_at, before.attempts
    )  # fmt: skip
    assert n_events(factory, job_id) == events


def test_a_job_cancelled_while_queued_never_starts(factory, tmp_path):
    job_id = create_job(factory, {}, cancel_requested=True)
    assert run_job(job_id, worker_settings(tmp_path), factory)["outcome"] == "cancelled"
    assert job_row(factory, job_id).status == "cancelled"
    assert not (tmp_path / "data").exists()


def test_a_bad_config_fails_naming_the_field(factory, tmp_path, job_config):
    job_id = create_job(factory, job_config(optim={"lr": -1}), tmp_path / "run")
    assert run_job(job_id, worker_settings(tmp_path), factory)["outcome"] == "failed"
    job = job_row(factory, job_id)
    assert job.status == "failed" and "optim.lr" in job.error and not (tmp_path / "run" / "train.log").exists()


def test_a_job_without_a_run_dir_gets_the_data_folders_runs_job_id(factory, tmp_path, monkeypatch):
    given = []

    def refuse(session, job, data_dir, run_dir):
        given.append(run_dir)
        raise ValueError("refused here")

    monkeypatch.setattr(runner, "launch_config", refuse)
    job_id = create_job(factory, {})
    assert run_job(job_id, worker_settings(tmp_path), factory)["outcome"] == "failed"
    assert given == [(tmp_path / "data" / "runs" / f"job_{job_id}").resolve()]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "fsdp"])
def test_a_two_process_job_runs_under_torchrun(tmp_path, job_config, backend):
    """num_processes=2: torchrun with 2 ranks (data parallel, or FSDP2 shards); rank 0's metrics and samples reach
    SQL once each; the final policy is a Hugging Face folder whatever the backend."""
    from webapp.db import Base, make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'aligner.db'}")
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    config = job_config(max_steps=2, model={"backend": backend})
    job_id = create_job(factory, config, tmp_path / "run", num_processes=2)
    result = run_job(job_id, worker_settings(tmp_path), factory)
    assert result["outcome"] == "succeeded", result
    job = job_row(factory, job_id)
    assert (job.status, job.step, job.attempts, job.error) == ("succeeded", 2, 1, None)
    with session_scope(factory) as session:
        steps = list(session.scalars(select(Metric.step).where(Metric.job_id == job_id, Metric.name == "val/rewards")))
        samples = session.scalar(select(func.count()).select_from(Sample).where(Sample.job_id == job_id))
    assert sorted(steps) == [0, 2] and samples == 6 * 2 + 8 * 2  # validation at 0 and 2 (6 prompts); 8 a step
    log = (tmp_path / "run" / "train.log").read_text()
    assert "torch.distributed.run --standalone --nproc_per_node 2" in log and log.count("final policy:") == 1
    assert (tmp_path / "run" / "final_policy" / "config.json").is_file()
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "fsdp").is_dir() == (backend == "fsdp")
    engine.dispose()


def test_trainer_commands(tmp_path):
    config = tmp_path / "job.yaml"
    assert trainer_command(config, False) == [sys.executable, "-m", "aligner.cli", "train", "--config", str(config)]
    assert trainer_command(config, True, python="py")[-1] == "--resume"
    assert trainer_command(config, True, num_processes=4, python="py") == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
        "-m", "aligner.cli", "train", "--config", str(config), "--resume",
    ]  # fmt: skip


def test_failure_message_leads_with_the_trainers_error():
    tail = "loading...\naligner train: error: reward server http://127.0.0.1:9 cannot be reached (...)"
    message = failure_message(2, tail)
    assert message.startswith("the trainer exited with status 2: aligner train: error: reward server http://127.0")
    assert message.endswith(tail)
    assert failure_message(-9, "Traceback\nMemoryError").startswith(
        "the trainer was killed by signal SIGKILL (out of memory?); last output: MemoryError"
    )


def test_the_sweep_requeues_fails_or_cancels_lost_jobs(factory, tmp_path):
    old = utcnow() - dt.timedelta(seconds=60)
    lost = create_job(factory, {}, status="running", worker="w:1:a", heartbeat_at=old, attempts=1)
    live = create_job(factory, {}, status="running", worker="w:2:b", heartbeat_at=utcnow(), attempts=1)
    exhausted = create_job(factory, {}, status="running", worker="w:3:c", heartbeat_at=old, attempts=3)
    cancelling = create_job(factory, {}, status="cancelling", worker="w:4:d", heartbeat_at=old, attempts=1)
    sent = []
    s = worker_settings(tmp_path, max_attempts=3)
    recovered = requeue_stale_jobs(s, factory, send=sent.append)
    assert sorted(recovered) == [(lost, "queued"), (exhausted, "failed"), (cancelling, "cancelled")]
    assert sent == [lost]
    assert job_row(factory, live).status == "running"
    assert "after 3 attempts" in job_row(factory, exhausted).error
    assert requeue_stale_jobs(s, factory, send=sent.append) == [] and sent == [lost]  # recovered once


class FlakyFactory:
    """Sessions whose commit fails (as when the database goes away) for calls `first`..`last` of the factory."""

    def __init__(self, factory, first: int, last: int):
        self.factory, self.first, self.last, self.calls, self.failures = factory, first, last, 0, 0

    def __call__(self):
        session = self.factory()
        self.calls += 1
        if self.first <= self.calls <= self.last:

            def commit():
                self.failures += 1
                raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))

            session.commit = commit
        return session


def test_a_tiny_job_runs_in_process_on_sqlite(tmp_path, job_config):
    """The whole runner without Celery: SQLite's upserts, metrics and samples of every step, success; a database
    that fails for a few ticks mid-run loses nothing (the reading position is rolled back with the transaction)."""
    from webapp.db import Base, make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'aligner.db'}")
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    job_id = create_job(factory, job_config(max_steps=3), tmp_path / "run")
    flaky = FlakyFactory(factory, first=4, last=8)  # 1: lease, 2: ingestor, 3...: ticks of 0.5 s
    result = run_job(job_id, worker_settings(tmp_path), flaky)
    assert result["outcome"] == "succeeded", result
    assert flaky.failures == 5
    job = job_row(factory, job_id)
    assert (job.status, job.step, job.max_steps, job.attempts, job.error) == ("succeeded", 3, 3, 1, None)
    with session_scope(factory) as session:
        steps = set(session.scalars(select(Metric.step).where(Metric.job_id == job_id)))
        samples = session.scalar(select(func.count()).select_from(Sample).where(Sample.job_id == job_id))
    assert steps == {0, 1, 2, 3} and samples == 6 * 3 + 8 * 3  # validation at 0, 2, 3 (6 prompts); 8 a step
    assert (tmp_path / "run" / "job.yaml").is_file() and (tmp_path / "run" / "final_policy").is_dir()
    assert not (tmp_path / "run" / "trainer.pid").exists()
    engine.dispose()


def test_a_stopped_worker_kills_its_trainer_and_releases_the_lease(factory, tmp_path, job_config, monkeypatch):
    """SystemExit or Ctrl-C in the worker mid-run: no trainer is left, and the sweep re-queues the job at once."""
    import worker.runner as runner

    job_id = create_job(factory, job_config(max_steps=500, save_interval=1000), tmp_path / "run")
    ticks = []
    real_sleep = runner.time.sleep

    def sleep(seconds):
        ticks.append(seconds)
        if len(ticks) == 3:
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(runner.time, "sleep", sleep)
    run = runner.JobRun(job_id, worker_settings(tmp_path), factory)
    with pytest.raises(KeyboardInterrupt):
        run.run()
    monkeypatch.undo()
    assert run.proc.poll() is not None and not (tmp_path / "run" / "trainer.pid").exists()
    job = job_row(factory, job_id)
    assert (job.status, job.heartbeat_at) == ("running", None)
    sent = []
    assert requeue_stale_jobs(worker_settings(tmp_path), factory, send=sent.append) == [(job_id, "queued")]
    assert sent == [job_id]


def test_the_trainer_gets_none_of_the_workers_credentials(tmp_path, job_config, monkeypatch):
    """The worker's database and broker URLs (with their passwords) stay in the worker: the trainer's reward
    function fails the run if it can see either of them."""
    from webapp.db import Base, make_engine, make_session_factory

    monkeypatch.setenv("ALIGNER_DATABASE_URL", "postgresql://aligner:db-secret@127.0.0.1:5432/aligner")
    monkeypatch.setenv("ALIGNER_BROKER_URL", "redis://:broker-secret@127.0.0.1:6379/0")
    engine = make_engine(f"sqlite:///{tmp_path / 'aligner.db'}")
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    config = job_config(max_steps=1, save_interval=1, val_check_interval=1)
    config["reward"] = {"function": "tests.helpers.rewards:confined_letter_reward"}
    job_id = create_job(factory, config, tmp_path / "run")
    result = run_job(job_id, worker_settings(tmp_path), factory)
    assert result["outcome"] == "succeeded", result
    engine.dispose()


def test_a_critic_override_a_job_may_not_set_fails_it_at_launch(factory, tmp_path, job_config):
    """A job row holding `host=0.0.0.0` (the API refuses it; the worker checks again) starts no critic server."""
    config = job_config(max_steps=1)
    config["algorithm"] = "ppo"
    (tmp_path / "critic_rm").mkdir()  # a catalogue folder that exists: the override alone is refused
    config["critic"] = {"model_path": str(tmp_path / "critic_rm"), "server_overrides": ["lr=1e-3", "host=0.0.0.0"]}
    job_id = create_job(factory, config, tmp_path / "run")
    assert run_job(job_id, worker_settings(tmp_path), factory)["outcome"] == "failed"
    error = job_row(factory, job_id).error
    assert error.startswith("cannot start the job: the job's config is refused at launch: ")
    assert "config.critic.server_overrides" in error
    assert "'host' cannot be set by a job; allowed: " in error and "config.critic.model" not in error
    assert not (tmp_path / "run" / CRITIC_LOG).exists()


def test_a_torn_newest_checkpoint_is_skipped_and_what_follows_the_one_before_is_pruned(factory, tmp_path, job_config):
    """RUN_DIR holds a good step 2 and a torn step 4: the job resumes from 2 with a warning event, step 4 is set
    aside, and the metric rows and lines of steps 3 and 4 are dropped, as the trainer drops them."""
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, 2)
    tear(write_checkpoint(run_dir, 4) / STATE_FILE)
    (run_dir / METRICS_FILE).write_text("".join(json.dumps({"step": s, "r": 1.0}) + "\n" for s in range(5)))
    job_id = create_job(factory, job_config(), run_dir, step=4)  # a job resumed after 4 steps
    with session_scope(factory) as session:
        session.add_all(Metric(job_id=job_id, step=s, name="r", value=1.0) for s in range(5))
        session.add_all(Checkpoint(job_id=job_id, step=s, path=str(run_dir / f"step_{s}")) for s in (2, 4))

    launch, done = JobRun(job_id, worker_settings(tmp_path), factory).start()
    assert done is None and launch.resume_step == 2 and launch.command[-1] == "--resume"
    assert set(checkpoint_steps(run_dir)) == {2} and (run_dir / CHECKPOINT_DIR / "step_000004.damaged").is_dir()
    with session_scope(factory) as session:
        assert sorted(session.scalars(select(Metric.step).where(Metric.job_id == job_id))) == [0, 1, 2]
        assert list(session.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id))) == [2]
        events = select(Event).where(Event.job_id == job_id, Event.kind == "log").order_by(Event.id)
        logs = [e.payload for e in session.scalars(events)]
    assert job_row(factory, job_id).step == 2
    assert [r["step"] for r in read_jsonl(run_dir / METRICS_FILE)] == [0, 1, 2]
    size = len(FILES[STATE_FILE])
    assert logs[0] == {
        "message": f"checkpoint step 4 is damaged ({STATE_FILE}: {size // 2} bytes, manifest says {size}): "
        "resuming from step 2",
        "level": "warning",
        "step": 4,
    }
    # In plain words: the try's number and the machine, not the lease's host:pid:token.
    host = socket.gethostname()
    assert logs[1]["message"] == f"started (try 1) on machine {host}: training from checkpoint step 2"


# A trainer that logs a KL of 2 a step (50 ms each) and, told SIGTERM, stops at the step boundary with a checkpoint;
# it says how its run ended in end.json, as the real one does. With SCRIPT in the run folder it only does what that
# says: write `record` as its end record (unless None), then exit with `status` (a negative one: killed by a signal).
SCRIPT = "scripted_end.json"
FAKE_TRAINER = """#!{python}
import json, os, pathlib, signal, sys, time
import yaml

args = sys.argv[1:]
config = yaml.safe_load(pathlib.Path(args[args.index("--config") + 1]).read_text())
run_dir, last = pathlib.Path(config["run_dir"]), config["trainer"]["max_steps"]
last = min(last, config["trainer"].get("max_epochs") or last)  # here: an epoch is a step
out_of_time = config["trainer"].get("max_time")  # here: the step after which the time is up

def end(reason, n, message=""):
    record = {{"end": reason, "step": n, "total_steps": last, "message": message}}
    (run_dir / "{end_file}").write_text(json.dumps(record))

if (run_dir / "{script}").exists():
    script = json.loads((run_dir / "{script}").read_text())
    if script["record"] is not None:
        (run_dir / "{end_file}").write_text(json.dumps(script["record"]))
    print("aligner train: error: from the log", file=sys.stderr)
    if script["status"] < 0:
        os.kill(os.getpid(), -script["status"])
    sys.exit(script["status"])
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
saved = [int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*")]
for n in range(max(saved) + 1 if "--resume" in args else 1, last + 1):
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({{"step": n, "train_rollouts/init_policy_kl": 2.0, "train_optim/loss": 0.1}}) + "\\n")
    time.sleep(0.05)
    if out_of_time == n:
        stop.append(1)
    if stop or n == last:
        (run_dir / "checkpoints" / f"step_{{n:06d}}").mkdir(parents=True)
        (run_dir / "checkpoints" / f"step_{{n:06d}}" / "trainer_state.pt").write_bytes(b"x")
        if stop:
            end("max_time" if out_of_time == n else "stopped", n, "time is up" if out_of_time == n else "")
            sys.exit(0)
(run_dir / "final_policy").mkdir()
end("completed", last)
"""


def fake_trainer_worker(tmp_path):
    """(engine, session factory, worker settings) of a SQLite database in `tmp_path` and a worker whose "python"
    runs FAKE_TRAINER."""
    from webapp.db import Base, make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'aligner.db'}")
    Base.metadata.create_all(engine)
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_TRAINER.format(python=sys.executable, end_file=END_FILE, script=SCRIPT))
    fake.chmod(0o755)
    return engine, make_session_factory(engine), worker_settings(tmp_path, python=str(fake), poll_interval=0.1)


def test_a_pause_on_alarm_pauses_the_job_at_a_checkpoint_and_resume_does_not_pause_it_again(tmp_path, job_config):
    """An alarm in health.pause_on stops the trainer at the step boundary with a checkpoint, as a cancel does, and
    the job ends paused; resumed, it runs to the end: the alarm still fires, and one episode pauses the job once."""
    from webapp.db import QUEUED, transition

    engine, factory, s = fake_trainer_worker(tmp_path)
    health = {"pause_on": ["kl_growth"], "window": 2, "min_points": 2}  # a KL of 2 passes kl_max (1) at step 2
    job_id = create_job(factory, job_config(max_steps=30, health=health), tmp_path / "run")

    outcome = run_job(job_id, s, factory)
    assert outcome["outcome"] == "paused", outcome
    job = job_row(factory, job_id)
    assert (job.status, job.alarms, job.error) == ("paused", ["kl_growth"], None)
    assert 2 <= job.step < 30 and list(checkpoint_steps(tmp_path / "run")) == [job.step]
    with session_scope(factory) as session:
        events = session.execute(select(Event.kind, Event.payload).where(Event.job_id == job_id).order_by(Event.id))
        events = [(kind, payload) for kind, payload in events]
    [firing] = [payload for kind, payload in events if kind == "health"]
    assert (firing["alarm"], firing["state"], firing["step"], firing["paused"]) == ("kl_growth", "firing", 2, True)
    assert events[-2][1]["status"] == "paused"
    assert events[-1][1]["message"] == (
        f"paused by alarm kl_growth (health.pause_on): stopped at checkpoint step {job.step}; resume the job to "
        "continue"
    )

    with session_scope(factory) as session:  # what POST /jobs/{id}/resume does
        transition(session, session.get(Job, job_id), QUEUED, attempts=0, worker=None, heartbeat_at=None)
    assert run_job(job_id, s, factory)["outcome"] == "succeeded"
    job = job_row(factory, job_id)
    assert (job.status, job.step, job.alarms) == ("succeeded", 30, ["kl_growth"])
    engine.dispose()


def test_a_run_that_ends_at_max_epochs_succeeds_and_one_stopped_at_max_time_is_paused(tmp_path, job_config):
    """trainer.max_epochs ends a run before max_steps with its final policy: a success; trainer.max_time stops it
    cleanly at a checkpoint (exit status 0, no final policy): paused, to be resumed, not failed."""
    engine, factory, s = fake_trainer_worker(tmp_path)

    epochs = create_job(factory, job_config(max_steps=30, trainer={"max_epochs": 3}), tmp_path / "epochs")
    assert run_job(epochs, s, factory)["outcome"] == "succeeded"
    assert (job_row(factory, epochs).status, job_row(factory, epochs).step) == ("succeeded", 3)

    timed = create_job(factory, job_config(max_steps=30, trainer={"max_time": 2}), tmp_path / "timed")
    assert run_job(timed, s, factory)["outcome"] == "paused"
    job = job_row(factory, timed)
    assert (job.status, job.step, job.error) == ("paused", 2, None)
    with session_scope(factory) as session:
        last = session.scalars(select(Event).where(Event.job_id == timed).order_by(Event.id.desc())).first()
        assert last.payload["stop"] == "max_time" and "time is up" in last.payload["message"]
    engine.dispose()


END_OF = {
    "completed": RunEnd("completed", 30, 30, "completed step 30 of 30"),
    "max_time": RunEnd("max_time", 3, 30, "time limit trainer.max_time (60 s) reached after step 3"),
    "stopped": RunEnd("stopped", 3, 30, "stopped at step 3 of 30 on request; continue with --resume"),
    "server_unavailable": RunEnd("server_unavailable", 3, 30, "reward server http://rm:8000 cannot be reached"),
    "failed": RunEnd("failed", 3, 30, "RuntimeError: the step broke"),
}


@pytest.mark.parametrize(
    ("record", "status", "outcome", "said"),
    [
        ("completed", 0, "succeeded", None),
        ("completed", 1, "succeeded", None),  # the run's outputs are complete; what failed after does not undo them
        ("max_time", 0, "paused", None),
        ("stopped", 0, "failed", "the trainer stopped at step 3 of 30 without a cancel (was it sent SIGTERM"),
        ("server_unavailable", 2, "failed", "the trainer exited with status 2: reward server http://rm:8000 cannot"),
        ("failed", 1, "failed", "the trainer exited with status 1: RuntimeError: the step broke"),
        (None, 2, "failed", "the trainer exited with status 2: aligner train: error: from the log"),
        (None, 0, "failed", "the trainer exited with status 0: no end record (end.json): how its run ended is"),
        (None, -9, "queued", None),  # killed outright (the OOM killer): another attempt, as before
    ],
)
def test_the_job_ends_as_the_trainers_end_record_says(tmp_path, job_config, record, status, outcome, said):
    """The worker reads how the run ended from end.json; a stale record of an earlier launch is removed before the
    trainer starts, so a launch that dies without writing one is a crash, whatever the last launch said."""
    engine, factory, s = fake_trainer_worker(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_end(run_dir, END_OF["completed"])  # an earlier launch's
    script = {"record": None if record is None else vars(END_OF[record]), "status": status}
    (run_dir / SCRIPT).write_text(json.dumps(script))
    job_id = create_job(factory, job_config(max_steps=30), run_dir)
    result = run_job(job_id, s, factory)
    job = job_row(factory, job_id)
    assert (result["outcome"], job.status) == (outcome, outcome), job.error
    if said is None:
        assert job.error is None
    else:
        assert job.error.startswith(said), job.error
    if record == "max_time":
        with session_scope(factory) as session:
            last = session.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id.desc())).first()
        assert last.payload == {
            "message": f"paused: {END_OF['max_time'].message}; resume the job to continue (trainer.max_time counts "
            "per launch)",
            "stop": "max_time",
        }
    engine.dispose()


def test_a_failed_jobs_error_and_events_hold_no_server_url_password_or_path(tmp_path, job_config):
    """The last line before a user (webapp.db.service_redactor): what the trainer said, which names what it was
    given, is stored with the catalogue's names in place of its URLs and the run folder."""
    from aligner.redact import redact_url
    from webapp.db import ServerEndpoint

    engine, factory, s = fake_trainer_worker(tmp_path)
    url = "http://alice:pa55word-xyz@127.0.0.1:9"
    with session_scope(factory) as session:
        session.add(ServerEndpoint(name="rm-secret", kind="reward", url=url, model_name="reward_model"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    said = f"reward server {redact_url(url)} cannot be reached (from {url}); see {run_dir.resolve()}/train.log"
    record = RunEnd("server_unavailable", 3, 30, said)
    (run_dir / SCRIPT).write_text(json.dumps({"record": vars(record), "status": 2}))
    job_id = create_job(factory, job_config(max_steps=30), run_dir)
    run_job(job_id, s, factory)
    job = job_row(factory, job_id)
    with session_scope(factory) as session:
        events = json.dumps([e.payload for e in session.scalars(select(Event).where(Event.job_id == job_id))])
    assert job.status == "failed"
    assert job.error.startswith(
        "the trainer exited with status 2: reward server <server rm-secret> cannot be reached (from <server "
        "rm-secret>); see <run folder>/train.log"
    ), job.error
    for text in (job.error, events):
        assert "pa55word" not in text and "127.0.0.1:9" not in text and str(run_dir.resolve()) not in text
    engine.dispose()


@pytest.mark.slow(40)  # eight trainer starts (their imports: ~5 s of CPU each): 34 s on two idle cores
def test_a_job_of_each_reinforce_preset_succeeds_with_the_presets_knobs(tmp_path, job_config):
    """Issue 32: a service job of every reinforce.algorithm preset runs to success through the runner (the real
    trainer, one step each, so the suite pays a trainer start per preset and little more), and its stored resolved
    config shows the preset's knobs."""
    from concurrent.futures import ThreadPoolExecutor

    from aligner.config import ALGORITHM_PRESETS, load_yaml
    from webapp.db import Base, make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'aligner.db'}")
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    jobs = {}
    for preset in ALGORITHM_PRESETS:
        config = job_config(max_steps=1, save_interval=1, val_check_interval=1, trainer={"num_val_prompts": 2})
        config["reinforce"] = {**config["reinforce"], "algorithm": preset}
        del config["reinforce"]["baseline"]  # the fixture's own choice would override the preset's
        jobs[preset] = create_job(factory, config, tmp_path / preset)
    settings = worker_settings(tmp_path, poll_interval=0.1)
    with ThreadPoolExecutor(2) as pool:  # two trainers at once: one starts while the other trains
        outcomes = dict(zip(jobs, pool.map(lambda job_id: run_job(job_id, settings, factory), jobs.values())))
    for preset, job_id in jobs.items():
        job = job_row(factory, job_id)
        assert (outcomes[preset]["outcome"], job.status, job.step, job.error) == ("succeeded", "succeeded", 1, None)
        assert job.config["reinforce"]["algorithm"] == preset
        # The config the trainer resolved and saved beside the run: what it ran.
        resolved = load_yaml((tmp_path / preset / "config.yaml").read_text())["reinforce"]
        assert resolved["algorithm"] == preset
        assert {knob: resolved[knob] for knob in ALGORITHM_PRESETS[preset]} == ALGORITHM_PRESETS[preset], preset
        assert (tmp_path / preset / "final_policy").is_dir()
    engine.dispose()
