"""The learning-rate schedule every trainer uses: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math


def lr_multiplier(step: int, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    """Linear warmup to 1 over `warmup_steps`, then cosine decay to `min_ratio` at `max_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
