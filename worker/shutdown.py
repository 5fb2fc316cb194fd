"""A worker that is told to stop (SIGTERM: every deploy, `docker compose stop`, `aligner up`'s Ctrl-C) hands its jobs
back instead of losing their work.

Celery's warm shutdown waits for running tasks, but a training job can run for hours, and the process running it
(a prefork pool process) gets no signal of its own. So:
- the main process, on `worker_shutting_down`, sets this process's flag and sends SIGTERM to its pool processes
  (its children in its own session: trainers, which run in sessions of their own, are left to their runners);
- a pool process running a job sets the flag on SIGTERM (`handing_back_on_sigterm`) instead of dying;
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

from worker.processes import child_pids

log = logging.getLogger(__name__)

_stop = threading.Event()


def stop_requested() -> bool:
    """Whether this worker process was told to stop (its runs hand their jobs back)."""
    return _stop.is_set()


def request_stop() -> None:
    _stop.set()


def reset() -> None:
    """Forget a stop request (tests; a pool process is never reused after one)."""
    _stop.clear()


@contextlib.contextmanager
def handing_back_on_sigterm() -> Iterator[None]:
    """While a run goes on in this process, SIGTERM asks it to hand its job back instead of ending the process (a pool
    process's own handler, billiard's, is put back after the run: an idle pool process ends as usual). Signal
    handlers belong to the main thread: elsewhere (a test's thread) nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _handle(signum, _frame) -> None:
        log.warning("signal %s: the running job goes back to the queue at its trainer's next step boundary", signum)
        request_stop()

    previous = signal.signal(signal.SIGTERM, _handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
