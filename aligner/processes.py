"""Process plumbing shared by the trainers, the servers' launcher, the worker and `aligner up` (no torch).

Free ports for child servers, a child that dies with its parent (PR_SET_PDEATHSIG), a service process its children
cannot read (`hide_from_children`, PR_SET_DUMPABLE: the worker and the API), signals to a child's whole process
group, and the minimal environment a trainer or critic server started for a job gets. Starting and stopping the
critic server itself is aligner/servers/launch.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys

from aligner.errors import ServerStartError

LOOPBACK = "127.0.0.1"  # where child servers listen and are reached: never another host's

# What a trainer or critic server started for a job may inherit from the process that starts it (the worker): the
# names a Python/torch/Hugging Face/PyTriton process needs to find its interpreter, libraries, caches, locale and
# accelerators, and the knobs of its threads and collectives. A name ending in "*" is a prefix. Anything else stays
# behind: the worker's own settings (ALIGNER_DATABASE_URL and ALIGNER_BROKER_URL hold credentials), cloud and
# registry credentials, proxies (their URLs may hold a password). torchrun sets its ranks' RANK, WORLD_SIZE,
# MASTER_ADDR, ... itself. This lives here, not in worker/, because it says what the library's processes need.
CHILD_ENV_ALLOWLIST = (
    # the user, the interpreter and its libraries, the compilers torch may call
    "PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH",
    "PYTHONHOME", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER",
    "PYTHONIOENCODING", "PYTHONWARNINGS", "CC", "CXX",
    # locale and time
    "LANG", "LANGUAGE", "LC_*", "TZ",
    # caches and TLS trust (paths, no secrets)
    "XDG_CACHE_HOME", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    # accelerators, collectives, threads and the allocator
    "CUDA_*", "NVIDIA_*", "NCCL_*", "GLOO_*", "OMP_*", "KMP_*", "MKL_*", "OPENBLAS_*", "DNNL_*", "ONEDNN_*",
    "MALLOC_*", "ATEN_CPU_CAPABILITY",
    # what the CPU can do, as tests and users set it (aligner/modeling/cpu.py)
    "ALIGNER_CPU_BF16",
    # torch (TORCH_*, TORCHELASTIC_*, TORCHINDUCTOR_*), its compiler, Hugging Face, PyTriton
    "TORCH*", "PYTORCH_*", "TRITON_*", "HF_*", "TRANSFORMERS_*", "TOKENIZERS_PARALLELISM", "PYTRITON_*",
)  # fmt: skip
# A name that says it holds a secret stays behind even when a prefix lets its family through (HF_TOKEN).
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIALS?|KEY|AUTH)(_|$)")


def minimal_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment cut down to CHILD_ENV_ALLOWLIST, then `extra` (set as given, unfiltered)."""
    names = {entry for entry in CHILD_ENV_ALLOWLIST if not entry.endswith("*")}
    prefixes = tuple(entry[:-1] for entry in CHILD_ENV_ALLOWLIST if entry.endswith("*"))
    env = {
        name: value
        for name, value in os.environ.items()
        if (name in names or name.startswith(prefixes)) and not _SECRET_NAME.search(name)
    }
    return {**env, **(extra or {})}


def free_port(count: int = 1) -> int:
    """A port p on 127.0.0.1 with p .. p+count-1 free (a Triton server takes HTTP, gRPC and metrics: count 3)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            port = s.getsockname()[1]
        if port + count - 1 > 65535:
            continue
        try:
            for p in range(port, port + count):
                with socket.socket() as s:
                    s.bind((LOOPBACK, p))
            return port
        except OSError:
            continue
    raise ServerStartError(f"no {count} consecutive free ports on {LOOPBACK}")


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


def hide_from_children() -> None:
    """Linux: no process of this user may read this one's /proc/PID/environ or memory, nor gets a core dump of it.

    A trainer or a reward try runs as the service's user, and such a process may otherwise read the worker's or the
    API's environment, which holds the database and broker credentials that its own (`minimal_env`) leaves out. This
    sets PR_SET_DUMPABLE to 0, which forks inherit; an exec sets it back, so the children stay ordinary processes.
    Root still reads everything.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # 4 = PR_SET_DUMPABLE


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
