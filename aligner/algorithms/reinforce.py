"""REINFORCE with a leave-one-out (RLOO) baseline: the pure tensor functions.

For a prompt ``x`` the policy ``pi`` samples ``k`` responses ``y_1 .. y_k``; each gets a scalar reward
``r_i = R(x, y_i)``, lowered by a KL penalty that keeps the policy near the frozen reference (initial) policy::

    r'_i = r_i - beta * KL_i                      KL_i: per-token estimate averaged over the response tokens

The baseline of a sample is the mean reward of the *other* samples of the same prompt (leave-one-out), which keeps
the gradient estimate unbiased while reducing its variance::

    b_i = 1/(k-1) * sum_{j != i} r'_j             A_i = r'_i - b_i            (optionally whitened over the batch)

and the loss is REINFORCE's, with the advantage a constant (no gradient flows through it)::

    L = - sum_{i,t} m_{i,t} * A_i * log pi(y_{i,t} | x, y_{i,<t}) / sum_{i,t} m_{i,t}

Defaults follow NVIDIA NeMo-Aligner's REINFORCE where they can: absolute KL (``|log pi - log pi_ref|``) and responses
that did not end properly (truncated at the length limit) excluded from the baseline. The loss above is
"token_mean" (every valid token of the batch weighs the same); NeMo-Aligner's own loss, which weighs each sample the
same and zeroes truncated ones, is ``aggregation="nemo"`` (:func:`nemo_reinforce_loss`); docs/training.md compares
them.

Every function is pure (no state, no in-place change of its inputs), works on the device of its inputs and returns
the floating dtype of its main input. Run the tests with::

    .venv/bin/python -m pytest tests/aligner/algorithms -q
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "advantages_from_baseline",
    "kl_estimate",
    "kl_penalty",
    "masked_mean",
    "nemo_reinforce_loss",
    "reinforce_loss",
    "response_loss_mask",
    "rewards_with_kl",
    "rloo_baseline",
    "truncated_importance_weights",
]

KL_ESTIMATORS = ("k1", "abs", "k2", "k3")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean", "nemo")


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the entries where ``mask`` is set, safe for empty masks.

    ``masked_mean = sum(values * mask) / max(sum(mask), 1)``, the sums over ``dim`` (over every element when ``dim``
    is None). ``mask`` (bool, 0/1 int or float weights) must broadcast to ``values``. Where the mask is empty the
    result is 0, not NaN, and entries where ``mask == 0`` are ignored even when they hold ``inf`` or ``NaN`` (e.g. the
    log-probs of padding), in the value and in the gradient. Returns the dtype of ``values``.
    """
    weights = torch.broadcast_to(mask.to(values.dtype), values.shape)
    total = (values.masked_fill(weights == 0, 0) * weights).sum(dim=dim)
    count = weights.sum(dim=dim).clamp_min(1)
    return total / count


def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    absolute: bool = True,
    estimator: str | None = None,
) -> Tensor:
    """Per-sample KL penalty between the policy and the reference, averaged over the response tokens.

    Args:
        logprobs: ``[B, T]`` log-probs ``log pi(y_t)`` of the sampled response tokens under the policy.
        ref_logprobs: ``[B, T]`` log-probs ``log pi_ref(y_t)`` of the same tokens under the frozen reference.
        mask: ``[B, T]`` (bool or 0/1) marking the valid response tokens.
        absolute: with ``estimator=None``, pick "abs" (True, NeMo-Aligner's default ``use_absolute_kl``) or "k1".
        estimator: per-token estimate, with ``d = logp - logp_ref``; it overrides ``absolute`` when given:

            - ``"k1"``:  ``d`` (unbiased, can be negative per token);
            - ``"abs"``: ``|d|``;
            - ``"k2"``:  ``d^2 / 2`` (Schulman's low-bias estimator; veRL's "mse");
            - ``"k3"``:  ``exp(-d) - 1 + d = exp(logp_ref - logp) - 1 - (logp_ref - logp)`` (Schulman's unbiased,
              non-negative estimator of KL(pi || pi_ref); computed as ``expm1(-d) + d``).

    Returns:
        ``[B]``: ``masked_mean(estimate, mask, dim=-1)``, i.e. ``sum_t m_t * k_t / max(sum_t m_t, 1)``; a sample
        without valid tokens gets 0. Masked positions may hold any value (even ``inf``): they are zeroed before the
        estimator, so they reach neither the value nor the gradient. The gradient is kept (detach it when the KL is
        a reward term, as the trainer does).

    Raises:
        ValueError: unknown ``estimator``, or mismatched shapes.
    """
    if estimator is None:
        estimator = "abs" if absolute else "k1"
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
    if logprobs.shape != ref_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, ref_logprobs {tuple(ref_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same shape"
        )
    valid = mask.bool()
    diff = torch.where(valid, logprobs - ref_logprobs, torch.zeros_like(logprobs))
    return masked_mean(kl_estimate(diff, estimator), valid, dim=-1)


def kl_estimate(diff: Tensor, estimator: str) -> Tensor:
    """One of KL_ESTIMATORS of ``d = logp - logp_ref`` (elementwise, any shape; see :func:`kl_penalty`)."""
    if estimator == "k1":
        return diff
    if estimator == "abs":
        return diff.abs()
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "k3":
        return torch.expm1(-diff) + diff
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def rewards_with_kl(rewards: Tensor, kl: Tensor, initial_policy_kl_penalty: float) -> Tensor:
    """KL-penalised rewards: ``rewards - initial_policy_kl_penalty * kl`` (all ``[B]``).

    ``initial_policy_kl_penalty`` is NeMo-Aligner's name for the coefficient ``beta``; 0 disables the penalty.
    """
    return rewards - initial_policy_kl_penalty * kl


def rloo_baseline(rewards: Tensor, group_ids: Tensor, is_end: Tensor) -> Tensor:
    """Leave-one-out baseline of each sample within its prompt group, over the samples that ended properly.

    Args:
        rewards: ``[B]`` float rewards (usually already KL-penalised).
        group_ids: ``[B]`` int; samples of the same prompt share an id. Groups are taken over the whole batch given,
            and their members need not be contiguous.
        is_end: ``[B]`` bool; True when the sample ended properly (EOS), False when it was truncated.

    Returns:
        ``[B]`` baseline, in the dtype and on the device of ``rewards``. With ``e_j = is_end[j]``, ``G(i)`` the group
        of ``i`` and ``n = sum_{j in G(i)} e_j`` its number of ended samples::

            b_i = sum_{j in G(i), j != i} e_j * r_j / (n - e_i)     if n >= 2
            b_i = r_i                                                if n <= 1  (advantage 0)

        so an ended sample gets the mean of the *other* ended samples of its group, a truncated one the mean of
        *all* the ended samples of its group, and every sample of a group with fewer than two ended samples gets
        its own reward. Truncated samples never enter anyone's baseline.

    This is NeMo-Aligner's ``calculate_rloo_baseline`` (``(1 - eye) @ (reward * mask)`` per group, ``baseline =
    reward`` when ``mask.sum() <= 1``), vectorised with ``index_add`` over the group ids. One deliberate difference:
    NeMo-Aligner divides by ``mask.sum() - 1`` for every sample, which for a truncated sample gives
    ``sum(ended rewards) / (n - 1)``, not a mean; here the divisor is ``n - e_i``, the number of terms summed. The
    two agree on every ended sample. The group sums are accumulated in float64 (except on MPS, which has none), so
    that ``group_sum - own_reward`` does not lose the small rewards of a group that also holds a large one.
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape or is_end.shape != rewards.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, group_ids {tuple(group_ids.shape)} and is_end {tuple(is_end.shape)} "
            "must all have the same 1-D shape [B]"
        )
    acc_dtype = rewards.dtype if rewards.device.type == "mps" else torch.float64
    ended = is_end.to(device=rewards.device, dtype=torch.bool)
    _, group = torch.unique(group_ids.to(rewards.device), return_inverse=True)  # group index in 0 .. G-1
    num_groups = int(group.max()) + 1 if group.numel() else 0

    own = torch.where(ended, rewards.to(acc_dtype), torch.zeros((), dtype=acc_dtype, device=rewards.device))
    own_count = ended.to(torch.int64)
    group_sum = torch.zeros(num_groups, dtype=acc_dtype, device=rewards.device).index_add_(0, group, own)
    group_count = torch.zeros(num_groups, dtype=torch.int64, device=rewards.device).index_add_(0, group, own_count)

    n = group_count[group]
    others_sum = group_sum[group] - own
    others_count = (n - own_count).clamp_min(1)  # >= 1 wherever n >= 2
    loo = (others_sum / others_count.to(acc_dtype)).to(rewards.dtype)
    return torch.where(n >= 2, loo, rewards)


def advantages_from_baseline(rewards: Tensor, baseline: Tensor, normalize: bool = False, eps: float = 1e-8) -> Tensor:
    """Advantages ``a = rewards - baseline`` (``[B]``), optionally whitened over the batch.

    With ``normalize``: ``(a - mean(a)) / (std(a) + eps)`` where ``std`` is the population standard deviation
    (``unbiased=False``: divide by ``B``, not ``B - 1``), over every sample of the batch given. A batch of one
    sample, or of equal advantages, gives zeros (never NaN).
    """
    advantages = rewards - baseline
    if not normalize:
        return advantages
    centered = advantages - advantages.mean()
    if advantages.numel() <= 1:
        return centered
    return centered / (advantages.std(correction=0) + eps)


def response_loss_mask(mask: Tensor, is_end: Tensor, exclude_truncated: bool = False) -> Tensor:
    """The ``[B, T]`` mask of the tokens that enter the loss, as a float tensor.

    ``mask`` as float (its own dtype if already floating, else the default float dtype); with ``exclude_truncated``,
    the rows of the samples with ``is_end`` False are zeroed: ``mask * is_end[:, None]``.
    """
    out_dtype = mask.dtype if mask.is_floating_point() else torch.get_default_dtype()
    out = mask.to(out_dtype)
    if exclude_truncated:
        out = out * is_end.to(device=out.device, dtype=out_dtype)[:, None]
    return out


def reinforce_loss(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    aggregation: str = "token_mean",
    normalizer: float | Tensor | None = None,
    token_weights: Tensor | None = None,
) -> Tensor:
    """REINFORCE policy-gradient loss (a scalar) for sequence-level advantages.

    Per token ``l_{i,t} = -logprobs[i, t] * advantages[i]``, the advantages detached (constants). With ``m`` the
    ``[B, T]`` mask (0/1) of valid tokens and ``n_i = sum_t m_{i,t}``:

    - ``"token_mean"``: ``sum_{i,t} m_{i,t} * l_{i,t} / D``, ``D = max(sum_i n_i, 1)``, every token weighs the same;
    - ``"seq_mean"``: ``sum_i (sum_t m_{i,t} * l_{i,t} / max(n_i, 1)) / D``, ``D = max(#{i : n_i > 0}, 1)``: each
      sample with at least one valid token weighs the same; samples without valid tokens add 0 and are not counted;
    - ``"nemo"``: the same per-sample token means, but ``D = max(B, 1)``, every row counted, those without valid
      tokens (e.g. truncated samples whose rows the mask zeroed) too: NeMo-Aligner's micro-batch loss (see
      :func:`nemo_reinforce_loss`).

    ``normalizer`` (a count, float or tensor) replaces ``D`` (still clamped to at least 1). It serves gradient
    accumulation: when a global batch is split into micro-batches, pass the count over the WHOLE global batch (its
    number of valid tokens for "token_mean", of samples with a valid token for "seq_mean") to every micro-batch;
    the sum of the micro-batch losses (and of their gradients) then equals the loss (and gradient) of the whole
    batch computed in one go. For "nemo" pass ``B * M`` (this micro-batch's rows times the number of micro-batches
    M): the sum over micro-batches is then NeMo-Aligner's mean of the micro-batch means.

    ``token_weights`` ``w`` ([B, T], detached; e.g. :func:`truncated_importance_weights`) multiply each token's term,
    ``l_{i,t} = -w_{i,t} * logprobs[i, t] * advantages[i]``, and leave the counts ``n_i`` and ``D`` as they are.

    An all-zero mask gives a loss of 0, not NaN, still attached to the graph of ``logprobs`` (zero gradients).
    Masked positions of ``logprobs`` may hold any value, ``-inf`` included.

    Raises:
        ValueError: unknown ``aggregation``, or mismatched shapes.
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {LOSS_AGGREGATIONS}")
    if logprobs.dim() != 2 or mask.shape != logprobs.shape or advantages.shape != logprobs.shape[:1]:
        raise ValueError(
            f"expected logprobs [B, T], mask [B, T] and advantages [B]; got {tuple(logprobs.shape)}, "
            f"{tuple(mask.shape)} and {tuple(advantages.shape)}"
        )
    weights = mask.to(logprobs.dtype)
    per_token = -logprobs * advantages.detach().to(logprobs.dtype)[:, None]
    per_token = per_token.masked_fill(weights == 0, 0) * weights
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(logprobs.dtype)

    if aggregation == "token_mean":
        total = per_token.sum()
        count = weights.sum()
    else:  # seq_mean, nemo: a mean per sample
        tokens_per_sample = weights.sum(dim=-1)
        total = (per_token.sum(dim=-1) / tokens_per_sample.clamp_min(1)).sum()
        if aggregation == "seq_mean":
            count = (tokens_per_sample > 0).sum().to(logprobs.dtype)
        else:
            count = torch.tensor(float(logprobs.shape[0]), dtype=logprobs.dtype, device=logprobs.device)

    if normalizer is not None:
        count = torch.as_tensor(normalizer, dtype=logprobs.dtype, device=logprobs.device)
    return total / count.clamp_min(1)


def truncated_importance_weights(logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Per-token truncated importance weights ``w_t = min(exp(logprobs_t - behaviour_logprobs_t), cap)`` ([B, T],
    detached; 0 where ``mask`` is 0).

    With one-step off-policy rollouts (``trainer.async_rollouts: 1``) the samples come from the policy before the
    previous update, ``pi_b``, while the gradient is taken at the current ``pi``. The on-policy REINFORCE gradient
    ``E_pi[A * grad log pi(y)]`` equals ``E_pi_b[(pi(y) / pi_b(y)) * A * grad log pi(y)]``; the per-token ratio, capped
    at ``cap`` (truncated importance sampling, as in Espeholt et al.'s V-trace and NeMo-RL / verl's TIS), keeps the
    variance bounded at the cost of a small bias when the policy moved a lot. On-policy the weights are 1.
    """
    ratio = (logprobs.detach().float() - behaviour_logprobs.float()).masked_fill(~mask.bool(), 0.0).exp()
    return ratio.clamp(max=cap) * mask.to(ratio.dtype)


def nemo_reinforce_loss(
    logprobs: Tensor,
    rewards_with_kl: Tensor,
    baseline: Tensor,
    mask: Tensor,
    is_end: Tensor,
    num_micro_batches: int = 1,
) -> Tensor:
    """NeMo-Aligner's REINFORCE actor loss of one micro-batch of ``B`` samples (a scalar), its share of the step.

    Per sample ``i`` the token mean of ``-log pi(y_{i,t}) * (r'_i - b_i)`` over its response tokens, zeroed when the
    sample did not end properly; summed over the micro-batch, divided by its size, and by the number of
    micro-batches ``M`` of the step (Megatron's schedule scales each micro-batch's loss by ``1 / M``)::

        l_i  = is_end_i * sum_t m_{i,t} * (-logprobs_{i,t}) * (rewards_with_kl_i - baseline_i) / max(n_i, 1)
        loss = sum_i l_i / (B * M)

    so the gradients summed over the ``M`` micro-batches are those of the mean of the micro-batch means (and, with
    gradients averaged over data-parallel ranks as NeMo-Aligner's are, of the mean over all ranks' micro-batches).
    NeMo-Aligner computes ``masked_mean(-logp * (rewards_with_kl - baseline), mask)`` per micro-batch and skips a
    micro-batch without an ended sample; its REINFORCE runs with ``micro_batch_size: 1``, where that is exactly
    ``l_i`` (its ``[mbs, T] * [mbs]`` product does not broadcast for a larger micro-batch). A truncated sample still
    counts in ``B``: its zero weighs in the mean.

    Args:
        logprobs: ``[B, T]`` log-probs of the response tokens under the policy being trained.
        rewards_with_kl, baseline: ``[B]`` the KL-penalised rewards and their RLOO baseline (constants).
        mask: ``[B, T]`` valid response tokens; ``is_end``: ``[B]`` bool, the samples that ended properly.
        num_micro_batches: ``M``, the micro-batches the step is split into (over every data-parallel rank when the
            gradients are summed over ranks, as Aligner's are).
    """
    if is_end.shape != logprobs.shape[:1]:
        raise ValueError(f"is_end must be [B] = [{logprobs.shape[0]}]; got {tuple(is_end.shape)}")
    loss_mask = response_loss_mask(mask, is_end, exclude_truncated=True)
    rows = max(logprobs.shape[0], 1)
    return reinforce_loss(
        logprobs, rewards_with_kl - baseline, loss_mask, "nemo", normalizer=rows * max(num_micro_batches, 1)
    )
