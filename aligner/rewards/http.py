"""`RemoteRewardClient`: the trainer's client of a reward server speaking Triton's HTTP/KServe-v2 protocol.

    reward: {server_url: http://127.0.0.1:8000}        # in an `aligner train` config

It sends `prompts` and `responses` (BYTES, plus `metadata` as JSON) to `aligner serve-reward`; with
`sentences_only=True` it sends NeMo-Aligner's single `sentences` input (prompt + response) instead, which any
NeMo-Aligner-compatible reward server understands. Scoring is asynchronous (`submit` returns a future, so the
trainer computes log-probs meanwhile), requests larger than the server's `max_batch_size` are split (Triton
rejects them otherwise) and sent concurrently, each with a timeout and bounded retries with exponential backoff.
An unreachable server is a `RewardError` naming the URL.
"""

from __future__ import annotations

import time

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
    `server` and its URL, and the `command` that should be running there when it cannot be reached.
    """
    url = f"{base_url}{path}"
    last = None
    for attempt in range(max_retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            response = session.request(method, url, json=payload, timeout=timeout_s)
        except requests.RequestException as err:
            last = f"{type(err).__name__}: {err}"
            if not idempotent and not _never_sent(err):
                raise error(
                    f"{server} {base_url}: {method} {path} failed ({last}); not retried: it may have been applied"
                ) from None
            continue
        if response.status_code < 400:
            return response.json()
        text = _error_text(response)
        if response.status_code not in RETRY_STATUS or BAD_REQUEST in text:
            raise error(f"{server} {base_url} refused the request: {text}")
        last = f"HTTP {response.status_code}: {text}"
        if not idempotent and response.status_code not in (429, 503):
            raise error(f"{server} {base_url}: {method} {path} failed ({last}); not retried: it may have been applied")
    raise error(
        f"{server} {base_url} cannot be reached ({method} {path} failed {max_retries + 1} times; "
        f"last error: {last}). Is `{command}` running there?"
    )


def _never_sent(err: requests.RequestException) -> bool:
    """True when the request cannot have reached the server: no connection was made."""
    if isinstance(err, requests.ConnectTimeout):
        return True
    from urllib3.exceptions import NewConnectionError

    reason = getattr(err.args[0], "reason", None) if err.args else None
    return isinstance(err, requests.ConnectionError) and isinstance(reason, NewConnectionError)


def _error_text(response: requests.Response) -> str:
    try:
        text = str(response.json().get("error", response.text))
    except ValueError:
        return response.text.strip()[:500]
    if BAD_REQUEST in text:  # the reason, not the whole server-side traceback around it
        return text[text.index(BAD_REQUEST) :].split("\n", 1)[0]
    return text
