import math

import pytest
import torch

from aligner.algorithms.diagnostics import group_reward_stats, reward_length_correlation, zero_spread_fraction


def test_correlation_worked_by_hand():
    # r = 1, 2, 3 and len = 1, 2, 4: deviations (-1, 0, 1) and (-4/3, -1/3, 5/3);
    # cov = 3, |r| = sqrt 2, |len| = sqrt(42/9)
    expected = 3 / math.sqrt(2 * 42 / 9)
    got = reward_length_correlation(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 2, 4]))
    assert got == pytest.approx(expected, rel=1e-12)


def test_correlation_sign_and_degenerate_cases():
    lengths = torch.tensor([3, 8, 5, 13])
    assert reward_length_correlation(lengths.float() * 0.5 + 1, lengths) == pytest.approx(1.0)
    assert reward_length_correlation(-lengths.float(), lengths) == pytest.approx(-1.0)
    assert reward_length_correlation(torch.ones(4), lengths) == 0.0  # a constant reward: nothing to correlate
    assert reward_length_correlation(torch.tensor([2.0]), torch.tensor([7])) == 0.0


def test_group_stats_and_zero_spread():
    rewards = torch.tensor([1.0, 1.0, 0.0, 2.0, 5.0, 5.0 + 1e-9], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    means, stds, spread = group_reward_stats(rewards, groups)
    assert means.tolist() == pytest.approx([1.0, 1.0, 5.0])
    assert stds.tolist() == pytest.approx([0.0, 1.0, 0.0], abs=1e-8)
    assert spread.tolist() == pytest.approx([0.0, 2.0, 0.0], abs=1e-8)
    assert zero_spread_fraction(rewards, groups) == pytest.approx(2 / 3)
    assert zero_spread_fraction(rewards, groups, atol=1e-12) == pytest.approx(1 / 3)
    assert zero_spread_fraction(torch.tensor([]), torch.tensor([], dtype=torch.long)) == 0.0


def test_missing_group_ids_are_not_counted():
    # ids 0 and 2 only: group 1 has no samples and must not count as a zero-spread group
    assert zero_spread_fraction(torch.tensor([1.0, 2.0, 3.0, 3.0]), torch.tensor([0, 0, 2, 2])) == pytest.approx(0.5)
