"""Follow a run directory and copy what the trainer writes into SQL, idempotently.

The trainer appends `metrics.jsonl` and `samples.jsonl` (aligner/trainers/run_log.py) and renames
`checkpoints/step_N.tmp` to `checkpoints/step_N` when a checkpoint is complete (aligner/run_layout.py).
`RunIngestor.poll` reads the lines added since its last call (a last line without its newline is left for the next
call) and writes:

- `Metric` rows, one per (step, name), upserted on the unique key: reading a file again never duplicates a row;
- `Sample` rows, `index` counting within (step, split), upserted on (job, step, split, index);
- `Checkpoint` rows for new complete checkpoint folders (rows of folders the trainer pruned are removed);
- `Event` rows for the API's Server-Sent Events: `metrics` (the step's values), `samples` (a summary), `checkpoint`,
  and `log` for each line of the trainer's `events.jsonl` (`{"message", "level", "step", ...}`) and for lines of
  the three files that had to be skipped (not JSON objects with a step: the user learns their count);
- `Job.step` and `Job.latest_reward`;
- `health` events and `Job.alarms`, from the run health monitor (worker/health_monitor.py), which sees each new
  step's raw values; `poll` returns the alarms that pause the job.

Events are emitted only for steps not already in SQL when the ingestor was created, so following a run again
after a restart relays nothing twice. It imports neither torch nor the trainer: the worker stays light.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from aligner.health import Alarm
from aligner.metrics import TRAIN_REWARD
from aligner.run_layout import EVENTS_FILE, METRICS_FILE, SAMPLES_FILE, checkpoint_steps
from webapp.db import Checkpoint, Job, Metric, Sample, add_event
from worker.health_monitor import HealthMonitor

log = logging.getLogger(__name__)

EXAMPLE_CHARS = 500  # prompt and response of the example in a `samples` event are cut to this length
EVENT_MESSAGE_CHARS = 2000  # a trainer event's message is cut to this length
EVENT_LEVELS = ("info", "warning", "error")


class JsonlTail:
    """The complete lines appended to a JSON-lines file since the last call."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.bad_lines = 0

    def read(self, final: bool = False) -> tuple[list[dict[str, Any]], bool]:
        """(new rows, whether the file shrank and was read again from the start).

        A last line without its newline is being written: it is left for the next call, unless `final` (the
        writer has exited), when it is parsed if it is valid JSON. Lines that are not JSON objects are skipped.
        """
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return [], False
        restarted = size < self.offset
        if restarted:
            log.warning("%s shrank (%d < %d bytes): reading it again from the start", self.path, size, self.offset)
            self.offset = 0
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        complete, rest = data[:end], data[end:]
        self.offset += len(complete)
        lines = complete.splitlines()
        if final and rest.strip():
            lines.append(rest)
            self.offset += len(rest)
        rows = []
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                row = None
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
            else:
                self.bad_lines += 1
                log.warning("%s: skipped a line that is not a JSON object with a step: %.200r", self.path, line)
        return rows, restarted


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _text(value: Any) -> str:
    """Generated text can hold NUL characters, which PostgreSQL's text type refuses: shown as U+FFFD instead."""
    return str(value).replace("\x00", "\ufffd")


def _extra_rewards(value: Any) -> dict[str, float | None] | None:
    """A validation sample's gold rewards as JSON can hold them (names cut short, non-finite values as null)."""
    if not isinstance(value, dict) or not value:
        return None
    return {
        _text(name)[:64]: _json_safe(number) for name, raw in value.items() if (number := _number(raw)) is not None
    }


def _json_safe(value: float) -> float | None:
    """NaN and infinities are not JSON (PostgreSQL's JSON type refuses them): None in event payloads."""
    return value if math.isfinite(value) else None


def upsert(session: Session, model: type, rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE on PostgreSQL and SQLite; select-then-write elsewhere."""
    if not rows:
        return
    table = model.__table__
    columns = [c for c in rows[0] if c not in keys]
    dialect = session.get_bind().dialect.name
    if dialect in ("postgresql", "sqlite"):
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        stmt = insert(table)
        stmt = stmt.on_conflict_do_update(index_elements=list(keys), set_={c: stmt.excluded[c] for c in columns})
        session.execute(stmt, rows)
        return
    for row in rows:  # portable fallback, one row at a time
        found = session.scalar(select(model).where(*(getattr(model, k) == row[k] for k in keys)))
        if found is None:
            session.add(model(**row))
        else:
            for c in columns:
                setattr(found, c, row[c])
    session.flush()


class RunIngestor:
    """Copies one run directory of one job into SQL; call `poll` repeatedly, then once with `final=True`."""

    def __init__(self, session: Session, job_id: int, run_dir: Path):
        self.job_id, self.run_dir = job_id, Path(run_dir)
        self.metrics = JsonlTail(self.run_dir / METRICS_FILE)
        self.samples = JsonlTail(self.run_dir / SAMPLES_FILE)
        self.events = JsonlTail(self.run_dir / EVENTS_FILE)
        self.tails = (self.metrics, self.samples, self.events)
        self.reported_bad_lines = {tail.path.name: 0 for tail in self.tails}
        self.sample_counts: dict[tuple[int, str], int] = defaultdict(int)
        # What SQL already holds: no event is emitted again for it.
        self.known_metric_steps = set(session.scalars(select(Metric.step).where(Metric.job_id == job_id).distinct()))
        self.known_sample_keys = {
            (step, split)
            for step, split in session.execute(
                select(Sample.step, Sample.split).where(Sample.job_id == job_id).distinct()
            )
        }
        self.known_checkpoints = set(session.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id)))
        self.health = HealthMonitor(session, job_id)

    def snapshot(self) -> tuple:
        """The reading position, to `restore` when the transaction of a `poll` fails and is retried later."""
        return (
            [(tail.offset, tail.bad_lines) for tail in self.tails],
            dict(self.reported_bad_lines),
            dict(self.sample_counts),
            set(self.known_metric_steps),
            set(self.known_sample_keys),
            set(self.known_checkpoints),
            self.health.snapshot(),
        )

    def restore(self, state: tuple) -> None:
        positions, reported, counts, *known, health = state
        self.health.restore(health)
        for tail, (offset, bad_lines) in zip(self.tails, positions, strict=True):
            tail.offset, tail.bad_lines = offset, bad_lines
        self.reported_bad_lines = dict(reported)
        self.sample_counts = defaultdict(int, counts)
        self.known_metric_steps, self.known_sample_keys, self.known_checkpoints = known

    def poll(self, session: Session, final: bool = False, pausable: bool = True) -> dict[str, Any]:
        """Ingest what is new; returns {"steps": [...], "samples": n, "checkpoints": [...], "events": n, "pause":
        [alarms]} of this call: "pause" holds the alarms that started firing and pause the job (in its
        health.pause_on, when `pausable`: the run can still be paused)."""
        steps, pause = self._ingest_metrics(session, final, pausable)
        n_samples = self._ingest_samples(session, final)
        checkpoints = self._register_checkpoints(session)
        events = self._relay_events(session, final)
        self._report_bad_lines(session)
        return {"steps": steps, "samples": n_samples, "checkpoints": checkpoints, "events": events, "pause": pause}

    # --------------------------------------------------------------------------------------------- events
    def _relay_events(self, session: Session, final: bool) -> int:
        lines, _ = self.events.read(final)
        for line in lines:
            level = line.get("level") if line.get("level") in EVENT_LEVELS else "info"
            payload = {k: v for k, v in line.items() if isinstance(v, str | int | float | bool) and k != "level"}
            payload = {k: _json_safe(v) if isinstance(v, float) else v for k, v in payload.items()}
            message = _text(line.get("message", ""))[:EVENT_MESSAGE_CHARS]
            add_event(session, self.job_id, "log", {**payload, "message": message, "level": level})
        return len(lines)

    def _report_bad_lines(self, session: Session) -> None:
        """A job event for lines the tails had to skip since the last report: the user learns, not only the log."""
        for tail in self.tails:
            new = tail.bad_lines - self.reported_bad_lines[tail.path.name]
            if new > 0:
                self.reported_bad_lines[tail.path.name] = tail.bad_lines
                message = (
                    f"skipped {new} line(s) of {tail.path.name} that are not JSON objects with a step "
                    f"({tail.bad_lines} in this run of the job); see the worker's log"
                )
                add_event(session, self.job_id, "log", {"message": message, "level": "warning"})

    # --------------------------------------------------------------------------------------------- metrics
    def _ingest_metrics(self, session: Session, final: bool, pausable: bool) -> tuple[list[int], list[Alarm]]:
        lines, _ = self.metrics.read(final)
        if not lines:
            return [], []
        by_step: dict[int, dict[str, float]] = {}
        raw_by_step: dict[int, dict[str, Any]] = {}  # as written, for the health monitor: a null is not dropped
        for line in lines:  # a step written twice (it cannot be, but) keeps its last values
            values = {
                _text(k): v for k, v in ((k, _number(v)) for k, v in line.items() if k != "step") if v is not None
            }
            by_step.setdefault(line["step"], {}).update(values)
            raw_by_step.setdefault(line["step"], {}).update((k, v) for k, v in line.items() if k != "step")
        sqlite = session.get_bind().dialect.name == "sqlite"
        rows = [
            {"job_id": self.job_id, "step": step, "name": name, "value": value}
            for step, values in by_step.items()
            for name, value in values.items()
            if not (sqlite and math.isnan(value))  # SQLite stores NaN as NULL, which the column refuses
        ]
        upsert(session, Metric, rows, ("job_id", "step", "name"))
        new_steps = sorted(s for s in by_step if s not in self.known_metric_steps)
        pause: list[Alarm] = []
        for step in new_steps:
            values = by_step[step]
            add_event(
                session,
                self.job_id,
                "metrics",
                {"step": step, "metrics": {k: _json_safe(v) for k, v in values.items()}},
            )
            pause += self.health.observe(session, step, raw_by_step[step], pausable and not pause)
        self.known_metric_steps.update(new_steps)
        last_step = max(by_step)
        fields: dict[str, Any] = {}
        job_step = session.scalar(select(Job.step).where(Job.id == self.job_id)) or 0
        if last_step >= job_step:
            fields["step"] = last_step
        rewarded = [s for s in by_step if TRAIN_REWARD in by_step[s]]
        if rewarded and max(rewarded) >= job_step:
            reward = by_step[max(rewarded)][TRAIN_REWARD]
            fields["latest_reward"] = reward if math.isfinite(reward) else None
        if fields:
            session.execute(update(Job).where(Job.id == self.job_id).values(**fields))
        return new_steps, pause

    # --------------------------------------------------------------------------------------------- samples
    def _ingest_samples(self, session: Session, final: bool) -> int:
        lines, restarted = self.samples.read(final)
        if restarted:
            self.sample_counts.clear()
        if not lines:
            return 0
        rows = []
        groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for line in lines:
            key = (line["step"], _text(line.get("split", "train")))
            reward = _number(line.get("reward"))
            row = {
                "job_id": self.job_id,
                "step": key[0],
                "split": key[1],
                "index": self.sample_counts[key],
                "prompt": _text(line.get("prompt", "")),
                "response": _text(line.get("response", "")),
                "reward": 0.0 if reward is None else reward,
                "kl": _number(line.get("kl")),
                "advantage": _number(line.get("advantage")),
                "is_end": bool(line.get("is_end", True)),
                "extra_rewards": _extra_rewards(line.get("extra_rewards")),
            }
            self.sample_counts[key] += 1
            rows.append(row)
            groups.setdefault(key, []).append(row)
        upsert(session, Sample, rows, ("job_id", "step", "split", "index"))
        for key, group in groups.items():
            if key in self.known_sample_keys:
                continue
            rewards = [r["reward"] for r in group]
            example = group[0]
            add_event(
                session,
                self.job_id,
                "samples",
                {
                    "step": key[0],
                    "split": key[1],
                    "count": len(group),
                    "mean_reward": _json_safe(sum(rewards) / len(rewards)),
                    "example": {
                        "prompt": example["prompt"][:EXAMPLE_CHARS],
                        "response": example["response"][:EXAMPLE_CHARS],
                        "reward": _json_safe(example["reward"]),
                    },
                },
            )
        # A group read in two parts (a write seen half done) gets one event, for its first part.
        self.known_sample_keys.update(groups)
        return len(rows)

    # --------------------------------------------------------------------------------------------- checkpoints
    def _register_checkpoints(self, session: Session) -> list[int]:
        found = checkpoint_steps(self.run_dir)
        new = [step for step in found if step not in self.known_checkpoints]
        for step in new:
            session.add(Checkpoint(job_id=self.job_id, step=step, path=str(found[step].resolve())))
            # Its folder's name, never the server's path: events reach users as they are.
            add_event(session, self.job_id, "checkpoint", {"step": step, "name": found[step].name})
        self.known_checkpoints.update(new)
        # Older checkpoints the trainer pruned (trainer.keep_checkpoints) leave the table too. Only older ones: the
        # newest folder can be briefly absent while the trainer replaces it.
        if found:
            gone = [s for s in self.known_checkpoints if s not in found and s < max(found)]
            if gone:
                session.execute(delete(Checkpoint).where(Checkpoint.job_id == self.job_id, Checkpoint.step.in_(gone)))
                self.known_checkpoints.difference_update(gone)
        if new:
            session.flush()
        return new


def prune_after(session: Session, job_id: int, step: int | None) -> None:
    """Delete the job's metrics, samples and checkpoint rows of steps after `step` (all of them for None).

    Called before a (re)start: the trainer resumes from checkpoint `step` and writes every later step again.
    """
    for model in (Metric, Sample, Checkpoint):
        stmt = delete(model).where(model.job_id == job_id)
        if step is not None:
            stmt = stmt.where(model.step > step)
        session.execute(stmt)
    reward = None
    if step is not None:
        reward = session.scalar(
            select(Metric.value)
            .where(Metric.job_id == job_id, Metric.name == TRAIN_REWARD)
            .order_by(Metric.step.desc())
            .limit(1)
        )
    fields: dict[str, Any] = {"step": step or 0, "latest_reward": reward}
    if step is None:  # a start from scratch: the alarms judged the metrics deleted here (from a checkpoint they stay)
        fields["alarms"] = []
    session.execute(update(Job).where(Job.id == job_id).values(**fields))
