"""The dashboard's client of the REST API: requests as one user, refusals as ApiError, the SSE event stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from aligner.errors import AlignerError

TIMEOUT_S = 10
UPLOAD_TIMEOUT_S = 60
REJECTED = "token rejected: sign in again"


class ApiError(AlignerError, RuntimeError):
    """A refused or failed request: `status` (0: unreachable), the API's message and its per-field errors."""

    def __init__(self, status: int, message: str, errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors or {}

    @property
    def rejected(self) -> bool:
        """The token is no good (wrong, expired or revoked): asking again with it only counts as a failed sign-in,
        and enough of those get the address's failed attempts refused (429)."""
        return self.status == 401

    def describe(self) -> str:
        """The message, then each field's reasons (those that only repeat the message left out), as Markdown."""
        lines = [self.message]
        for field, reasons in self.errors.items():
            for reason in reasons if isinstance(reasons, list) else [reasons]:
                if reason != self.message:
                    lines.append(f"- `{field}`: {reason}")
        return "\n".join(lines)


class Api:
    """The REST API at `base_url` (e.g. http://127.0.0.1:5000) as one user (`token`), for the browser whose
    `X-Forwarded-For` chain is `forwarded_for` (the API heeds it only when it trusts the dashboard as a proxy:
    ALIGNER_TRUSTED_PROXIES, docs/security.md)."""

    def __init__(self, base_url: str, token: str, forwarded_for: str | None = None):
        self.base = base_url.rstrip("/") + "/api/v1"
        self.headers = {"Authorization": f"Bearer {token}"}
        if forwarded_for:
            self.headers["X-Forwarded-For"] = forwarded_for

    def request(self, method: str, path: str, timeout: float = TIMEOUT_S, **kwargs) -> requests.Response:
        try:
            response = requests.request(method, self.base + path, headers=self.headers, timeout=timeout, **kwargs)
        except requests.RequestException as err:
            raise ApiError(0, f"the API at {self.base} cannot be reached: {err}") from None
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {}
            message = body.get("message") if isinstance(body, dict) else None
            errors = body.get("errors") if isinstance(body, dict) else None
            raise ApiError(response.status_code, message or response.text[:300] or response.reason, errors)
        return response

    def get(self, path: str, **params) -> Any:
        return self.request("GET", path, params=params).json()

    def post(self, path: str, body: dict | None = None, timeout: float = TIMEOUT_S, **params) -> Any:
        return self.request("POST", path, timeout=timeout, json=body, params=params or None).json()

    def upload(self, path: str, file_path: str, name: str) -> Any:
        """POST a file as the multipart field `file`, named `name` (the dataset upload)."""
        with open(file_path, "rb") as f:
            return self.request("POST", path, timeout=UPLOAD_TIMEOUT_S, files={"file": (name, f)}).json()

    def patch(self, path: str, body: dict) -> Any:
        return self.request("PATCH", path, json=body).json()

    def delete(self, path: str) -> None:
        self.request("DELETE", path)

    def get_all(self, path: str, pages: int = 20, **params) -> list[dict]:
        """The items of a paged list (100 a page, at most `pages` pages)."""
        items: list[dict] = []
        for page in range(1, pages + 1):
            body = self.get(path, per_page=100, page=page, **params)
            items += body["items"]
            if len(items) >= body["total"] or not body["items"]:
                break
        return items

    def download(self, path: str, target: Path) -> Path:
        """A file the API sends (a zip), written to `target`."""
        response = self.request("GET", path, stream=True)
        with target.open("wb") as f:
            for chunk in response.iter_content(1 << 20):
                f.write(chunk)
        return target

    def events(self, job_id: int, after: int = 0, batches: int = 20) -> list[dict]:
        """The job's events after event id `after` (the SSE stream read with timeout=0, 500 events a batch)."""
        events: list[dict] = []
        last = after
        for _ in range(batches):
            text = self.request("GET", f"/jobs/{job_id}/events", params={"timeout": 0, "last_event_id": last}).text
            batch = parse_sse(text)
            events += batch
            if len(batch) < 500:
                break
            last = batch[-1]["id"]
        return events


def parse_sse(text: str) -> list[dict]:
    """Server-Sent Events text -> [{"id", "kind", "data", "created_at"}] (comments and the retry field skipped;
    created_at only where the event has one)."""
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                key, _, value = line.partition(":")
                fields[key] = value.removeprefix(" ")
        if "data" in fields:
            try:
                data = json.loads(fields["data"])
            except ValueError:
                data = fields["data"]
            event = {"id": int(fields.get("id", 0)), "kind": fields.get("event", "message"), "data": data}
            if fields.get("created_at"):
                event["created_at"] = fields["created_at"]
            events.append(event)
    return events
