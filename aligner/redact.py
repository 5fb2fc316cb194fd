"""What a message may say about a server: its URL without credentials, and names in place of known secrets.

    redact_url("http://user:secret@rm.internal:8000/v2?token=x")   ->  "http://rm.internal:8000/v2"
    Redactor({"/srv/models/sft-7b": "<model sft-7b>"}).text("cannot load /srv/models/sft-7b/config.json")
                                                                   ->  "cannot load <model sft-7b>/config.json"

The reward and critic clients name their server with `redact_url` (aligner/rewards/http.py), so train.log, a job's
error and its events never hold a password from a URL. The service replaces what else it knows to be its own (the
catalogue's folders, URLs and function targets, its data folder, its database's password) with names before
anything reaches a user: `webapp.db.service_redactor` builds a `Redactor` of those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """`url` without its user, password, query and fragment (a query may carry a token); text that does not parse
    as a URL with a host is returned with anything before an `@` dropped."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        host, port = None, None
    if not host:
        return url.rpartition("@")[2]
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def url_secrets(url: str) -> list[str]:
    """The spellings of `url`'s credentials that a message could carry: `user:password@` and the password (when it
    is long enough not to be an ordinary word), raw and percent-decoded."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return []
    found = []
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if userinfo:
        found.append(userinfo + "@")
    for secret in (password, unquote(password or "")):
        if secret and len(secret) >= 6:
            found.append(secret)
    if user and password is None and len(user) >= 6:  # a bare token as the user part
        found.append(user)
    return found


class Redactor:
    """Replaces each known secret (a key of `names`) with its name, longest first, in text and in JSON-like values
    (dicts, lists, tuples: their strings, keys included)."""

    def __init__(self, names: Mapping[str, str]):
        self.names = sorted(((k, v) for k, v in names.items() if k), key=lambda item: -len(item[0]))

    def text(self, text: str) -> str:
        for secret, name in self.names:
            if secret in text:
                text = text.replace(secret, name)
        return text

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.value(v) for v in value)
        return value
