"""A critic server started by a training run or the worker: launch it, wait until its models are ready, stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from aligner.errors import ServerStartError
from aligner.processes import die_with_parent, free_port, signal_group

CRITIC_MODELS = ("critic_infer", "critic_train", "critic_save")  # what the critic server binds, in this order


def _critic_dies_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # SIGTERM, not SIGKILL: the server then stops Triton and removes its workspace.
    die_with_parent(signal.SIGTERM)


def launch_critic_server(
    model_path: str | Path,
    log_path: str | Path,
    port: int | None = None,
    checkpoint: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    timeout_s: float = 180.0,
) -> tuple[subprocess.Popen, str]:
    """Start `aligner serve-critic` in its own process group and wait until Triton is ready: (process, URL).

    Output goes to `log_path`. `checkpoint` (a critic_save path) restores the critic for an exact resume.
    """
    port = port or free_port(3)
    cmd = [sys.executable, "-m", "aligner.cli", "serve-critic", "--model", str(model_path), "--port", str(port)]
    if checkpoint:
        cmd += ["--checkpoint", str(checkpoint)]
    for item in overrides:
        cmd += ["--set", item]
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ,
            preexec_fn=_critic_dies_with_parent,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"the critic server exited with status {proc.returncode}; see {log_path}")
        with contextlib.suppress(requests.RequestException):
            # Triton reports itself ready before PyTriton has bound the models: wait for each of them.
            if all(requests.get(f"{url}/v2/models/{m}/ready", timeout=2).status_code == 200 for m in CRITIC_MODELS):
                return proc, url
        time.sleep(0.3)
    stop_server(proc)
    raise ServerStartError(f"the critic server was not ready after {timeout_s:.0f} s; see {log_path}")


def stop_server(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the server, then SIGKILL its whole process group (Triton and its stubs) after at most `grace_s`.

    Only the main process gets the SIGTERM: it stops Triton, which ends the model stubs in a few seconds; a SIGTERM
    to the whole group also hits the stubs first, and PyTriton then waits out its full timeout for them.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    signal_group(proc, signal.SIGKILL)
    proc.wait()
