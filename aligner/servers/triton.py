"""The Triton plumbing both servers share: where a PyTriton server listens, how it starts and stops, bad requests.

`run_triton` binds a server's models with PyTriton and serves them until SIGTERM, Ctrl-C or `stop`; the workspace of
a server that was SIGKILLed is removed at the next start. A model function raises `BadRequest` for a request the
caller got wrong: PyTriton answers it with HTTP 500, and the message's `BAD_REQUEST` prefix tells the clients
(aligner/rewards/http.py) not to retry it. Used by aligner/servers/reward_server.py and critic_server.py.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from aligner.config import Section
from aligner.errors import AlignerError
from aligner.processes import LOOPBACK
from aligner.rewards.http import BAD_REQUEST

WORKSPACE_PREFIX = "aligner-triton-"
# The `max_batch_size` the servers declare to Triton for their batched models. Triton refuses a larger request and
# NeMo-Aligner's clients never split a batch (NeMo's own servers declare 9999999): the servers accept any size and
# split into their configured forward batch inside.
DECLARED_MAX_BATCH_SIZE = 9_999_999
# How long a stopping Triton waits for in-flight requests and open connections. Its default, 30 s, is spent in full
# whenever a client keeps an idle keep-alive connection open (as `requests` sessions do): every stop took 30 s.
EXIT_TIMEOUT_S = 5


class BadRequest(AlignerError, ValueError):
    """A request the server cannot serve; the message says why.

    PyTriton answers every exception of a model's function with HTTP 500; the message's `BAD_REQUEST` prefix tells
    the clients (`aligner.rewards.http.ServerConnection`) it is the caller's fault: never retried. The clients do not
    show the message (they show nothing a server sends): the server's log has it.
    """

    def __init__(self, reason: str):
        super().__init__(BAD_REQUEST + reason)


class TritonEndpointConfig(Section):
    """Where a PyTriton server listens and how long it waits to batch: what `run_triton` reads (reward and critic)."""

    host: str = Field(LOOPBACK, description="Address to listen on (0.0.0.0 for every interface).")
    http_port: int = Field(8000, ge=1, le=65535)
    grpc_port: int | None = Field(None, ge=1, le=65535, description="Default: http_port + 1.")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="Prometheus metrics; default: http_port + 2.")
    max_queue_delay_us: int = Field(2000, ge=0, description="How long Triton waits to fill a batch (microseconds).")


def decode_text(name: str, values: np.ndarray) -> list[str]:
    out = []
    for i, value in enumerate(values.reshape(-1)):
        if isinstance(value, bytes | np.bytes_):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError as err:
                raise BadRequest(f"{name}[{i}] is not valid UTF-8 ({err.reason} at byte {err.start})") from None
        out.append(str(value))
    return out


# ------------------------------------------------------------------------------------------------- serving
def remove_stale_workspaces(root: Path) -> None:
    """Workspaces of servers that died without cleaning up (SIGKILL): their pid is part of the folder name."""
    for folder in root.glob(WORKSPACE_PREFIX + "*"):
        try:
            pid = int(folder.name.removeprefix(WORKSPACE_PREFIX).split("-")[0])
        except ValueError:
            continue
        if not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fix_triton_python_stub() -> None:
    """Triton's Python backend stub must load this interpreter's libpython: with the system's (another patch release)
    the models fail to load (`'_thread.RLock' object has no attribute '_recursion_count'`)."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir and libdir not in current.split(":"):
        os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{current}" if current else libdir


def run_triton(
    config: TritonEndpointConfig, bind: Callable[[Any], None], what: str, detail: str, ready=None, stop=None
) -> None:
    """Serve Triton with the models `bind(triton)` binds until SIGTERM/SIGINT (or `stop` is set).

    `config`'s `grpc_port` and `metrics_port` default to the ports after `http_port`;
    `what` names the server in its messages ("reward server"), `detail` goes into the ready line; `ready` is set
    once Triton answers. The workspace is removed at the end, and stale ones of dead servers at the start.
    """
    from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy

    _fix_triton_python_stub()
    tmp_root = Path(tempfile.gettempdir())
    remove_stale_workspaces(tmp_root)
    workspace = tmp_root / f"{WORKSPACE_PREFIX}{os.getpid()}-{time.time_ns()}"  # PyTriton creates it
    grpc_port = config.grpc_port or config.http_port + 1
    metrics_port = config.metrics_port or config.http_port + 2
    triton_config = TritonConfig(
        http_address=config.host,
        http_port=config.http_port,
        grpc_address=config.host,
        grpc_port=grpc_port,
        metrics_address=config.host,
        metrics_port=metrics_port,
        exit_on_error=True,
        exit_timeout_secs=EXIT_TIMEOUT_S,
        log_verbose=0,
    )
    stop = stop or threading.Event()
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            handlers[sig] = signal.signal(sig, lambda *_: stop.set())
    started = time.perf_counter()
    try:
        # Triton starts only after the models are bound, and loads them before it opens its ports: with the default
        # policy it starts empty and answers /v2/health/ready with 200 while an inference still gets 404.
        policy = TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True)
        with Triton(config=triton_config, workspace=workspace, triton_lifecycle_policy=policy) as triton:
            bind(triton)
            triton.run()
            # The startup's objects (about 440,000: torch, transformers, PyTriton) out of every later collection: a
            # full collection over them took 0.3 s, and PyTriton's teardown and the interpreter's exit ran enough of
            # them that a SIGTERM took 8-13 s to stop the server instead of 4.
            gc.freeze()
            url = f"http://{config.host}:{config.http_port}"
            print(
                f"{what} ready in {time.perf_counter() - started:.1f} s: {url} ({detail}; "
                f"gRPC {config.host}:{grpc_port}; metrics http://{config.host}:{metrics_port}/metrics)",
                file=sys.stderr,
                flush=True,
            )
            if ready is not None:
                ready.set()
            while not stop.wait(0.5):
                if not triton.is_alive():
                    raise RuntimeError("the Triton server process died; see its log above")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        shutil.rmtree(workspace, ignore_errors=True)
        print(f"{what} stopped", file=sys.stderr, flush=True)


def require_pytriton(what: str) -> None:
    try:
        import pytriton.triton  # noqa: F401
    except ImportError as err:
        raise RuntimeError(f"the {what} needs NVIDIA PyTriton: pip install 'aligner[serve]' ({err})") from None
