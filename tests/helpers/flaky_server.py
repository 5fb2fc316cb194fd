"""A fake Triton server (HTTP/KServe v2) of a reward model and a critic, in a thread, that can go away and come back:
what the clients' waiting (aligner/rewards/http.py) is tested against, in milliseconds.

    server = FlakyServer()
    server.fail("503", times=2)        # the next 2 requests answer 503, then it serves again
    server.stop(); server.start()      # the port closes (connection refused), then opens again
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers.rewards import varied_reward

# mode -> (status, error) of a failed request; "reset" closes the connection without an answer.
FAILURES = {
    "502": (502, "no upstream"),
    "503": (503, "unavailable"),
    "504": (504, "upstream timed out"),
    "loading": (404, "Request for unknown model: 'reward_model' has no available versions"),
    "unknown": (404, "Request for unknown model: 'reward_model' is not found"),
    "400": (400, "unexpected inference input 'SECRET'"),
    "500": (500, "SECRET"),
    "reset": (None, ""),
}


class FlakyServer:
    def __init__(self, max_batch_size: int = 0):
        self.max_batch_size = max_batch_size
        self.port = 0
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request that reached the server
        self.on_request = None  # called with the number of each request (from 1) as it arrives
        self._failures: list[str | None] = []  # modes of the next requests, in order (None: served)
        self._failing: str | None = None  # the mode of every request after those, until `recover`
        self.ready = True  # what GET /v2/health/ready says (False: a server that is stopping or starting)
        self._lock = threading.Lock()
        self.httpd: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again, on the same port)."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        """Close the port: connections are refused until `start`."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def fail(self, mode: str, times: int | None = 1, after: int = 0) -> None:
        """The next `times` requests fail as `mode` (FAILURES), once `after` more requests were served (counted
        after those already planned); `times` None: every request from then on, until `recover`."""
        with self._lock:
            self._failures += [None] * after
            if times is None:
                self._failing = mode
            else:
                self._failures += [mode] * times

    def recover(self) -> None:
        with self._lock:
            self._failures, self._failing = [], None
            self.ready = True

    def _next_failure(self) -> str | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else self._failing

    def answer(self, method: str, path: str, body: dict | None) -> dict:
        model, _, action = path.removeprefix("/v2/models/").partition("/")
        if method == "GET":
            config = {"max_batch_size": self.max_batch_size}
            return {**config, "output": [{"name": "values"}]} if model == "critic_infer" else config
        inputs = {i["name"]: i for i in (body or {}).get("inputs", [])}
        if model == "reward_model":
            rewards = varied_reward(inputs["prompts"]["data"], inputs["responses"]["data"])
            return {"outputs": [{"name": "rewards", "shape": [len(rewards), 1], "datatype": "FP32", "data": rewards}]}
        rows, width = inputs["tokens"]["shape"]
        if model == "critic_infer":
            return {"outputs": [{"name": "values", "shape": [rows, width], "data": [0.25] * (rows * width)}]}
        if model == "critic_train":
            return {"outputs": [{"name": "loss", "shape": [rows, 1], "data": [0.5] * rows}]}
        raise ValueError(f"no model {model} ({action})")


def _handler(server: FlakyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.handle_request("GET", None)

        def do_POST(self):  # noqa: N802
            self.handle_request("POST", json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))

        def handle_request(self, method: str, body: dict | None) -> None:
            if self.path == "/v2/health/ready":  # what a client asks after a 500: not one of the counted requests
                self.send(200 if server.ready else 400, {})
                return
            server.requests.append((method, self.path))
            if server.on_request is not None:
                server.on_request(len(server.requests))
            mode = server._next_failure()
            if mode == "reset":
                self.close_connection = True  # closed without an answer
                return
            if mode is not None:
                status, error = FAILURES[mode]
                self.send(status, {"error": error})
            else:
                self.send(200, server.answer(method, self.path, body))

        def send(self, status: int, answer: dict) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler


class FakeTime:
    """A monotonic clock that only `sleep` moves, and the sleeps asked for; `on_sleep(n, fn)` runs `fn` at the
    n-th sleep (from 1), e.g. to bring a server back."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []
        self._hooks: dict[int, list] = {}

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        for fn in self._hooks.pop(len(self.sleeps), []):
            fn()

    def on_sleep(self, n: int, fn) -> None:
        self._hooks.setdefault(n, []).append(fn)
