"""Run one training job: take its lease, launch the trainer, follow it into SQL, and record how it ended.

`run_job(job_id)` is what the Celery task `aligner.run_job` does (worker/tasks.py); it runs as well without Celery.
The contract, step by step, is docs/service.md "The worker"; what survives crashes and restarts, docs/reliability.md:
- Only the copy that takes the job's lease (worker/lease.py) writes anything; another stands down.
- The stored config is checked again (`webapp.job_config.launch_config`) before it becomes RUN_DIR/job.yaml; the
  trainer resumes from the newest intact checkpoint, SQL rows and JSONL lines of later steps dropped first.
- The trainer runs in its own process group with `aligner.processes.minimal_env()`, dies with the worker, and its
  whole group is killed on the way out, whatever happens.
- The job's final status follows the trainer's end record (`aligner.run_layout.RunEnd`); without one, the exit.
- A PPO job without `critic.server_url` gets a critic server (worker/critic.py) for the length of its run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from aligner.errors import ServerStartError
from aligner.health import Alarm
from aligner.processes import die_with_parent, minimal_env, signal_group
from aligner.run_layout import (
    COMPLETED,
    CRITIC_LOG,
    END_FILE,
    EVENTS_FILE,
    MAX_TIME,
    METRICS_FILE,
    SAMPLES_FILE,
    STOPPED,
    checkpoint_steps,
    clear_end,
    damaged_message,
    read_end,
    resume_checkpoint,
)
from aligner.trainers.run_log import truncate_after
from webapp.db import (
    CANCELLED,
    CANCELLING,
    FAILED,
    PAUSED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    Event,
    Job,
    TransitionConflict,
    add_event,
    run_dir_for,
    session_scope,
    transition,
    utcnow,
)
from webapp.job_config import launch_config
from worker.critic import CriticPlan, CriticServer, critic_plan
from worker.devices import DeviceLease, acquire_devices
from worker.ingest import RunIngestor, prune_after
from worker.lease import holds_lease, lease_owner, renew_lease, renewing_lease, runnable, take_lease
from worker.processes import kill_group, kill_leftover_critic, kill_leftover_trainer
from worker.run_files import JOB_CONFIG_FILE, TRAIN_LOG_FILE, TRAINER_PID_FILE
from worker.settings import Settings, session_factory
from worker.shutdown import handing_back_on_sigterm, stop_requested

log = logging.getLogger(__name__)

ERROR_TAIL_LINES = 30
ERROR_TAIL_CHARS = 4000


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


def failure_message(returncode: int, tail: str, reason: str | None = None) -> str:
    """A first line saying why (`reason`, the trainer's end record's; else its own error message when it printed
    one), then the log's tail."""
    marker = "aligner train: error:"
    if not reason and marker in tail:
        reason = tail[tail.rindex(marker) :].strip()
    elif not reason:
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


def starting_point(step: int | None) -> str:
    """Where a run of the job starts, in words: "checkpoint step N", or "the beginning" without a checkpoint."""
    return "the beginning" if step is None else f"checkpoint step {step}"


# ------------------------------------------------------------------------------------------------- a run
@dataclass
class Launch:
    """What a run of the job starts: the trainer's command and, for a PPO job, its critic server."""

    run_dir: Path
    config_path: Path
    command: list[str]
    resume_step: int | None
    config: dict[str, Any] = field(default_factory=dict)  # what job.yaml holds
    critic: CriticPlan | None = None


class JobRun:
    """One run of one job by this worker, `owner` of its lease while it runs (the steps of this module's docstring)."""

    def __init__(
        self,
        job_id: int,
        settings: Settings,
        factory: sessionmaker[Session],
        owner: str | None = None,
        send: Callable[[int], Any] | None = None,
    ):
        self.job_id, self.settings, self.factory = job_id, settings, factory
        self.owner = owner or lease_owner()
        self.send = send  # hands a job back to the broker (the Celery task passes `enqueue_job`)
        self.proc: subprocess.Popen | None = None
        self.critic: CriticServer | None = None  # the critic server this run started, until it is stopped
        self.devices = DeviceLease()  # the GPUs this run holds, until it ends
        self.handing_back = False  # the worker is stopping: the job goes back to the queue when the trainer stops
        self.pausing: Alarm | None = None  # the health alarm that stops the trainer: the job ends paused

    def result(self, outcome: str, **extra: Any) -> dict[str, Any]:
        return {"job_id": self.job_id, "outcome": outcome, "worker": self.owner, **extra}

    # ----------------------------------------------------------------------------------------------- start
    def start(self) -> tuple[Launch | None, dict[str, Any] | None]:
        """Devices, then lease and prepare in one transaction: (launch, None), or (None, result) when there is
        nothing to run here now (the devices are released then)."""
        stood_down = self.result("stood_down", reason="another worker holds a live lease, or not runnable")
        with session_scope(self.factory) as session:
            num_gpus = session.scalar(select(Job.num_gpus).where(Job.id == self.job_id, runnable(self.settings)))
        if num_gpus is None:
            return None, stood_down
        devices = acquire_devices(self.settings.gpus, num_gpus, self.settings.device_lock_dir)
        if devices is None:
            with session_scope(self.factory) as session:  # its message is alive (offered again): no sweep resends it
                offered = update(Job).where(Job.id == self.job_id, Job.status == QUEUED).values(queued_at=utcnow())
                session.execute(offered)
                if num_gpus > len(self.settings.gpus):  # never here: the user learns why the job waits
                    here = f"worker {socket.gethostname()} has {len(self.settings.gpus)} (ALIGNER_WORKER_GPUS)"
                    self._say_once(session, f"the job needs {num_gpus} GPU(s) and {here}: it waits for another")
            return None, self.result("waiting_for_devices", num_gpus=num_gpus, devices=list(self.settings.gpus))
        self.devices = devices
        try:
            launch, result = self._lease_and_prepare()
        except TransitionConflict:  # the job changed under us (a cancel): the next message or sweep sees it anew
            launch, result = None, stood_down
        except BaseException:
            self.devices.release()
            raise
        if launch is None:
            self.devices.release()
        return launch, result

    def _say_once(self, session: Session, message: str) -> None:
        """A warning event, unless it is already the job's newest log event (a job offered again and again)."""
        newest = session.scalar(
            select(Event.payload).where(Event.job_id == self.job_id, Event.kind == "log").order_by(Event.id.desc())
        )
        if not newest or newest.get("message") != message:
            add_event(session, self.job_id, "log", {"message": message, "level": "warning"})

    def _lease_and_prepare(self) -> tuple[Launch | None, dict[str, Any] | None]:
        with session_scope(self.factory) as session:
            if not take_lease(session, self.job_id, self.owner, self.settings):
                session.rollback()
                return None, self.result("stood_down", reason="another worker holds a live lease")
            job = session.get(Job, self.job_id, populate_existing=True)
            job.devices = self.devices.describe()
            if job.cancel_requested and job.status == QUEUED:
                transition(session, job, CANCELLED, devices=None)
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
                transition(session, job, FAILED, error=f"cannot start the job: {err}", devices=None)
                return None, self.result(FAILED, error=job.error)
            where = starting_point(launch.resume_step)
            on = f" with GPU {self.devices.visible_devices}" if self.devices.devices else ""
            host = self.owner.split(":", 1)[0]  # lease_owner(): host:pid:token
            add_event(
                session,
                job.id,
                "log",
                {
                    # In a newcomer's words: the try's number and the machine (its host), not the lease's token.
                    "message": f"started (try {job.attempts}) on machine {host}{on}: training from {where}",
                    "command": launch.command,
                },
            )
        return launch, None

    def _prepare(self, session: Session, job: Job) -> Launch:
        settings = self.settings
        run_dir = Path(job.run_dir or run_dir_for(settings.data_dir, job.id)).expanduser().resolve()
        # The stored config names catalogue entries: checked again, for the job's owner, as things are now (a
        # JobRefused, a ValueError, names each refused field).
        config = launch_config(session, job, settings.data_dir, run_dir)
        config.trainer.progress_bar = False  # train.log is no terminal
        run_dir.mkdir(parents=True, exist_ok=True)
        kill_leftover_trainer(run_dir)
        kill_leftover_critic(run_dir)
        config_path = run_dir / JOB_CONFIG_FILE
        resolved = config.model_dump(mode="json")
        config_path.write_text(yaml.safe_dump(resolved, sort_keys=False))
        # The trainer's own choice (newest intact checkpoint), made here first: what is pruned below must match it.
        resume_step, _, skipped = resume_checkpoint(run_dir)
        for step, reason in skipped:
            message = damaged_message(step, reason, resume_step)
            add_event(session, job.id, "log", {"message": message, "level": "warning", "step": step})
        critic = critic_plan(resolved, run_dir, resume_step)
        # What the trainer will write again is dropped now, as the trainer drops it when it starts (RunLog): rows
        # and lines after the checkpoint; all of them when it starts from the beginning. The files then only grow
        # while the ingestor follows them.
        prune_after(session, job.id, resume_step)
        for name in (METRICS_FILE, SAMPLES_FILE):
            if resume_step is None:
                (run_dir / name).unlink(missing_ok=True)
            else:
                truncate_after(run_dir / name, resume_step)
        (run_dir / EVENTS_FILE).unlink(missing_ok=True)  # relayed into SQL already: a launch's events start afresh
        clear_end(run_dir)  # the end record read after this launch is this launch's, or there is none
        job.run_dir, job.max_steps = str(run_dir), config.trainer.max_steps
        command = trainer_command(config_path, resume_step is not None, job.num_processes, settings.python)
        return Launch(run_dir, config_path, command, resume_step, resolved, critic)

    # ----------------------------------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        with handing_back_on_sigterm():
            return self._run()

    def _run(self) -> dict[str, Any]:
        launch, done = self.start()
        if launch is None:
            log.info("job %d: %s", self.job_id, done)
            return done
        log_path = launch.run_dir / TRAIN_LOG_FILE
        pid_path = launch.run_dir / TRAINER_PID_FILE
        try:
            if launch.critic is not None:
                stopped = self._start_critic(launch)
                if stopped is not None:
                    return stopped
            if stop_requested():
                return self._hand_back(launch, "the worker is stopping before the trainer started")
            with log_path.open("ab") as out:
                out.write(f"\n=== {utcnow().isoformat()} worker {self.owner}: {' '.join(launch.command)}\n".encode())
                out.flush()
                log_start = out.tell()
                self.proc = subprocess.Popen(
                    launch.command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=minimal_env(self._job_env()),  # none of the worker's credentials
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
                    signal_group(self.proc, signal.SIGKILL)  # no trainer (or child of it) outlives its run
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=10)
                with contextlib.suppress(OSError):
                    pid_path.unlink()
            finally:
                self._stop_critic(record=False)  # no critic server outlives its run either
                self.devices.release()

    def _job_env(self) -> dict[str, str]:
        """What the job's processes get beyond `minimal_env`: exactly the GPUs this run holds (none: the CPU)."""
        return {"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": self.devices.visible_devices}

    # ----------------------------------------------------------------------------------------------- critic
    def _start_critic(self, launch: Launch) -> dict[str, Any] | None:
        """Start the PPO job's critic server and write its URL into job.yaml; None when the trainer may start,
        else the run's result (failed: the server did not start; cancelled meanwhile; lease lost).

        The server starts in this (main) thread; a helper thread renews the lease meanwhile."""
        plan = launch.critic
        log_path = launch.run_dir / CRITIC_LOG
        error = None
        with self._renewing_lease() as lease:
            try:
                self.critic = CriticServer.start(
                    launch.run_dir, plan, self.settings.critic_start_timeout, self.owner, self._job_env()
                )
            except ServerStartError as err:
                error = err
        if lease["lost"]:
            self._stop_critic(record=False)
            return self._lost_lease()
        with session_scope(self.factory) as session:
            job = session.get(Job, self.job_id, populate_existing=True)
            if not holds_lease(job, self.owner):
                session.rollback()
                self._stop_critic(record=False)
                return self._lost_lease()
            if error is not None:
                tail = read_tail(log_path, lines=15, chars=2000)
                message = f"cannot start the critic server: {error}"
                transition(session, job, FAILED, error=f"{message}\n\n--- last lines of {CRITIC_LOG} ---\n{tail}")
                return self.result(FAILED, error=job.error)
            where = f" from {plan.checkpoint}" if plan.checkpoint else ""
            add_event(
                session,
                job.id,
                "log",
                {"message": f"critic server started at {self.critic.url}{where} (log: {log_path})"},
            )
            if job.cancel_requested or job.status == CANCELLING:
                transition(session, job, CANCELLED, error=None)
                add_event(session, job.id, "log", {"message": "cancelled before the trainer started"})
                cancelled = self.result(CANCELLED)
            else:
                cancelled = None
        if cancelled is not None:
            self._stop_critic()
            return cancelled
        config = {**launch.config, "critic": {**(launch.config.get("critic") or {}), "server_url": self.critic.url}}
        launch.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        log.info("job %d: critic server pid %d at %s", self.job_id, self.critic.proc.pid, self.critic.url)
        return None

    def _renewing_lease(self):
        return renewing_lease(self.factory, self.job_id, self.owner, self.settings.poll_interval)

    def _stop_critic(self, record: bool = True) -> None:
        """Stop the critic server this run started (its whole process group). `record`: the job is still this run's
        (the trainer has ended normally): its lease is renewed meanwhile and the stop is said in the events; else
        (an error, a lost lease, a released lease) nothing is written."""
        critic, self.critic = self.critic, None
        if critic is None:
            return
        with self._renewing_lease() if record else contextlib.nullcontext():
            returncode = critic.stop(self.settings.critic_stop_grace)
        log.info("job %d: critic server at %s stopped (exit status %s)", self.job_id, critic.url, returncode)
        if record:
            try:
                with session_scope(self.factory) as session:
                    message = f"critic server at {critic.url} stopped (exit status {returncode})"
                    add_event(session, self.job_id, "log", {"message": message})
            except Exception as err:
                log.warning("job %d: could not record the critic server's stop: %s", self.job_id, err)

    def _follow(self, launch: Launch, log_path: Path, log_start: int) -> dict[str, Any]:
        settings, proc = self.settings, self.proc
        with session_scope(self.factory) as session:
            ingestor = RunIngestor(session, self.job_id, launch.run_dir)
        last_renewal = time.monotonic()
        term_at: float | None = None  # when SIGTERM went to the trainer (a cancel, or this worker stopping)
        cancelled = killed = False
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
                    cancel = job.cancel_requested or job.status == CANCELLING
                    pausable = returncode is None and not (cancel or cancelled or self.handing_back)
                    pause = ingestor.poll(session, final=returncode is not None, pausable=pausable)["pause"]
                    if pause and self.pausing is None:
                        self.pausing = pause[0]
                        if term_at is None:
                            term_at = time.monotonic()
                            signal_group(proc, signal.SIGTERM)
                        message = (
                            f"alarm {self.pausing.name} fired at step {self.pausing.step} (health.pause_on): the "
                            "trainer stops at the next step boundary (checkpoint) and the job is paused"
                        )
                        add_event(session, self.job_id, "log", {"message": message, "alarm": self.pausing.name})
                    if returncode is None and not cancelled and (cancel or (stop_requested() and term_at is None)):
                        # a cancel overrides a hand-back under way: the job ends cancelled, not queued
                        cancelled, self.handing_back = cancel, not cancel
                        if term_at is None:
                            term_at = time.monotonic()
                            signal_group(proc, signal.SIGTERM)
                        message = (
                            "cancel requested: the trainer stops at the next step boundary (checkpoint)"
                            if cancel
                            else f"worker {self.owner} is stopping: the trainer stops at the next step boundary "
                            "(checkpoint) and the job goes back to the queue"
                        )
                        add_event(session, self.job_id, "log", {"message": message})
                last_renewal = time.monotonic()
                ingested_after_exit = returncode is not None
            except Exception as err:
                ingestor.restore(snapshot)
                if not _transient(err):
                    raise
                log.warning("job %d: database unavailable (%s); retrying", self.job_id, err)
                # Fencing: a worker that cannot renew its lease must stop before another may take the job over.
                if time.monotonic() - last_renewal > 0.8 * settings.lease_timeout:
                    signal_group(proc, signal.SIGKILL)
                    raise
            if ingested_after_exit:  # the trainer has exited and its last lines are in SQL
                break
            if term_at is not None and not killed and time.monotonic() - term_at > settings.cancel_grace:
                log.warning(
                    "job %d: trainer still alive %.0f s after SIGTERM: SIGKILL", self.job_id, settings.cancel_grace
                )
                killed = kill_group(proc.pid, signal.SIGKILL)
            time.sleep(settings.poll_interval)
        self._stop_critic()  # the trainer has ended: its critic server goes before the final status
        return self._finish(launch, returncode, killed, read_tail(log_path, log_start))

    def _finish(self, launch: Launch, returncode: int, killed: bool, tail: str) -> dict[str, Any]:
        """Record how the run ended; a cancel or a worker racing with this write makes it look again."""
        for _ in range(5):
            try:
                return self._record_end(launch, returncode, killed, tail)
            except TransitionConflict as err:
                log.info("job %d: %s; looking again", self.job_id, err)
        return self._record_end(launch, returncode, killed, tail)

    def _record_end(self, launch: Launch, returncode: int, killed: bool, tail: str) -> dict[str, Any]:
        settings = self.settings
        requeued = False
        with session_scope(self.factory) as session:
            job = session.get(Job, self.job_id, populate_existing=True)
            if not holds_lease(job, self.owner):
                return self._lost_lease()
            cancelled = job.cancel_requested or job.status == CANCELLING
            end = read_end(launch.run_dir)  # how the trainer says its run ended; None: it died without saying
            newest = max(checkpoint_steps(launch.run_dir), default=None)
            where = starting_point(newest)
            # How a stop the worker asked for (a cancel, a pause) ended, for its event.
            stopped = f"stopped at {where}" if newest is not None else "stopped before a checkpoint"
            if killed:
                stopped += f"; killed {settings.cancel_grace:.0f} s after SIGTERM"
            signalled = returncode < 0 and -returncode in signal.valid_signals()
            if end is not None and end.end == COMPLETED:
                transition(session, job, SUCCEEDED, error=None, devices=None)
            elif cancelled:
                transition(session, job, CANCELLED, error=None, devices=None)
                add_event(session, job.id, "log", {"message": f"cancelled: {stopped}"})
            elif self.pausing is not None:
                alarm = self.pausing.name
                transition(session, job, PAUSED, error=None, devices=None)
                message = f"paused by alarm {alarm} (health.pause_on): {stopped}; resume the job to continue"
                add_event(session, job.id, "log", {"message": message, "alarm": alarm})
            elif self.handing_back:
                return self._hand_back(launch, f"worker {self.owner} stopped", session=session)
            elif end is not None and end.end == MAX_TIME:
                # A clean stop the config asked for: resumable like a pause, with the time counted afresh.
                transition(session, job, PAUSED, error=None, devices=None)
                message = f"paused: {end.message}; resume the job to continue (trainer.max_time counts per launch)"
                add_event(session, job.id, "log", {"message": message, "stop": MAX_TIME})
            elif end is not None and end.end == STOPPED:
                transition(
                    session,
                    job,
                    FAILED,
                    error=f"the trainer stopped at step {end.step} of {end.total_steps} without a cancel (was it sent "
                    f"SIGTERM from outside?); resume the job to continue\n\n--- last lines of {TRAIN_LOG_FILE} ---\n"
                    f"{tail}",
                    devices=None,
                )
            elif end is not None:  # server_unavailable, failed: the trainer's own word on what went wrong
                transition(session, job, FAILED, error=failure_message(returncode, tail, end.message), devices=None)
            elif signalled and job.attempts < settings.max_attempts:
                # Killed from outside (the OOM killer, an operator): worth another attempt from the last checkpoint;
                # a trainer that raised an error exits with a status instead, and would only raise it again.
                name = signal.Signals(-returncode).name
                transition(session, job, QUEUED, worker=None, heartbeat_at=None, devices=None)
                message = (
                    f"the trainer was killed by signal {name} at step {job.step}; re-queued to resume from {where} "
                    f"(attempt {job.attempts} of ALIGNER_MAX_ATTEMPTS={settings.max_attempts})"
                )
                add_event(session, job.id, "log", {"message": message, "level": "warning"})
                requeued = True
            elif returncode == 0:
                reason = f"no end record ({END_FILE}): how its run ended is unknown; resume the job to continue"
                transition(session, job, FAILED, error=failure_message(returncode, tail, reason), devices=None)
            else:
                transition(session, job, FAILED, error=failure_message(returncode, tail), devices=None)
            status, error = job.status, job.error
        if requeued:
            self._send()
        log.info("job %d: %s (trainer exit status %s)", self.job_id, status, returncode)
        return self.result(status, returncode=returncode, error=error)

    def _hand_back(self, launch: Launch, reason: str, session: Session | None = None) -> dict[str, Any]:
        """The worker is stopping: the job goes back to the queue without counting an attempt, and the next worker
        resumes it from its newest checkpoint. Its new message is sent after the commit."""
        with session_scope(self.factory) if session is None else contextlib.nullcontext(session) as session:
            job = session.get(Job, self.job_id, populate_existing=True)
            if not holds_lease(job, self.owner):
                return self._lost_lease()
            if job.status == CANCELLING or job.cancel_requested:
                transition(session, job, CANCELLED, error=None, devices=None)
                add_event(session, job.id, "log", {"message": f"{reason} while the job was being cancelled"})
                return self.result(CANCELLED)
            where = starting_point(max(checkpoint_steps(launch.run_dir), default=None))
            attempts = max(job.attempts - 1, 0)  # a deploy is not the job's fault
            transition(session, job, QUEUED, worker=None, heartbeat_at=None, devices=None, attempts=attempts)
            message = f"{reason}: the job went back to the queue and resumes from {where} (no attempt counted)"
            add_event(session, job.id, "log", {"message": message})
            session.commit()
        self._send()
        log.info("job %d: handed back to the queue (%s)", self.job_id, reason)
        return self.result("handed_back", resume_from=where)

    def _send(self) -> None:
        """Send the job's message again; if the broker is away, the recovery sweep sends it later."""
        if self.send is None:
            return
        try:
            self.send(self.job_id)
        except Exception as err:
            log.warning("job %d: could not send it to the broker (%s); the recovery sweep will", self.job_id, err)

    def _lost_lease(self) -> dict[str, Any]:
        """Another worker took the job over (or it was deleted): stop the trainer, write nothing."""
        log.warning("job %d: lease lost to another worker; stopping this copy of the trainer", self.job_id)
        if self.proc is not None:
            signal_group(self.proc, signal.SIGKILL)
        return self.result("lease_lost")

    def _fail_best_effort(self, err: BaseException) -> None:
        """A worker-side error: the trainer is killed; then the job is marked failed when the error is the worker's
        own, or its lease released (heartbeat cleared, so the sweep re-queues it at once) when the worker process is
        being stopped (SystemExit, KeyboardInterrupt). While the database is away nothing can be written: the lease
        goes stale and the task retry or the sweep resumes the job from its last checkpoint."""
        if self.proc is not None:
            signal_group(self.proc, signal.SIGKILL)
        if _transient(err):
            return
        try:
            with session_scope(self.factory) as session:
                job = session.get(Job, self.job_id, populate_existing=True)
                if not holds_lease(job, self.owner):
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


def run_job(
    job_id: int,
    settings: Settings | None = None,
    factory: sessionmaker[Session] | None = None,
    send: Callable[[int], Any] | None = None,
) -> dict:
    """Run job `job_id` to its end (or stand down, or hand it back); returns {"job_id", "outcome", ...}. `send`
    puts a job back on the broker (a trainer killed from outside, a worker stopping); without it the recovery sweep
    does, after ALIGNER_REQUEUE_AFTER seconds."""
    settings = settings or Settings.from_env()
    factory = factory or session_factory(settings.database_url)
    return JobRun(int(job_id), settings, factory, send=send).run()
