"""The service's environment variables, read once into one typed object: `service_settings()`.

The API (webapp/), the worker (worker/), `aligner up` and `aligner ui` read their ALIGNER_* variables here and
nowhere else. Each field of `ServiceSettings` names its variable, its default and what it means; the table in
docs/service.md ("Environment variables") is `markdown_table()`'s output (tests/webapp/test_settings.py keeps the
two the same). The object is built at the first call and kept for the process; a test that changes the environment
calls `service_settings.cache_clear()`.

A malformed number stops the process at its first read, with a ConfigError naming the variable. No Flask, no
database here: the worker and the CLI import this module too.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from aligner.errors import ConfigError


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, what it means, how its text becomes the field's value, and what the
    docs show as its default when that is not the field's default itself."""

    name: str
    meaning: str
    parse: Callable[[str], Any] = str
    empty_is_unset: bool = True  # "" reads as unset (the default); False: "" is the value, as it always was
    shown_default: str | None = None


def _setting(
    name: str,
    default: Any,
    meaning: str,
    parse: Callable[[str], Any] = str,
    *,
    empty_is_unset: bool = True,
    shown_default: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    variable = Variable(name, meaning, parse, empty_is_unset, shown_default)
    if factory is not None:
        return field(default_factory=factory, metadata={"variable": variable})
    return field(default=default, metadata={"variable": variable})


def _whole(text: str) -> int:
    return int(float(text))  # "3" and "3.0" alike, as the worker has always read its counts


def _gigabytes(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(text)
    return value


def _hops(text: str) -> int:
    hops = int(text)
    if hops < 0:
        raise ValueError(text)
    return hops


@dataclass(frozen=True)
class ServiceSettings:
    """The ALIGNER_* environment of one service process (`service_settings()`); built without an environment it
    holds the defaults."""

    # ---- everywhere: the API, the worker, `aligner up`
    data_dir: Path = _setting(
        "ALIGNER_DATA_DIR",
        Path("aligner_data"),
        "run folders (`runs/job_ID`), uploads, base of relative paths in configs",
        Path,
        empty_is_unset=False,
    )
    database_url: str | None = _setting(
        "ALIGNER_DATABASE_URL",
        None,
        "the service's database (`postgresql://...` uses psycopg 3)",
        shown_default="SQLite `DATA_DIR/aligner.db`",
    )
    broker_url: str = _setting(
        "ALIGNER_BROKER_URL",
        "redis://127.0.0.1:6379/0",
        "Celery broker (`aligner up` without it starts its own Redis)",
        empty_is_unset=False,
    )
    queue: str = _setting(
        "ALIGNER_QUEUE",
        "aligner",
        "queue the API sends to, the workers consume and the sweep re-sends to (set it alike everywhere)",
        empty_is_unset=False,
    )
    # A worker's stop takes up to this long, so whatever stops a worker (compose, `aligner up`) waits longer.
    cancel_grace: float = _setting(
        "ALIGNER_CANCEL_GRACE", 60.0, "seconds between SIGTERM and SIGKILL on cancel or when the worker stops", float
    )
    visibility_timeout: int = _setting(
        "ALIGNER_VISIBILITY_TIMEOUT",
        12 * 3600,
        "Redis visibility timeout: longer than most jobs, as the lease and the sweep do the recovery",
        int,
        empty_is_unset=False,
    )
    # ---- the worker
    lease_timeout: float = _setting(
        "ALIGNER_LEASE_TIMEOUT", 60.0, "seconds without a heartbeat after which a job's worker counts as lost", float
    )
    sweep_interval: float = _setting("ALIGNER_SWEEP_INTERVAL", 15.0, "seconds between recovery sweeps", float)
    poll_interval: float = _setting(
        "ALIGNER_POLL_INTERVAL", 0.5, "seconds between a worker's looks at its trainer (and its heartbeats)", float
    )
    max_attempts: int = _setting(
        "ALIGNER_MAX_ATTEMPTS",
        3,
        "starts after which a lost job (or one whose trainer was killed) fails instead of being re-queued",
        _whole,
    )
    requeue_after: float = _setting(
        "ALIGNER_REQUEUE_AFTER",
        120.0,
        "seconds a queued job may go untaken before the sweep sends its message again",
        float,
    )
    worker_gpus: str = _setting(
        "ALIGNER_WORKER_GPUS",
        "",
        "this worker's devices, e.g. `0,1,2,3`: one job per device at once, each with its own "
        "`CUDA_VISIBLE_DEVICES` (parsed by worker/devices.py)",
        shown_default="(none)",
    )
    device_lock_dir: Path | None = _setting(
        "ALIGNER_DEVICE_LOCK_DIR",
        None,
        "host-local folder of the device locks",
        Path,
        shown_default="`$TMPDIR/aligner-devices-UID`",
    )
    device_wait: float = _setting(
        "ALIGNER_DEVICE_WAIT", 15.0, "seconds before a job that found too few free GPUs here is offered again", float
    )
    trainer_python: str = _setting(
        "ALIGNER_TRAINER_PYTHON",
        None,
        "Python that runs `aligner.cli train`",
        shown_default="the worker's interpreter",
        factory=lambda: sys.executable,
    )
    critic_start_timeout: float = _setting(
        "ALIGNER_CRITIC_START_TIMEOUT", 300.0, "seconds a PPO job's critic server gets to become ready", float
    )
    critic_stop_grace: float = _setting(
        "ALIGNER_CRITIC_STOP_GRACE",
        5.0,
        "seconds between SIGTERM and SIGKILL when a PPO job's critic server is stopped",
        float,
    )
    # ---- the API (app config defaults: webapp/__init__.py, docs/security.md "Limits")
    job_limits: str | None = _setting(
        "ALIGNER_JOB_LIMITS",
        None,
        "caps over a job's sizes, a JSON object, e.g. `{\"model.num_threads\": 8}` (webapp/job_config.py); the app's "
        "`JOB_LIMITS` wins",
        shown_default="(none)",
    )
    signin_limit: str = _setting(
        "ALIGNER_SIGNIN_LIMIT",
        "10 per minute",
        "requests without a valid token per client address, then 429 (`SIGNIN_FAILURE_LIMIT`)",
        empty_is_unset=False,
    )
    ratelimit_storage_uri: str = _setting(
        "ALIGNER_RATELIMIT_STORAGE_URI",
        "memory://",
        "where those are counted; `redis://HOST:6379/DB` for all API processes (`RATELIMIT_STORAGE_URI`)",
        empty_is_unset=False,
    )
    trusted_proxies: int = _setting(
        "ALIGNER_TRUSTED_PROXIES",
        0,
        "proxies in front of the API whose `X-Forwarded-For` it trusts for the client address (werkzeug `ProxyFix`); "
        "the dashboard counts as one (`TRUSTED_PROXIES`, docs/security.md)",
        _hops,
    )
    max_upload_bytes: int = _setting(
        "ALIGNER_MAX_UPLOAD_BYTES",
        256 * 1024 * 1024,
        "bytes of one uploaded file: a dataset over the API (`MAX_DATASET_SIZE`, then 413) and any upload to the "
        "dashboard (`aligner ui`, then 413)",
        int,
    )
    max_active_jobs: int = _setting(
        "ALIGNER_MAX_ACTIVE_JOBS",
        4,
        "queued + running + cancelling jobs per user, then 429 (`MAX_ACTIVE_JOBS_PER_USER`)",
        int,
        empty_is_unset=False,
    )
    max_dataset_bytes: int = _setting(
        "ALIGNER_MAX_DATASET_BYTES",
        1024**3,
        "bytes of all of a user's uploads, then 413 (`MAX_DATASET_BYTES_PER_USER`)",
        int,
        empty_is_unset=False,
    )
    max_event_streams: int = _setting(
        "ALIGNER_MAX_EVENT_STREAMS",
        4,
        "open event streams per user and API process, then 429 (`MAX_EVENT_STREAMS_PER_USER`)",
        int,
        empty_is_unset=False,
    )
    max_tries: int = _setting(
        "ALIGNER_MAX_TRIES",
        1,
        "reward tries and dry runs running per user and API process, then 429 (`MAX_TRIES_PER_USER`)",
        int,
        empty_is_unset=False,
    )
    try_threads: int = _setting(
        "ALIGNER_TRY_THREADS",
        None,
        "torch threads the reward tries and dry runs of one API process may use at once, all users together; a try "
        "past them gets 503 (`TRY_THREADS`)",
        int,
        shown_default="the host's CPU cores",
        factory=lambda: os.cpu_count() or 1,
    )
    max_downloads: int = _setting(
        "ALIGNER_MAX_DOWNLOADS",
        2,
        "checkpoint and policy downloads being built or sent per user and API process, then 429 "
        "(`MAX_DOWNLOADS_PER_USER`)",
        int,
        empty_is_unset=False,
    )
    worker_device_memory_gb: float | None = _setting(
        "ALIGNER_WORKER_DEVICE_MEMORY_GB",
        None,
        "memory of one worker device in GB (1e9 bytes), e.g. `80`: a job whose estimated memory per process exceeds "
        'it is refused with 422 (`WORKER_DEVICE_MEMORY_GB`, docs/scaling.md "Memory: which backend fits")',
        _gigabytes,
        shown_default="measured on the API's host: CUDA device 0's memory, else the host's RAM (shared by a job's "
        "processes)",
    )
    # ---- the dashboard
    api_url: str = _setting(
        "ALIGNER_API_URL", "http://127.0.0.1:5000", "the REST API `aligner ui` talks to", empty_is_unset=False
    )
    # The variables the environment sets (each by name), for a default that differs from "not set".
    given: frozenset[str] = frozenset()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ServiceSettings:
        values: dict[str, Any] = {}
        given = set()
        for item in fields(cls):
            variable: Variable | None = item.metadata.get("variable")
            if variable is None or variable.name not in environ:
                continue
            given.add(variable.name)
            raw = environ[variable.name]
            if raw == "" and variable.empty_is_unset:
                continue
            try:
                values[item.name] = variable.parse(raw)
            except ValueError:
                raise ConfigError(
                    f"{variable.name}={raw!r} is not valid: expected something like {_shown_default(item)}"
                ) from None
        return cls(**values, given=frozenset(given))

    def is_set(self, attribute: str) -> bool:
        """Whether the environment sets the variable of field `attribute` (empty or not)."""
        return variable_of(attribute).name in self.given


def variable_of(attribute: str) -> Variable:
    """The environment variable of ServiceSettings' field `attribute`."""
    for item in fields(ServiceSettings):
        if item.name == attribute and "variable" in item.metadata:
            return item.metadata["variable"]
    raise KeyError(attribute)


@functools.cache
def service_settings() -> ServiceSettings:
    """This process's settings, read from the environment at the first call (`service_settings.cache_clear()` to
    read it again)."""
    return ServiceSettings.from_environ(os.environ)


def _shown_default(item) -> str:
    variable: Variable = item.metadata["variable"]
    if variable.shown_default is not None:
        return variable.shown_default
    value = item.default
    if isinstance(value, str | Path):
        return f"`{value}`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown_table() -> str:
    """The variables as the Markdown table of docs/service.md ("Environment variables")."""
    rows = ["| variable | default | what |", "| --- | --- | --- |"]
    for item in fields(ServiceSettings):
        variable = item.metadata.get("variable")
        if variable is not None:
            rows.append(f"| `{variable.name}` | {_shown_default(item)} | {variable.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
