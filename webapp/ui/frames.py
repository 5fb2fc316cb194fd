"""API JSON -> what the dashboard shows: pandas DataFrames for its tables and line charts, Markdown and text."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from aligner.metrics import TIMERS_PREFIX
from webapp.ui.catalogue import human_bytes

JOB_COLUMNS = ["sel", "id", "name", "algorithm", "status", "health", "step", "latest reward", "age"]
# The health alarms (GET /jobs `alarms`, `health` events) in words.
ALARM_WORDS = {
    "validation_divergence": "validation divergence",
    "length_hacking": "length hacking",
    "kl_growth": "KL growth",
    "zero_spread": "zero reward spread",
    "nonfinite": "non-finite values",
    "ending_collapse": "ending collapse",
}
SELECTED = "▶"  # the selected job's row (a table refresh clears Gradio's own highlight)


def age(created_at: str | None, now: dt.datetime | None = None) -> str:
    """`2026-11-22T19:00:00+00:00` -> "12 s", "5 min", "3 h", "2 d"."""
    if not created_at:
        return ""
    then = dt.datetime.fromisoformat(created_at)
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.UTC)
    seconds = max(0, int(((now or dt.datetime.now(dt.UTC)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def alarm_words(name: str) -> str:
    """`length_hacking` -> "length hacking"."""
    return ALARM_WORDS.get(name, name.replace("_", " "))


def jobs_frame(page: dict, now: dt.datetime | None = None, selected: int | None = None) -> pd.DataFrame:
    """GET /jobs -> one row per job: a marker on the `selected` one, id, name, algorithm, status, firing health
    alarms, step (as step/max_steps), latest reward, age."""
    rows = []
    for job in page.get("items", []):
        reward = job.get("latest_reward")
        alarms = ", ".join(alarm_words(str(a)) for a in job.get("alarms") or [])
        rows.append(
            [
                SELECTED if selected is not None and job["id"] == selected else "",
                job["id"],
                job["name"],
                job.get("algorithm") or "reinforce",
                job["status"],
                f"⚠ {alarms}" if alarms else "",
                f"{job.get('step', 0)}/{job.get('max_steps', '?')}",
                "" if reward is None else f"{reward:+.4f}",
                age(job.get("created_at"), now),
            ]
        )
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


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


def checkpoints_frame(body: dict) -> pd.DataFrame:
    """Step, size and time of each checkpoint: never where it lies on the server."""
    return pd.DataFrame(
        [[c["step"], human_bytes(c.get("size_bytes")), c["created_at"]] for c in body.get("items", [])],
        columns=["step", "size", "created_at"],
    )


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
