"""`ServerConnection`: how the reward and critic clients talk to a server speaking Triton's HTTP/KServe-v2 protocol.

    reward: {server_url: http://127.0.0.1:8000}        # in an `aligner train` config

`RemoteRewardClient` (aligner/rewards/remote.py) sends what the model declares: `prompts` and `responses` (BYTES,
plus `metadata` as JSON) to `aligner serve-reward`, NeMo-Aligner's `sentences` or `tokens` to a NeMo-Aligner reward
server. `RemoteCriticClient` (aligner/rewards/critic_client.py) talks to `aligner serve-critic` or NeMo-Aligner's
critic server. Both build and read their tensors with aligner/rewards/kserve.py, and send every request through one
`ServerConnection` with their `RetrySettings`, which tells three kinds of failure apart:

- **the server is away** (connection refused or reset, no answer within the timeout, HTTP 502/503/504, Triton's 400/404
  for a model that is loading, or that was served before and is gone while the server restarts, or HTTP 500 while
  `/v2/health/ready` says the server is not ready: a stopping Triton fails requests so for up to 30 s): the request is
  retried with exponential backoff (`backoff_s`, doubling, at most `max_backoff_s`) until the server answers or
  `unavailable_timeout_s` has passed since it went away; then a `ServerUnavailableError` names the URL (never its
  user, password or query: `aligner.redact.redact_url`), the time waited
  and the config key that sets the limit. The `on_wait` callback hears when the waiting starts (and at most once a
  minute while it goes on: `REPORT_INTERVAL_S`) and when the server is back (`ServerWait`); `stop_waiting` ends the
  waiting (a run asked to stop);
- **a transient failure** of a server that answers (HTTP 429, 500 from a server that says it is ready, a malformed
  status line): `max_retries` retries with backoff;
- **the request's fault** (any other 4xx, a 500 marked BAD_REQUEST, a redirect, an answer that is not a JSON
  object): an error at once.

A request that is not idempotent (a critic training step) is retried only when it cannot have been applied: never
sent, HTTP 429 or 503, or a model not loaded. A model the server does not know before it has answered us is a
server starting (PyTriton serves HTTP a moment before its models) or a wrong model name: retried `max_retries` times,
then refused.

Nothing a server sends reaches an error message (nor, through it, train.log and a job's error): a job may point its
client at any URL, and the start of another service's answer could be a secret. Errors say the HTTP status (with
its standard phrase, not the server's), or the kind of connection failure; a server's own log says why it refused.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import requests

from aligner.errors import RewardError, RewardServerUnavailableError, ServerUnavailableError
from aligner.redact import redact_url

READY_PATH = "/v2/health/ready"
READY_TIMEOUT_S = 2.0
NOT_READY_STATUS = {400, 503}  # what /v2/health/ready answers for "not ready" (Triton: 400)
UNAVAILABLE_STATUS = {502, 503, 504}  # a gateway without its server, a server not (yet) serving
TRANSIENT_STATUS = {429, 500}
BAD_REQUEST = "bad request: "  # starts the message of an error a server blames on the request
# Triton's errors (HTTP 400 or 404) for a model that is loading; and for one it does not have, which while a server
# restarts is a model not loaded yet. Looked for in the error, never shown.
MODEL_LOADING = ("has no available versions", "is not at ready state", "is not ready")
MODEL_UNKNOWN = "unknown model"
MAX_BACKOFF_S = 20.0
REPORT_INTERVAL_S = 60.0  # a wait still going on is reported at most this often


@dataclass(frozen=True)
class RetrySettings:
    """How a client's `ServerConnection` waits and retries, as the module's docstring says; the reward and critic
    clients' one definition (their config sections set three: `RetrySettings.of`)."""

    timeout_s: float = 60.0  # seconds one request may take
    max_retries: int = 3  # retries of a transient failure, then an error
    backoff_s: float = 0.5  # the first retry's delay, doubling with each
    max_backoff_s: float = MAX_BACKOFF_S  # the longest delay while a server is away
    unavailable_timeout_s: float = 600.0  # seconds to wait for a server that is away, then `unavailable_error`

    @classmethod
    def of(cls, section: Any) -> RetrySettings:
        """The settings of a config section with `timeout_s`, `max_retries` and `unavailable_timeout_s` (`reward`,
        `critic`); the backoff keeps its defaults."""
        return cls(
            timeout_s=section.timeout_s,
            max_retries=section.max_retries,
            unavailable_timeout_s=section.unavailable_timeout_s,
        )


def normalize_url(url: str) -> str:
    """`host:port` or a URL -> `http://host:port` (no trailing slash)."""
    url = url.rstrip("/")
    return url if url.startswith(("http://", "https://")) else "http://" + url


@dataclass(frozen=True)
class ServerWait:
    """What `ServerConnection` tells its `on_wait` callback: `state` "waiting" (the server went away, or is still
    away) or "back"; `reason` (the client's words for the last failure, nothing the server sent), `waited_s` since
    it went away, `limit_s` the connection's `unavailable_timeout_s`."""

    state: str
    server: str  # "reward server" | "critic server"
    url: str  # without credentials (redact_url)
    reason: str
    waited_s: float
    limit_s: float

    @property
    def message(self) -> str:
        if self.state == "back":
            return f"{self.server} {self.url} is back after {_seconds(self.waited_s)}"
        if self.waited_s < 1:
            return f"waiting for {self.server} {self.url}: {self.reason}; retrying for up to {_seconds(self.limit_s)}"
        left = max(0.0, self.limit_s - self.waited_s)
        return (
            f"waiting for {self.server} {self.url}: {self.reason}; away for {_seconds(self.waited_s)}, retrying for "
            f"up to {_seconds(left)} more"
        )


def _seconds(value: float) -> str:
    """Tenths under 10 s, whole seconds from there (and for whole values): 0.5 s, 7.5 s, 1 s, 72 s, 600 s."""
    return f"{value:.1f} s" if value < 10 and value != int(value) else f"{value:.0f} s"


class ServerConnection:
    """One server's URL, an HTTP session, and the retry policy above (`request`) with `retry`'s timeouts and
    backoff (RetrySettings' defaults when None); shared by a client's threads.

    `server` and `command` name the server and what should run there, `error` is the client's error class and
    `unavailable_error` the one raised past `unavailable_timeout_s`, whose config key is `timeout_key`. `sleep` and
    `clock` (monotonic) are injectable for tests; the default sleep ends early on `close`, `stop_waiting` and when the
    program exits (`_end_waits_at_exit`).
    """

    def __init__(
        self,
        url: str,
        retry: RetrySettings | None = None,
        *,
        on_wait: Callable[[ServerWait], None] | None = None,
        server: str = "reward server",
        command: str = "aligner serve-reward",
        timeout_key: str = "reward.unavailable_timeout_s",
        error: type[RewardError] = RewardError,
        unavailable_error: type[ServerUnavailableError] = RewardServerUnavailableError,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url = normalize_url(url)
        self.shown = redact_url(self.url)  # how messages name it: a password in the URL stays out of every log
        retry = retry or RetrySettings()
        self.timeout_s, self.max_retries, self.backoff_s = retry.timeout_s, retry.max_retries, retry.backoff_s
        self.unavailable_timeout_s, self.max_backoff_s = retry.unavailable_timeout_s, retry.max_backoff_s
        self.on_wait, self.server, self.command, self.timeout_key = on_wait, server, command, timeout_key
        self.error, self.unavailable_error = error, unavailable_error
        self.session = requests.Session()
        self._closed, self._stopped = threading.Event(), threading.Event()
        self._wake = threading.Event()  # ends the default sleep early: set by `close` and `stop_waiting`
        self.sleep, self.clock = sleep or self._wake.wait, clock
        _end_waits_at_exit(self)
        self._lock = threading.Lock()
        self._away_since: float | None = None  # when the current outage began (None: the server is answering)
        self._reported_at = 0.0
        self.answered = False  # a request has succeeded: an unknown model is then one that is being reloaded

    @property
    def who(self) -> str:
        return f"{self.server} {self.shown}"

    def request(
        self,
        method: str,
        path: str,
        payload: dict | None = None,
        timeout_s: float | None = None,
        idempotent: bool = True,
    ) -> dict:
        """The server's JSON answer to one call, retried as the module's docstring says; failures raise `error`
        (or `unavailable_error`), naming the server and its URL."""
        what = f"{method} {path}"
        transient_failures = unavailable_failures = 0
        while True:
            kind, outcome = self._attempt(method, path, payload, timeout_s or self.timeout_s, idempotent)
            if kind == "ok":
                self._back()
                return outcome
            if kind in ("transient", "unknown"):
                transient_failures += 1
                if transient_failures > self.max_retries and kind == "unknown":
                    raise self.error(f"{self.who} refused the request ({what}: {outcome}; its log says why)")
                if transient_failures > self.max_retries:
                    raise self.error(
                        f"{self.who} cannot be reached ({what} failed {transient_failures} times; last error: "
                        f"{outcome}). Is `{self.command}` running there?"
                    )
                delay = self.backoff_s * 2 ** (transient_failures - 1)
            else:
                if self._stopped.is_set():
                    raise self._unavailable(f"stopped waiting for it: asked to stop ({what}; last error: {outcome})")
                waited, left = self._away(outcome)
                if left <= 0:
                    limit = f"{self.timeout_key} (now {self.unavailable_timeout_s:g} s)"
                    raise self._unavailable(
                        f"waited {_seconds(waited)} for it ({what}; last error: {outcome}). Is `{self.command}` "
                        f"running there? To wait longer, raise {limit}.",
                        waited,
                    )
                delay = min(self.backoff_s * 2**unavailable_failures, self.max_backoff_s, left)
                unavailable_failures += 1
            self.sleep(delay)
            if self._closed.is_set():
                raise self.error(f"{self.who}: the client was closed while {what} waited to be retried")

    def _unavailable(self, why: str, waited: float | None = None) -> ServerUnavailableError:
        if waited is None:
            with self._lock:
                waited = 0.0 if self._away_since is None else self.clock() - self._away_since
        message = f"{self.who} cannot be reached: {why}"
        return self.unavailable_error(message, server=self.server, url=self.shown, waited_s=waited)

    def _attempt(self, method: str, path: str, payload: dict | None, timeout_s: float, idempotent: bool):
        """("ok", answer), ("unavailable" | "transient" | "unknown", reason in words), or an error raised at once.
        "unknown": a model the server does not know, before it has answered us: retried like a transient failure
        (PyTriton's HTTP endpoint is up a moment before its models are), then refused."""
        what = f"{method} {path}"
        try:
            # No redirects: a Triton server sends none, and a redirect would send the request on to another address.
            response = self.session.request(
                method, f"{self.url}{path}", json=payload, timeout=timeout_s, allow_redirects=False
            )
        except requests.RequestException as err:
            if not idempotent and not _never_sent(err):
                raise self.error(
                    f"{self.who}: {what} failed ({_failure(err)}); not retried: it may have been applied"
                ) from None
            away = _away_reason(err, timeout_s)
            return ("unavailable", away) if away else ("transient", _failure(err))
        code = response.status_code
        if code < 300:
            answer = _json_object(response, self.who, what, self.error)
            self.answered = True
            return "ok", answer
        status = _status(code)
        text = _error_text(response)  # decides the retry; never shown
        bad_request = BAD_REQUEST in text
        if not bad_request and code in (400, 404):
            if any(phrase in text for phrase in MODEL_LOADING):
                return "unavailable", f"{status} (the model is loading)"
            if MODEL_UNKNOWN in text:
                return ("unavailable", f"{status} (the model is not loaded)") if self.answered else ("unknown", status)
        if code not in UNAVAILABLE_STATUS | TRANSIENT_STATUS or bad_request:
            why = "; the server blames the request" if bad_request else ""
            raise self.error(f"{self.who} refused the request ({what}: {status}{why}; its log says why)")
        if not idempotent and code not in (429, 503):
            raise self.error(f"{self.who}: {what} failed ({status}); not retried: it may have been applied")
        if code == 500 and not self._ready():
            # A Triton server that is stopping keeps taking requests for up to 30 s and fails each with 500 once its
            # Python side is gone (seen with PyTriton); its readiness says it is going away, not that the call is bad.
            return "unavailable", f"{status} (the server is not ready: stopping or starting)"
        return ("unavailable" if code in UNAVAILABLE_STATUS else "transient"), status

    def _ready(self) -> bool:
        """False when the server says it is not ready (KServe v2 `GET /v2/health/ready`: Triton answers 400 while it
        stops or starts, a proxy 503) or no longer answers; any other answer, a server without that endpoint
        included, counts as ready: its 500 is then the request's failure, not the server's absence."""
        try:
            response = self.session.get(f"{self.url}{READY_PATH}", timeout=READY_TIMEOUT_S, allow_redirects=False)
        except requests.RequestException:
            return False
        return response.status_code not in NOT_READY_STATUS

    def _notify(self, wait: ServerWait) -> None:
        if self.on_wait is not None:
            self.on_wait(wait)

    def _away(self, reason: str) -> tuple[float, float]:
        """A failure that says the server is away: (seconds since it went away, seconds left to wait). The first of
        an outage, and one a REPORT_INTERVAL_S after the last report, are reported."""
        now = self.clock()
        with self._lock:
            report = False
            if self._away_since is None:
                self._away_since = self._reported_at = now
                report = True
            elif now - self._reported_at >= REPORT_INTERVAL_S:
                self._reported_at, report = now, True
            waited = now - self._away_since
        left = self.unavailable_timeout_s - waited
        if report and left > 0:
            self._notify(ServerWait("waiting", self.server, self.shown, reason, waited, self.unavailable_timeout_s))
        return waited, left

    def _back(self) -> None:
        with self._lock:
            since, self._away_since = self._away_since, None
        if since is not None:
            waited = self.clock() - since
            self._notify(ServerWait("back", self.server, self.shown, "", waited, self.unavailable_timeout_s))

    def stop_waiting(self) -> None:
        """Wait no more for the server when it is away (the run was asked to stop): a request waiting, or finding it
        away from now on, raises `unavailable_error` at once."""
        self._stopped.set()
        self._wake.set()

    def close(self) -> None:
        """Close the session; requests waiting to be retried give up at once."""
        self._closed.set()
        self._wake.set()
        self.session.close()


def _end_waits_at_exit(connection: ServerConnection) -> None:
    """End `connection`'s waits when the program exits: its clients' worker threads are joined then (by
    concurrent.futures, through the threading module's exit hooks, which run before `atexit`'s), and a request waiting
    for a server that is away would hold the exit up for as long as `unavailable_timeout_s`. The hook holds the
    connection weakly, and runs before the executors' (the hooks run newest first)."""
    register = getattr(threading, "_register_atexit", None)  # CPython >= 3.9, as concurrent.futures uses it
    if register is None:
        return
    ref = weakref.ref(connection)

    def end_waits() -> None:
        if (alive := ref()) is not None:
            alive._closed.set()
            alive._wake.set()

    with contextlib.suppress(RuntimeError):  # the program is already exiting
        register(end_waits)


def _status(code: int) -> str:
    """`HTTP 500 Internal Server Error`: the standard phrase, not the reason the server sent with the code."""
    try:
        return f"HTTP {code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"HTTP {code}"


def _failure(err: requests.RequestException) -> str:
    """A failed request in words that hold nothing the server sent: when it cannot have reached the server, the
    system's reason; else only the kinds of error (a malformed status line or
    chunk would otherwise be quoted)."""
    if _never_sent(err):
        # The system's reason alone: urllib3's words around it repeat the address, which `who` already names.
        reasons = [e.strerror for e in _causes(err) if isinstance(e, OSError) and e.strerror]
        return f"{type(err).__name__}: {reasons[0]}" if reasons else type(err).__name__
    reason = getattr(err.args[0], "reason", None) if err.args else None
    return type(err).__name__ + (f" ({type(reason).__name__})" if isinstance(reason, BaseException) else "")


def _json_object(response: requests.Response, who: str, what: str, error: type[RewardError]) -> dict[str, Any]:
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise error(f"{who} answered {what} with something other than a JSON object")
    return answer


def int_field(answer: dict[str, Any], name: str, who: str, error: type[RewardError] = RewardError) -> int:
    """`answer[name]` (0 when absent): an int, or `error` that does not quote what the server sent instead."""
    value = answer.get(name) or 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{who} answered a {name} that is not an integer")
    return value


def _never_sent(err: requests.RequestException) -> bool:
    """True when the request cannot have reached the server: no connection was made."""
    if isinstance(err, requests.ConnectTimeout):
        return True
    from urllib3.exceptions import NewConnectionError

    reason = getattr(err.args[0], "reason", None) if err.args else None
    return isinstance(err, requests.ConnectionError) and isinstance(reason, NewConnectionError)


def _causes(err: BaseException) -> list[BaseException]:
    """`err` and the exceptions inside it (arguments, `reason`, cause and context), as urllib3 nests them."""
    found: list[BaseException] = []
    todo = [err]
    while todo and len(found) < 32:
        e = todo.pop()
        if any(e is f for f in found):
            continue
        found.append(e)
        todo += [a for a in e.args if isinstance(a, BaseException)]
        todo += [v for v in (getattr(e, "reason", None), e.__cause__, e.__context__) if isinstance(v, BaseException)]
    return found


def _away_reason(err: requests.RequestException, timeout_s: float) -> str | None:
    """The failure in words when it says the server is away (not there, or gone mid-request); else None."""
    if isinstance(err, requests.ConnectTimeout):
        return "connection timed out"
    if isinstance(err, requests.ReadTimeout):
        return f"no answer within {timeout_s:g} s"
    causes = _causes(err)
    if any(isinstance(e, ConnectionRefusedError) for e in causes):
        return "connection refused"
    if _never_sent(err):
        return "cannot connect"
    if any(isinstance(e, ConnectionResetError | ConnectionAbortedError | BrokenPipeError) for e in causes):
        return "connection reset"
    return None


def _error_text(response: requests.Response) -> str:
    """The error a server sent, to look for BAD_REQUEST in (never to show)."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    return str(body.get("error", "")) if isinstance(body, dict) else ""


class PooledClient:
    """What the reward and critic clients share: a `connection` (ServerConnection), and a `pool` of requests and a
    `chunk_pool` of the chunks they split into, both ended by `close`."""

    connection: ServerConnection
    pool: ThreadPoolExecutor
    chunk_pool: ThreadPoolExecutor

    def stop_waiting(self) -> None:
        """Requests waiting for the server (away) give up now: the run was asked to stop."""
        self.connection.stop_waiting()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.chunk_pool.shutdown(wait=False, cancel_futures=True)
        self.connection.close()
