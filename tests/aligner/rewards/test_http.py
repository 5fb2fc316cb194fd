"""aligner/rewards/http.py and its clients against a local HTTP server that answers badly: nothing the server sends
reaches an error message (a job's error is its trainer's last lines, where these messages end up)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from aligner.errors import CriticError, RewardError
from aligner.rewards.critic_client import RemoteCriticClient
from aligner.rewards.http import BAD_REQUEST, RetrySettings
from aligner.rewards.remote import RemoteRewardClient

SECRET = "SECRET-BODY"
# mode -> (status, body) of every answer; "garbage" answers no HTTP at all. A config that clients accept, for the
# modes whose inferences are what goes wrong.
ANSWERS = {
    "500-text": (500, SECRET),
    "500-bad-request": (500, json.dumps({"error": f"{BAD_REQUEST}{SECRET}"})),
    "404": (404, json.dumps({"error": SECRET})),
    "redirect": (302, ""),
    "200-not-json": (200, SECRET),
    "200-config-strings": (200, json.dumps({"max_batch_size": SECRET})),
    "garbage": (None, f"{SECRET} 42\r\n\r\n"),
}
CONFIG = json.dumps({"max_batch_size": 0, "output": [{"name": "values"}, {"name": "rewards"}]})
INFERENCE = json.dumps({"outputs": [{"name": n, "data": [SECRET]} for n in ("values", "rewards")]})


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.answer(*(ANSWERS.get(self.server.mode) or (200, CONFIG)))

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(*(ANSWERS.get(self.server.mode) or (200, INFERENCE)))

    def answer(self, status, body):
        if status is None:  # the client cannot parse the status line, and would quote it
            self.wfile.write(body.encode())
            return
        self.send_response(status, SECRET)  # the reason phrase is the server's too
        if status == 302:
            self.send_header("Location", f"http://{SECRET}.invalid/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def raised(error, call, *args, **kwargs) -> str:
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize("mode", ANSWERS)
def test_errors_hold_nothing_the_server_sent(server, mode):
    server.mode = mode
    for client, error in ((RemoteRewardClient, RewardError), (RemoteCriticClient, CriticError)):
        message = raised(error, client, server.url, retry=RetrySettings(timeout_s=5, max_retries=1, backoff_s=0.01))
        assert SECRET.lower() not in message.lower() and server.url in message, message  # hosts come lowercased
    if mode == "500-text":
        assert "HTTP 500 Internal Server Error" in message


def test_answers_that_are_not_numbers_are_not_quoted(server):
    server.mode = "inference"
    retry = RetrySettings(timeout_s=5, max_retries=1)
    rewards = RemoteRewardClient(server.url, retry=retry)
    critic = RemoteCriticClient(server.url, retry=retry)
    message = raised(RewardError, rewards.score, ["p"], ["r"])
    assert message.endswith("non-finite or non-numeric reward for sample 0: a str"), message
    message = raised(CriticError, lambda: critic.infer(np.ones((1, 1)), [1]).result(timeout=10))
    assert message.endswith("returned non-numeric values"), message
    rewards.close()
    critic.close()
