"""SQL persistence of the training service, shared by the API (webapp/) and the worker (worker/).

SQLAlchemy 2 models on PostgreSQL or SQLite; the schema is created and migrated by Alembic (`aligner db upgrade`,
migrations/). The job state machine lives here, in `transition`, so every status change is checked in one place,
applied as one conditional UPDATE (`... WHERE id = :id AND status = :expected`: of two concurrent changes only one
applies, the other raises TransitionConflict, a 409 over the API) and leaves an event that the API streams
(Server-Sent Events).

    queued -> running -> succeeded | failed | cancelled | paused    (cancelling between running and cancelled)

`paused`: a run health alarm named in the job's `health.pause_on` stopped it at a checkpoint (worker/runner.py);
like the other final statuses it goes back to queued through resume or retry.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    exists,
    false,
    func,
    select,
    update,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, column_property, mapped_column, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value

from aligner.errors import AlignerError
from aligner.redact import Redactor, redact_url, url_secrets
from webapp.settings import service_settings

RUNS_DIR = "runs"  # in the data folder: one run folder per job, job_ID (`run_dir_for`)
# Integer columns are 32-bit on PostgreSQL: larger ids and steps cannot exist (and SQLite overflows past 2^63).
INT32_MAX = 2**31 - 1

QUEUED, RUNNING, CANCELLING = "queued", "running", "cancelling"
SUCCEEDED, FAILED, CANCELLED, PAUSED = "succeeded", "failed", "cancelled", "paused"
STATUSES = (QUEUED, RUNNING, CANCELLING, SUCCEEDED, FAILED, CANCELLED, PAUSED)
FINAL_STATUSES = (SUCCEEDED, FAILED, CANCELLED, PAUSED)
# A job's training algorithm: its config's `algorithm`, kept in `Job.algorithm`.
REINFORCE, PPO = "reinforce", "ppo"
ALGORITHMS = (REINFORCE, PPO)
# What a user may do to a job (POST /jobs/{id}/<action>; delete: DELETE /jobs/{id}); which of them apply now is
# `job_actions`.
CANCEL, RESUME, RETRY, DELETE = "cancel", "resume", "retry", "delete"
ACTIONS = (CANCEL, RESUME, RETRY, DELETE)
# Every allowed status change. A final job goes back to queued only through resume or retry.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    QUEUED: (RUNNING, CANCELLED, FAILED),
    RUNNING: (SUCCEEDED, FAILED, CANCELLING, CANCELLED, PAUSED, QUEUED),  # queued: a lost worker's job is re-queued
    CANCELLING: (CANCELLED, FAILED, SUCCEEDED),  # a cancel overrides a pause under way
    SUCCEEDED: (QUEUED,),
    FAILED: (QUEUED,),
    CANCELLED: (QUEUED,),
    PAUSED: (QUEUED,),
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    # The operator role (`aligner token create --admin`); every other user is a plain user.
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ApiToken(Base):
    """A bearer token; only its SHA-256 is stored, the token itself is shown once at creation.

    It authenticates until `expires_at` (never, when None) unless revoked (`revoked_at`, kept for the record).
    """

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(100), default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    algorithm: Mapped[str] = mapped_column(String(20), default=REINFORCE)  # reinforce | ppo
    status: Mapped[str] = mapped_column(String(20), default=QUEUED, index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # the resolved training config
    run_dir: Mapped[str] = mapped_column(Text, default="")
    num_processes: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, index=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The lease: the worker running the job renews heartbeat_at; another copy seeing a live lease stands down.
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the job was last handed to the broker: a queued job no worker took for ALIGNER_REQUEUE_AFTER seconds is
    # sent again (worker/recovery.py), so a message the broker lost never strands it.
    queued_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    num_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    devices: Mapped[str | None] = mapped_column(String(200), nullable=True)  # the GPUs its run holds: "host:0,1"
    step: Mapped[int] = mapped_column(Integer, default=0)
    max_steps: Mapped[int] = mapped_column(Integer, default=0)
    latest_reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The run health alarms firing now (aligner/health.py names), kept by the worker's monitor; a restarted worker
    # reads them back, so an alarm is announced (and pauses) once per episode.
    alarms: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    # When its owner (or an admin) deleted it: the row stays as a tombstone that only admins see, with its events
    # (the audit line, ending with a `deleted` event); its config, metrics, samples, checkpoints and run folder are
    # gone (webapp/jobs.py delete_finished). A deleted job never changes status again (`transition`).
    deleted_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    # has_checkpoint (bool) is mapped below Checkpoint.

    @property
    def actions(self) -> list[str]:
        """The actions that apply to the job now (`job_actions`)."""
        return job_actions(self)


class Metric(Base):
    """One value of one metric at one step: the unique key makes re-ingesting a file after a restart harmless."""

    __tablename__ = "metrics"
    __table_args__ = (
        UniqueConstraint("job_id", "step", "name", name="uq_metrics_job_step_name"),
        Index("ix_metrics_job_name_step", "job_id", "name", "step"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(100))
    value: Mapped[float] = mapped_column(Float)


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (
        UniqueConstraint("job_id", "step", "split", "index", name="uq_samples_job_step_split_index"),
        Index("ix_samples_job_step", "job_id", "step"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(String(20))
    index: Mapped[int] = mapped_column(Integer)  # position within (step, split)
    prompt: Mapped[str] = mapped_column(Text)
    response: Mapped[str] = mapped_column(Text)
    reward: Mapped[float] = mapped_column(Float)
    kl: Mapped[float | None] = mapped_column(Float, nullable=True)
    advantage: Mapped[float | None] = mapped_column(Float, nullable=True)
    is_end: Mapped[bool] = mapped_column(Boolean, default=True)
    # A validation sample's gold rewards (the config's validation.extra_rewards): {name: value}.
    extra_rewards: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)


class Event(Base):
    """What happened to a job, in order: its id is the Server-Sent Events id (resumable with Last-Event-ID)."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(20))  # status | metrics | samples | checkpoint | log | health
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


# Whether the job has a checkpoint to resume from, read in the job's own SELECT (an EXISTS subquery): a page of jobs
# and their actions is one query.
Job.has_checkpoint = column_property(exists().where(Checkpoint.job_id == Job.id))


class Dataset(Base):
    """An uploaded, validated prompt file: its owner's alone, or every user's once an admin shares it."""

    __tablename__ = "datasets"
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(Text)  # relative to the data folder
    num_prompts: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    shared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


# ------------------------------------------------------------------------------------------------- catalogue
# What a job may use, registered by an admin (webapp/catalogue.py): jobs name these, never a path, URL or code.
POLICY, REWARD, CRITIC, TOKENIZER = "policy", "reward", "critic", "tokenizer"
MODEL_KINDS = (POLICY, REWARD, CRITIC, TOKENIZER)
SERVER_KINDS = (REWARD, CRITIC)


class CatalogueModel(Base):
    """A model folder on the server (Hugging Face layout) that jobs may use as `kind`."""

    __tablename__ = "catalogue_models"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    kind: Mapped[str] = mapped_column(String(20))
    path: Mapped[str] = mapped_column(Text)  # absolute, symlinks resolved when registered
    architecture: Mapped[str] = mapped_column(String(200), default="")
    num_parameters: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class RewardFunction(Base):
    """A reward function registered by an admin: `target` is its `module:callable`, which only admins see."""

    __tablename__ = "reward_functions"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    target: Mapped[str] = mapped_column(String(300))
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class ServerEndpoint(Base):
    """A running reward or critic server registered by an admin; jobs name it, only admins see its URL."""

    __tablename__ = "server_endpoints"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    kind: Mapped[str] = mapped_column(String(20))
    url: Mapped[str] = mapped_column(Text)
    model_name: Mapped[str] = mapped_column(String(100), default="reward_model")
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


def run_dir_for(data_dir: str | Path, job_id: int) -> Path:
    """The run folder the service gives job `job_id` (its `Job.run_dir`): DATA_DIR/runs/job_ID. The API sets it when
    it creates the job; the worker falls back to it for a job that has none."""
    return Path(data_dir) / RUNS_DIR / f"job_{job_id}"


# ------------------------------------------------------------------------------------------------- redaction
DATA_DIR_NAME = "<data dir>"  # what messages say instead of the server's data folder
RUN_DIR_NAME = "<run folder>"  # ... instead of a job's run folder


def service_redactor(session: Session, run_dir: str | Path | None = None, data_dir: str | Path | None = None):
    """A `Redactor` (aligner/redact.py) of what is the server's own and never goes to a user: each catalogue model's
    folder, server URL (with and without credentials) and reward function target, replaced by the entry's name
    (`<model sft-7b>`, `<server rm-prod>`, `<reward function my-checker>`); a job's `run_dir` (`<run folder>`), the
    data folder (`data_dir`, the one `run_dir` lies in, the settings'; `<data dir>`); the database's password.
    Kept in the session's `info` for its life (sessions are short: a request, an ingest tick)."""
    key = ("redactor", str(run_dir), str(data_dir))
    cached = session.info.get(key)
    if cached is not None:
        return cached
    names = dict(_catalogue_secrets(session))
    folders = [Path(d).resolve() for d in (data_dir, service_settings().data_dir) if d]
    if run_dir and Path(run_dir).is_absolute():
        run = Path(run_dir)
        names[str(run)] = names[str(run.resolve())] = RUN_DIR_NAME
        if run.parent.name == RUNS_DIR:
            folders.append(run.parent.parent)
    for folder in folders:
        if len(folder.parts) > 1:  # never "/": every path would go
            names[str(folder)] = DATA_DIR_NAME
    bind = session.get_bind()
    password = getattr(getattr(bind, "url", None), "password", None)
    if password:
        names[str(password)] = "***"
    names.pop("", None)
    names.pop(".", None)
    redactor = Redactor(names)
    session.info[key] = redactor
    return redactor


def _catalogue_secrets(session: Session) -> dict[str, str]:
    """The catalogue's folders, targets and server URLs (and the URLs' credentials) by the names users see: read once
    per session, whatever run folders its redactors are for (a page of jobs has as many)."""
    cached = session.info.get("catalogue_secrets")
    if cached is not None:
        return cached
    names: dict[str, str] = {}
    for name, path in session.execute(select(CatalogueModel.name, CatalogueModel.path)):
        names[path] = f"<model {name}>"
    for name, target in session.execute(select(RewardFunction.name, RewardFunction.target)):
        names[target] = f"<reward function {name}>"
    for name, url in session.execute(select(ServerEndpoint.name, ServerEndpoint.url)):
        shown = f"<server {name}>"
        for spelling in (url, url.rstrip("/"), redact_url(url), redact_url(url).rstrip("/")):
            names[spelling] = shown
        names.update(dict.fromkeys(url_secrets(url), "***"))
    session.info["catalogue_secrets"] = names
    return names


def _job_run_dir(session: Session, job_id: int) -> str | None:
    job = session.get(Job, job_id)
    return job.run_dir if job is not None else None


def run_dir_name(run_dir: str | Path | None) -> str | None:
    """A run folder as users see it: relative to the data folder (`runs/job_ID`) when it is one the service made,
    else its name; never the server's absolute path."""
    if not run_dir:
        return run_dir
    run = Path(run_dir)
    return f"{RUNS_DIR}/{run.name}" if run.parent.name == RUNS_DIR else run.name


def column_values(row: Base) -> dict[str, Any]:
    """A row's columns by name: what a response is built from when it adds or hides fields."""
    return {column.name: getattr(row, column.name) for column in row.__table__.columns}


# ------------------------------------------------------------------------------------------------- engine
def database_url(data_dir: Path | None = None) -> str:
    """The settings' `database_url` (ALIGNER_DATABASE_URL), or a SQLite file in `data_dir` (default: the settings'
    `data_dir`; no server needed)."""
    settings = service_settings()
    if settings.database_url:
        return settings.database_url
    folder = Path(data_dir or settings.data_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'aligner.db'}"


def create_private_file(path: str | Path) -> Path:
    """`path`, created empty if missing (in an existing folder), readable and writable by its owner only (0600): it
    holds secrets (token hashes and job configs in the SQLite database, a token in stack.json). SQLite gives its
    -wal and -shm files the database file's mode. A missing folder is left for the caller to report."""
    path = Path(path)
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    with contextlib.suppress(FileNotFoundError, PermissionError):  # another user's file: its mode is theirs
        os.chmod(path, 0o600)
    return path


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:" and not database.startswith("file:"):
            create_private_file(database)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # WAL: the API reads while the worker writes
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# ------------------------------------------------------------------------------------------------- jobs
class TransitionError(AlignerError, ValueError):
    """A status change the state machine does not allow (e.g. cancelling a finished job)."""


class TransitionConflict(TransitionError):
    """The job's status changed since it was read (another request or worker came first): nothing was applied."""


def transition(session: Session, job: Job, status: str, **fields: Any) -> Event:
    """Move `job` from the status it was read with to `status` (checked against TRANSITIONS), set `fields`, and
    record a status event: one `UPDATE ... WHERE status = <the status read>`, so a concurrent change makes this one
    raise TransitionConflict instead of applying twice. `job` is kept in step without another write."""
    expected = job.status
    if status not in TRANSITIONS.get(expected, ()):
        raise TransitionError(f"job {job.id} is {expected}; it cannot become {status}")
    now = utcnow()
    values: dict[str, Any] = {"status": status}
    if status == RUNNING:
        values["started_at"] = job.started_at or now
    if status in FINAL_STATUSES:
        values["finished_at"] = now
    if status == QUEUED:
        values.update(finished_at=None, error=None, cancel_requested=False, queued_at=now)
    values.update(fields)
    if isinstance(values.get("error"), str):  # the last line before a user reads it (trainer logs hold paths)
        values["error"] = service_redactor(session, job.run_dir).text(values["error"])
    column_values = {**values}
    if status == RUNNING:  # never overwrite a start time another writer set meanwhile
        column_values["started_at"] = func.coalesce(Job.started_at, now)
    applied = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == expected, Job.deleted_at.is_(None))
        .values(**column_values)
        .execution_options(synchronize_session=False)
    )
    if applied.rowcount != 1:
        row = session.execute(select(Job.status, Job.deleted_at).where(Job.id == job.id)).first()
        current = "deleted" if row is None or row.deleted_at is not None else row.status
        raise TransitionConflict(
            f"job {job.id} changed meanwhile: it is {current} now, not {expected}; nothing was done"
        )
    for key, value in values.items():
        set_committed_value(job, key, value)
    payload = {"status": status, "error": job.error, "step": job.step}
    return add_event(session, job.id, "status", payload)


def refusal(job: Job, action: str) -> str | None:
    """Why `action` (one of ACTIONS) does not apply to `job` now, as the API's 409 says it; None when it applies.

    cancel: a queued or running job. A job being cancelled is refused here, though POST /cancel answers it 200 with
    nothing changed (a second click, a retried request). resume: a finished job (paused included) with a checkpoint,
    unless it succeeded after all its steps. retry: a failed, cancelled or paused job. delete: a finished job (paused
    included); a queued, running or cancelling one must be cancelled first. Nothing applies to a deleted job."""
    if action not in ACTIONS:
        raise ValueError(f"unknown job action {action!r}; the actions are {', '.join(ACTIONS)}")
    if job.deleted_at is not None:
        return f"job {job.id} was deleted"
    if action == DELETE:
        if job.status in FINAL_STATUSES:
            return None
        return f"job {job.id} is {job.status}: cancel it first; only a finished job can be deleted"
    if action == CANCEL:
        if job.status in (QUEUED, RUNNING):
            return None
        if job.status == CANCELLING:
            return f"job {job.id} is being cancelled already"
        return f"job {job.id} has already finished ({job.status})"
    if action == RESUME:
        if job.status not in FINAL_STATUSES:
            return f"job {job.id} is {job.status}: only a finished job can be resumed"
        if job.status == SUCCEEDED and job.step >= job.max_steps:
            return f"job {job.id} has finished all its {job.max_steps} steps: nothing to resume"
        if not job.has_checkpoint:
            return f"job {job.id} has no checkpoint to resume from: retry it instead"
        return None
    if job.status in (FAILED, CANCELLED, PAUSED):  # retry
        return None
    return f"job {job.id} is {job.status}: only a failed, cancelled or paused job can be retried"


def job_actions(job: Job) -> list[str]:
    """The actions (ACTIONS order) that `refusal` lets through: what the API's job carries as `actions` and the
    dashboard's buttons follow."""
    return [action for action in ACTIONS if refusal(job, action) is None]


def add_event(session: Session, job_id: int, kind: str, payload: dict[str, Any]) -> Event:
    """Record an event of the job; its text goes through `service_redactor` first: events reach users verbatim."""
    if any(isinstance(v, str | dict | list) for v in payload.values()):
        payload = service_redactor(session, _job_run_dir(session, job_id)).value(payload)
    ev = Event(job_id=job_id, kind=kind, payload=payload)
    session.add(ev)
    return ev


# ------------------------------------------------------------------------------------------------- users
def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    session: Session, user_name: str, token_name: str = "", admin: bool = False, expires_days: float | None = None
) -> str:
    """A new API token for `user_name` (the user is created if new); returns the token, stored only hashed.

    `admin` makes the user an operator (it never takes the role away); `expires_days` bounds the token's life.
    """
    user = session.scalar(select(User).where(User.name == user_name))
    if user is None:
        user = User(name=user_name)
        session.add(user)
        session.flush()
    user.is_admin = user.is_admin or admin
    token = "alg_" + secrets.token_urlsafe(32)
    expires_at = None if expires_days is None else utcnow() + dt.timedelta(days=expires_days)
    session.add(ApiToken(user_id=user.id, token_hash=hash_token(token), name=token_name, expires_at=expires_at))
    return token


def list_tokens(session: Session) -> list[tuple[ApiToken, User]]:
    """Every token (revoked and expired ones too) with its user, oldest first."""
    return list(session.execute(select(ApiToken, User).join(User, ApiToken.user_id == User.id).order_by(ApiToken.id)))


def revoke_token(session: Session, token_id: int) -> bool:
    """Revoke token `token_id` from now on; False when there is no such token or it was revoked already."""
    row = session.get(ApiToken, token_id)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    return True


# last_used_at is written at most once a minute per token: a write (and, on SQLite, a database-wide lock and an
# fsync) on every authenticated GET made reads several times slower (bench/api_load.py).
TOKEN_LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


def _live_token(session: Session, token: str, now: dt.datetime) -> ApiToken | None:
    """The token's row when it is known, unrevoked and unexpired at `now`."""
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
    if row is None or row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= now):
        return None
    return row


def token_is_live(session: Session, token: str) -> bool:
    """Whether `token` still signs in (known, unrevoked, unexpired), recording nothing: for a request that outlives
    its sign-in, such as an event stream."""
    return _live_token(session, token, utcnow()) is not None


def user_for_token(session: Session, token: str) -> User | None:
    """The token's user, or None (unknown, revoked or expired); records the use in last_used_at (to the minute)."""
    now = utcnow()
    row = _live_token(session, token, now)
    if row is None:
        return None
    if row.last_used_at is None or now - row.last_used_at >= TOKEN_LAST_USED_RESOLUTION:
        row.last_used_at = now
    return session.get(User, row.user_id)
