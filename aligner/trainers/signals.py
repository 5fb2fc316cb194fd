"""Stopping a training run cleanly: SIGTERM or a first Ctrl-C ask it to stop at the next step boundary."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def stop_on_signals(trainer) -> Iterator[None]:
    """SIGTERM and a first Ctrl-C call `trainer.request_stop()`; a Ctrl-C once `trainer.stop_requested` is set
    interrupts at once. Handlers can only be installed from the main thread: elsewhere signals are left alone."""

    def handle(signum, frame) -> None:
        if signum == signal.SIGINT and trainer.stop_requested:
            raise KeyboardInterrupt
        print(
            f"\nsignal {signal.Signals(signum).name}: stopping after this step (checkpoint follows)", file=sys.stderr
        )
        trainer.request_stop()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
