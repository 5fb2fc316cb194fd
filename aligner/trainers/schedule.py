"""The learning-rate schedule of every trainer: linear warmup, then cosine or linear decay to a floor."""

from __future__ import annotations

import math
from typing import Literal

import torch

Decay = Literal["cosine", "linear"]


def lr_multiplier(
    step: int, warmup_steps: int, max_steps: int, min_ratio: float = 0.0, decay: Decay = "cosine"
) -> float:
    """Linear warmup to 1 over `warmup_steps`, then `decay` to `min_ratio` at `max_steps`, and `min_ratio` after.

    REINFORCE/PPO decay by cosine to optim.min_lr / optim.lr, the reward model linearly to 0, the demo's SFT by
    cosine to 0.1 after a warmup of a tenth of its steps.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, max_steps - warmup_steps)
    if decay == "linear":
        # Written as the share of the decay still ahead, so min_ratio=0 gives exactly (max_steps - step) / span.
        return min_ratio + (1 - min_ratio) * max(0.0, (max_steps - step) / span)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_scheduler(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    max_steps: int,
    min_ratio: float = 0.0,
    decay: Decay = "cosine",
) -> torch.optim.lr_scheduler.LambdaLR:
    """The optimiser's learning rate times `lr_multiplier` of the number of `scheduler.step()` calls so far."""
    # A lambda, not a partial: LambdaLR leaves functions out of its state_dict, so checkpoints hold no schedule
    # arguments (the config does) and stay as they were.
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, warmup_steps, max_steps, min_ratio, decay)
    )
