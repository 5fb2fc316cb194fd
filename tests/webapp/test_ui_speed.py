"""The Job page's speed and time left against a real run's wall clock, and the dry run's step estimate against real
steps of the demo (issue 30: the header summed timers/step with its phases, about 2x slow; the dry run guessed
about 5x slow)."""

from __future__ import annotations

import json
import time

import pytest

from aligner.metrics import TIMER_STEP, TIMER_WALL
from aligner.trainers.run_log import RunLog
from tests.helpers.training import train
from webapp.ui import job_view

RECORDED_STEPS = 16


@pytest.mark.slow(15)
def test_the_speed_is_a_recorded_runs_steps_over_its_wall_time(run_config, monkeypatch):
    """A tiny run with validations and checkpoints, each step's wall clock taken when its metrics are logged: the
    header's s/step is (wall time)/(steps) from its first step's end to its last's within 10%, and the time left
    follows."""
    logged_at: dict[int, float] = {}
    log_metrics = RunLog.log_metrics

    def timed(self, step, metrics):
        log_metrics(self, step, metrics)
        logged_at[step] = time.perf_counter()

    monkeypatch.setattr(RunLog, "log_metrics", timed)
    config = run_config(trainer={"max_steps": RECORDED_STEPS, "val_check_interval": 4, "save_interval": 4,
                                 "progress_bar": False})  # fmt: skip
    trainer = train(config)
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    body = {"metrics": {}}
    for row in rows:
        for name, value in row.items():
            if name != "step":
                body["metrics"].setdefault(name, []).append([row["step"], value])
    assert TIMER_STEP in body["metrics"]
    first = max(1, RECORDED_STEPS - job_view.SPEED_WINDOW)  # the first step warms up: the speed leaves it out
    wall = (logged_at[RECORDED_STEPS] - logged_at[first]) / (RECORDED_STEPS - first)
    job = {"id": 1, "name": "tiny", "status": "running", "step": RECORDED_STEPS, "max_steps": RECORDED_STEPS + 600}
    shown = job_view.seconds_per_step(job, body)
    assert shown == pytest.approx(wall, rel=0.1), (shown, wall)
    summary = job_view.run_summary(job, body, [])
    assert f"({shown:.3g} s a step)" in summary
    assert f"about **{job_view.duration(600 * shown)}** left" in summary


@pytest.mark.slow(30)
def test_the_dry_runs_estimate_is_within_2x_of_the_demos_measured_step(demo_assets_dir, tmp_path):
    """The dry run's try (the same subprocess, with its timing of the step's batch) and its estimate on the demo's
    config, then a few real steps of that config with the try's threads: the estimate is within 2x of their mean
    wall time (the first step, which warms up, left out)."""
    from aligner.config import load_config
    from webapp.dry_run import DRY_RUN_PROMPTS, DRY_RUN_SAMPLES, estimate_step_s, step_batch
    from webapp.rewards_try import _bounded, _run_try

    steps = 4
    config = load_config(demo_assets_dir / "reinforce.yaml", [f"run_dir={tmp_path / 'run'}"])
    tried = _bounded(config, max_threads=1)  # one thread each: two would wait on each other on a busy machine
    outcome = _run_try(tried, DRY_RUN_PROMPTS, DRY_RUN_SAMPLES, 600, step_batch(config))
    estimate = estimate_step_s(config, outcome.result["timings"])
    measured_config = config.model_copy(
        update={
            "model": config.model.model_copy(update={"num_threads": tried.model.num_threads}),
            "trainer": config.trainer.model_copy(update={"max_steps": steps, "val_check_interval": 0}),
        }
    )
    rows = [json.loads(line) for line in (train(measured_config).run_dir / "metrics.jsonl").read_text().splitlines()]
    measured = [row[TIMER_WALL] for row in rows if row["step"] > 1]
    step_s = sum(measured) / len(measured)
    print(f"\ndemo step: estimated {estimate:.3g} s, measured {step_s:.3g} s; timings {outcome.result['timings']}")
    assert step_s / 2 <= estimate <= 2 * step_s
