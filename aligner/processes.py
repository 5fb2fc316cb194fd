"""Process plumbing shared by the trainers, the servers' launcher, the worker and `aligner up` (no torch).

Free ports for child servers, a child that dies with its parent (PR_SET_PDEATHSIG), and signals to a child's whole
process group. Starting and stopping the critic server itself is aligner/servers/launch.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

from aligner.errors import ServerStartError


def free_port(count: int = 1) -> int:
    """A port p on 127.0.0.1 with p .. p+count-1 free (a Triton server takes HTTP, gRPC and metrics: count 3)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + count - 1 > 65535:
            continue
        try:
            for p in range(port, port + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise ServerStartError(f"no {count} consecutive free ports on 127.0.0.1")


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: this process gets `sig` when its parent dies, even by SIGKILL (PR_SET_PDEATHSIG).

    Called in a child between fork and exec (`preexec_fn`) or first thing in a process: a trainer whose worker
    was killed, a rank whose torchrun agent was killed, a critic server whose trainer or worker was killed.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
