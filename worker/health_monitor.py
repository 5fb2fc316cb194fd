"""The worker's run health monitor: the rules of aligner/health.py evaluated over a job's metrics as they arrive.

`RunIngestor` (worker/ingest.py) owns one and hands it each new step's raw values, before they are cleaned for SQL
(a NaN that SQLite cannot store, a null, still reach the `nonfinite` rule). After each new step every rule is
evaluated over the job's series (loaded from SQL when the monitor is made, then kept in memory). When a rule starts
firing a `health` event is added,

    {"alarm": NAME, "state": "firing", "step": N, "message": "...", "paused": bool}

and when it stops, `{"alarm": NAME, "state": "cleared", "step": N, "message": "..."}`. The names firing are kept in
`jobs.alarms`, read back by the next monitor of the job (a restarted worker, a resumed job): an episode is announced
once, and an alarm that is still firing when a paused job resumes does not pause it again until it has cleared and
fires anew. `paused` is true when the alarm is in the job's `health.pause_on` and the run can still be paused; the
runner (worker/runner.py) then stops the trainer at a checkpoint and the job ends `paused`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from pydantic import ValidationError
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from aligner.config import HealthConfig
from aligner.health import RULE_NAMES, WATCHED_METRICS, Alarm, evaluate, watched
from aligner.metrics import GOLD_REWARD_PREFIX
from webapp.db import Job, Metric, add_event

log = logging.getLogger(__name__)

HEALTH_EVENT = "health"
FIRING, CLEARED = "firing", "cleared"


def job_health_config(job_id: int, config: dict[str, Any] | None) -> HealthConfig:
    """The job's `health` section; the defaults for a job stored before it existed (or one that no longer
    validates, which the launch check refuses anyway)."""
    try:
        return HealthConfig.model_validate((config or {}).get("health") or {})
    except ValidationError as err:
        log.warning("job %d: its health section is invalid (%s); the defaults apply", job_id, err)
        return HealthConfig()


class HealthMonitor:
    """The run health of one job: its watched series, the alarms firing, and the events when they change."""

    def __init__(self, session: Session, job_id: int):
        self.job_id = job_id
        job = session.get(Job, job_id)
        self.config = job_health_config(job_id, job.config if job is not None else None)
        self.firing: set[str] = set(job.alarms or []) if job is not None else set()
        self.series: dict[str, list[tuple[int, float]]] = {}
        if not self.config.enabled:
            return
        rows = session.execute(
            select(Metric.name, Metric.step, Metric.value)
            .where(
                Metric.job_id == job_id,
                or_(Metric.name.in_(WATCHED_METRICS), Metric.name.startswith(GOLD_REWARD_PREFIX, autoescape=True)),
            )
            .order_by(Metric.step)
        )
        for name, step, value in rows:
            self.series.setdefault(name, []).append((step, value))

    def snapshot(self) -> tuple:
        """The state to `restore` when the transaction of a poll fails (the series only ever grow at their end)."""
        return {name: len(points) for name, points in self.series.items()}, set(self.firing)

    def restore(self, state: tuple) -> None:
        lengths, firing = state
        self.series = {name: points[: lengths[name]] for name, points in self.series.items() if name in lengths}
        self.firing = firing

    def observe(self, session: Session, step: int, values: dict[str, Any], pausable: bool = True) -> list[Alarm]:
        """Add a new step's raw values (a null or non-number read as NaN) and evaluate the rules; returns the alarms
        that started firing and that pause the job (in `health.pause_on`, and `pausable`)."""
        if not self.config.enabled:
            return []
        for name, value in values.items():
            if not watched(name):
                continue
            points = self.series.setdefault(name, [])
            if points and step <= points[-1][0]:
                continue  # a step already judged (a file read again)
            number = value if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
            points.append((step, float(number)))
        return self._judge(session, step, pausable)

    def _judge(self, session: Session, step: int, pausable: bool) -> list[Alarm]:
        alarms = {alarm.name: alarm for alarm in evaluate(self.series, self.config)}
        pausing = []
        for name in RULE_NAMES:
            if name in alarms and name not in self.firing:
                alarm = alarms[name]
                paused = pausable and name in self.config.pause_on
                payload = {"alarm": name, "state": FIRING, "step": alarm.step, "message": alarm.message}
                add_event(session, self.job_id, HEALTH_EVENT, {**payload, "paused": paused})
                if paused:
                    pausing.append(alarm)
            elif name in self.firing and name not in alarms:
                payload = {"alarm": name, "state": CLEARED, "step": step, "message": f"{name} no longer fires"}
                add_event(session, self.job_id, HEALTH_EVENT, payload)
        firing = set(alarms)
        if firing != self.firing:
            self.firing = firing
            ordered = [name for name in RULE_NAMES if name in firing]
            session.execute(update(Job).where(Job.id == self.job_id).values(alarms=ordered))
        return pausing
