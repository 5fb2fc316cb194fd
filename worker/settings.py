"""The worker's settings: what a job's run needs, built from the service's settings (webapp/settings.py, whose
environment variables docs/service.md lists under "Environment variables"), and the database sessions of the URL
they name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from webapp.db import database_url, make_engine, make_session_factory
from webapp.settings import ServiceSettings, service_settings
from worker.devices import default_lock_dir, parse_devices

_DEFAULTS = ServiceSettings()  # the variables' defaults, for a Settings built by hand (tests)


@dataclass(frozen=True)
class Settings:
    """Worker settings: `Settings.from_env()` takes the service's settings; each field's meaning is its variable's
    (webapp/settings.py) unless said here."""

    database_url: str
    data_dir: Path = _DEFAULTS.data_dir
    lease_timeout: float = _DEFAULTS.lease_timeout
    poll_interval: float = _DEFAULTS.poll_interval
    cancel_grace: float = _DEFAULTS.cancel_grace
    sweep_interval: float = _DEFAULTS.sweep_interval
    max_attempts: int = _DEFAULTS.max_attempts
    python: str = _DEFAULTS.trainer_python
    critic_start_timeout: float = _DEFAULTS.critic_start_timeout
    # Short: the trainer has saved the critic with each checkpoint (critic_save) before it ends, and a PyTriton server
    # takes 15-30 s to shut down cleanly.
    critic_stop_grace: float = _DEFAULTS.critic_stop_grace
    # A job that waits behind others gets a harmless duplicate message at worst.
    requeue_after: float = _DEFAULTS.requeue_after
    gpus: tuple[str, ...] = ()  # this worker's devices, parsed from `worker_gpus` (worker/devices.py)
    device_lock_dir: Path = field(default_factory=default_lock_dir)
    device_wait: float = _DEFAULTS.device_wait

    @classmethod
    def from_env(cls) -> Settings:
        """The settings of this process's environment (webapp.settings.service_settings(), read once)."""
        service = service_settings()
        return cls(
            database_url=database_url(service.data_dir),
            data_dir=service.data_dir,
            lease_timeout=service.lease_timeout,
            cancel_grace=service.cancel_grace,
            sweep_interval=service.sweep_interval,
            poll_interval=service.poll_interval,
            max_attempts=service.max_attempts,
            python=service.trainer_python,
            critic_start_timeout=service.critic_start_timeout,
            critic_stop_grace=service.critic_stop_grace,
            requeue_after=service.requeue_after,
            gpus=parse_devices(service.worker_gpus),
            device_lock_dir=service.device_lock_dir or default_lock_dir(),
            device_wait=service.device_wait,
        )


_factories: dict[tuple[int, str], sessionmaker[Session]] = {}


def session_factory(url: str) -> sessionmaker[Session]:
    """One engine per process and URL: a forked pool process never reuses its parent's connections."""
    key = (os.getpid(), url)
    if key not in _factories:
        _factories[key] = make_session_factory(make_engine(url))
    return _factories[key]
