"""Run health rules (aligner/health.py) on hand-made metric series: each fires on its failure, stays quiet on a
healthy run and on the first steps' noise."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from aligner.config import HEALTH_RULES, HealthConfig, config_from_dict
from aligner.errors import ConfigError
from aligner.health import (
    ENTROPIES,
    GRAD_NORM,
    KL,
    LENGTH_CORR,
    LOSS,
    PROPERLY_ENDED,
    RULES,
    TRAIN_REWARD,
    VAL_REWARD,
    ZERO_SPREAD,
    ending_collapse,
    entropy_collapse,
    evaluate,
    kl_growth,
    length_hacking,
    nonfinite,
    validation_divergence,
    zero_spread,
)

# Rules judged late and length alarms only on a rise: the cases below show each rule's windows and thresholds apart.
CONFIG = HealthConfig(min_points=20, length_corr_min_rise=0.2)


def per_step(values, start=1):
    return [(start + i, float(v)) for i, v in enumerate(values)]


def noisy(rng, values, scale):
    return [v + rng.uniform(-scale, scale) for v in values]


def healthy_run(steps=80, seed=0):
    """A run like the demo's (aligner/demo): reward rising 0 -> 0.6 with noise, validation rising with noise, KL
    growing by ~0.005 a step to a plateau, no length correlation, a fifth of groups without spread, every response
    ended, finite losses, the entropy falling to under a third of where it began."""
    rng = random.Random(seed)
    rise = [min(0.6, 0.6 * s / 50) for s in range(1, steps + 1)]
    series = {
        TRAIN_REWARD: per_step(noisy(rng, rise, 0.15)),
        KL: per_step(noisy(rng, [min(0.25, 0.006 * s) for s in range(1, steps + 1)], 0.02)),
        LENGTH_CORR: per_step(noisy(rng, [0.0] * steps, 0.3)),
        ZERO_SPREAD: per_step(noisy(rng, [0.2] * steps, 0.15)),
        PROPERLY_ENDED: per_step([1.0] * steps),
        LOSS: per_step(noisy(rng, [0.0] * steps, 0.2)),
        GRAD_NORM: per_step(noisy(rng, [0.35] * steps, 0.1)),
        VAL_REWARD: [(s, min(0.6, 0.6 * s / 50) + rng.uniform(-0.08, 0.08)) for s in range(0, steps + 1, 10)],
        "val/extra_rewards/rule": [(s, 0.1 + 0.005 * s) for s in range(0, steps + 1, 10)],
        # entropy falling as the policy learns, 1.5 -> 0.45 nats a token, with noise
        ENTROPIES[0]: per_step(noisy(rng, [max(0.45, 1.5 - 0.02 * s) for s in range(1, steps + 1)], 0.1)),
    }
    return series


def up_to(series, step):
    return {name: [p for p in points if p[0] <= step] for name, points in series.items()}


def test_every_rule_is_named_in_the_config_and_pause_on_takes_only_those():
    assert tuple(RULES) == HEALTH_RULES
    assert HealthConfig(pause_on=["kl_growth", "nonfinite", "kl_growth"]).pause_on == ["kl_growth", "nonfinite"]
    with pytest.raises(ValidationError, match="unknown alarm 'kl'"):
        HealthConfig(pause_on=["kl"])
    with pytest.raises(ConfigError, match=r"health\.pause_on: unknown alarm 'kl'"):
        config_from_dict({"health": {"pause_on": ["kl"]}})
    with pytest.raises(ValidationError, match="min_points"):
        HealthConfig(window=30, min_points=20)


def test_a_healthy_run_stays_quiet_at_every_step():
    for seed in range(3):
        series = healthy_run(seed=seed)
        for step in range(0, 81):
            assert evaluate(up_to(series, step), CONFIG) == [], (seed, step)


def test_with_the_defaults_a_healthy_run_stays_quiet_and_a_length_reward_fires_within_its_first_steps():
    defaults = HealthConfig()
    for seed in range(3):
        series = healthy_run(seed=seed)
        assert all(evaluate(up_to(series, step), defaults) == [] for step in range(81)), seed
    # reward = length: the correlation is high from the first step, which the defaults flag once min_points are in
    paid_for_length = {LENGTH_CORR: per_step([0.95] * 30)}
    fired = [step for step in range(1, 31) if evaluate(up_to(paid_for_length, step), defaults)]
    assert fired and fired[0] == defaults.min_points <= 10


def test_disabled_health_raises_nothing():
    series = {LOSS: per_step([math.nan])}
    assert [a.name for a in evaluate(series, CONFIG)] == ["nonfinite"]
    assert evaluate(series, HealthConfig(enabled=False)) == []


def test_validation_divergence_on_the_validation_reward_and_on_a_gold_reward():
    train = per_step([0.8 * s / 60 for s in range(1, 61)])  # rising all along
    falling = [(s, v) for s, v in zip(range(0, 61, 10), [0.1, 0.3, 0.5, 0.6, 0.5, 0.4, 0.3], strict=True)]
    alarm = validation_divergence({TRAIN_REWARD: train, VAL_REWARD: falling}, CONFIG)
    assert alarm is not None and alarm.name == "validation_divergence" and alarm.step == 60
    assert "val/rewards fell from 0.533 (to step 40) to 0.4 (to step 60)" in alarm.message

    rising = [(s, 0.1 + s / 100) for s in range(0, 61, 10)]
    gold = {TRAIN_REWARD: train, VAL_REWARD: rising, "val/extra_rewards/rule": falling}
    alarm = validation_divergence(gold, CONFIG)
    assert alarm is not None and "val/extra_rewards/rule fell" in alarm.message and "val/rewards" not in alarm.message
    assert validation_divergence({TRAIN_REWARD: train, VAL_REWARD: rising}, CONFIG) is None

    flat = per_step([0.4] * 60)  # validation falls, training does not rise: not divergence
    assert validation_divergence({TRAIN_REWARD: flat, VAL_REWARD: falling}, CONFIG) is None
    early = {TRAIN_REWARD: train[:15], VAL_REWARD: [(0, 0.9), (5, 0.1), (10, 0.1), (15, 0.1)]}
    assert validation_divergence(early, CONFIG) is None  # fewer than min_points training steps


def test_length_hacking_needs_a_high_and_rising_correlation():
    rising = per_step([0.0] * 20 + [0.8] * 10)
    alarm = length_hacking({LENGTH_CORR: rising}, CONFIG)
    assert alarm is not None and alarm.step == 30 and "correlation 0.80" in alarm.message
    assert length_hacking({LENGTH_CORR: per_step([0.8] * 30)}, CONFIG) is None  # high from the start: the task
    assert length_hacking({LENGTH_CORR: per_step([0.0] * 20 + [0.4] * 10)}, CONFIG) is None  # below the threshold
    assert length_hacking({LENGTH_CORR: per_step([0.0] * 5 + [0.9] * 10)}, CONFIG) is None  # early noise
    assert length_hacking({}, CONFIG) is None  # the metric is not logged


def test_kl_growth_by_slope_and_by_ceiling():
    fast = per_step([0.05 * s for s in range(1, 31)])
    alarm = kl_growth({KL: fast}, CONFIG)
    assert alarm is not None and "grows by 0.05 per step" in alarm.message
    high = per_step([1.5] * 30)
    alarm = kl_growth({KL: high}, CONFIG)
    assert alarm is not None and "1.5 on average" in alarm.message and "ceiling 1" in alarm.message
    assert kl_growth({KL: per_step([0.05 * s for s in range(1, 15)])}, CONFIG) is None  # early
    assert kl_growth({KL: per_step([0.005 * s for s in range(1, 31)])}, CONFIG) is None  # slow


def test_zero_spread_over_the_recent_window():
    alarm = zero_spread({ZERO_SPREAD: per_step([0.9] * 20)}, CONFIG)
    assert alarm is not None and "90% of prompt groups" in alarm.message
    assert zero_spread({ZERO_SPREAD: per_step([1.0] * 10)}, CONFIG) is None  # early
    assert zero_spread({ZERO_SPREAD: per_step([0.9] * 10 + [0.5] * 10)}, CONFIG) is None  # recovered


def test_nonfinite_fires_on_the_first_bad_value_and_clears_after_a_window():
    series = {LOSS: per_step([0.1, 0.2, math.nan]), GRAD_NORM: per_step([0.3, 0.3, 0.3, math.inf])}
    alarm = nonfinite(series, CONFIG)
    assert alarm is not None and alarm.step == 3
    assert alarm.message.startswith("train_optim/loss is nan at step 3; train_optim/grad_norm is inf at step 4")
    assert nonfinite({LOSS: per_step([0.1, math.nan] + [0.1] * 9)}, CONFIG) is not None  # within the window
    assert nonfinite({LOSS: per_step([0.1, math.nan] + [0.1] * 10)}, CONFIG) is None  # a window of finite steps
    assert nonfinite({LOSS: per_step([0.1] * 5)}, CONFIG) is None


def test_ending_collapse_needs_a_low_share_far_below_its_start():
    alarm = ending_collapse({PROPERLY_ENDED: per_step([1.0] * 15 + [0.05] * 10)}, CONFIG)
    assert alarm is not None and "only 5% of responses ended properly" in alarm.message
    assert ending_collapse({PROPERLY_ENDED: per_step([0.1] * 25)}, CONFIG) is None  # never ended: no collapse
    assert ending_collapse({PROPERLY_ENDED: per_step([1.0] * 15 + [0.3] * 10)}, CONFIG) is None  # above the floor
    assert ending_collapse({PROPERLY_ENDED: per_step([1.0] * 3 + [0.0] * 10)}, CONFIG) is None  # early


@pytest.mark.parametrize("name", ENTROPIES)  # REINFORCE's estimate and PPO's
def test_entropy_collapse_needs_the_entropy_far_below_its_start(name):
    rng = random.Random(1)
    collapsed = per_step(noisy(rng, [1.2] * 15 + [0.05] * 10, 0.02))
    alarm = entropy_collapse({name: collapsed}, CONFIG)
    assert alarm is not None and alarm.name == "entropy_collapse" and alarm.step == 25
    assert name in alarm.message and "floor 10%" in alarm.message
    assert [a.name for a in evaluate({name: collapsed}, CONFIG)] == ["entropy_collapse"]
    steady = per_step(noisy(rng, [1.2] * 40, 0.3))  # noisy around its start
    assert entropy_collapse({name: steady}, CONFIG) is None
    assert entropy_collapse({name: per_step([1.2] * 15 + [0.3] * 10)}, CONFIG) is None  # a quarter: above the floor
    assert entropy_collapse({name: per_step([0.05] * 25)}, CONFIG) is None  # low from the start: no collapse
    assert entropy_collapse({name: per_step([1.2] * 3 + [0.0] * 10)}, CONFIG) is None  # early
    assert entropy_collapse({name: per_step([0.0] * 25)}, CONFIG) is None  # nothing to fall from
    assert entropy_collapse({}, CONFIG) is None  # not logged
