"""An `aligner serve-reward` / `serve-critic` subprocess on free loopback ports, for the server tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from aligner.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90


class ServerProcess:
    """`aligner <command> --port P <args>` in a session of its own; ready when every model in `models` is, or with
    no `models` when Triton's /v2/health/ready says so (what a client that knows no model names waits for)."""

    def __init__(self, command: str, args: list[str], models: tuple[str, ...]):
        self.port = free_port(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 - lives with the server
        cmd = [sys.executable, "-m", "aligner.cli", command, "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            if all(self._ready(m) for m in models) if models else self._ready(None):
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not ready after {START_TIMEOUT_S} s:\n{self.output()}")

    def _ready(self, model: str | None) -> bool:
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        try:
            return requests.get(self.url + path, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def stop(self, sig=signal.SIGTERM, timeout=60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode
