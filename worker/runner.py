"""Run one training job: take its lease, launch the trainer, follow it into SQL, and record how it ended.

`run_job(job_id)` is what the Celery task `aligner.run_job` does (worker/tasks.py); it runs as well without Celery:

1. Lease. One atomic `UPDATE jobs SET worker=<me>, heartbeat_at=now, attempts=attempts+1 WHERE id=... AND
   (status='queued' OR (status='running' AND heartbeat older than the lease timeout))`. No row updated: another
   worker holds a live lease (or the job is finished or cancelled); this copy stands down and writes nothing.
   A queued job becomes running (`webapp.db.transition`); a running job with a stale lease is taken over.
2. Prepare. The stored config is validated and written to RUN_DIR/job.yaml (run_dir forced to the job's, progress
   bar off). When RUN_DIR holds a complete checkpoint the trainer resumes from it (`--resume`): SQL rows and JSONL
   lines of later steps are dropped first, exactly as the trainer drops them, so nothing is ever counted twice.
3. Launch `python -m aligner.cli train --config RUN_DIR/job.yaml [--resume]` in its own process group (session),
   output appended to RUN_DIR/train.log. On Linux it gets SIGKILL if the worker process dies (PR_SET_PDEATHSIG).
4. Follow, every `poll_interval` (0.5 s): renew the heartbeat (only while this worker still owns the lease),
   ingest metrics, samples and checkpoints (worker/ingest.py), and honour a cancel: SIGTERM to the trainer's
   group (it stops at the next step boundary with a checkpoint), SIGKILL after `cancel_grace` seconds.
5. End: exit 0 -> succeeded; a cancel -> cancelled; non-zero -> failed with the trainer's error message and the
   tail of train.log. Whatever happens in the worker, the trainer's whole process group is killed on the way out.

`requeue_stale_jobs()` is the recovery sweep (run by the worker at start and then periodically, see
worker/celery_app.py): a running job whose heartbeat is older than the lease timeout lost its worker; it goes
back to queued and `aligner.run_job` is sent again, and the new run resumes from the last checkpoint.
A job that lost its worker `max_attempts` times fails instead; a lost job that was being cancelled is cancelled.

A job with `num_processes > 1` runs data-parallel under `torchrun --standalone` on this host (`trainer_command`,
aligner/distributed.py): the ranks split each step's prompts, rank 0 alone writes the run directory, so following
and resuming it is the same as for one process. A cancel's SIGTERM reaches torchrun, which passes it to the ranks
(they agree on the step to stop at); torchrun itself SIGKILLs ranks still alive after its shutdown timeout
(TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s by default), and ranks die with torchrun (PR_SET_PDEATHSIG).

A PPO job (`algorithm: ppo`) without `critic.server_url` gets a critic server from its worker, between steps 2 and 3:
`aligner serve-critic` (aligner/processes.py `launch_critic_server`) from `critic.model_path` with
`critic.server_overrides`, restoring the critic of the checkpoint the trainer resumes from
(`checkpoints/step_N/critic`), output in RUN_DIR/critic_server.log. The lease is renewed while it starts; its URL is
written into job.yaml's `critic.server_url`, and its process group id into RUN_DIR/critic.pid. It is stopped (SIGTERM
to its group, SIGKILL after `critic_stop_grace`) when the trainer has ended, before the job's final status is written,
and on every other way out of the run (worker error, SystemExit, lost lease). A server left by a SIGKILLed worker is
killed by the next run of the job on this host, or by a recovery sweep on this host (from critic.pid). A server that
does not start fails the job with an error naming its log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import and_, or_, select, update
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from aligner.errors import ServerStartError
from aligner.processes import die_with_parent
from aligner.run_layout import checkpoint_steps, critic_checkpoint
from aligner.servers.launch import launch_critic_server, stop_server
from webapp.db import (
    CANCELLED,
    CANCELLING,
    DEFAULT_DATA_DIR,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    Job,
    add_event,
    database_url,
    make_engine,
    make_session_factory,
    session_scope,
    transition,
    utcnow,
)
from worker.ingest import (
    METRICS_FILE,
    SAMPLES_FILE,
    RunIngestor,
    prune_after,
    truncate_jsonl_after,
)

log = logging.getLogger(__name__)

JOB_CONFIG_FILE = "job.yaml"
TRAIN_LOG_FILE = "train.log"
PID_FILE = "trainer.pid"
CRITIC_LOG_FILE = "critic_server.log"
CRITIC_PID_FILE = "critic.pid"
FINAL_POLICY_DIR = "final_policy"  # aligner.trainer.FINAL_POLICY_DIR
ERROR_TAIL_LINES = 30
ERROR_TAIL_CHARS = 4000


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


@dataclass(frozen=True)
class Settings:
    """Worker settings, from the environment (`Settings.from_env()`); the README's "Worker" section lists them."""

    database_url: str
    data_dir: Path = DEFAULT_DATA_DIR
    lease_timeout: float = 60.0  # s without a heartbeat after which a job's worker counts as lost
    poll_interval: float = 0.5  # s between two looks at the run directory (and heartbeats)
    cancel_grace: float = 60.0  # s the trainer gets after SIGTERM to finish its step and checkpoint
    sweep_interval: float = 15.0  # s between two recovery sweeps in a worker
    max_attempts: int = 3  # a job whose worker is lost this many times fails
    python: str = field(default_factory=lambda: sys.executable)  # interpreter that runs the trainer
    critic_start_timeout: float = 300.0  # s a PPO job's critic server gets to become ready
    # s between SIGTERM and SIGKILL when the critic server is stopped. Short: the trainer has saved the critic with
    # each checkpoint (critic_save) before it ends, and a PyTriton server takes 15-30 s to shut down cleanly.
    critic_stop_grace: float = 5.0

    @classmethod
    def from_env(cls) -> Settings:
        data_dir = Path(os.environ.get("ALIGNER_DATA_DIR") or DEFAULT_DATA_DIR)
        return cls(
            database_url=database_url(data_dir),
            data_dir=data_dir,
            lease_timeout=_env_float("ALIGNER_LEASE_TIMEOUT", 60.0),
            poll_interval=_env_float("ALIGNER_POLL_INTERVAL", 0.5),
            cancel_grace=_env_float("ALIGNER_CANCEL_GRACE", 60.0),
            sweep_interval=_env_float("ALIGNER_SWEEP_INTERVAL", 15.0),
            max_attempts=int(_env_float("ALIGNER_MAX_ATTEMPTS", 3)),
            python=os.environ.get("ALIGNER_TRAINER_PYTHON") or sys.executable,
            critic_start_timeout=_env_float("ALIGNER_CRITIC_START_TIMEOUT", 300.0),
            critic_stop_grace=_env_float("ALIGNER_CRITIC_STOP_GRACE", 5.0),
        )


_factories: dict[tuple[int, str], sessionmaker[Session]] = {}


def session_factory(url: str) -> sessionmaker[Session]:
    """One engine per process and URL: a forked pool process never reuses its parent's connections."""
    key = (os.getpid(), url)
    if key not in _factories:
        _factories[key] = make_session_factory(make_engine(url))
    return _factories[key]


def lease_owner() -> str:
    """Who holds a lease: host, process and a token unique to this run of the task."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _transient(err: BaseException) -> bool:
    """A lost or refused database connection: worth retrying at the next tick."""
    return isinstance(err, OperationalError) or (isinstance(err, DBAPIError) and err.connection_invalidated)


# ------------------------------------------------------------------------------------------------- commands
def trainer_command(config_path: Path, resume: bool, num_processes: int = 1, python: str | None = None) -> list[str]:
    """`python -m aligner.cli train --config job.yaml [--resume]`, or its `torchrun` form for several processes.

    `python -m torch.distributed.run` is `torchrun` run by the same interpreter (same virtualenv).
    """
    python = python or sys.executable
    args = ["-m", "aligner.cli", "train", "--config", str(config_path)] + (["--resume"] if resume else [])
    if num_processes > 1:
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(num_processes), *args]
    return [python, *args]


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("no permission to signal process group %d", pgid)
        return False


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not kill_group(pgid, 0):
            return True
        time.sleep(0.05)
    return False


def kill_leftover_trainer(run_dir: Path) -> None:
    """Kill a trainer that a lost worker on this host left running in `run_dir` (from its trainer.pid file).

    Linux's PDEATHSIG normally kills it with its worker; this also covers other platforms' leftovers only when
    /proc shows the process is still that trainer (never an unrelated process that reused the id).
    """
    path = run_dir / PID_FILE
    try:
        info = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int):
        return
    if str(run_dir / JOB_CONFIG_FILE) not in _cmdline(pid):  # "" when the process is gone
        return
    log.warning("killing trainer process group %d left running in %s by a lost worker", pid, run_dir)
    kill_group(pid, signal.SIGKILL)
    _wait_group_gone(pid, 10.0)


def _group_members(pgid: int) -> list[int]:
    """Live processes of this host in process group `pgid` (from /proc; zombies, dead already, are left out)."""
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(proc.name))
    return members


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_leftover_critic(run_dir: Path) -> bool:
    """Kill a critic server that a lost worker on this host left running for `run_dir` (from its critic.pid file).

    Only a process group that still is that server is killed: its leader runs `serve-critic`, or (the leader gone)
    a member runs Triton. True when one was killed.
    """
    path = Path(run_dir) / CRITIC_PID_FILE
    try:
        info = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return False
    pgid = info.get("pgid")
    if info.get("host") != socket.gethostname() or not isinstance(pgid, int) or pgid <= 1:
        return False
    killed = False
    members = _group_members(pgid)
    leader = _cmdline(pgid) if pgid in members else ""
    if ("serve-critic" in leader) or (not leader and any("triton" in _cmdline(pid) for pid in members)):
        log.warning("killing critic server process group %d left running for %s by a lost worker", pgid, run_dir)
        kill_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        killed = True
    with contextlib.suppress(OSError):
        path.unlink()
    return killed


# ------------------------------------------------------------------------------------------------- messages
def read_tail(path: Path, start: int = 0, lines: int = ERROR_TAIL_LINES, chars: int = ERROR_TAIL_CHARS) -> str:
    """The last `lines` lines (at most `chars` characters) of a file from byte offset `start`."""
    try:
        with path.open("rb") as f:
            f.seek(max(start, path.stat().st_size - 64 * 1024, 0))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    text = text.replace("\x00", "\ufffd").replace("\r", "\n")  # PostgreSQL text refuses NUL
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return tail[-chars:]


def failure_message(returncode: int, tail: str) -> str:
    """A first line saying why (the trainer's own error message when it printed one), then the log's tail."""
    marker = "aligner train: error:"
    if marker in tail:
        reason = tail[tail.rindex(marker) :].strip()
    else:
        reason = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "no output")
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        head = f"the trainer was killed by signal {name}"
        if -returncode == signal.SIGKILL:
            head += " (out of memory?)"
        head += f"; last output: {reason}"
    else:
        head = f"the trainer exited with status {returncode}: {reason}"
    return f"{head}\n\n--- last lines of {TRAIN_LOG_FILE} ---\n{tail}"


# ------------------------------------------------------------------------------------------------- the lease
def _stale_before(settings: Settings) -> dt.datetime:
    return utcnow() - dt.timedelta(seconds=settings.lease_timeout)


def take_lease(session: Session, job_id: int, owner: str, settings: Settings) -> bool:
    """The atomic UPDATE of step 1; True when this worker now holds the job's lease (not yet committed)."""
    result = session.execute(
        update(Job)
        .where(
            Job.id == job_id,
            or_(
                Job.status == QUEUED,
                and_(
                    Job.status == RUNNING,
                    or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < _stale_before(settings)),
                ),
            ),
        )
        .values(worker=owner, heartbeat_at=utcnow(), attempts=Job.attempts + 1)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def renew_lease(session: Session, job_id: int, owner: str) -> Job | None:
    """Heartbeat; returns the job (fresh from the database) while this worker owns it, else None."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker == owner, Job.status.in_((RUNNING, CANCELLING)))
        .values(heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        return None
    return session.get(Job, job_id, populate_existing=True)


# ------------------------------------------------------------------------------------------------- a run
@dataclass
class CriticPlan:
    """The critic server a PPO job needs from its worker (no `critic.server_url` in its config)."""

    model_path: str
    overrides: list[str]
    checkpoint: Path | None


@dataclass
class Launch:
    run_dir: Path
    config_path: Path
    command: list[str]
    resume_step: int | None
    config: dict[str, Any] = field(default_factory=dict)  # what job.yaml holds
    critic: CriticPlan | None = None


class JobRun:
    def __init__(self, job_id: int, settings: Settings, factory: sessionmaker[Session], owner: str | None = None):
        self.job_id, self.settings, self.factory = job_id, settings, factory
        self.owner = owner or lease_owner()
        self.proc: subprocess.Popen | None = None
        self.critic_proc: subprocess.Popen | None = None
        self.critic_url: str | None = None

    def result(self, outcome: str, **extra: Any) -> dict[str, Any]:
        return {"job_id": self.job_id, "outcome": outcome, "worker": self.owner, **extra}

    # ----------------------------------------------------------------------------------------------- start
    def start(self) -> tuple[Launch | None, dict[str, Any] | None]:
        """Lease and prepare in one transaction: (launch, None), or (None, result) when there is nothing to run."""
        with session_scope(self.factory) as session:
            if not take_lease(session, self.job_id, self.owner, self.settings):
                session.rollback()
                return None, self.result("stood_down", reason="another worker holds a live lease, or not runnable")
            job = session.get(Job, self.job_id, populate_existing=True)
            if job.cancel_requested and job.status == QUEUED:
                transition(session, job, CANCELLED)
                return None, self.result(CANCELLED, reason="cancelled before it started")
            if job.status == QUEUED:
                transition(session, job, RUNNING)
            else:
                add_event(
                    session, job.id, "log", {"message": f"worker {self.owner} takes over the job from a lost worker"}
                )
            try:
                launch = self._prepare(session, job)
            except (ValueError, OSError) as err:  # a bad stored config, an unusable run directory
                transition(session, job, FAILED, error=f"cannot start the job: {err}")
                return None, self.result(FAILED, error=job.error)
            where = f"checkpoint step {launch.resume_step}" if launch.resume_step is not None else "the beginning"
            add_event(
                session,
                job.id,
                "log",
                {
                    "message": f"attempt {job.attempts} on {self.owner}: training from {where}",
                    "command": launch.command,
                },
            )
        return launch, None

    def _prepare(self, session: Session, job: Job) -> Launch:
        from aligner.config import config_from_dict

        settings = self.settings
        run_dir = Path(job.run_dir or settings.data_dir / "runs" / f"job_{job.id}").expanduser().resolve()
        data = dict(job.config or {})
        data["run_dir"] = str(run_dir)
        data["trainer"] = {**(data.get("trainer") or {}), "progress_bar": False}  # train.log is no terminal
        config = config_from_dict(data, settings.data_dir)  # a ConfigError (ValueError) names the bad field
        run_dir.mkdir(parents=True, exist_ok=True)
        kill_leftover_trainer(run_dir)
        kill_leftover_critic(run_dir)
        config_path = run_dir / JOB_CONFIG_FILE
        resolved = config.model_dump(mode="json")
        config_path.write_text(yaml.safe_dump(resolved, sort_keys=False))
        checkpoints = checkpoint_steps(run_dir)
        resume_step = max(checkpoints) if checkpoints else None
        critic = None
        critic_section = resolved.get("critic") or {}
        if resolved.get("algorithm", "reinforce") == "ppo" and not critic_section.get("server_url"):
            if not critic_section.get("model_path"):
                raise ValueError("critic.model_path: a PPO job without critic.server_url needs the critic's model")
            critic = CriticPlan(
                model_path=str(critic_section["model_path"]),
                overrides=[str(item) for item in critic_section.get("server_overrides") or []],
                checkpoint=critic_checkpoint(run_dir, resume_step) if resume_step is not None else None,
            )
        # What the trainer will write again is dropped now: rows after the checkpoint, lines after it.
        prune_after(session, job.id, resume_step)
        for name in (METRICS_FILE, SAMPLES_FILE):
            truncate_jsonl_after(run_dir / name, resume_step)
        job.run_dir, job.max_steps = str(run_dir), config.trainer.max_steps
        command = trainer_command(config_path, resume_step is not None, job.num_processes, settings.python)
        return Launch(run_dir, config_path, command, resume_step, resolved, critic)

    # ----------------------------------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        launch, done = self.start()
        if launch is None:
            log.info("job %d: %s", self.job_id, done)
            return done
        log_path = launch.run_dir / TRAIN_LOG_FILE
        pid_path = launch.run_dir / PID_FILE
        try:
            if launch.critic is not None:
                stopped = self._start_critic(launch)
                if stopped is not None:
                    return stopped
            with log_path.open("ab") as out:
                out.write(f"\n=== {utcnow().isoformat()} worker {self.owner}: {' '.join(launch.command)}\n".encode())
                out.flush()
                log_start = out.tell()
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                self.proc = subprocess.Popen(
                    launch.command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # its own process group: signals reach the trainer and its children
                    preexec_fn=die_with_parent,
                )
            pid_path.write_text(json.dumps({"host": socket.gethostname(), "pid": self.proc.pid, "worker": self.owner}))
            log.info("job %d: trainer pid %d: %s", self.job_id, self.proc.pid, " ".join(launch.command))
            return self._follow(launch, log_path, log_start)
        except BaseException as err:
            self._fail_best_effort(err)
            raise
        finally:
            try:
                if self.proc is not None:
                    kill_group(self.proc.pid, signal.SIGKILL)  # no trainer (or child of it) outlives its run
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=10)
                with contextlib.suppress(OSError):
                    pid_path.unlink()
            finally:
                self._stop_critic(launch.run_dir, record=False)  # no critic server outlives its run either

    # ----------------------------------------------------------------------------------------------- critic
    def _start_critic(self, launch: Launch) -> dict[str, Any] | None:
        """Start the PPO job's critic server and write its URL into job.yaml; None when the trainer may start,
        else the run's result (failed: the server did not start; cancelled meanwhile; lease lost).

        The server starts in this (main) thread; a helper thread renews the lease meanwhile."""
        plan = launch.critic
        log_path = launch.run_dir / CRITIC_LOG_FILE
        error = None
        with self._heartbeats() as state:
            try:
                self.critic_proc, self.critic_url = launch_critic_server(
                    plan.model_path,
                    log_path,
                    checkpoint=plan.checkpoint,
                    overrides=plan.overrides,
                    timeout_s=self.settings.critic_start_timeout,
                )
            except ServerStartError as err:
                error = err
        if self.critic_proc is not None:
            info = {"host": socket.gethostname(), "pgid": self.critic_proc.pid, "url": self.critic_url}
            (launch.run_dir / CRITIC_PID_FILE).write_text(json.dumps({**info, "worker": self.owner}))
        if state["lost"]:
            self._stop_critic(launch.run_dir, record=False)
            return self._lost_lease()
        with session_scope(self.factory) as session:
            job = session.get(Job, self.job_id, populate_existing=True)
            if job is None or job.worker != self.owner or job.status not in (RUNNING, CANCELLING):
                session.rollback()
                self._stop_critic(launch.run_dir, record=False)
                return self._lost_lease()
            if error is not None:
                tail = read_tail(log_path, lines=15, chars=2000)
                message = f"cannot start the critic server: {error}"
                transition(session, job, FAILED, error=f"{message}\n\n--- last lines of {CRITIC_LOG_FILE} ---\n{tail}")
                return self.result(FAILED, error=job.error)
            where = f" from {plan.checkpoint}" if plan.checkpoint else ""
            add_event(
                session,
                job.id,
                "log",
                {"message": f"critic server started at {self.critic_url}{where} (log: {log_path})"},
            )
            if job.cancel_requested or job.status == CANCELLING:
                transition(session, job, CANCELLED, error=None)
                add_event(session, job.id, "log", {"message": "cancelled before the trainer started"})
                cancelled = self.result(CANCELLED)
            else:
                cancelled = None
        if cancelled is not None:
            self._stop_critic(launch.run_dir)
            return cancelled
        config = {**launch.config, "critic": {**(launch.config.get("critic") or {}), "server_url": self.critic_url}}
        launch.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        log.info("job %d: critic server pid %d at %s", self.job_id, self.critic_proc.pid, self.critic_url)
        return None

    @contextlib.contextmanager
    def _heartbeats(self):
        """Renew the lease from a helper thread while the main thread waits on the critic server (start, stop);
        yields {"lost": the lease was lost, "cancel": a cancel was requested}."""
        state = {"lost": False, "cancel": False}
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.settings.poll_interval):
                try:
                    with session_scope(self.factory) as session:
                        job = renew_lease(session, self.job_id, self.owner)
                        if job is None:
                            state["lost"] = True
                            return
                        state["cancel"] = job.cancel_requested or job.status == CANCELLING
                except Exception as err:  # a database hiccup: the next beat tries again
                    log.warning("job %d: heartbeat failed: %s", self.job_id, err)

        thread = threading.Thread(target=beat, name=f"job-{self.job_id}-heartbeat", daemon=True)
        thread.start()
        try:
            yield state
        finally:
            done.set()
            thread.join()

    def _stop_critic(self, run_dir: Path, record: bool = True) -> None:
        """Stop the critic server this run started (its whole process group). `record`: the job is still this run's
        (the trainer has ended normally): its lease is renewed meanwhile and the stop is said in the events; else
        (an error, a lost lease, a released lease) nothing is written."""
        proc, self.critic_proc = self.critic_proc, None
        if proc is None:
            return
        try:
            with self._heartbeats() if record else contextlib.nullcontext():
                stop_server(proc, grace_s=self.settings.critic_stop_grace)
                _wait_group_gone(proc.pid, 10.0)  # the leader is reaped; its group's other processes die with it
        finally:
            with contextlib.suppress(OSError):
                (run_dir / CRITIC_PID_FILE).unlink()
        log.info("job %d: critic server at %s stopped (exit status %s)", self.job_id, self.critic_url, proc.returncode)
        if record:
            try:
                with session_scope(self.factory) as session:
                    message = f"critic server at {self.critic_url} stopped (exit status {proc.returncode})"
                    add_event(session, self.job_id, "log", {"message": message})
            except Exception as err:
                log.warning("job %d: could not record the critic server's stop: %s", self.job_id, err)

    def _follow(self, launch: Launch, log_path: Path, log_start: int) -> dict[str, Any]:
        settings, proc = self.settings, self.proc
        with session_scope(self.factory) as session:
            ingestor = RunIngestor(session, self.job_id, launch.run_dir)
        last_renewal = time.monotonic()
        cancel_at: float | None = None
        killed = False
        returncode = None
        ingested_after_exit = False
        while True:
            returncode = proc.poll()  # read before ingesting: lines written before the exit are in this tick
            snapshot = ingestor.snapshot()
            try:
                with session_scope(self.factory) as session:
                    job = renew_lease(session, self.job_id, self.owner)
                    if job is None:
                        return self._lost_lease()
                    ingestor.poll(session, final=returncode is not None)
                    cancel = job.cancel_requested or job.status == CANCELLING
                    if cancel and cancel_at is None and returncode is None:
                        cancel_at = time.monotonic()
                        kill_group(proc.pid, signal.SIGTERM)
                        add_event(
                            session,
                            self.job_id,
                            "log",
                            {"message": "cancel requested: the trainer stops at the next step boundary (checkpoint)"},
                        )
                last_renewal = time.monotonic()
                ingested_after_exit = returncode is not None
            except Exception as err:
                ingestor.restore(snapshot)
                if not _transient(err):
                    raise
                log.warning("job %d: database unavailable (%s); retrying", self.job_id, err)
                # Fencing: a worker that cannot renew its lease must stop before another may take the job over.
                if time.monotonic() - last_renewal > 0.8 * settings.lease_timeout:
                    kill_group(proc.pid, signal.SIGKILL)
                    raise
            if ingested_after_exit:  # the trainer has exited and its last lines are in SQL
                break
            if cancel_at is not None and not killed and time.monotonic() - cancel_at > settings.cancel_grace:
                log.warning(
                    "job %d: trainer still alive %.0f s after SIGTERM: SIGKILL", self.job_id, settings.cancel_grace
                )
                killed = kill_group(proc.pid, signal.SIGKILL)
            time.sleep(settings.poll_interval)
        self._stop_critic(launch.run_dir)  # the trainer has ended: its critic server goes before the final status
        return self._finish(launch, returncode, cancel_at is not None, killed, read_tail(log_path, log_start))

    def _finish(self, launch: Launch, returncode: int, cancelled: bool, killed: bool, tail: str) -> dict[str, Any]:
        with session_scope(self.factory) as session:
            job = session.get(Job, self.job_id, populate_existing=True)
            if job is None or job.worker != self.owner or job.status not in (RUNNING, CANCELLING):
                return self._lost_lease()
            cancelled = cancelled or job.cancel_requested or job.status == CANCELLING
            completed = returncode == 0 and job.step >= job.max_steps and (launch.run_dir / FINAL_POLICY_DIR).is_dir()
            if completed:
                transition(session, job, SUCCEEDED, error=None)
            elif cancelled:
                checkpoints = checkpoint_steps(launch.run_dir)
                note = (
                    f"stopped at step {max(checkpoints)} (checkpoint)"
                    if checkpoints
                    else "stopped before a checkpoint"
                )
                if killed:
                    note += f"; killed {self.settings.cancel_grace:.0f} s after SIGTERM"
                transition(session, job, CANCELLED, error=None)
                add_event(session, job.id, "log", {"message": f"cancelled: {note}"})
            elif returncode == 0:
                transition(
                    session,
                    job,
                    FAILED,
                    error=f"the trainer stopped at step {job.step} of {job.max_steps} without a cancel (was it sent "
                    f"SIGTERM from outside?); resume the job to continue\n\n--- last lines of {TRAIN_LOG_FILE} ---\n"
                    f"{tail}",
                )
            else:
                transition(session, job, FAILED, error=failure_message(returncode, tail))
            status, error = job.status, job.error
        log.info("job %d: %s (trainer exit status %s)", self.job_id, status, returncode)
        return self.result(status, returncode=returncode, error=error)

    def _lost_lease(self) -> dict[str, Any]:
        """Another worker took the job over (or it was deleted): stop the trainer, write nothing."""
        log.warning("job %d: lease lost to another worker; stopping this copy of the trainer", self.job_id)
        if self.proc is not None:
            kill_group(self.proc.pid, signal.SIGKILL)
        return self.result("lease_lost")

    def _fail_best_effort(self, err: BaseException) -> None:
        """A worker-side error: the trainer is killed; then the job is marked failed when the error is the worker's
        own, or its lease released (heartbeat cleared, so the sweep re-queues it at once) when the worker process is
        being stopped (SystemExit, KeyboardInterrupt). While the database is away nothing can be written: the lease
        goes stale and the task retry or the sweep resumes the job from its last checkpoint."""
        if self.proc is not None:
            kill_group(self.proc.pid, signal.SIGKILL)
        if _transient(err):
            return
        try:
            with session_scope(self.factory) as session:
                job = session.get(Job, self.job_id, populate_existing=True)
                if job is None or job.worker != self.owner or job.status not in (RUNNING, CANCELLING):
                    return
                if isinstance(err, Exception):
                    transition(session, job, FAILED, error=f"worker error: {type(err).__name__}: {err}")
                else:
                    job.heartbeat_at = None
                    add_event(
                        session, job.id, "log", {"message": f"worker {self.owner} stopped ({type(err).__name__})"}
                    )
        except Exception:
            log.exception("job %d: could not record the worker error", self.job_id)


def run_job(job_id: int, settings: Settings | None = None, factory: sessionmaker[Session] | None = None) -> dict:
    """Run job `job_id` to its end (or stand down); returns {"job_id", "outcome", ...}."""
    settings = settings or Settings.from_env()
    factory = factory or session_factory(settings.database_url)
    return JobRun(int(job_id), settings, factory).run()


# ------------------------------------------------------------------------------------------------- recovery
def requeue_stale_jobs(
    settings: Settings | None = None,
    factory: sessionmaker[Session] | None = None,
    *,
    send: Callable[[int], Any],
) -> list[tuple[int, str]]:
    """Recover jobs whose worker was lost (heartbeat older than the lease timeout): [(job id, new status)].

    running -> queued and `send(job_id)` (the worker passes its `enqueue_job`); after `max_attempts`
    starts -> failed; cancelling -> cancelled. Each job is claimed with a conditional UPDATE, so concurrent sweeps
    of several workers recover it once. The task is sent before the commit: if the commit fails, the task finds
    the stale lease and takes the job over anyway.
    """
    settings = settings or Settings.from_env()
    factory = factory or session_factory(settings.database_url)
    stale = or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < _stale_before(settings))
    with session_scope(factory) as session:
        candidates = list(session.scalars(select(Job.id).where(Job.status.in_((RUNNING, CANCELLING)), stale)))
    recovered = []
    for job_id in candidates:
        with session_scope(factory) as session:
            claimed = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_((RUNNING, CANCELLING)), stale)
                .values(heartbeat_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            if claimed.rowcount != 1:
                continue
            job = session.get(Job, job_id, populate_existing=True)
            if job.run_dir:  # a PPO job's critic server that its lost worker on this host left running
                kill_leftover_critic(Path(job.run_dir))
            lost = f"worker {job.worker} lost (no heartbeat for over {settings.lease_timeout:g} s)"
            if job.status == CANCELLING or job.cancel_requested:
                transition(session, job, CANCELLED, worker=None)
                add_event(session, job_id, "log", {"message": f"{lost}; the job was being cancelled: cancelled"})
            elif job.attempts >= settings.max_attempts:
                transition(
                    session,
                    job,
                    FAILED,
                    worker=None,
                    error=f"{lost} after {job.attempts} attempts (ALIGNER_MAX_ATTEMPTS={settings.max_attempts}); "
                    "resume the job to try again",
                )
            else:
                transition(session, job, QUEUED, worker=None)
                add_event(session, job_id, "log", {"message": f"{lost}; re-queued to resume from its last checkpoint"})
                send(job_id)
            recovered.append((job_id, job.status))
            log.warning("job %d: %s -> %s", job_id, lost, job.status)
    return recovered
