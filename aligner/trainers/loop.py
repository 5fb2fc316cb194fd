"""The pieces the training loops share (REINFORCE/PPO, the reward model, the demo's SFT): the AdamW they build, one
optimiser step on accumulated gradients, how many steps a run has, which steps validate and checkpoint, and its
wall-clock limit. Each trainer writes its own loop around them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch


def adamw(parameters: Iterable[torch.nn.Parameter], optim, device: torch.device) -> torch.optim.AdamW:
    """AdamW with the lr, betas, eps and weight_decay of the config section `optim`."""
    return torch.optim.AdamW(
        parameters,
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        # One kernel over all parameters instead of a loop of small ops (CPU and CUDA alike).
        fused=device.type in ("cpu", "cuda"),
    )


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    parameters: Iterable[torch.nn.Parameter],
    max_grad_norm: float,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> torch.Tensor:
    """Clip the accumulated gradients of `parameters` to `max_grad_norm`, step the optimiser (then the scheduler,
    if given) and drop the gradients; returns their norm before clipping.

    The gradients go right away, so they take no memory while the next batch is prepared (generation included).
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def is_validation_step(step: int, val_check_interval: int, max_steps: int) -> bool:
    """After step `step` (counted from 1): every `val_check_interval` steps, and after the last; never with an
    interval of 0 (validation off)."""
    return val_check_interval > 0 and (step % val_check_interval == 0 or step == max_steps)


def is_save_step(step: int, trainer, max_steps: int) -> bool:
    """Whether step `step` is checkpointed on schedule (`trainer` the config section): every `save_interval` steps,
    or with `save_on_validation` at every validation step (NeMo's tie); always after the last."""
    if trainer.save_on_validation:
        return is_validation_step(step, trainer.val_check_interval, max_steps)
    return step % trainer.save_interval == 0 or step == max_steps


def run_length(trainer, num_prompts: int, prompts_per_step: int) -> int:
    """Steps of a run: `trainer.max_steps`, or fewer when `trainer.max_epochs` passes over the `num_prompts`
    training prompts end first (the prompts left that do not fill a whole step are not taken)."""
    if trainer.max_epochs is None:
        return trainer.max_steps
    return min(trainer.max_steps, trainer.max_epochs * num_prompts // prompts_per_step)


class RunClock:
    """`trainer.max_time` of one launch: the clock starts when the run's loop does (a resumed run gets the whole
    limit again, as NeMo's timer restarts with each job)."""

    def __init__(self, max_time: float | None):
        self.max_time = max_time
        self.started = time.monotonic()

    def expired(self) -> bool:
        return self.max_time is not None and time.monotonic() - self.started >= self.max_time
