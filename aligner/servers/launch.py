"""A critic server started by a training run or the worker: launch it, wait until its models are ready, stop it;
and the `--set` items a job may give the one its worker starts (`check_critic_overrides`, no torch: the API uses it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from aligner.errors import ConfigError, ServerStartError
from aligner.processes import LOOPBACK, die_with_parent, free_port, signal_group

CRITIC_MODELS = ("critic_infer", "critic_train", "critic_save")  # what the critic server binds, in this order

# CriticServerConfig fields a job's `critic.server_overrides` may set on the critic server its worker starts: how the
# critic learns and batches. Never where it listens (host, ports), what it loads (model_path, checkpoint), where it
# writes (save_root), nor the device: those are the worker's. num_threads only up to the host's cores.
SAFE_CRITIC_OVERRIDES = frozenset(
    {
        "reward_mean",
        "reward_std",
        "combine_rm_and_critic_server",
        "loss_clip_val",
        "lr",
        "weight_decay",
        "betas",
        "eps",
        "max_grad_norm",
        "micro_batch_size",
        "batch_size",
        "max_batch_size",
        "train_max_batch_size",
        "dynamic_batching",
        "max_queue_delay_us",
        "num_threads",
    }
)


def check_critic_overrides(items: list[str]) -> list[str]:
    """A job's `critic.server_overrides`, checked against SAFE_CRITIC_OVERRIDES: the items as `key=value` (key
    stripped), or a ConfigError naming the refused key and the keys allowed. The values' types are the server's to
    check when it starts; num_threads is bounded here (from 1 to this host's cores), as a job could otherwise start
    any number of threads."""
    checked = []
    for item in items:
        key, sep, value = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"critic.server_overrides: {item!r} is not of the form key=value (e.g. lr=1e-5)")
        if key not in SAFE_CRITIC_OVERRIDES:
            raise ConfigError(
                f"critic.server_overrides: {key!r} cannot be set by a job; allowed: "
                f"{', '.join(sorted(SAFE_CRITIC_OVERRIDES))}"
            )
        if key == "num_threads":
            cores = os.cpu_count() or 1
            try:
                threads = int(value)
            except ValueError:
                threads = 0
            if not 1 <= threads <= cores:
                raise ConfigError(
                    f"critic.server_overrides: num_threads must be an integer from 1 to {cores} (this host's cores); "
                    f"got {value.strip()!r}"
                )
        checked.append(f"{key}={value}")
    return checked


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
    env: dict[str, str] | None = None,
    save_root: str | Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start `aligner serve-critic` in its own process group and wait until Triton is ready: (process, URL).

    Output goes to `log_path`. `checkpoint` (a critic_save path) restores the critic for an exact resume. `env`: the
    server's whole environment (default: this process's). `save_root`: the only folder critic_save may write in
    (and the checkpoint must lie in). The server listens on 127.0.0.1 whatever `overrides` say.
    """
    port = port or free_port(3)
    cmd = [sys.executable, "-m", "aligner.cli", "serve-critic", "--model", str(model_path), "--port", str(port)]
    if checkpoint:
        cmd += ["--checkpoint", str(checkpoint)]
    for item in overrides:
        cmd += ["--set", item]
    # After the caller's items, so that none of them can move these: the last --set of a key wins.
    cmd += ["--set", f"host={LOOPBACK}"]
    if save_root is not None:
        cmd += ["--set", f"save_root={save_root}"]
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ if env is None else env,
            preexec_fn=_critic_dies_with_parent,
        )
    url = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"the critic server exited with status {proc.returncode}; see {log_path}")
        with contextlib.suppress(requests.RequestException):
            # Each model, not /v2/health/ready: a foreign server on the port would be ready with other models.
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
