"""The Bradley-Terry preference loss of reward-model training: the pure tensor functions.

A reward model ``r`` scores a prompt ``x`` with a response ``y`` by one scalar. Bradley-Terry models the
probability that a labeller prefers the chosen response ``y_c`` over the rejected one ``y_r`` as the sigmoid of
the reward difference::

    P(y_c > y_r | x) = sigmoid(r(x, y_c) - r(x, y_r))

and training maximises the log-likelihood of the observed preferences, i.e. minimises, over a batch of B pairs::

    L = - 1/B * sum_i log sigmoid(r_c,i - r_r,i)

The loss depends only on the differences: adding a constant to every reward changes nothing. Equal rewards give
``log 2`` (about 0.693), the loss of a model that cannot tell the two apart. ``preference_accuracy`` is the share of
pairs the model orders correctly (chosen strictly above rejected; a tie counts as wrong).

Run the tests with::

    .venv/bin/python -m pytest tests/aligner/algorithms -q
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["bradley_terry_loss", "preference_accuracy", "preference_margin"]


def _check_pair(chosen_rewards: Tensor, rejected_rewards: Tensor) -> None:
    if chosen_rewards.dim() != 1 or rejected_rewards.dim() != 1:
        raise ValueError(
            "chosen_rewards and rejected_rewards must be 1-D tensors [B], got shapes "
            f"{tuple(chosen_rewards.shape)} and {tuple(rejected_rewards.shape)}"
        )
    if chosen_rewards.shape != rejected_rewards.shape:
        raise ValueError(
            f"chosen_rewards {tuple(chosen_rewards.shape)} and rejected_rewards {tuple(rejected_rewards.shape)} "
            "must have the same shape: one reward of each per pair"
        )
    if chosen_rewards.numel() == 0:
        raise ValueError("the batch holds no pairs")


def bradley_terry_loss(chosen_rewards: Tensor, rejected_rewards: Tensor) -> Tensor:
    """Mean over the B pairs of ``-log sigmoid(chosen - rejected)``: a scalar in the dtype of the rewards.

    Computed with ``logsigmoid``, so a large negative margin gives a large finite loss, not ``inf``. The gradient
    raises ``chosen_rewards`` and lowers ``rejected_rewards`` by ``sigmoid(rejected - chosen) / B`` each.
    """
    _check_pair(chosen_rewards, rejected_rewards)
    return -F.logsigmoid(chosen_rewards - rejected_rewards).mean()


@torch.no_grad()
def preference_accuracy(chosen_rewards: Tensor, rejected_rewards: Tensor) -> float:
    """Share of pairs with ``chosen > rejected`` (strictly: a tie counts as wrong)."""
    _check_pair(chosen_rewards, rejected_rewards)
    return (chosen_rewards > rejected_rewards).float().mean().item()


@torch.no_grad()
def preference_margin(chosen_rewards: Tensor, rejected_rewards: Tensor) -> float:
    """Mean of ``chosen - rejected`` over the pairs."""
    _check_pair(chosen_rewards, rejected_rewards)
    return (chosen_rewards.float() - rejected_rewards.float()).mean().item()
