"""Whether a batch of rollouts can teach anything, and whether its reward is being gamed: pure tensor functions.

RLOO learns from the spread of rewards within a prompt's group: a group whose samples all get the same reward has
advantage 0 for every sample and contributes no gradient. The share of such groups is the share of the batch that
is wasted::

    frac_zero_std_groups = #{g : max_i r_{g,i} - min_i r_{g,i} <= atol} / #groups

A reward that pays for length rather than content shows as a correlation of reward with response length, which a
policy gaming it drives up::

    reward_length_corr = cov(r, len) / (std(r) * std(len))        (Pearson; 0 when either does not vary)

They feed the train_rollouts/ metrics, the service's health alarms (aligner/health.py) and `aligner try-reward`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ZERO_SPREAD_ATOL", "group_reward_stats", "reward_length_correlation", "zero_spread_fraction"]

# Rewards closer than this within a group count as equal: float32 scores of identical texts differ by less.
ZERO_SPREAD_ATOL = 1e-6


def reward_length_correlation(rewards: Tensor, lengths: Tensor) -> float:
    """Pearson correlation of `rewards` [B] with `lengths` [B] (tokens); 0.0 for fewer than 2 samples or when either
    is constant (no linear relation can be measured)."""
    r, n = rewards.detach().double().flatten(), lengths.detach().double().flatten()
    if r.numel() < 2:
        return 0.0
    r, n = r - r.mean(), n - n.mean()
    denominator = (r.square().sum() * n.square().sum()).sqrt()
    if denominator.item() <= 0 or not torch.isfinite(denominator):
        return 0.0
    return float((r * n).sum() / denominator)


def group_reward_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per group of `group_ids` (ids 0..G-1, as generation numbers a step's prompts): (mean, population std, range
    max - min) of its rewards, each [G] in float64."""
    r, g = rewards.detach().double().flatten(), group_ids.detach().long().flatten()
    size = int(g.max()) + 1 if g.numel() else 0
    counts = torch.zeros(size, dtype=torch.float64).index_add_(0, g, torch.ones_like(r)).clamp_min(1)
    means = torch.zeros(size, dtype=torch.float64).index_add_(0, g, r) / counts
    variances = torch.zeros(size, dtype=torch.float64).index_add_(0, g, (r - means[g]).square()) / counts
    high = torch.full((size,), -torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amax")
    low = torch.full((size,), torch.inf, dtype=torch.float64).scatter_reduce(0, g, r, "amin")
    return means, variances.sqrt(), high - low


def zero_spread_fraction(rewards: Tensor, group_ids: Tensor, atol: float = ZERO_SPREAD_ATOL) -> float:
    """Share of the groups (prompts) with at least one sample whose rewards all lie within `atol` of each other: the
    groups RLOO learns nothing from. 0.0 for an empty batch."""
    if rewards.numel() == 0:
        return 0.0
    present = torch.zeros(int(group_ids.max()) + 1, dtype=torch.bool)
    present[group_ids.long().flatten().cpu()] = True
    _means, _stds, spread = group_reward_stats(rewards.cpu(), group_ids.cpu())
    return float((spread[present] <= atol).double().mean())
