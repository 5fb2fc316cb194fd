"""aligner/redact.py, and the reward and critic clients naming their server without its credentials."""

from __future__ import annotations

import socket

import pytest

from aligner.errors import ServerUnavailableError
from aligner.redact import Redactor, redact_url, url_secrets
from aligner.rewards.critic_client import RemoteCriticClient
from aligner.rewards.http import RetrySettings
from aligner.rewards.remote import RemoteRewardClient


def test_redact_url_drops_user_password_query_and_fragment():
    assert redact_url("http://user:s3cret@rm.internal:8000/v2?token=abc#x") == "http://rm.internal:8000/v2"
    assert redact_url("https://tok@host") == "https://host"
    assert redact_url("http://[::1]:9/") == "http://[::1]:9/"
    assert redact_url("not a url with a user:pw@inside") == "inside"
    assert redact_url("http://[::1") == "http://[::1"  # unparsable and no credentials: unchanged


def test_url_secrets_and_the_redactor_replace_longest_first():
    assert url_secrets("http://user:s3cret%21@h:1") == ["user:s3cret%21@", "s3cret%21", "s3cret!"]
    redactor = Redactor({"/srv/models": "<models>", "/srv/models/sft": "<model sft>", "": "never"})
    assert redactor.value({"m": ["at /srv/models/sft/config.json", 3]}) == {"m": ["at <model sft>/config.json", 3]}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("client", [RemoteRewardClient, RemoteCriticClient])
def test_a_server_that_cannot_be_reached_is_named_without_its_credentials(client):
    url = f"http://alice:pa55word-xyz@127.0.0.1:{_closed_port()}"
    waits = []
    retry = RetrySettings(timeout_s=1, max_retries=0, backoff_s=0.01, unavailable_timeout_s=0.05)
    with pytest.raises(ServerUnavailableError) as raised:
        client(url, retry=retry, on_wait=waits.append)
    said = [str(raised.value), raised.value.url, *(w.message for w in waits), *(w.url for w in waits)]
    assert waits and all("pa55word" not in text and "alice" not in text for text in said), said
    assert f"http://127.0.0.1:{url.rsplit(':', 1)[1]}" in str(raised.value)
