"""What a reward source is to a trainer: `score(prompts, responses, metadata)` returning a future of one float each."""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import torch

from aligner.errors import RewardError


class RewardClient(Protocol):
    def submit(self, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]) -> Future:
        """Start scoring; the future yields a float32 tensor [B] of rewards."""
        ...

    def close(self) -> None: ...


def check_rewards(values: Sequence[float], expected: int, source: str) -> torch.Tensor:
    values = list(values) if not isinstance(values, torch.Tensor) else values.flatten().tolist()
    if len(values) != expected:
        raise RewardError(f"{source} returned {len(values)} rewards for {expected} samples")
    bad = [i for i, v in enumerate(values) if not isinstance(v, int | float) or not math.isfinite(v)]
    if bad:
        value = values[bad[0]]
        # Only a number is shown: another value may come from a remote server, and nothing it sends is shown.
        shown = repr(value) if isinstance(value, int | float) else f"a {type(value).__name__}"
        raise RewardError(f"{source} returned a non-finite or non-numeric reward for sample {bad[0]}: {shown}")
    return torch.tensor(values, dtype=torch.float32)


def done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
