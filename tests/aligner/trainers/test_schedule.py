"""The one learning-rate schedule (aligner/trainers/schedule.py) against the three it replaced, and by hand."""

from __future__ import annotations

import math

import pytest
import torch

from aligner.trainers.schedule import lr_multiplier, lr_scheduler


# The schedules each trainer had before they shared one, verbatim.
def old_trainer_cosine(step: int, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def old_reward_model_linear(step: int, warmup_steps: int, max_steps: int) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))


def old_demo_sft(step: int, steps: int) -> float:
    warmup = max(1, steps // 10)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


# Every (warmup, max_steps) pairing: no warmup, a warmup longer than the run, runs of 1 step.
LENGTHS = [(w, m) for w in (0, 1, 3, 10) for m in (1, 2, 7, 10, 50)]


@pytest.mark.parametrize(("warmup", "max_steps"), LENGTHS)
def test_equals_the_old_schedules_on_every_step_a_scheduler_reaches(warmup, max_steps):
    # LambdaLR evaluates the schedule at steps 0 .. max_steps (the last after the final optimiser step).
    for step in range(max_steps + 1):
        for min_ratio in (0.0, 0.1, 0.35):
            assert lr_multiplier(step, warmup, max_steps, min_ratio) == old_trainer_cosine(
                step, warmup, max_steps, min_ratio
            )
        assert lr_multiplier(step, warmup, max_steps, decay="linear") == old_reward_model_linear(
            step, warmup, max_steps
        )
    for step in range(max_steps + 1):
        assert lr_multiplier(step, max(1, max_steps // 10), max_steps, 0.1) == old_demo_sft(step, max_steps)


def test_values_worked_by_hand():
    # Warmup 4: (step + 1) / 4; then 16 steps of decay, halfway at step 12.
    assert lr_multiplier(0, 4, 20, 0.1) == 0.25
    assert lr_multiplier(3, 4, 20, 0.1) == 1.0
    assert lr_multiplier(4, 4, 20, 0.1) == 1.0
    assert lr_multiplier(12, 4, 20, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # cos(pi / 2) = 0
    assert lr_multiplier(8, 4, 20, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))  # a quarter of the way
    assert lr_multiplier(12, 4, 20, decay="linear") == 0.5  # (20 - 12) / 16
    assert lr_multiplier(16, 4, 20, decay="linear") == 0.25
    assert lr_multiplier(12, 4, 20, 0.2, decay="linear") == pytest.approx(0.6)  # 0.2 + 0.8 * 0.5
    # The demo's SFT: 100 steps, warmup 10, cosine to 0.1; halfway through the 90 steps of decay at step 55.
    assert lr_multiplier(0, 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_multiplier(55, 10, 100, 0.1) == pytest.approx(0.55)


def test_constant_steps_hold_min_ratio_at_the_end_as_nemos_cosine_annealing():
    # Warmup 2, max 12, constant 4: the cosine spans steps 2 .. 8 (6 steps), halfway at step 5, then min_ratio.
    assert lr_multiplier(1, 2, 12, 0.1, constant_steps=4) == 1.0
    assert lr_multiplier(5, 2, 12, 0.1, constant_steps=4) == pytest.approx(0.1 + 0.9 * 0.5)
    assert [lr_multiplier(s, 2, 12, 0.1, constant_steps=4) for s in (8, 10, 12, 20)] == pytest.approx([0.1] * 4)
    assert lr_multiplier(7, 2, 12, 0.1, constant_steps=4) > 0.1
    # 0 constant steps is the schedule without them.
    assert all(lr_multiplier(s, 2, 12, 0.1, constant_steps=0) == lr_multiplier(s, 2, 12, 0.1) for s in range(13))


@pytest.mark.parametrize("decay", ["cosine", "linear"])
@pytest.mark.parametrize("min_ratio", [0.0, 0.1, 0.5])
def test_decay_reaches_min_ratio_at_max_steps_and_stays(decay, min_ratio):
    assert lr_multiplier(20, 4, 20, min_ratio, decay) == pytest.approx(min_ratio, abs=1e-15)
    assert lr_multiplier(30, 4, 20, min_ratio, decay) == pytest.approx(min_ratio, abs=1e-15)
    values = [lr_multiplier(s, 4, 20, min_ratio, decay) for s in range(4, 21)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # never rises after the warmup


def test_scheduler_sets_the_rate_and_its_state_holds_no_schedule():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = lr_scheduler(optimizer, 2, 10, min_ratio=0.1, decay="linear")
    rates = []
    for _ in range(11):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == [2.0 * lr_multiplier(s, 2, 10, 0.1, "linear") for s in range(11)]
    # A function is left out of LambdaLR's state: checkpoints hold what they held before the shared schedule.
    assert scheduler.state_dict()["lr_lambdas"] == [None]
