"""The learning-rate schedule of every trainer: linear warmup, cosine or linear decay to a floor, and optionally a
constant phase at the floor before `max_steps` (NeMo's CosineAnnealing `constant_steps`)."""

from __future__ import annotations

import math
from typing import Literal

import torch

Decay = Literal["cosine", "linear"]


def lr_multiplier(
    step: int,
    warmup_steps: int,
    max_steps: int,
    min_ratio: float = 0.0,
    decay: Decay = "cosine",
    constant_steps: int = 0,
) -> float:
    """Linear warmup to 1 over `warmup_steps`, then `decay` to `min_ratio` at `end = max_steps - constant_steps`,
    and `min_ratio` after (the last `constant_steps` steps, and past `max_steps`).

    REINFORCE/PPO decay by cosine to optim.min_lr / optim.lr (with sched.constant_steps), the reward model linearly
    to 0, the demo's SFT by cosine to 0.1 after a warmup of a tenth of its steps.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    end = max_steps - constant_steps
    span = max(1, end - warmup_steps)
    if decay == "linear":
        # Written as the share of the decay still ahead, so min_ratio=0 gives exactly (end - step) / span.
        return min_ratio + (1 - min_ratio) * max(0.0, (end - step) / span)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_scheduler(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    max_steps: int,
    min_ratio: float = 0.0,
    decay: Decay = "cosine",
    constant_steps: int = 0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The optimiser's learning rate times `lr_multiplier` of the number of `scheduler.step()` calls so far."""
    # A lambda, not a partial: LambdaLR leaves functions out of its state_dict, so checkpoints hold no schedule
    # arguments (the config does) and stay as they were.
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, warmup_steps, max_steps, min_ratio, decay, constant_steps)
    )
