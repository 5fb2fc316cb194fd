"""What the Job page and Compare show, from API JSON: the charts' data, the run's summary (best validation, change in
reward, gold rewards and what they measure, speed, time left, alarms), the event log in words with each event's time,
and the differences between compared jobs (config, reward scale). Pure functions, tested without a browser.

The speed is the trainer's wall time between two steps' metrics (timers/wall: the step, its validation, the
checkpoint and logging in between), never the sum of the phase timers, which overlap timers/step."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pandas as pd

from aligner.metrics import (
    CHARTS,
    GOLD_REWARD_PREFIX,
    INIT_POLICY_KL,
    MISMATCH_KL,
    MISMATCH_KL_WORTH_CORRECTING,
    OPTIM_PREFIX,
    ROLLOUTS_PREFIX,
    TIMER_STEP,
    TIMER_WALL,
    TIMERS_PREFIX,
    TRAIN_REWARD,
    VAL_PREFIX,
    VAL_REWARD,
    chart_of,
    is_gold_reward,
)
from aligner.rewards.builtins import BUILTIN_REWARDS, builtin_for_target
from webapp.ui.frames import alarm_words, metrics_frame, utc

ACTIVE = ("queued", "running", "cancelling")
HEAD_TAIL = 5  # steps averaged at each end for the change in train reward
GOLD_LABEL = "gold: "  # a gold reward's legend label: GOLD_LABEL + its name
GOLD_AXIS_TITLE = "gold reward"
# The latest steps whose timers/wall make the speed: enough to hold the validations and checkpoints that come every
# few tens of steps (a 10-step window missed them and put the demo at 0.26 s a step where it ran at 0.39).
SPEED_WINDOW = 100
EVENT_TIME = "%H:%M:%S"  # an event's time in the log, UTC; with EVENT_DAY first when the log spans days
EVENT_DAY = "%b %d "


def series_label(name: str) -> str:
    """A metric's name in a chart's legend: "train", "validation", "gold: NAME" (val/extra_rewards/NAME), a timer's
    phase."""
    if name.startswith(GOLD_REWARD_PREFIX):
        return GOLD_LABEL + name.removeprefix(GOLD_REWARD_PREFIX)
    if name.startswith((ROLLOUTS_PREFIX, OPTIM_PREFIX)):
        return "train"
    if name.startswith(VAL_PREFIX):
        return "validation"
    return name.removeprefix(TIMERS_PREFIX)


def _metrics(body: dict) -> dict[str, list]:
    metrics = body.get("metrics", {}) if isinstance(body, dict) else {}
    return metrics if isinstance(metrics, dict) else {}


def series_labels(names: list[str]) -> dict[str, str]:
    """The legend labels of a chart's metrics: series_label's, except where two of them would read alike (pass@1 and
    pass@k are both "validation", the clip fractions all "train"): those are labelled by their own names' last part
    (`train_optim/clip_fraction_low`: "clip_fraction_low"), so no two series merge into one line."""
    plain = {name: series_label(name) for name in names}
    counts: dict[str, int] = {}
    for label in plain.values():
        counts[label] = counts.get(label, 0) + 1
    return {name: (label if counts[label] == 1 else name.rpartition("/")[2]) for name, label in plain.items()}


def job_charts(body: dict) -> list[tuple[str, pd.DataFrame, str, bool]]:
    """(title, data, y title, log) of the job page's charts that have data, in the registry's order
    (aligner/metrics.py CHARTS): each draws its metrics, then the logged gold rewards its spec names, by name; each
    series labelled apart from the chart's others (series_labels)."""
    logged = _metrics(body)
    charts = []
    for chart in CHARTS:
        family = sorted(n for n in logged if n not in chart.metrics and chart_of(n) == chart.title)
        names = [*chart.metrics, *family]
        frame = metrics_frame(body, names)
        if len(frame):  # the legend in the order of `names`
            frame = frame.sort_values("series", key=lambda col: col.map(names.index), kind="stable")
            frame["series"] = frame["series"].map(series_labels(list(dict.fromkeys(frame["series"]))))
            charts.append((chart.title, frame, chart.unit, chart.log))
    return charts


def chart_notes(body: dict, config: dict | None) -> dict[str, str]:
    """Chart title -> a line the chart shows under its title. The engine-trainer mismatch chart: when the latest
    train_rollouts/mismatch_kl is above MISMATCH_KL_WORTH_CORRECTING, that the rollout correction is worth switching
    on (reinforce.rollout_correction: tis or mis), or, with one on already (the job's resolved `config`), that it
    is."""
    points = [point for point in _metrics(body).get(MISMATCH_KL) or [] if point[1] is not None]
    if not points:
        return {}
    latest = float(max(points, key=lambda point: point[0])[1])
    if not latest > MISMATCH_KL_WORTH_CORRECTING:
        return {}
    reinforce = (config or {}).get("reinforce") if isinstance(config, dict) else None
    correction = reinforce.get("rollout_correction") if isinstance(reinforce, dict) else None
    over = f"mismatch KL {latest:.2g} > {MISMATCH_KL_WORTH_CORRECTING:g}"
    if correction in (None, "none"):
        note = f"{over}: the correction is worth switching on (reinforce.rollout_correction: tis or mis)"
    else:
        note = f"{over}: the correction is on (reinforce.rollout_correction: {correction})"
    return {chart_of(MISMATCH_KL): note}


def gold_series(frame: pd.DataFrame) -> list[str]:
    """The gold rewards' labels among a chart's series (job_charts' frames): drawn on an axis of their own, since a
    rule's 0..1 next to a reward model's -2..5 looks flat however much it moves."""
    return [name for name in dict.fromkeys(frame["series"]) if str(name).startswith(GOLD_LABEL)] if len(frame) else []


def chart_revision(job_id: Any, title: str) -> str:
    """A chart's plotly uirevision: the same for a job's chart across redraws (the user's zoom is kept while new
    steps come), another for another job or chart (a fresh view)."""
    return f"job {job_id}: {title}"


def last_step(body: dict) -> int | None:
    steps = [int(s) for points in _metrics(body).values() for s, _v in points]
    return max(steps) if steps else None


def append_metrics(held: dict, new: dict) -> dict:
    """A GET /jobs/{id}/metrics body: `held`'s series with `new`'s points (asked with since_step) appended, each
    series only with the points after the last step it holds, so none is held twice. `held` is left as it is."""
    series = {name: list(points) for name, points in _metrics(held).items()}
    for name, points in _metrics(new).items():
        kept = series.setdefault(name, [])
        last = int(kept[-1][0]) if kept else None
        kept += [p for p in points if last is None or int(p[0]) > last]
    return {**held, "metrics": series}


def _values(body: dict, name: str) -> list[tuple[int, float]]:
    return [(int(s), float(v)) for s, v in _metrics(body).get(name, []) if v is not None]


def best_validation(body: dict) -> tuple[float, int] | None:
    """(best val/rewards, its step), the earliest step on a tie."""
    points = _values(body, VAL_REWARD)
    if not points:
        return None
    step, value = max(points, key=lambda p: (p[1], -p[0]))
    return value, step


def reward_change(body: dict) -> float | None:
    """Mean train reward of the last HEAD_TAIL steps less that of the first HEAD_TAIL; None until the two windows
    are apart (2 x HEAD_TAIL steps): overlapping, they share steps and understate the change."""
    values = [v for _s, v in sorted(_values(body, TRAIN_REWARD))]
    if len(values) < 2 * HEAD_TAIL:
        return None
    head, tail = values[:HEAD_TAIL], values[-HEAD_TAIL:]
    return sum(tail) / len(tail) - sum(head) / len(head)


def reward_change_from(body: dict) -> int | None:
    """The step from which `reward_change` has a value (None once it has, or before the first step)."""
    steps = sorted(s for s, _v in _values(body, TRAIN_REWARD))
    if not steps or len(steps) >= 2 * HEAD_TAIL:
        return None
    return steps[0] + 2 * HEAD_TAIL - 1


def gold_rewards(body: dict) -> dict[str, tuple[tuple[int, float], tuple[int, float]]]:
    """{name: ((first step, value), (latest step, value))} of each gold reward (val/extra_rewards/NAME) logged."""
    out = {}
    for metric in sorted(n for n in _metrics(body) if is_gold_reward(n)):
        points = sorted(_values(body, metric))
        if points:
            out[metric.removeprefix(GOLD_REWARD_PREFIX)] = (points[0], points[-1])
    return out


def gold_meaning(config: dict, name: str) -> str:
    """What gold reward `name` of a job's config measures, in a sentence: a built-in's description, else its
    source."""
    reward = ((config or {}).get("validation") or {}).get("extra_rewards", {}).get(name) or {}
    function = str(reward.get("function") or "")
    builtin = BUILTIN_REWARDS.get(function) or builtin_for_target(function)
    if builtin:
        return builtin.description
    source = reward_source({"reward": reward})
    return f"Scored by {source}." if source != "unknown" else "A reward of its own."


def seconds_per_step(job: dict, body: dict, now: dt.datetime | None = None) -> float | None:
    """The mean of timers/wall (the wall time from one step's metrics to the next's, checkpoints included) over the
    last SPEED_WINDOW steps, the run's first step (its warm-up) left out once there are others; for a run logged
    without it, of timers/step (the step alone); without either, the time since the job started over its steps."""
    logged = sorted(_values(body, TIMER_WALL) or _values(body, TIMER_STEP))
    warm = [(step, value) for step, value in logged if step > 1]
    timed = [v for _s, v in (warm or logged)[-SPEED_WINDOW:]]
    if timed:
        mean = sum(timed) / len(timed)
        return mean if mean > 0 else None
    started, step = job.get("started_at"), job.get("step") or 0
    if not started or step < 1:
        return None
    then = utc(started)
    ended = job.get("finished_at")
    end = utc(ended) if ended else (now or dt.datetime.now(dt.UTC))
    return max(0.0, (end - then).total_seconds()) / step or None


def duration(seconds: float) -> str:
    """75 -> "1 min 15 s", 3900 -> "1 h 5 min"."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def alarm_badges(job: dict, events: list[dict]) -> list[str]:
    """ "⚠ length hacking: MESSAGE" for each firing alarm: the job's `alarms`, with the message of the newest health
    event of each (an alarm cleared since is left out)."""
    firing: dict[str, str] = {}
    for event in events:
        data = event.get("data")
        if event.get("kind") == "health" and isinstance(data, dict) and "alarm" in data:
            name = str(data["alarm"])
            firing.pop(name, None)
            if data.get("state") == "firing":
                firing[name] = str(data.get("message") or "")
    names = list(dict.fromkeys([*(job.get("alarms") or []), *firing]))
    badges = []
    for name in names:
        message = firing.get(name, "")
        badges.append(f"⚠ {alarm_words(name)}" + (f": {message}" if message else ""))
    return badges


def fold(text: str) -> str:
    """A multi-line text (a traceback) as its first and last lines."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} … {lines[-1]}"


def first_line(text: str | None) -> str:
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def run_summary(job: dict, body: dict, events: list[dict], now: dt.datetime | None = None) -> str:
    """The Job page's header (Markdown): name, status, progress, best validation, change in train reward, each gold
    reward (first -> latest validation) and what it measures, latest KL, speed, time left, alarms, the open server
    wait, the error's first line."""
    from webapp.ui.frames import server_waiting

    algorithm = job.get("algorithm") or "reinforce"
    status = job["status"]
    lines = [f"### Job {job['id']}: {job['name']} ({'PPO' if algorithm == 'ppo' else 'REINFORCE'})"]
    facts = [f"**{status}**", f"step **{job.get('step', 0)}/{job.get('max_steps', '?')}**"]
    best = best_validation(body)
    if best:
        facts.append(f"best validation reward **{best[0]:.4g}** (step {best[1]})")
    change, change_from = reward_change(body), reward_change_from(body)
    if change is not None:
        facts.append(f"train reward change **{change:+.4g}** (first vs last {HEAD_TAIL} steps)")
    elif change_from is not None:
        facts.append(f"train reward change n/a until step {change_from}")
    golds = gold_rewards(body)
    for name, ((first_step, first), (latest_step, latest)) in golds.items():
        facts.append(
            f"gold reward {name} **{first:.4g} → {latest:.4g}** (validation, step {first_step} → {latest_step})"
        )
    kl = _values(body, INIT_POLICY_KL)
    if kl:
        facts.append(f"KL **{sorted(kl)[-1][1]:.4g}**")
    per_step = seconds_per_step(job, body, now)
    if per_step:
        facts.append(f"**{1 / per_step:.3g}** steps/s ({per_step:.3g} s a step)")
        left = max(0, (job.get("max_steps") or 0) - (job.get("step") or 0))
        if status in ACTIVE and left:
            facts.append(f"about **{duration(left * per_step)}** left")
    lines.append(" · ".join(facts))
    for name in golds:
        lines.append(
            f"*Gold reward {name}*: {gold_meaning(job.get('config') or {}, name)} It scores the validation answers "
            "beside the run's own reward: the run's reward rising while the gold falls means the policy games its "
            "reward."
        )
    badges = alarm_badges(job, events)
    if badges:
        lines.append(" ".join(f"`{badge}`" for badge in badges))
    waiting = server_waiting(events) if status == "running" else None
    if waiting:
        lines.append("**waiting** `" + waiting.replace("`", "'") + "`")
    if job.get("error"):
        lines.append(f"**error**: {first_line(job['error'])}")
    return "\n\n".join(lines)


def describe_event(event: dict) -> str | None:
    """One event in words (None for the metrics and samples events the charts and Samples show)."""
    kind, data = event.get("kind"), event.get("data")
    data = data if isinstance(data, dict) else {"message": str(data)}
    step = f"step {data['step']}: " if data.get("step") is not None and kind != "status" else ""
    if kind in ("metrics", "samples"):
        return None
    if kind == "status":
        status = str(data.get("status"))
        if status == "failed":
            return f"failed: {first_line(data.get('error')) or 'no error given'}"
        return status
    if kind == "checkpoint":
        return f"{step}checkpoint saved"
    if kind == "health":
        name = alarm_words(str(data.get("alarm")))
        if data.get("state") == "cleared":
            return f"{step}health: {name} cleared"
        paused = " (job paused)" if data.get("paused") else ""
        return f"{step}health: {name} — {fold(data.get('message') or '')}{paused}"
    if kind == "log":
        level = data.get("level", "info")
        return f"{step}{'' if level == 'info' else level + ': '}{fold(data.get('message', ''))}"
    words = ", ".join(f"{k} {v}" for k, v in data.items() if not isinstance(v, dict | list))
    return f"{kind}: {words}"


def event_time(event: dict, with_day: bool = False) -> str:
    """When the API recorded the event (its `created_at`), short and in UTC: "19:00:05 UTC" ("Nov 22 19:00:05 UTC"
    `with_day`); "" when the event has no time."""
    created = event.get("created_at")
    if not created:
        return ""
    return utc(str(created)).strftime((EVENT_DAY if with_day else "") + EVENT_TIME) + " UTC"


def event_log(events: list[dict], last: int = 200) -> str:
    """The job's events in words, newest first, each after its time (with the day when they span more than one)."""
    described = [(e, line) for e in events if (line := describe_event(e))][-last:]
    days = {utc(str(e["created_at"])).date() for e, _line in described if e.get("created_at")}
    lines = [" · ".join(filter(None, (event_time(e, len(days) > 1), line))) for e, line in described]
    return "\n".join(reversed(lines)) or "(no events yet)"


def waiting_message(job: dict) -> str:
    """What the Job page says while no chart has data."""
    status = job.get("status")
    if status == "queued":
        return "Waiting for the first step: the job is queued (a worker picks it up when one is free)."
    if status in ("failed", "cancelled", "paused") or status == "succeeded":
        error = first_line(job.get("error"))
        return f"The job {status} before its first step" + (f": {error}" if error else ".")
    return "Waiting for the first step: generating step 1 ..."


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """{"trainer": {"lr": 1}} -> {"trainer.lr": 1}."""
    if not isinstance(config, dict):
        return {prefix: config} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_diff(configs: dict[str, dict]) -> pd.DataFrame:
    """{label: config} -> one row per dotted key whose values differ (or that some lack): key, then each label. The
    run folder is left out: the server gives each job its own."""
    labels = list(configs)
    flat = {label: {k: v for k, v in flatten(config).items() if k != "run_dir"} for label, config in configs.items()}
    keys = sorted({key for values in flat.values() for key in values})
    rows = []
    for key in keys:
        shown = [_show(flat[label][key]) if key in flat[label] else "—" for label in labels]
        if len(set(shown)) > 1:
            rows.append([key, *shown])
    return pd.DataFrame(rows, columns=["key", *labels])


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def reward_source(config: dict) -> str:
    """ "function NAME", "model NAME" or "server NAME" from a job's config (the API's catalogue names, or
    aligner's model_path and server_url)."""
    reward = (config or {}).get("reward") or {}
    keys = ("function", "function"), ("model", "model"), ("model_path", "model"), ("server", "server")
    for key, word in (*keys, ("server_url", "server")):
        if reward.get(key):
            return f"{word} {reward[key]}"
    return "unknown"


def scale_warning(bodies: dict[str, dict], configs: dict[str, dict]) -> str | None:
    """Why the jobs' rewards may not be comparable: different reward sources, or train reward ranges that differ by
    more than 10x (the range: max - min, or the largest magnitude when a job has one value)."""
    sources = {label: reward_source(config) for label, config in configs.items()}
    if len(set(sources.values())) > 1:
        listed = "; ".join(f"{label}: {source}" for label, source in sources.items())
        return f"⚠ The jobs score with different rewards ({listed}): their rewards may be on different scales."
    ranges = {}
    for label, body in bodies.items():
        values = [v for _s, v in _values(body, TRAIN_REWARD)]
        if values:
            ranges[label] = (max(values) - min(values)) or max(abs(v) for v in values)
    positive = [r for r in ranges.values() if r > 0]
    if len(positive) > 1 and max(positive) > 10 * min(positive):
        listed = "; ".join(f"{label}: {r:.3g}" for label, r in ranges.items())
        return f"⚠ The jobs' train rewards span ranges more than 10x apart ({listed}): different scales?"
    return None


def job_choice(job: dict) -> tuple[str, int]:
    """A job in Compare's list: ("12: name (algo, status)", 12)."""
    algorithm = job.get("algorithm") or "reinforce"
    return f"{job['id']}: {job['name']} ({algorithm}, {job['status']})", int(job["id"])


def validation_steps(body: dict) -> list[int]:
    return sorted({int(s) for s, _v in _metrics(body).get(VAL_REWARD, [])})


def answers_frame(samples: dict[str, list[dict]], prompt: str | None) -> pd.DataFrame:
    """{label: validation samples of one step} -> the answers to `prompt` side by side: a column per job, rows
    response and reward."""
    columns: dict[str, list[str]] = {}
    for label, items in samples.items():
        item = next((i for i in items if i.get("prompt") == prompt), None)
        reward = item.get("reward") if item else None
        columns[label] = [item["response"] if item else "(no answer)", "" if reward is None else f"{reward:.4g}"]
    return pd.DataFrame({"": ["response", "reward"], **columns})


def common_prompts(samples: dict[str, list[dict]]) -> list[str]:
    """The prompts every job answered, in the first job's order."""
    lists = [[i.get("prompt") for i in items] for items in samples.values()]
    if not lists:
        return []
    shared = set(lists[0]).intersection(*map(set, lists[1:]))
    return [p for p in dict.fromkeys(lists[0]) if p in shared]
