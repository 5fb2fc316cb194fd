"""pass@k and mean@k from ``n`` samples per prompt: unbiased estimators.

Draw ``n >= k`` responses for a prompt, ``c`` of them correct. The probability that at least one of ``k`` responses
drawn without replacement from those ``n`` is correct, averaged over all ``C(n, k)`` subsets, is (Chen et al. 2021,
"Evaluating Large Language Models Trained on Code", the Codex paper, eq. 1)::

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)     (1 when n - c < k)

the product form being the paper's numerically stable one (no large binomials). mean@k, the expected mean score of
``k`` such responses, is the mean of all ``n`` scores (every response lies in the same share ``k / n`` of the
subsets), whatever ``k``. Both are unbiased estimates of the same quantities over fresh samples; the functions are
pure. Per prompt with :func:`pass_at_k`/:func:`mean_at_k`, per group of a batch with :func:`grouped_pass_at_k`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["grouped_mean_at_k", "grouped_pass_at_k", "mean_at_k", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for ``c`` correct out of ``n`` samples: ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``.

    Raises ValueError unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_at_k(scores: Tensor, k: int) -> float:
    """Unbiased mean@k of one prompt's ``n`` scores (``[n]``, e.g. 0/1 correctness or rewards): their mean, the
    expected mean over the ``C(n, k)`` subsets of size ``k``. Raises ValueError unless ``1 <= k <= n``."""
    n = scores.numel()
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n; got n={n}, k={k}")
    return float(scores.detach().double().mean())


def _groups(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if values.dim() != 1 or group_ids.shape != values.shape:
        raise ValueError("values and group_ids must have the same 1-D shape [B]")
    ids, group = torch.unique(group_ids.cpu(), return_inverse=True)
    counts = torch.zeros(ids.numel(), dtype=torch.float64).index_add_(0, group, torch.ones(group.numel()).double())
    return ids, group, counts


def grouped_pass_at_k(correct: Tensor, group_ids: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """pass@k per group of a batch: ``(ids, values)``, the sorted distinct group ids and their pass@k (float64).

    ``correct`` ``[B]`` (bool or 0/1). Each group needs at least ``k`` samples (ValueError otherwise). The batch
    pass@k is ``values.mean()``.
    """
    ids, group, counts = _groups(correct, group_ids)
    hits = torch.zeros_like(counts).index_add_(0, group, correct.detach().cpu().bool().double())
    values = [pass_at_k(int(n), int(c), k) for n, c in zip(counts.tolist(), hits.tolist(), strict=True)]
    return ids, torch.tensor(values, dtype=torch.float64)


def grouped_mean_at_k(scores: Tensor, group_ids: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """mean@k per group: ``(ids, values)`` as :func:`grouped_pass_at_k`, for float ``scores`` ``[B]``."""
    ids, group, counts = _groups(scores, group_ids)
    if bool((counts < k).any()) or k < 1:
        raise ValueError(f"every group needs at least k={k} >= 1 samples")
    sums = torch.zeros_like(counts).index_add_(0, group, scores.detach().cpu().double())
    return ids, sums / counts
