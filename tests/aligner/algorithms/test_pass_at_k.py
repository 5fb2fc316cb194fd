"""Tests of aligner.algorithms.pass_at_k against brute-force enumeration of every k-subset and the Codex paper's
formula with exact binomials.

Run: .venv/bin/python -m pytest tests/aligner/algorithms -q
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from torch.testing import assert_close

from aligner.algorithms.pass_at_k import grouped_mean_at_k, grouped_pass_at_k, mean_at_k, pass_at_k


def _brute_pass_at_k(correct: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


def _brute_mean_at_k(scores: list[float], k: int) -> float:
    subsets = list(itertools.combinations(scores, k))
    return sum(sum(s) / k for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_enumeration(n):
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(correct, k), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_values():
    # n = 4, c = 1, k = 2: 1 - C(3, 2) / C(4, 2) = 1 - 3/6 = 0.5; k = 1 is c / n
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k: every 3-subset holds a correct one


def test_pass_at_k_large_n_is_stable():
    # C(1000, 100) ~ 6e139 overflows no float here: the product form against exact rationals
    n, c, k = 1000, 7, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_rejects_bad_arguments():
    for n, c, k in [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_at_k_equals_enumeration():
    scores = [0.0, 1.0, 0.25, 0.5, 1.0]
    for k in range(1, 6):
        assert mean_at_k(torch.tensor(scores), k) == pytest.approx(_brute_mean_at_k(scores, k))
    with pytest.raises(ValueError):
        mean_at_k(torch.tensor(scores), 6)


def test_grouped_pass_and_mean_at_k():
    correct = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0, 0, 0])
    group_ids = torch.tensor([5, 5, 5, 2, 2, 2, 9, 9, 9, 9])
    ids, values = grouped_pass_at_k(correct, group_ids, k=2)
    assert ids.tolist() == [2, 5, 9]
    # group 2: 3 of 3 correct -> 1; group 5: 1 of 3 -> 1 - C(2, 2) / C(3, 2) = 2/3; group 9: 0 of 4 -> 0
    assert_close(values, torch.tensor([1.0, 2 / 3, 0.0], dtype=torch.float64))
    ids, means = grouped_mean_at_k(correct.float(), group_ids, k=2)
    assert_close(means, torch.tensor([1.0, 1 / 3, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError):
        grouped_pass_at_k(correct, group_ids, k=4)  # groups 2 and 5 hold only 3 samples
    with pytest.raises(ValueError):
        grouped_mean_at_k(correct.float(), group_ids, k=4)
