"""A worker that is told to stop (SIGTERM: every deploy, `docker compose stop`, `aligner up`'s Ctrl-C) hands its jobs
back instead of losing their work.

Celery's warm shutdown waits for running tasks, but a training job can run for hours, and the process running it
(a prefork pool process) gets no signal of its own. So:
- the main process, on `worker_shutting_down`, sets this process's flag and sends SIGTERM to its pool processes
  (its children in its own session: trainers, which run in sessions of their own, are left to their runners);
- a pool process sets the flag on SIGTERM (`install_pool_handler`, from `worker_process_init`) instead of dying;
- a run that sees the flag (worker/runner.py) passes SIGTERM to its trainer, which stops at the step boundary with
  a checkpoint, and puts the job back in the queue without counting an attempt; the next worker resumes it there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_stop = threading.Event()
_active_runs = 0  # runs in this process (worker/runner.py): with none, SIGTERM keeps its usual meaning


def stop_requested() -> bool:
    """Whether this worker process was told to stop (its runs hand their jobs back)."""
    return _stop.is_set()


def request_stop() -> None:
    _stop.set()


def reset() -> None:
    """Forget a stop request (tests; a pool process is never reused after one)."""
    _stop.clear()


@contextlib.contextmanager
def active_run() -> Iterator[None]:
    """Marks a run in progress in this process (a SIGTERM then hands it back instead of ending the process)."""
    global _active_runs
    _active_runs += 1
    try:
        yield
    finally:
        _active_runs -= 1


def install_pool_handler() -> None:
    """In a pool process: SIGTERM asks the running job to hand itself back, rather than killing the process. An idle
    pool process ends as usual (the pool itself terminates its processes with SIGTERM)."""

    def _handle(signum, _frame) -> None:
        request_stop()
        if _active_runs == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        log.warning("signal %s: handing the running job back to the queue at its next step boundary", signum)

    signal.signal(signal.SIGTERM, _handle)


def stop_pool_processes() -> list[int]:
    """In the main process: set the flag and SIGTERM each pool process (children in this process's session);
    returns their pids."""
    request_stop()
    own_session = os.getsid(0)
    signalled = []
    for pid in child_pids():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(pid) == own_session:
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
    return signalled


def child_pids(parent: int | None = None) -> list[int]:
    """The pids whose parent is `parent` (default: this process), from /proc (Linux; elsewhere none)."""
    parent = os.getpid() if parent is None else parent
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                found.append(int(stat.parent.name))
    return found
