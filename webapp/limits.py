"""Limits an operator sets: failed sign-ins per client address (429 with Retry-After), and per user the active jobs
(429), the bytes of uploaded datasets (413), the open event streams (429) and the reward tries running (429). Each
is an app config key whose default is a field of the service's settings (LIMIT_SETTINGS; the variables:
webapp/settings.py, docs/service.md "Environment variables"; the limits: docs/security.md "Limits").

Failed sign-ins are Flask-Limiter's: a shared limit on every blueprint that needs a token, deducted only when the
answer is 401 (no, a wrong, an expired or a revoked token). A request whose token is valid is exempt: it is served
and counts nothing, whatever its address's failures (tokens are 256-bit: throttling a valid one protects nothing,
and would let one user's typos, or anyone's garbage, lock out everyone behind the same address). Once an address
has used up its failures, its requests without a valid token get 429 until the window ends. The address is the
client's, or with TRUSTED_PROXIES (webapp/__init__.py) the one its proxies forward (docs/security.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from apiflask import APIFlask, HTTPError
from flask import Blueprint, current_app
from flask_limiter import Limiter, RateLimitExceeded
from flask_limiter.util import get_remote_address
from limits import parse_many
from sqlalchemy import func, select

from webapp.auth import current_user, token_user
from webapp.db import CANCELLING, QUEUED, RUNNING, Dataset, Job, User
from webapp.errors import abort_fields
from webapp.extensions import db
from webapp.settings import service_settings

ACTIVE_STATUSES = (QUEUED, RUNNING, CANCELLING)
SIGNIN_SCOPE = "failed-signin"
EXTENSION = "aligner_limits"

# config key: the field of ServiceSettings (webapp/settings.py) that gives its default
LIMIT_SETTINGS = {
    "SIGNIN_FAILURE_LIMIT": "signin_limit",
    "RATELIMIT_STORAGE_URI": "ratelimit_storage_uri",
    "MAX_ACTIVE_JOBS_PER_USER": "max_active_jobs",
    "MAX_DATASET_BYTES_PER_USER": "max_dataset_bytes",
    "MAX_EVENT_STREAMS_PER_USER": "max_event_streams",
    "MAX_TRIES_PER_USER": "max_tries",
    "MAX_DOWNLOADS_PER_USER": "max_downloads",
}
TRY_EXTENSION = "aligner_try_slots"
DOWNLOAD_EXTENSION = "aligner_download_slots"


def config_defaults() -> dict[str, Any]:
    """Each limit's config default: its field of the service's settings (its environment variable, when set)."""
    settings = service_settings()
    return {key: getattr(settings, attribute) for key, attribute in LIMIT_SETTINGS.items()}


class StreamSlots:
    """Open event streams (or reward tries running) per user, counted in this API process.

    Rate limiters (Flask-Limiter and the `limits` library under it) count requests per time window, not requests
    still in progress, hence this counter. It lives in the process: with several API processes (gunicorn -w N) a
    user may hold up to N times MAX_EVENT_STREAMS_PER_USER streams in all.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[int] = Counter()

    def acquire(self, user_id: int, limit: int) -> Callable[[], None] | None:
        """A release function for a newly taken slot (safe to call more than once), or None when all are taken."""
        with self._lock:
            if self._open[user_id] >= limit:
                return None
            self._open[user_id] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._open[user_id] -= 1
                if not self._open[user_id]:
                    del self._open[user_id]

        return release

    def open_count(self, user_id: int) -> int:
        with self._lock:
            return self._open[user_id]


def init_app(app: APIFlask, authenticated: Iterable[Blueprint]) -> None:
    """Count failed sign-ins on the `authenticated` blueprints; set up the per-user limits."""
    try:  # a typo fails at start, not on every request
        parse_many(app.config["SIGNIN_FAILURE_LIMIT"])
    except ValueError as err:
        raise ValueError(f"SIGNIN_FAILURE_LIMIT (env ALIGNER_SIGNIN_LIMIT): {err}") from None
    # A storage that goes away (Redis down): count in this process meanwhile rather than fail every request.
    app.config.setdefault("RATELIMIT_IN_MEMORY_FALLBACK_ENABLED", True)
    limiter = Limiter(get_remote_address, app=app)  # reads RATELIMIT_STORAGE_URI, RATELIMIT_ENABLED, ...
    signin = limiter.shared_limit(
        app.config["SIGNIN_FAILURE_LIMIT"],
        scope=SIGNIN_SCOPE,
        deduct_when=lambda response: response.status_code == 401,
        exempt_when=lambda: token_user() is not None,
    )
    for blueprint in authenticated:
        signin(blueprint)
    app.extensions[EXTENSION] = StreamSlots()
    app.extensions[TRY_EXTENSION] = StreamSlots()  # the same counting serves reward tries
    app.extensions[DOWNLOAD_EXTENSION] = StreamSlots()  # and downloads

    @app.errorhandler(RateLimitExceeded)
    def _too_many_failed_signins(exc: RateLimitExceeded):
        breached = limiter.current_limit
        retry_after = max(1, math.ceil(breached.reset_at - time.time())) if breached else 1
        item = exc.limit.limit
        window = f"{item.multiples} {item.GRANULARITY.name}{'s' if item.multiples != 1 else ''}"
        reason = f"{item.amount} requests without a valid token within {window}; retry after {retry_after} s"
        error = HTTPError(
            429,
            "Too many failed sign-ins from this address",
            headers={"Retry-After": str(retry_after)},
            extra_data={"errors": {"Authorization": [reason]}},
        )
        return app.error_callback(error)


def _lock_user(user_id: int) -> None:
    """Hold the user's row until the commit, so one user's concurrent requests count one after the other.

    FOR NO KEY UPDATE (not FOR UPDATE): rows that merely reference the user can still be inserted meanwhile.
    SQLite has no row locks and ignores this; two requests in the same instant may then both pass.
    """
    db.session.execute(select(User.id).where(User.id == user_id).with_for_update(key_share=True))


def check_active_jobs(user_id: int | None = None) -> None:
    """429 when user `user_id` (default: the current one; an admin resuming or retrying a job counts its owner's)
    already has MAX_ACTIVE_JOBS_PER_USER jobs queued, running or cancelling."""
    limit = current_app.config["MAX_ACTIVE_JOBS_PER_USER"]
    own = user_id is None or user_id == current_user().id
    user_id = current_user().id if user_id is None else user_id
    _lock_user(user_id)
    active = db.session.scalar(
        select(func.count()).select_from(Job).where(Job.user_id == user_id, Job.status.in_(ACTIVE_STATUSES))
    )
    if active >= limit:
        abort_fields(
            429,
            f"{'You have' if own else 'The job owner has'} {active} active jobs (queued, running or cancelling) "
            f"and the limit is {limit} per user: wait for one to finish, or cancel one",
        )


def check_dataset_bytes(upload_bytes: int, reserved: int | None = None) -> None:
    """413 when the current user's datasets plus `upload_bytes` would pass MAX_DATASET_BYTES_PER_USER.

    The datasets are counted from their rows' size_bytes (a row from before that column, 0, by its file), never from
    the files in the user's folder: an upload's temporary file, or one a killed API process left, counts for nothing.
    Two uploads in the same instant both pass a plain check, and no row lock holds on SQLite, so an upload is checked
    twice: before it is read, and again after its row (`reserved`, its id, left out of the sum) is committed. Of
    concurrent uploads, the last to commit sees every other's row: the datasets that stay never pass the limit, on
    SQLite and on PostgreSQL, across API processes; under such a race both may be refused, and the caller deletes its
    refused row (webapp/datasets.py).
    """
    limit = current_app.config["MAX_DATASET_BYTES_PER_USER"]
    where = [Dataset.user_id == current_user().id]
    if reserved is not None:
        where.append(Dataset.id != reserved)
    data_dir = Path(current_app.config["DATA_DIR"])
    stored = 0
    for size, path in db.session.execute(select(Dataset.size_bytes, Dataset.path).where(*where)):
        file = data_dir / path
        stored += size or (file.stat().st_size if file.is_file() else 0)
    if stored + upload_bytes > limit:
        reason = (
            f"{upload_bytes} bytes; with the {stored} bytes of your datasets that passes the limit of {limit} bytes "
            "per user"
        )
        abort_fields(413, f"Dataset storage limit reached ({limit} bytes per user)", {"file": [reason]})


def _take_slot(extension: str, config_key: str, refusal: Callable[[int], str]) -> Callable[[], None]:
    """One of the current user's `config_key` slots of the counter `extension` (a release function), or 429 with
    `refusal(limit)` when none is free."""
    limit = current_app.config[config_key]
    release = current_app.extensions[extension].acquire(current_user().id, limit)
    if release is None:
        abort_fields(429, refusal(limit))
    return release


def event_stream_slot() -> Callable[[], None]:
    """Take one of the current user's MAX_EVENT_STREAMS_PER_USER stream slots (429 when none is free).

    Call the returned function when the stream ends or its client goes away; calling it again does nothing. The
    server learns that a client went away only when a write fails: on an idle stream, at a heartbeat.
    """
    return _take_slot(
        EXTENSION,
        "MAX_EVENT_STREAMS_PER_USER",
        lambda limit: f"You have {limit} event streams open and the limit is {limit} per user: close one first",
    )


def try_slot() -> Callable[[], None]:
    """Take one of the current user's MAX_TRIES_PER_USER slots for a reward try (POST /rewards/try, a dry run; 429
    when none is free); call the returned function when the try has ended."""
    return _take_slot(
        TRY_EXTENSION,
        "MAX_TRIES_PER_USER",
        lambda limit: (
            f"You have {limit} reward {'try' if limit == 1 else 'tries'} running and the limit is {limit} "
            "per user: wait for it to finish"
        ),
    )


def download_slot() -> Callable[[], None]:
    """Take one of the current user's MAX_DOWNLOADS_PER_USER slots for a checkpoint or policy download (429 when
    none is free): a download builds a zip of the whole folder, so a user may not start many at once. Call the
    returned function once the file is sent (or the client went away)."""
    return _take_slot(
        DOWNLOAD_EXTENSION,
        "MAX_DOWNLOADS_PER_USER",
        lambda limit: f"You have {limit} downloads running and the limit is {limit} per user: wait for one to finish",
    )
