"""The pieces the training loops share (REINFORCE/PPO, the reward model, the demo's SFT): the AdamW they build, one
optimiser step on accumulated gradients, and which steps validate. Each trainer writes its own loop around them.
"""

from __future__ import annotations

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
    """After step `step` (counted from 1): every `val_check_interval` steps, and after the last."""
    return step % val_check_interval == 0 or step == max_steps
