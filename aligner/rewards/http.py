"""`RemoteRewardClient`: the trainer's client of a reward server speaking Triton's HTTP/KServe-v2 protocol.

    reward: {server_url: http://127.0.0.1:8000}        # in an `aligner train` config

It sends `prompts` and `responses` (BYTES, plus `metadata` as JSON) to `aligner serve-reward`; with
`sentences_only=True` it sends NeMo-Aligner's single `sentences` input (prompt + response) instead, which any
NeMo-Aligner-compatible reward server understands. Scoring is asynchronous (`submit` returns a future, so the
trainer computes log-probs meanwhile), requests larger than the server's `max_batch_size` are split (Triton
rejects them otherwise) and sent concurrently, each with a timeout and bounded retries with exponential backoff.
An unreachable server is a `RewardError` naming the URL.

Nothing a server sends reaches an error message (nor, through it, train.log and a job's error): a job may point its
client at any URL, and the start of another service's answer could be a secret. Errors say the HTTP status (with
its standard phrase, not the server's), or the kind of connection failure; a server's own log says why it refused.
"""

from __future__ import annotations

import time
from http import HTTPStatus
from typing import Any

import requests

from aligner.errors import RewardError

RETRY_STATUS = {429, 500, 502, 503, 504}
BAD_REQUEST = "bad request: "  # starts the message of an error a server blames on the request


def normalize_url(url: str) -> str:
    """`host:port` or a URL -> `http://host:port` (no trailing slash)."""
    url = url.rstrip("/")
    return url if url.startswith(("http://", "https://")) else "http://" + url


def request_json(
    session: requests.Session,
    base_url: str,
    method: str,
    path: str,
    payload: dict | None,
    timeout_s: float,
    max_retries: int,
    backoff_s: float,
    server: str = "reward server",
    command: str = "aligner serve-reward",
    error: type[RewardError] = RewardError,
    idempotent: bool = True,
) -> dict:
    """One call with retries on connection errors, timeouts and 5xx; a 4xx is the caller's fault: no retry.

    A 5xx whose error holds BAD_REQUEST is the caller's fault too: Triton answers 500 to any error raised by a model's
    Python function, so the servers mark the bad requests they detect. A request that is not `idempotent` (a training
    step) is retried only when it cannot have reached the server, or on 429/503. Failures raise `error`, naming the
    `server` and its URL, the status or the kind of failure (nothing of what the server sent), and the `command` that
    should be running there when it cannot be reached. A redirect (3xx) is refused, as is an answer that is not a
    JSON object.
    """
    url = f"{base_url}{path}"
    last = None
    for attempt in range(max_retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            # No redirects: a Triton server sends none, and a redirect would send the request on to another address.
            response = session.request(method, url, json=payload, timeout=timeout_s, allow_redirects=False)
        except requests.RequestException as err:
            last = _failure(err)
            if not idempotent and not _never_sent(err):
                raise error(
                    f"{server} {base_url}: {method} {path} failed ({last}); not retried: it may have been applied"
                ) from None
            continue
        if response.status_code < 300:
            return _json_object(response, f"{server} {base_url}", f"{method} {path}", error)
        status = _status(response.status_code)
        bad_request = BAD_REQUEST in _error_text(response)  # decides the retry; never shown
        if response.status_code not in RETRY_STATUS or bad_request:
            why = "; the server blames the request" if bad_request else ""
            raise error(f"{server} {base_url} refused the request ({method} {path}: {status}{why}; its log says why)")
        last = status
        if not idempotent and response.status_code not in (429, 503):
            raise error(f"{server} {base_url}: {method} {path} failed ({last}); not retried: it may have been applied")
    raise error(
        f"{server} {base_url} cannot be reached ({method} {path} failed {max_retries + 1} times; "
        f"last error: {last}). Is `{command}` running there?"
    )


def _status(code: int) -> str:
    """`HTTP 500 Internal Server Error`: the standard phrase, not the reason the server sent with the code."""
    try:
        return f"HTTP {code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"HTTP {code}"


def _failure(err: requests.RequestException) -> str:
    """A failed request in words that hold nothing the server sent: when it cannot have reached the server, the
    error itself (the address and the system's reason); else only the kinds of error (a malformed status line or
    chunk would otherwise be quoted)."""
    if _never_sent(err):
        return f"{type(err).__name__}: {err}"
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


def outputs_by_name(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A KServe v2 answer's outputs by name; malformed entries are left out (the caller says what is missing)."""
    outputs = answer.get("outputs")
    if not isinstance(outputs, list):
        return {}
    return {o["name"]: o for o in outputs if isinstance(o, dict) and isinstance(o.get("name"), str)}


def _error_text(response: requests.Response) -> str:
    """The error a server sent, to look for BAD_REQUEST in (never to show)."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    return str(body.get("error", "")) if isinstance(body, dict) else ""
