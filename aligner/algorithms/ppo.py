"""PPO with a learned critic: the pure tensor functions.

The policy ``pi`` samples a response; per token ``t`` of it the actor has the log-probs ``log pi(y_t)``, the frozen
reference (initial) policy ``log pi_ref(y_t)`` and the critic a value ``V_t``. The reward model scores the whole
response once (``R``). PPO turns these into per-token rewards, advantages and returns::

    r_t = -beta * k_t + [t = last] * R                 k_t: per-token KL estimate (|log pi - log pi_ref| by default)
    delta_t = r_t + gamma * V_{t+1} - V_t             V after the last token is 0 (the episode ends there)
    A_t = delta_t + gamma * lambda * A_{t+1}          generalised advantage estimation (GAE); G_t = A_t + V_t
    A <- (A - mean(A)) / sqrt(var(A) + eps)           optional whitening over the valid tokens of the batch

and trains the actor on the clipped-ratio objective and the critic on a clipped value loss::

    rho_t = exp(log pi(y_t) - log pi_old(y_t))
    L_actor  = mean_t max(-A_t * rho_t, -A_t * clip(rho_t, 1 - eps, 1 + eps)) - c_H * mean_t H_t
    L_critic = 0.5 * mean_t max((V_t - G_t)^2, (V_old_t + clip(V_t - V_old_t, -c, c) - G_t)^2)

Every mean is over the valid tokens of the batch ("token mean"), as NVIDIA NeMo-Aligner averages them; the defaults
are NeMo-Aligner's (``initial_policy_kl_penalty`` 0.01, ``use_absolute_kl`` true, ``discount_factor`` 1.0,
``gae_lambda`` 0.95, ``ratio_eps`` 0.2, ``entropy_bonus`` 0.0, ``loss_clip_val`` 0.2). Tensors are ``[B, T]`` over
the response tokens, right-padded, with a mask marking the valid ones; the functions are pure (no state, no in-place
change of their inputs), and masked positions may hold any value (``inf``, ``NaN``): they reach neither the results
nor the gradients. Run the tests with::

    .venv/bin/python -m pytest tests/aligner/algorithms/test_ppo.py -q
"""

from __future__ import annotations

import torch
from torch import Tensor

from aligner.algorithms.reinforce import kl_penalty, masked_mean

__all__ = [
    "clipped_value_loss",
    "entropy_from_logits",
    "gae",
    "normalize_advantages",
    "per_token_kl",
    "per_token_rewards",
    "ppo_actor_loss",
]


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"expected {', '.join(shapes)} of the same shape [B, T]; got {listed}")


def _weights(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(device=like.device, dtype=like.dtype)


def _zero_masked(values: Tensor, weights: Tensor) -> Tensor:
    """``values`` with the masked-out entries set to 0, even where they held inf or NaN."""
    return values.masked_fill(weights == 0, 0)


def _token_mean(per_token: Tensor, weights: Tensor, normalizer: float | Tensor | None) -> Tensor:
    """``sum(m * x) / D``, ``D = max(sum(m), 1)`` or the given ``normalizer`` (clamped to at least 1)."""
    total = (_zero_masked(per_token, weights) * weights).sum()
    count = weights.sum()
    if normalizer is not None:
        count = torch.as_tensor(normalizer, dtype=total.dtype, device=total.device)
    return total / count.clamp_min(1)


def per_token_kl(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, absolute: bool = True, estimator: str | None = None
) -> Tensor:
    """Per-token KL estimate ``k_t`` between the policy and the reference, ``[B, T]``, 0 at masked positions.

    With ``d = logprobs - ref_logprobs``: ``|d|`` (``absolute``, NeMo-Aligner's ``use_absolute_kl``), ``d`` (k1,
    ``absolute=False``) or, with ``estimator="k3"``, ``exp(-d) - 1 + d``; the estimators of
    :func:`aligner.algorithms.reinforce.kl_penalty`, not averaged over the tokens. Raises ValueError on an unknown
    estimator or mismatched shapes.
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, mask=mask)
    # kl_penalty averages over the last dim; over a dim of size one that average is the token's own estimate.
    return kl_penalty(logprobs[..., None], ref_logprobs[..., None], mask[..., None], absolute, estimator)


def per_token_rewards(
    rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float = 0.01,
    absolute: bool = True,
    estimator: str | None = None,
) -> Tensor:
    """PPO's per-token rewards ``[B, T]``: a KL penalty on every valid token, the sequence reward on the last one.

    ``r_{i,t} = m_{i,t} * (-kl_coef * k_{i,t}) + [t = last_i] * rewards[i]``, where ``k`` is :func:`per_token_kl`
    and ``last_i`` the index of the last valid token of row ``i`` (the last ``t`` with ``m_{i,t} != 0``). This is
    NeMo-Aligner's ``calculate_ppo_rewards`` with ``calculate_kl_penalty``; ``kl_coef`` is its
    ``initial_policy_kl_penalty`` (0 turns the penalty off). A row without valid tokens gets zeros: its reward has no
    token to go to. Masked positions are 0. The result has the dtype of ``logprobs``.

    Args:
        rewards: ``[B]`` sequence rewards (e.g. from the reward model, already standardised).
        logprobs, ref_logprobs: ``[B, T]`` log-probs of the sampled tokens under the policy and the reference.
        mask: ``[B, T]`` (bool or 0/1) valid response tokens.
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, mask=mask)
    if rewards.shape != logprobs.shape[:1]:
        raise ValueError(f"rewards must be [B] = [{logprobs.shape[0]}]; got {tuple(rewards.shape)}")
    valid = mask.to(logprobs.device).bool()
    out = -kl_coef * per_token_kl(logprobs, ref_logprobs, valid, absolute, estimator)
    positions = torch.arange(valid.shape[1], device=valid.device)
    last = torch.where(valid, positions, -1).amax(dim=1)  # -1: no valid token
    has_token = last >= 0
    rows = torch.arange(valid.shape[0], device=valid.device)[has_token]
    sequence_reward = torch.zeros_like(out)
    sequence_reward[rows, last[has_token]] = rewards.to(device=out.device, dtype=out.dtype)[has_token]
    return out + sequence_reward


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over right-padded responses: ``(advantages, returns)``, both ``[B, T]``.

    With ``r`` and ``V`` zeroed where ``mask`` is 0, and ``V_T = 0``, ``A_T = 0`` past the end::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        G_t     = A_t + V_t                       (the returns: the critic's regression targets)

    so the episode ends after the last valid token (bootstrap 0; a response truncated at the length limit is
    treated the same way, as NeMo-Aligner does). ``gamma`` is NeMo-Aligner's ``discount_factor``, ``lam`` its
    ``gae_lambda``. ``lam = 1`` gives Monte-Carlo returns ``G_t = sum_{k>=t} gamma^(k-t) r_k``; ``lam = 0`` one-step
    TD errors. On the valid tokens this equals NeMo-Aligner's ``calculate_advantages_and_returns``; masked positions
    of the result are 0 here (NeMo leaves values there that its loss masks away). The mask is expected to be one
    contiguous run of valid tokens per row, as a response is.

    Computed without a gradient (the targets are constants). Returns the dtype of ``values``.
    """
    _check_same_shape(rewards=rewards, values=values, mask=mask)
    with torch.no_grad():
        weights = _weights(mask, values)
        v = _zero_masked(values.detach(), weights) * weights
        r = _zero_masked(rewards.detach().to(values.dtype), weights) * weights
        next_v = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)
        deltas = r + gamma * next_v - v
        advantages = torch.zeros_like(v)
        running = torch.zeros_like(v[:, 0])
        for t in range(v.shape[1] - 1, -1, -1):
            running = deltas[:, t] + gamma * lam * running
            advantages[:, t] = running
        returns = advantages + v
        valid = weights != 0
        return advantages * valid, returns * valid


def normalize_advantages(advantages: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Advantages whitened over the valid tokens of the whole batch: ``(A - mu) / sqrt(sigma^2 + eps)``.

    ``mu = masked_mean(A, m)`` and ``sigma^2 = masked_mean((A - mu)^2, m)`` (the population variance, as
    NeMo-Aligner's ``normalize_tensor``; eps inside the square root, 1e-8 as there). Masked positions are 0 in the
    result; an empty mask gives zeros and a single valid token (or equal advantages) gives 0, never NaN.
    """
    _check_same_shape(advantages=advantages, mask=mask)
    weights = _weights(mask, advantages)
    mean = masked_mean(advantages, weights)
    var = masked_mean((advantages - mean) ** 2, weights)
    return _zero_masked((advantages - mean) * torch.rsqrt(var + eps), weights)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dim: ``H = -sum_v p_v * log p_v`` (``[B, T, V]`` -> ``[B, T]``).

    Computed from ``log_softmax`` in the logits' dtype; ``-inf`` logits (tokens excluded by a top-k or top-p filter)
    count as ``p * log p = 0`` and keep the gradient finite.
    """
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp.masked_fill(torch.isneginf(logp), 0)).sum(dim=-1)


def ppo_actor_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ratio_eps: float = 0.2,
    entropy: Tensor | None = None,
    entropy_bonus: float = 0.0,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO's clipped-ratio policy loss (a scalar) and the fraction of tokens the clip cut, ``(loss, clip_fraction)``.

    Per valid token, with ``rho = exp(logprobs - old_logprobs)`` and the advantages and old log-probs constants::

        l_t = max(-A_t * rho_t, -A_t * clip(rho_t, 1 - ratio_eps, 1 + ratio_eps))
        loss = sum_t m_t * l_t / D - entropy_bonus * sum_t m_t * H_t / D

    ``D = max(sum_t m_t, 1)`` (every token of the batch weighs the same, as NeMo-Aligner's ``masked_mean``), or the
    given ``normalizer``: pass the valid-token count of the WHOLE batch to every micro-batch and the micro-batch
    losses (and clip fractions) sum to those of the batch. ``clip_fraction = sum_t m_t * [clipped term > unclipped
    term] / D`` (detached): the share of tokens whose gradient the clip removed. ``entropy`` ([B, T], e.g.
    :func:`entropy_from_logits`) is required when ``entropy_bonus != 0``; NeMo-Aligner's default bonus is 0.

    Args:
        logprobs: ``[B, T]`` log-probs of the sampled tokens under the policy being trained (with gradient).
        old_logprobs: ``[B, T]`` the same under the policy that sampled them (the rollout's).
        advantages: ``[B, T]`` per-token advantages (from :func:`gae`, usually normalised).
        mask: ``[B, T]`` (bool or 0/1) valid response tokens.

    Raises:
        ValueError: mismatched shapes, or an entropy bonus without ``entropy``.
    """
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    if entropy_bonus != 0 and entropy is None:
        raise ValueError("entropy_bonus is set but no entropy was given (see entropy_from_logits)")
    weights = _weights(mask, logprobs)
    # Zeroed before any arithmetic: a -inf or NaN at a masked position would otherwise turn the gradient into NaN.
    ratio = (_zero_masked(logprobs, weights) - _zero_masked(old_logprobs.detach().to(logprobs.dtype), weights)).exp()
    adv = _zero_masked(advantages.detach().to(logprobs.dtype), weights)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - ratio_eps, 1.0 + ratio_eps)
    loss = _token_mean(torch.maximum(unclipped, clipped), weights, normalizer)
    if entropy is not None and entropy_bonus != 0:
        _check_same_shape(entropy=entropy, logprobs=logprobs)
        loss = loss - entropy_bonus * _token_mean(entropy.to(logprobs.dtype), weights, normalizer)
    clip_fraction = _token_mean((clipped > unclipped).to(logprobs.dtype), weights, normalizer).detach()
    return loss, clip_fraction


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float = 0.2,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """The critic's clipped value loss (a scalar), NeMo-Aligner's with ``loss_clip_val = clip``::

        V_clip_t = V_old_t + clip(V_t - V_old_t, -clip, clip)
        loss = 0.5 * sum_t m_t * max((V_clip_t - G_t)^2, (V_t - G_t)^2) / D

    ``D = max(sum_t m_t, 1)`` or the given ``normalizer`` (as in :func:`ppo_actor_loss`). ``clip <= 0`` turns the
    clipping off (the plain squared error). The max makes the clip pessimistic: a value that moved more than ``clip``
    away from the rollout's value, towards the target, gets no further gradient.

    Args:
        values: ``[B, T]`` the critic's current values (with gradient).
        old_values: ``[B, T]`` the values at rollout time (``prev_values``); constants.
        returns: ``[B, T]`` the targets ``G`` from :func:`gae`; constants.
        mask: ``[B, T]`` (bool or 0/1) valid tokens.
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    weights = _weights(mask, values)
    # Zeroed before any arithmetic, so that inf or NaN at masked positions cannot reach the gradient.
    current = _zero_masked(values, weights)
    old = _zero_masked(old_values.detach().to(values.dtype), weights)
    target = _zero_masked(returns.detach().to(values.dtype), weights)
    per_token = (current - target) ** 2
    if clip > 0:
        values_clipped = old + (current - old).clamp(-clip, clip)
        per_token = torch.maximum(per_token, (values_clipped - target) ** 2)
    return 0.5 * _token_mean(per_token, weights, normalizer)
