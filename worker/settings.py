"""The worker's settings, read from the environment (the README's "Worker" section lists them), and the database
sessions of the URL they name."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from webapp.db import DEFAULT_DATA_DIR, database_url, make_engine, make_session_factory
from webapp.queues import CANCEL_GRACE_S
from worker.devices import default_lock_dir, parse_devices


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


@dataclass(frozen=True)
class Settings:
    """Worker settings, from the environment (`Settings.from_env()`)."""

    database_url: str
    data_dir: Path = DEFAULT_DATA_DIR
    lease_timeout: float = 60.0  # s without a heartbeat after which a job's worker counts as lost
    poll_interval: float = 0.5  # s between two looks at the run directory (and heartbeats)
    cancel_grace: float = CANCEL_GRACE_S  # s the trainer gets after SIGTERM to finish its step and checkpoint
    sweep_interval: float = 15.0  # s between two recovery sweeps in a worker
    max_attempts: int = 3  # a job whose worker is lost this many times fails
    python: str = field(default_factory=lambda: sys.executable)  # interpreter that runs the trainer
    critic_start_timeout: float = 300.0  # s a PPO job's critic server gets to become ready
    # s between SIGTERM and SIGKILL when the critic server is stopped. Short: the trainer has saved the critic with
    # each checkpoint (critic_save) before it ends, and a PyTriton server takes 15-30 s to shut down cleanly.
    critic_stop_grace: float = 5.0
    # s a queued job may go without a worker taking it before the sweep sends it to the broker again (a broker that
    # restarted without its messages); a job that waits behind others gets a harmless duplicate message at worst.
    requeue_after: float = 120.0
    gpus: tuple[str, ...] = ()  # this worker's devices (ALIGNER_WORKER_GPUS=0,1,2,3): worker/devices.py
    device_lock_dir: Path = field(default_factory=default_lock_dir)
    device_wait: float = 15.0  # s before a job that found too few free devices here is offered again

    @classmethod
    def from_env(cls) -> Settings:
        data_dir = Path(os.environ.get("ALIGNER_DATA_DIR") or DEFAULT_DATA_DIR)
        return cls(
            database_url=database_url(data_dir),
            data_dir=data_dir,
            lease_timeout=_env_float("ALIGNER_LEASE_TIMEOUT", 60.0),
            poll_interval=_env_float("ALIGNER_POLL_INTERVAL", 0.5),
            cancel_grace=_env_float("ALIGNER_CANCEL_GRACE", CANCEL_GRACE_S),
            sweep_interval=_env_float("ALIGNER_SWEEP_INTERVAL", 15.0),
            max_attempts=int(_env_float("ALIGNER_MAX_ATTEMPTS", 3)),
            python=os.environ.get("ALIGNER_TRAINER_PYTHON") or sys.executable,
            critic_start_timeout=_env_float("ALIGNER_CRITIC_START_TIMEOUT", 300.0),
            critic_stop_grace=_env_float("ALIGNER_CRITIC_STOP_GRACE", 5.0),
            requeue_after=_env_float("ALIGNER_REQUEUE_AFTER", 120.0),
            gpus=parse_devices(os.environ.get("ALIGNER_WORKER_GPUS")),
            device_lock_dir=Path(os.environ.get("ALIGNER_DEVICE_LOCK_DIR") or default_lock_dir()),
            device_wait=_env_float("ALIGNER_DEVICE_WAIT", 15.0),
        )


_factories: dict[tuple[int, str], sessionmaker[Session]] = {}


def session_factory(url: str) -> sessionmaker[Session]:
    """One engine per process and URL: a forked pool process never reuses its parent's connections."""
    key = (os.getpid(), url)
    if key not in _factories:
        _factories[key] = make_session_factory(make_engine(url))
    return _factories[key]
