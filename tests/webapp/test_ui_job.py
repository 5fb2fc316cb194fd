"""The Job page and Compare without a browser: plotly figures, the run's summary, the event log in words, config
differences and the reward-scale warning, from hand-made API JSON (the Jobs tab's buttons: tests/webapp/test_ui.py)."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from aligner import metrics
from aligner.metrics import INIT_POLICY_KL, TRAIN_REWARD, VAL_REWARD
from tests.helpers.api import create_job
from webapp.ui import charts, job_view
from webapp.ui.frames import metrics_frame, series_frame
from webapp.ui.job_page import draw, load
from webapp.ui.jobs_tab import selected_status

NOW = dt.datetime(2026, 11, 22, 19, 0, 0, tzinfo=dt.UTC)


def frame(points: dict[str, list[tuple[int, float]]]) -> pd.DataFrame:
    return series_frame([(s, v, name) for name, values in points.items() for s, v in values])


def test_ema_is_debiased_as_tensorboard_s_worked_by_hand():
    # a = 0.5 from m_0 = 0: m = 0.5, 0.25, 0.125 over 1 - a^t = 0.5, 0.75, 0.875
    assert charts.ema([1.0, 0.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3, 1 / 7])
    # a = 0.75: m = 0.5, 1.375, 2.03125 over 0.25, 0.4375, 0.578125
    assert charts.ema([2.0, 4.0, 4.0], 0.75) == pytest.approx([2.0, 22 / 7, 130 / 37])
    # a = 0.99: the first point is itself, not 0.01 of it (no pull towards the zero start)
    assert charts.ema([5.06, 5.0], 0.99) == pytest.approx([5.06, (0.99 * 0.0506 + 0.05) / (1 - 0.99**2)])
    assert charts.ema([3.0, 1.0], 0.0) == [3.0, 1.0]
    assert charts.ema([0.7, 0.7, 0.7], 0.9) == [0.7, 0.7, 0.7]  # constant: as it is
    assert charts.ema([1.0, float("nan"), 3.0], 0.5)[2] == pytest.approx((0.5 * 0.5 + 1.5) / 0.75)  # NaN skipped


def test_a_chart_has_integer_step_ticks_markers_a_title_and_rounded_hover():
    fig = charts.line_chart(frame({"train": [(0, 0.1), (1, 0.2), (2, 0.4)]}), "Reward", "reward", x_range=(0, 4))
    axis = fig.layout.xaxis
    assert axis.tickformat == "d" and axis.dtick == 1 and axis.tick0 == 0  # ticks 0, 1, 2, ...: never 0.5
    assert axis.range[0] < 0 and 4 < axis.range[1] < 4.5  # the caller's range, markers drawn whole
    assert fig.layout.title.text == "Reward" and fig.layout.yaxis.title.text == "reward"
    (trace,) = fig.data
    assert trace.mode == "lines+markers" and list(trace.x) == [0, 1, 2]
    assert "%{y:.4g}" in trace.hovertemplate and "%{x:d}" in trace.hovertemplate
    assert [charts.step_dtick(n) for n in (1, 4, 10, 11, 40, 5000)] == [1, 1, 1, 2, 5, 500]


def test_smoothing_draws_the_raw_points_faint_and_the_ema_solid():
    values = [1.0] + [0.0] * (charts.MIN_SMOOTH_POINTS - 1)
    points = list(enumerate(values, start=1))
    fig = charts.line_chart(frame({"train": points}), "Reward", "reward", smoothing=0.5)
    raw, smooth = fig.data
    assert raw.opacity == 0.3 and not raw.showlegend and list(raw.y) == values
    assert smooth.opacity is None and list(smooth.y) == charts.ema(values, 0.5) and smooth.name == "train"


def test_a_series_too_short_to_smooth_is_drawn_raw_and_its_legend_says_so():
    # the case: 9 validation points at 0.99 smoothing were drawn at ~half their value
    short = [(s, 5.0 + 0.01 * s) for s in range(charts.MIN_SMOOTH_POINTS - 1)]
    long = [(s, 1.0 + s) for s in range(charts.MIN_SMOOTH_POINTS)]
    fig = charts.line_chart(frame({"train": long, "validation": short}), "Reward", "reward", smoothing=0.99)
    by_name = {trace.name: trace for trace in fig.data}
    assert set(by_name) == {"train (raw)", "train", f"validation (raw: < {charts.MIN_SMOOTH_POINTS} points)"}
    validation = by_name[f"validation (raw: < {charts.MIN_SMOOTH_POINTS} points)"]
    assert list(validation.y) == [v for _s, v in short] and validation.opacity == 1.0 and validation.showlegend
    unsmoothed = charts.line_chart(frame({"validation": short}), "Reward", "reward")
    assert [t.name for t in unsmoothed.data] == ["validation"]  # no smoothing asked: nothing to explain


def test_gold_rewards_get_their_own_right_axis_and_the_zoom_is_kept_per_job_and_chart():
    view = {"job_id": 7, "job": JOB, "metrics": BODY}
    _msg, *plots = draw(view, 0.0, True)
    figures = {p["value"].layout.title.text: p["value"] for p in plots if p.get("value") is not None}
    reward = figures["Reward"]
    axes = {trace.name: trace.yaxis for trace in reward.data}
    assert axes == {"train": None, "validation": None, "gold: rule" + charts.RIGHT_AXIS: "y2"}  # None: the left
    assert reward.layout.yaxis2.side == "right" and reward.layout.yaxis2.overlaying == "y"
    assert reward.layout.yaxis2.title.text == job_view.GOLD_AXIS_TITLE and reward.layout.yaxis2.autorange
    assert reward.layout.yaxis.title.text == "reward"
    # every chart keeps the user's zoom while its job runs: the same uirevision with more steps, another per chart
    more = {**BODY["metrics"], "train_rollouts/rewards": [[s, 0.1 * s] for s in range(1, 14)]}
    _msg, *redrawn = draw({**view, "metrics": {"metrics": more}}, 0.5, False)
    revisions = [p["value"].layout.uirevision for p in plots if p.get("value") is not None]
    assert revisions == [p["value"].layout.uirevision for p in redrawn if p.get("value") is not None]
    assert all(revisions) and len(set(revisions)) == len(revisions)
    other = draw({**view, "job_id": 8, "job": {**JOB, "id": 8}}, 0.0, True)[1]["value"]
    assert other.layout.uirevision != reward.layout.uirevision
    # a chart of gold rewards alone keeps them on its one axis
    alone = charts.line_chart(frame({"gold: rule": [(0, 0.1)]}), "Reward", "reward", right=["gold: rule"])
    assert alone.data[0].yaxis is None and "yaxis2" not in alone.layout.to_plotly_json()


def test_log_scale_when_asked_and_every_value_is_positive():
    positive = frame({"train": [(1, 0.01), (2, 0.1)]})
    assert charts.line_chart(positive, "KL", "KL", log_y=True).layout.yaxis.type == "log"
    assert charts.line_chart(positive, "KL", "KL").layout.yaxis.type == "linear"
    signed = charts.line_chart(frame({"train": [(1, 0.0), (2, -0.1)]}), "KL", "KL", log_y=True)
    assert signed.layout.yaxis.type == "linear" and "values ≤ 0" in signed.layout.title.text


def test_charts_share_the_jobs_x_range():
    assert charts.x_extent(100, 7, active=True) == (0.0, 100.0)  # a running job: its whole length
    assert charts.x_extent(100, 7, active=False) == (0.0, 7.0)  # a finished one: what it did
    assert charts.x_extent(100, None, active=False) == (0.0, 100.0)


BODY = {
    "metrics": {
        "train_rollouts/rewards": [[s, 0.1 * s] for s in range(1, 13)],  # first 5: mean 0.3, last 5: mean 1.0
        "val/rewards": [[0, 0.05], [4, 0.6], [8, 0.6], [12, 0.5]],
        "val/extra_rewards/rule": [[0, 0.0], [4, 1.0]],
        "train_rollouts/init_policy_kl": [[11, 0.02], [12, 0.03]],
        "train_rollouts/reward_length_corr": [[1, 0.2]],
        "train_rollouts/frac_zero_std_groups": [[1, 0.5]],
        "timers/generate": [[11, 1.5], [12, 1.5]],
        "timers/train": [[11, 0.5], [12, 0.5]],
        "timers/step": [[11, 2.2], [12, 2.2]],  # the phases and more; not their sum with them
        "timers/wall": [[11, 2.4], [12, 2.6]],  # the step and the checkpoint after the one before
    }
}
GOLD_CONFIG = {"validation": {"extra_rewards": {"rule": {"function": "demo"}}}}
JOB = {"id": 7, "name": "run", "status": "running", "step": 12, "max_steps": 100, "algorithm": "reinforce",
       "config": GOLD_CONFIG}  # fmt: skip


def test_job_charts_show_what_has_data_and_label_gold_rewards():
    shown = {title: data for title, data, _y, _log in job_view.job_charts(BODY)}
    assert list(shown) == ["Reward", "KL to the initial policy", "Reward-length correlation",
                           "Groups with zero reward spread", "Time per step"]  # fmt: skip
    assert list(dict.fromkeys(shown["Reward"]["series"])) == ["train", "validation", "gold: rule"]
    logs = {title: log for title, _d, _y, log in job_view.job_charts(BODY)}
    assert logs["KL to the initial policy"] and not logs["Reward"]
    assert job_view.job_charts({"metrics": {}}) == []
    ppo = {"metrics": {"train_optim/critic_loss": [[1, 0.9]], "train_rollouts/values": [[1, -0.2]]}}
    assert [t for t, *_ in job_view.job_charts(ppo)] == ["Critic loss", "Value estimates"]


# A GRPO-family run's metrics (issue 32): every chart of aligner.metrics that a REINFORCE run feeds.
GRPO_BODY = {
    "metrics": {
        metrics.CLIP_FRACTION: [[1, 0.1], [2, 0.12]],
        metrics.CLIP_FRACTION_LOW: [[1, 0.04], [2, 0.05]],
        metrics.CLIP_FRACTION_HIGH: [[1, 0.06], [2, 0.07]],
        metrics.RATIO_MEAN: [[1, 1.0], [2, 1.01]],
        metrics.RATIO_MIN: [[1, 0.7], [2, 0.6]],
        metrics.RATIO_MAX: [[1, 1.4], [2, 1.5]],
        metrics.MISMATCH_KL: [[1, 2e-4], [2, 3e-3]],
        metrics.ROLLOUT_ENTROPY: [[1, 1.2], [2, 1.1]],
        metrics.ZERO_SPREAD_GROUPS: [[1, 0.5], [2, 0.4]],
        metrics.DROPPED_GROUPS: [[1, 0.5], [2, 0.4]],
        metrics.VAL_PASS_AT_1: [[0, 0.2], [2, 0.3]],
        metrics.VAL_PASS_AT_K: [[0, 0.5], [2, 0.6]],
    }
}


def test_the_grpo_familys_charts_draw_each_series_apart():
    shown = {title: data for title, data, _y, _log in job_view.job_charts(GRPO_BODY)}
    new = ["Clip fraction", "Importance ratio", "Engine-trainer mismatch", "Entropy"]
    assert set(new) <= set(metrics.CHART_ORDER) and set(new) | {"Pass@k", "Groups with zero reward spread"} <= set(
        shown
    )
    for title, data in shown.items():  # as many legend entries as metrics logged: none merged into another's line
        drawn = {name for name in GRPO_BODY["metrics"] if metrics.chart_of(name) == title}
        assert data["series"].nunique() == len(drawn), title
    assert list(dict.fromkeys(shown["Pass@k"]["series"])) == ["pass@1", "pass@k"]
    assert list(dict.fromkeys(shown["Clip fraction"]["series"])) == [
        "clip_fraction", "clip_fraction_low", "clip_fraction_high"
    ]  # fmt: skip
    assert list(dict.fromkeys(shown["Entropy"]["series"])) == ["train"]  # alone: as every other single series
    view = {"job_id": 7, "job": JOB, "metrics": GRPO_BODY}
    _msg, *plots = draw(view, 0.0, True)
    titles = [plot["value"].layout.title.text for plot in plots if plot.get("visible")]
    assert len(titles) == len(shown)


def test_the_mismatch_chart_says_when_the_correction_is_worth_switching_on():
    over = metrics.MISMATCH_KL_WORTH_CORRECTING * 3
    body = {"metrics": {metrics.MISMATCH_KL: [[1, over], [2, over]]}}
    title = metrics.chart_of(metrics.MISMATCH_KL)
    off = {"reinforce": {"rollout_correction": "none"}}
    note = job_view.chart_notes(body, off)[title]
    assert "worth switching on" in note and "rollout_correction" in note and "tis or mis" in note
    assert f"{metrics.MISMATCH_KL_WORTH_CORRECTING:g}" in note
    on = job_view.chart_notes(body, {"reinforce": {"rollout_correction": "tis"}})[title]
    assert "is on" in on and "tis" in on and "worth switching on" not in on
    # the latest point decides: a run whose mismatch fell back under the threshold has no note
    fell = {"metrics": {metrics.MISMATCH_KL: [[1, over], [2, metrics.MISMATCH_KL_WORTH_CORRECTING / 2]]}}
    assert job_view.chart_notes(fell, off) == {} and job_view.chart_notes({"metrics": {}}, off) == {}
    # on the page: under the chart's title, in lines a narrow chart holds
    _msg, *plots = draw({"job_id": 7, "job": {**JOB, "config": off}, "metrics": body}, 0.0, True)
    (figure,) = [plot["value"] for plot in plots if plot.get("visible")]
    text = figure.layout.title.text
    assert text.startswith(title + "<br><sup>") and "worth switching" in text
    assert all(len(line) <= charts.NOTE_LINE for line in charts.note_lines(note))
    assert figure.layout.height > charts.HEIGHT


def test_summary_numbers_from_hand_made_metrics():
    assert job_view.best_validation(BODY) == (0.6, 4)  # the earliest of a tie
    assert job_view.reward_change(BODY) == pytest.approx(1.0 - 0.3)
    # The speed: the mean wall time between steps (timers/wall), never the phases summed with the step.
    assert job_view.seconds_per_step(JOB, BODY) == pytest.approx(2.5)
    no_wall = {"metrics": {k: v for k, v in BODY["metrics"].items() if k != "timers/wall"}}
    assert job_view.seconds_per_step(JOB, no_wall) == pytest.approx(2.2)  # a run logged before timers/wall
    started = {**JOB, "started_at": "2026-11-22T18:59:00+00:00"}
    assert job_view.seconds_per_step(started, {"metrics": {}}, NOW) == pytest.approx(60 / 12)
    summary = job_view.run_summary(JOB, BODY, [])
    assert "best validation reward **0.6** (step 4)" in summary
    assert "train reward change **+0.7**" in summary and "KL **0.03**" in summary
    assert "**0.4** steps/s" in summary and "about **3 min 40 s** left" in summary  # 88 steps x 2.5 s
    # The gold reward, first -> latest, and what it measures (the built-in's own words).
    assert "gold reward rule **0 → 1** (validation, step 0 → 4)" in summary
    assert "*Gold reward rule*: The demo task's reward: (kind - unkind adjectives) / adjectives" in summary
    assert "rising while the gold falls" in summary
    served = {**JOB, "config": {"validation": {"extra_rewards": {"rule": {"server": "judge"}}}}}
    assert "*Gold reward rule*: Scored by server judge." in job_view.run_summary(served, BODY, [])
    assert "left" not in job_view.run_summary({**JOB, "status": "succeeded"}, BODY, [])
    assert job_view.duration(3900) == "1 h 5 min"


def test_alarm_badges_come_from_the_job_and_its_health_events():
    events = [
        {"id": 1, "kind": "health", "data": {"alarm": "kl_growth", "state": "firing", "step": 3, "message": "KL x3"}},
        {"id": 2, "kind": "health", "data": {"alarm": "kl_growth", "state": "cleared", "step": 5, "message": ""}},
        {"id": 3, "kind": "health",
         "data": {"alarm": "length_hacking", "state": "firing", "step": 6, "message": "longer, not better"}},
    ]  # fmt: skip
    badges = job_view.alarm_badges({**JOB, "alarms": ["length_hacking", "zero_spread"]}, events)
    assert badges == ["⚠ length hacking: longer, not better", "⚠ zero reward spread"]
    assert "`⚠ length hacking: longer, not better`" in job_view.run_summary({**JOB, "alarms": []}, BODY, events)


def test_the_event_log_in_words():
    traceback = "Traceback (most recent call last):\n  File x, line 1\nValueError: bad"
    events = [
        {"id": 1, "kind": "status", "data": {"status": "queued", "error": None, "step": 0}},
        {"id": 2, "kind": "log", "data": {"message": "started (try 1) on machine a: training from scratch"}},
        {"id": 3, "kind": "log", "data": {"message": "critic server started at http://h:1 (log: x)"}},
        {"id": 4, "kind": "metrics", "data": {"step": 1, "metrics": {}}},
        {"id": 5, "kind": "checkpoint", "data": {"step": 40, "path": "/x"}},
        {"id": 6, "kind": "health", "data": {"alarm": "length_hacking", "state": "firing", "step": 41,
                                              "message": "length up, reward flat", "paused": True}},
        {"id": 7, "kind": "log", "data": {"message": traceback, "level": "error", "step": 41}},
        {"id": 8, "kind": "status", "data": {"status": "failed", "error": "trainer exited 1\n" + traceback}},
    ]  # fmt: skip
    assert job_view.event_log(events).splitlines() == [
        "failed: trainer exited 1",
        "step 41: error: Traceback (most recent call last): … ValueError: bad",
        "step 41: health: length hacking — length up, reward flat (job paused)",
        "step 40: checkpoint saved",
        "critic server started at http://h:1 (log: x)",
        "started (try 1) on machine a: training from scratch",
        "queued",
    ]
    assert "{" not in job_view.event_log(events)  # no JSON
    cleared = {"id": 9, "kind": "health", "data": {"alarm": "kl_growth", "state": "cleared", "step": 50}}
    assert job_view.describe_event(cleared) == "step 50: health: KL growth cleared"


def test_each_event_log_line_starts_with_its_time_in_utc():
    events = [
        {"id": 1, "kind": "status", "data": {"status": "queued"}, "created_at": "2026-11-22T18:59:58+00:00"},
        {"id": 2, "kind": "log", "data": {"message": "started (try 1) on machine a: training from the beginning"},
         "created_at": "2026-11-22T18:59:59.5+00:00"},
        {"id": 3, "kind": "metrics", "data": {"step": 1}, "created_at": "2026-11-22T19:00:01+00:00"},
        {"id": 4, "kind": "checkpoint", "data": {"step": 2}, "created_at": "2026-11-22T20:00:05+01:00"},
    ]  # fmt: skip
    assert job_view.event_log(events).splitlines() == [
        "19:00:05 UTC · step 2: checkpoint saved",  # given in +01:00, shown in UTC
        "18:59:59 UTC · started (try 1) on machine a: training from the beginning",
        "18:59:58 UTC · queued",
    ]
    resumed = {"id": 5, "kind": "status", "data": {"status": "running"}, "created_at": "2026-11-23T08:00:00+00:00"}
    assert job_view.event_log([*events, resumed]).splitlines()[:2] == [
        "Nov 23 08:00:00 UTC · running",  # the log spans two days: each line says which
        "Nov 22 19:00:05 UTC · step 2: checkpoint saved",
    ]


def test_the_reward_change_waits_until_its_two_windows_are_apart():
    """The first and last HEAD_TAIL steps overlap before 2 x HEAD_TAIL steps: no change shown until then."""
    body = {"metrics": {"train_rollouts/rewards": [[s, 0.1 * s] for s in range(1, 7)]}}
    assert job_view.reward_change(body) is None
    summary = job_view.run_summary({**JOB, "step": 6}, body, [])
    assert "train reward change n/a until step 10" in summary and "**+" not in summary
    body["metrics"]["train_rollouts/rewards"] += [[s, 0.1 * s] for s in range(7, 11)]
    assert job_view.reward_change(body) == pytest.approx(0.5)  # steps 6-10 against 1-5
    assert "n/a" not in job_view.run_summary({**JOB, "step": 10}, body, [])


def test_an_empty_job_page_says_why():
    assert "queued" in job_view.waiting_message({"status": "queued"})
    assert "generating step 1" in job_view.waiting_message({"status": "running"})
    failed = job_view.waiting_message({"status": "failed", "error": "cannot start the job: no GPU\nmore"})
    assert failed == "The job failed before its first step: cannot start the job: no GPU"


def test_config_diff_lists_the_dotted_keys_that_differ():
    a = {"trainer": {"lr": 0.001, "max_steps": 10}, "reward": {"function": "f"}, "name": "a", "run_dir": "/r/1"}
    b = {"trainer": {"lr": 0.0003, "max_steps": 10}, "reward": {"function": "f", "function_args": {"k": 1}}}
    diff = job_view.config_diff({"1: a": a, "2: b": b})
    assert diff.columns.tolist() == ["key", "1: a", "2: b"]
    assert diff.values.tolist() == [["name", "a", "—"], ["reward.function_args.k", "—", "1"],
                                    ["trainer.lr", "0.001", "0.0003"]]  # fmt: skip


def test_a_warning_when_rewards_are_on_different_scales():
    def body(values):
        return {"metrics": {"train_rollouts/rewards": [[i, v] for i, v in enumerate(values)]}}

    same = {"a": {"reward": {"function": "f"}}, "b": {"reward": {"function": "f"}}}
    assert job_view.scale_warning({"a": body([0, 1]), "b": body([0.2, 0.5])}, same) is None
    wide = job_view.scale_warning({"a": body([0, 1]), "b": body([-20, 5])}, same)
    assert wide and "more than 10x" in wide and "b: 25" in wide
    sources = {"a": {"reward": {"function": "f"}}, "b": {"reward": {"server_url": "http://rm"}}}
    assert "server http://rm" in job_view.scale_warning({"a": body([0, 1]), "b": body([0, 1])}, sources)


def test_two_jobs_answers_side_by_side():
    samples = {
        "1: a": [{"prompt": "p", "response": "ra", "reward": 0.123456}, {"prompt": "q", "response": "x"}],
        "2: b": [{"prompt": "q", "response": "y", "reward": None}, {"prompt": "p", "response": "rb", "reward": 1.0}],
    }
    assert job_view.common_prompts(samples) == ["p", "q"]
    answers = job_view.answers_frame(samples, "p")
    assert answers.columns.tolist() == ["", "1: a", "2: b"]
    assert answers.values.tolist() == [["response", "ra", "rb"], ["reward", "0.1235", "1"]]
    assert job_view.job_choice({"id": 12, "name": "n", "algorithm": "ppo", "status": "paused"}) == (
        "12: n (ppo, paused)",
        12,
    )


class FakeApi:
    """The calls the Job page makes (with their query), the events each stream read returns, and the server's
    metrics (`metrics`: {name: [[step, value], ...]}), filtered by since_step as the API does."""

    def __init__(self, events: list[dict], metrics: dict | None = None):
        self.all_events, self.calls, self.metrics = events, [], metrics or {}

    def events(self, jid: int, after: int = 0) -> list[dict]:
        self.calls.append(f"events>{after}")
        return [e for e in self.all_events if e["id"] > after]

    def get(self, path: str, **params) -> dict:
        self.calls.append(path + "".join(f"?{k}={v}" for k, v in params.items()))
        if path.endswith("/metrics"):
            since = params.get("since_step", -1)
            found = {n: [p for p in points if p[0] > since] for n, points in self.metrics.items()}
            return {"job_id": 1, "metrics": {n: points for n, points in found.items() if points}}
        return {"id": 1, "status": "running"} if path == "/jobs/1" else {"items": []}


def test_the_job_page_fetches_again_only_after_new_events():
    api = FakeApi([{"id": 1, "kind": "status", "data": {"status": "running"}}])
    view = load(api, 1, {})
    assert view["changed"] and view["last_event"] == 1
    assert api.calls == ["events>0", "/jobs/1", "/jobs/1/metrics", "/jobs/1/checkpoints"]
    api.calls.clear()
    assert load(api, 1, view)["changed"] is False and api.calls == ["events>1"]  # nothing new: nothing redrawn
    api.all_events.append({"id": 2, "kind": "metrics", "data": {"step": 1}})
    api.calls.clear()
    later = load(api, 1, view)
    assert api.calls == ["events>1", "/jobs/1", "/jobs/1/metrics"] and later["last_event"] == 2
    assert [e["id"] for e in later["events"]] == [1]  # the charts show metrics events: not kept
    api.calls.clear()
    load(api, 2, later)  # another job: read from the start
    assert api.calls[0] == "events>0"


def test_the_job_page_appends_the_new_steps_of_the_metrics():
    """After the first load the page asks only for the steps after the last one it holds (since_step) and appends
    them: its frames hold every point exactly once. A status change, a fresh page or another job fetches all."""
    reward, kl = [[1, 0.1], [2, 0.2]], [[1, 0.01], [2, 0.02]]
    api = FakeApi(
        [{"id": 1, "kind": "status", "data": {"status": "running"}}, {"id": 2, "kind": "metrics", "data": {}}],
        {TRAIN_REWARD: reward, INIT_POLICY_KL: kl},
    )
    view = load(api, 1, {})
    assert "/jobs/1/metrics" in api.calls and view["metrics"]["metrics"] == {TRAIN_REWARD: reward, INIT_POLICY_KL: kl}
    # Steps 3 and 4 come (the validation of step 4 too), each with its metrics event.
    reward += [[3, 0.3], [4, 0.4]]
    kl.append([3, 0.03])
    api.metrics[VAL_REWARD] = [[4, 0.5]]
    api.all_events += [{"id": 3, "kind": "metrics", "data": {}}, {"id": 4, "kind": "metrics", "data": {}}]
    api.calls.clear()
    later = load(api, 1, view)
    assert api.calls == ["events>2", "/jobs/1", "/jobs/1/metrics?since_step=2"]
    held = metrics_frame(later["metrics"])
    assert held[["step", "series"]].values.tolist() == [
        [1, INIT_POLICY_KL], [2, INIT_POLICY_KL], [3, INIT_POLICY_KL],
        [1, TRAIN_REWARD], [2, TRAIN_REWARD], [3, TRAIN_REWARD], [4, TRAIN_REWARD],
        [4, VAL_REWARD],
    ]  # fmt: skip
    assert held["value"].tolist() == [0.01, 0.02, 0.03, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert len(view["metrics"]["metrics"][TRAIN_REWARD]) == 2  # the earlier state is left as it was
    # A points fetch that overlaps what the page holds (the API read after the events) adds nothing twice.
    overlapping = {"metrics": {TRAIN_REWARD: [[4, 0.4], [5, 0.5]]}}
    appended = job_view.append_metrics(later["metrics"], overlapping)["metrics"][TRAIN_REWARD]
    assert appended == [[1, 0.1], [2, 0.2], [3, 0.3], [4, 0.4], [5, 0.5]]
    # Events that are not metrics fetch no metrics; a status change (a retry may have deleted steps) fetches all.
    api.all_events.append({"id": 5, "kind": "log", "data": {"message": "hello"}})
    api.calls.clear()
    quiet = load(api, 1, later)
    assert api.calls == ["events>4", "/jobs/1"] and quiet["metrics"] is later["metrics"]
    api.all_events.append({"id": 6, "kind": "status", "data": {"status": "queued"}})
    api.calls.clear()
    load(api, 1, quiet)
    assert "/jobs/1/metrics" in api.calls
    for fresh_view in ({}, {**quiet, "job_id": 2}):  # a fresh page, or the page of another job: start over
        api.calls.clear()
        assert load(api, 1, fresh_view)["metrics"]["metrics"][TRAIN_REWARD] == reward
        assert "/jobs/1/metrics" in api.calls


def test_the_selected_jobs_status_is_read_from_the_table():
    table = pd.DataFrame([["", 3, "running"], ["▶", 4, "paused"]], columns=["sel", "id", "status"])
    assert selected_status(table, 4) == "paused" and selected_status(table, 9) is None
    assert selected_status(table, None) is None


def test_the_job_page_downloads_the_best_policy_or_says_there_is_none(api_url, client, token, config, data_dir):
    from webapp import ui

    job = create_job(client, token, config)
    app = ui.build_app(api_url, data_dir)
    fetch = next(fn.fn for fn in app.fns.values() if fn.name == "download_best_model")
    file, message = fetch(token, {"job_id": job["id"]})
    assert file["visible"] is False and f"job {job['id']} has no best policy yet" in message
    best = data_dir / job["run_dir"] / "best_policy"
    best.mkdir(parents=True)
    (best / "config.json").write_text('{"model_type": "llama"}')
    file, message = fetch(token, {"job_id": job["id"]})
    assert file["visible"] is True and file["value"].endswith(f"job_{job['id']}_best_policy.zip")
    assert message.startswith(f"Best policy of job {job['id']}")
