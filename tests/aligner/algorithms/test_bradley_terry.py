"""Tests of aligner.algorithms.bradley_terry against values worked out by hand (the arithmetic is in the comments).

Run: .venv/bin/python -m pytest tests/aligner/algorithms -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from aligner.algorithms.bradley_terry import bradley_terry_loss, preference_accuracy, preference_margin


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def test_equal_rewards_give_log_2():
    # sigmoid(0) = 1/2 -> -log(1/2) = log 2, whatever the common value
    assert_close(bradley_terry_loss(t([0.0]), t([0.0])), t(math.log(2)))
    assert_close(bradley_terry_loss(t([5.0, -3.0]), t([5.0, -3.0])), t(math.log(2)))


def test_margin_of_ln3_gives_minus_log_three_quarters():
    # sigmoid(ln 3) = 3 / (3 + 1) = 3/4 -> -log(3/4) = log(4/3)
    assert_close(bradley_terry_loss(t([math.log(3)]), t([0.0])), t(-math.log(3 / 4)))
    # the wrong way round: sigmoid(-ln 3) = 1/4 -> log 4
    assert_close(bradley_terry_loss(t([0.0]), t([math.log(3)])), t(math.log(4)))


def test_batch_is_the_mean_over_pairs_and_only_differences_matter():
    # margins 0 and ln 3: (log 2 + log(4/3)) / 2 = log(8/3) / 2
    chosen, rejected = t([1.0, 2.0 + math.log(3)]), t([1.0, 2.0])
    expected = t(math.log(8 / 3) / 2)
    assert_close(bradley_terry_loss(chosen, rejected), expected)
    assert_close(bradley_terry_loss(chosen + 100.0, rejected + 100.0), expected)


def test_large_negative_margin_is_finite():
    # -log sigmoid(-200) = log(1 + e^200) ~ 200 (a naive log(sigmoid) would give inf)
    loss = bradley_terry_loss(t([-100.0]), t([100.0]))
    assert torch.isfinite(loss) and loss.item() == pytest.approx(200.0)


def test_gradient_raises_chosen_and_lowers_rejected():
    chosen, rejected = t([0.0, math.log(3)]).requires_grad_(), t([0.0, 0.0]).requires_grad_()
    bradley_terry_loss(chosen, rejected).backward()
    # dL/dc_i = -sigmoid(-m_i) / B: pair 0 (m = 0) -1/2 / 2 = -1/4; pair 1 (m = ln 3) -(1/4) / 2 = -1/8
    assert_close(chosen.grad, t([-0.25, -0.125]))
    assert_close(rejected.grad, t([0.25, 0.125]))  # the opposite: descent lowers the rejected reward


def test_keeps_the_dtype():
    assert bradley_terry_loss(t([1.0], torch.float64), t([0.0], torch.float64)).dtype == torch.float64


def test_accuracy_counts_ties_as_wrong_and_margin_is_the_mean_difference():
    chosen, rejected = t([1.0, 2.0, 3.0, 0.5]), t([0.0, 2.0, 4.0, -0.5])
    # right, tie (wrong), wrong, right -> 2/4
    assert preference_accuracy(chosen, rejected) == pytest.approx(0.5)
    # (1 + 0 - 1 + 1) / 4 = 0.25
    assert preference_margin(chosen, rejected) == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("chosen", "rejected", "match"),
    [
        (torch.zeros(3), torch.zeros(2), "same shape"),
        (torch.zeros(2, 1), torch.zeros(2, 1), "1-D"),
        (torch.zeros(()), torch.zeros(()), "1-D"),
        (torch.zeros(0), torch.zeros(0), "no pairs"),
    ],
)
@pytest.mark.parametrize("fn", [bradley_terry_loss, preference_accuracy, preference_margin])
def test_shape_errors(fn, chosen, rejected, match):
    with pytest.raises(ValueError, match=match):
        fn(chosen, rejected)
