"""Per-step metrics and sample generations, as JSON lines in the run directory.

- `metrics.jsonl`: one object per step, `{"step": 3, NAME: 0.41, ...}` (NeMo-Aligner's names, each declared in the
  registry aligner/metrics.py).
- `samples.jsonl`: one object per sample, `{"step", "split", "prompt", "response", "reward", "kl", "advantage",
  "is_end"}`.
- `events.jsonl`: what the user should hear about while the run goes on, `{"step", "level", "message", ...}` (the
  service's worker relays each line as a job event; it starts the file afresh at each launch, having relayed it).
Lines are flushed as they are written, so another process (the worker) can follow the files live. On resume,
lines of steps after the checkpoint are dropped, so no step is ever written twice.

With `logging.tensorboard` / `logging.mlflow` the metrics also go to TensorBoard and MLflow (tracking.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aligner.run_layout import EVENTS_FILE, METRICS_FILE, SAMPLES_FILE
from aligner.trainers.tracking import open_sinks

if TYPE_CHECKING:
    from aligner.config import LoggingConfig


def truncate_after(path: Path, step: int) -> None:
    """Keep only the lines of steps <= `step` (a line cut short by a crash is dropped too)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    path.write_text("".join(k + "\n" for k in kept))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reward_change(values: list[float], window: int = 5) -> str:
    """'train reward (mean of N steps): +A first -> +B last': the mean of the first and last `window` values."""
    n = min(window, len(values))
    first, last = sum(values[:n]) / n, sum(values[-n:]) / n
    return f"train reward (mean of {n} steps): {first:+.3f} first -> {last:+.3f} last"


class RunLog:
    def __init__(
        self,
        run_dir: Path,
        resume_step: int | None = None,
        enabled: bool = True,
        events_only: bool = False,
        tracking: LoggingConfig | None = None,
        params: dict[str, Any] | None = None,
    ):
        """`events_only`: for events before the run's position is known (the trainer's setup): the metrics and
        samples files are left alone, and only `log_event` may be used. `tracking`: the `logging` section, whose
        TensorBoard / MLflow sinks get the metrics too; `params`: the resolved config they record."""
        self.enabled = enabled
        self.metrics_path, self.samples_path = run_dir / METRICS_FILE, run_dir / SAMPLES_FILE
        self.events_path = run_dir / EVENTS_FILE
        self.sinks: list = []
        if not enabled:
            return
        if events_only:
            run_dir.mkdir(parents=True, exist_ok=True)
            return
        for path in (self.metrics_path, self.samples_path):
            if resume_step is None:
                path.unlink(missing_ok=True)
            else:
                truncate_after(path, resume_step)
        if tracking is not None:
            self.sinks = open_sinks(run_dir, tracking, resume_step, params or {})

    def _append(self, path: Path, rows: list[dict[str, Any]]) -> None:
        if self.enabled and rows:
            with path.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._append(self.metrics_path, [{"step": step, **metrics}])
        for sink in list(self.sinks):
            try:
                sink.log_metrics(step, metrics)
            except Exception as err:  # metrics.jsonl has the step: a tracking store that fails must not end the run
                self.sinks.remove(sink)
                message = f"{sink.name} logging stopped: {type(err).__name__}: {err}"
                print(f"WARNING: {message}", file=sys.stderr)
                self.log_event(step, message, level="warning")

    def close(self, finished: bool) -> None:
        """End the TensorBoard / MLflow logging: the MLflow run as FINISHED (`finished`) or KILLED (stopped early:
        a resume continues it)."""
        for sink in self.sinks:
            sink.close("FINISHED" if finished else "KILLED")
        self.sinks = []

    def log_samples(self, rows: list[dict[str, Any]]) -> None:
        self._append(self.samples_path, rows)

    def log_event(self, step: int, message: str, level: str = "info", **fields: Any) -> None:
        """A line for the run's user (`level` info | warning | error), relayed by the service as a job event."""
        self._append(self.events_path, [{"step": step, "level": level, "message": message, **fields}])


class Timers:
    """Wall-clock seconds per phase, each under its timer's metric name (aligner/metrics.py `TIMER_*`)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        """Seconds timed elsewhere (e.g. a background thread's) counted under `name`."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def pop(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out
