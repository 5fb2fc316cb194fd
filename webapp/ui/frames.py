"""API JSON -> what the dashboard shows: pandas DataFrames for its tables and line charts, Markdown and text."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from aligner.metrics import TIMERS_PREFIX
from webapp.ui.catalogue import human_bytes

STARTED = "started (UTC)"  # the column's header states the zone: the dashboard's browser may be in any
JOB_COLUMNS = [
    *("sel", "id", "name", "algorithm", "status", "health", "step", "latest reward"),
    *(STARTED, "duration"),  # no age: the table redraws when a job changes, and an age would go stale meanwhile
]
OWNER = "owner"  # the column the admin's All users view adds after `id`
STARTED_FORMAT = "%m-%d %H:%M"  # short: the year is rarely in doubt
RUNNING_STATUSES = ("running", "cancelling")  # a job whose run goes on: its duration is the time so far
# The health alarms (GET /jobs `alarms`, `health` events) in words.
ALARM_WORDS = {
    "validation_divergence": "validation divergence",
    "length_hacking": "length hacking",
    "kl_growth": "KL growth",
    "zero_spread": "zero reward spread",
    "nonfinite": "non-finite values",
    "ending_collapse": "ending collapse",
    "entropy_collapse": "entropy collapse",
}
SELECTED = "▶"  # the selected job's row (a table refresh clears Gradio's own highlight)


UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def utc(timestamp: str) -> dt.datetime:
    """The API's `2026-11-22T19:00:00+00:00` as an aware datetime in UTC (a naive one is UTC, as the database keeps
    it)."""
    then = dt.datetime.fromisoformat(timestamp)
    return (then if then.tzinfo is not None else then.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def started(job: dict) -> str:
    """When the job first ran, as `11-22 19:00` in UTC; "" when it never has."""
    return utc(job["started_at"]).strftime(STARTED_FORMAT) if job.get("started_at") else ""


def duration(job: dict, now: dt.datetime | None = None) -> str:
    """From its start to its end, or to `now` while it runs (running or cancelling), as "42 s", "5 min 03 s",
    "2 h 05 min", "1 d 03 h"; "" when it never started, or when it waits in the queue again (a resumed job)."""
    if not job.get("started_at"):
        return ""
    if job.get("status") in RUNNING_STATUSES:
        end = now or dt.datetime.now(dt.UTC)
    elif job.get("finished_at"):
        end = utc(job["finished_at"])
    else:
        return ""
    seconds = max(0, int((end - utc(job["started_at"])).total_seconds()))
    for (unit, size), (small, small_size) in zip(UNITS, UNITS[1:], strict=False):
        if seconds >= size:
            return f"{seconds // size} {unit} {seconds % size // small_size:02d} {small}"
    return f"{seconds} s"


def alarm_words(name: str) -> str:
    """`length_hacking` -> "length hacking"."""
    return ALARM_WORDS.get(name, name.replace("_", " "))


def jobs_frame(
    page: dict, now: dt.datetime | None = None, selected: int | None = None, owners: bool = False
) -> pd.DataFrame:
    """GET /jobs -> one row per job: a marker on the `selected` one, id, name, algorithm, status, firing health
    alarms, step (as step/max_steps), latest reward, start, duration. `owners`: GET /admin/jobs, with each
    job's owner after its id; its deleted jobs (the admins' audit tombstones) left out, as nothing applies to them."""
    rows = []
    for job in page.get("items", []):
        if owners and job.get("deleted_at"):
            continue
        reward = job.get("latest_reward")
        alarms = ", ".join(alarm_words(str(a)) for a in job.get("alarms") or [])
        rows.append(
            [
                SELECTED if selected is not None and job["id"] == selected else "",
                job["id"],
                *([job.get("user", "")] if owners else []),
                job["name"],
                job.get("algorithm") or "reinforce",
                job["status"],
                f"⚠ {alarms}" if alarms else "",
                f"{job.get('step', 0)}/{job.get('max_steps', '?')}",
                "" if reward is None else f"{reward:+.4f}",
                started(job),
                duration(job, now),
            ]
        )
    return pd.DataFrame(rows, columns=job_columns(owners))


def job_columns(owners: bool = False) -> list[str]:
    """The Jobs table's columns; `owners`: with the owner's after the id (the admin's All users view)."""
    return [*JOB_COLUMNS[:2], OWNER, *JOB_COLUMNS[2:]] if owners else list(JOB_COLUMNS)


def action_message(kind: str, jid: int, status: str | None, owner: str | None = None) -> str:
    """What the Jobs tab says after `kind` (cancel, resume, retry) of job `jid`, which is now `status`: redrawn as the
    status changes, so a cancel says "cancelling" only while the run is still stopping."""
    whose = f"{owner}'s job" if owner else "Job"
    if kind == "cancel":
        if status == "cancelling":
            return f"{whose} {jid}: **cancelling**: its run stops at the next step, with a checkpoint."
        if status == "cancelled":
            return f"{whose} {jid}: **cancelled**."
    if kind == "retry" and status == "queued":
        return f"{whose} {jid}: retried from scratch (its metrics, samples and checkpoints deleted): **queued**."
    return f"{whose} {jid}: {kind} -> **{status}**."


def metrics_frame(body: dict, names: list[str] | None = None, strip_prefix: str = "") -> pd.DataFrame:
    """GET /jobs/{id}/metrics -> long format: step, value, series (the metric's name less `strip_prefix`)."""
    metrics = body.get("metrics", body) if isinstance(body, dict) else {}
    rows = []
    for name, points in metrics.items():
        if names is not None and name not in names:
            continue
        series = name.removeprefix(strip_prefix)
        rows += [(int(step), float(value), series) for step, value in points if value is not None]
    return series_frame(rows).sort_values(["series", "step"], ignore_index=True)


def series_frame(rows: list[tuple[int, float, str]] | None = None) -> pd.DataFrame:
    """step (int), value (float), series (str): typed even when empty, as the plots take their axis types from it."""
    frame = pd.DataFrame(rows or [], columns=["step", "value", "series"])
    return frame.astype({"step": "int64", "value": "float64", "series": "object"})


def timers_frame(body: dict) -> pd.DataFrame:
    """The timers/* metrics (seconds per step by phase: generate, logprobs, reward, train, ...)."""
    metrics = body.get("metrics", {})
    names = [name for name in metrics if name.startswith(TIMERS_PREFIX)]
    return metrics_frame(body, names, strip_prefix=TIMERS_PREFIX)


def compare_frame(bodies: dict[str, dict], metric: str) -> pd.DataFrame:
    """{label: GET /jobs/{id}/metrics body} -> one metric of each job: step, value, series (= the label)."""
    frames = []
    for label, body in bodies.items():
        frame = metrics_frame(body, [metric])
        frame["series"] = label
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else series_frame()


def clock_time(timestamp: str | None) -> str:
    """`2026-11-22T19:00:00.123456+00:00` -> "2026-11-22 19:00:00" in UTC (the column or line says UTC): whole
    seconds, short enough for a table cell."""
    return utc(timestamp).strftime("%Y-%m-%d %H:%M:%S") if timestamp else ""


CHECKPOINT_COLUMNS = ["step", "size", "saved (UTC)"]


def checkpoints_frame(body: dict) -> pd.DataFrame:
    """Step, size and time of each checkpoint: never where it lies on the server."""
    items = body.get("items", [])
    rows = [[c["step"], human_bytes(c.get("size_bytes")), clock_time(c.get("created_at"))] for c in items]
    return pd.DataFrame(rows, columns=CHECKPOINT_COLUMNS)


def server_waiting(events: list[dict]) -> str | None:
    """The newest "waiting for reward/critic server ..." event (aligner/trainers/reinforce.py `_server_wait`) that no
    "is back" (or failure) of that server, nor a status change of the job, has followed: its message, or None."""
    waiting: dict[str, str] = {}  # server -> message, oldest first
    for event in events:
        data = event["data"]
        if event["kind"] == "status":
            waiting.clear()
        elif event["kind"] == "log" and isinstance(data, dict) and "wait" in data:
            server = str(data.get("server"))
            waiting.pop(server, None)
            if data["wait"] == "waiting":
                waiting[server] = str(data.get("message", ""))
    return list(waiting.values())[-1] if waiting else None
