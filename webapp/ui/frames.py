"""API JSON -> what the dashboard shows: pandas DataFrames for its tables and line charts, Markdown and text."""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd

# Charts of the job page: (title, metric names, y title). Several names share a chart, one colour each.
CHARTS: list[tuple[str, list[str], str]] = [
    ("Reward", ["train_rollouts/rewards", "val/rewards"], "reward"),
    ("Reward with KL penalty", ["train_rollouts/rewards_with_kl"], "reward - beta KL"),
    ("KL to the initial policy", ["train_rollouts/init_policy_kl"], "KL"),
    ("Loss", ["train_optim/loss"], "loss"),
    ("Grad norm", ["train_optim/grad_norm"], "grad norm"),
    ("Response length", ["train_rollouts/response_lengths", "val/response_lengths"], "tokens"),
    (
        "Fraction properly ended",
        ["train_rollouts/fraction_of_samples_properly_ended", "val/fraction_of_samples_properly_ended"],
        "fraction",
    ),
]
# A PPO job's charts, beside the ones above (aligner/trainers/ppo.py logs the shared metrics under the same names).
PPO_CHARTS: list[tuple[str, list[str], str]] = [
    ("Critic loss", ["train_optim/critic_loss"], "loss"),
    ("Value estimates", ["train_rollouts/values"], "value"),
    ("Clip fraction", ["train_optim/clip_fraction"], "fraction"),
    ("Entropy", ["train_optim/entropy"], "nats per token"),
]
TIMERS_PREFIX = "timers/"
TIMER_PHASES = ["generate", "logprobs", "init_logprobs", "reward", "critic_infer", "train", "critic_train", "validate"]
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def color_map(names: list[str]) -> dict[str, str]:
    """Fixed colours for a chart's series: Gradio 6.31 keeps the series of a plot's first data, so name them all."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


COMPARE_METRICS = [
    "train_rollouts/rewards",
    "train_rollouts/rewards_with_kl",
    "train_rollouts/init_policy_kl",
    "train_rollouts/response_lengths",
    "train_rollouts/fraction_of_samples_properly_ended",
    "train_optim/loss",
    "train_optim/grad_norm",
    "train_optim/lr",
    "val/rewards",
    "train_rollouts/values",
    "train_optim/critic_loss",
    "train_optim/clip_fraction",
    "train_optim/entropy",
]
JOB_COLUMNS = ["id", "name", "algorithm", "status", "step", "latest reward", "age"]
EVENT_KINDS_SHOWN = ("status", "checkpoint", "log")  # metrics and samples events are what the charts show


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


def jobs_frame(page: dict, now: dt.datetime | None = None) -> pd.DataFrame:
    """GET /jobs -> one row per job: id, name, algorithm, status, step (as step/max_steps), latest reward, age."""
    rows = []
    for job in page.get("items", []):
        reward = job.get("latest_reward")
        rows.append(
            [
                job["id"],
                job["name"],
                job.get("algorithm") or job.get("kind") or "reinforce",
                job["status"],
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


def job_charts(job: dict, body: dict) -> list[tuple[str, pd.DataFrame, bool]]:
    """(title, data, shown) of every chart of the job page, CHARTS then PPO_CHARTS: the PPO ones are shown for a PPO
    job (or any job that logged their metrics)."""
    metrics = body.get("metrics", {}) if isinstance(body, dict) else {}
    ppo_metrics = {name for _title, names, _y in PPO_CHARTS for name in names}
    is_ppo = job.get("algorithm") == "ppo" or bool(ppo_metrics & set(metrics))
    charts = [(title, metrics_frame(body, names), True) for title, names, _y in CHARTS]
    return charts + [(title, metrics_frame(body, names), is_ppo) for title, names, _y in PPO_CHARTS]


def plot_value(frame: pd.DataFrame) -> pd.DataFrame | None:
    """What a gr.LinePlot gets: None rather than an empty frame (one that drew nothing stays blank in Gradio 6.31)."""
    return frame if len(frame) else None


def compare_frame(bodies: dict[str, dict], metric: str) -> pd.DataFrame:
    """{label: GET /jobs/{id}/metrics body} -> one metric of each job: step, value, series (= the label)."""
    frames = []
    for label, body in bodies.items():
        frame = metrics_frame(body, [metric])
        frame["series"] = label
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else series_frame()


def checkpoints_frame(body: dict) -> pd.DataFrame:
    return pd.DataFrame(
        [[c["step"], c["path"], c["created_at"]] for c in body.get("items", [])],
        columns=["step", "path", "created_at"],
    )


def job_summary(job: dict, num_steps_logged: int = 0, events: list[dict] | None = None) -> str:
    """The job page's header; a running job waiting for its reward or critic server says so under its status."""
    reward = job.get("latest_reward")
    algorithm = job.get("algorithm") or "reinforce"
    lines = [
        f"### Job {job['id']}: {job['name']} ({'PPO' if algorithm == 'ppo' else 'REINFORCE'})",
        f"**status** `{job['status']}` · **step** {job['step']}/{job['max_steps']}"
        + ("" if reward is None else f" · **latest reward** {reward:+.4f}")
        + f" · **attempts** {job.get('attempts', 0)} · **metrics logged for** {num_steps_logged} steps",
    ]
    waiting = server_waiting(events or []) if job["status"] == "running" else None
    if waiting:
        lines.append("**waiting** `" + waiting.replace("`", "'") + "`")
    if job.get("error"):
        lines.append(f"**error**\n```\n{job['error']}\n```")
    return "\n\n".join(lines)


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


def event_log(events: list[dict], last: int = 100) -> str:
    """One line an event: `#12 log [warning] step 3: message` for the trainer's events, else the event's data."""
    lines = []
    for event in [e for e in events if e["kind"] in EVENT_KINDS_SHOWN][-last:]:
        data = event["data"]
        if event["kind"] == "log" and isinstance(data, dict) and "message" in data:
            step = f" step {data['step']}" if "step" in data else ""
            lines.append(f"#{event['id']} log [{data.get('level', 'info')}]{step}: {data['message']}")
            continue
        text = json.dumps(data, separators=(", ", ": ")) if not isinstance(data, str) else data
        lines.append(f"#{event['id']} {event['kind']}: {text}")
    return "\n".join(lines) or "(no events yet)"
