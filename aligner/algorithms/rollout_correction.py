"""Rollout correction: importance weights for the mismatch between the inference engine and the trainer.

The rollout engine (e.g. vLLM in bf16) samples a response with log-probs ``q_t = log pi_rollout(y_t)``; the trainer
recomputes them as ``p_t = log pi_train(y_t)``. Even for the same weights they differ (kernels, precision), and with
asynchronous rollouts the weights differ too. The policy gradient taken on the engine's samples is corrected by the
importance ratio ``rho = pi_train / pi_rollout`` (constants: no gradient), per token or per sample::

    token:     rho_{i,t} = exp(p_{i,t} - q_{i,t})
    sequence:  rho_i = exp(sum_t (p - q))  ("product", unbiased)   or   exp(mean_t (p - q))  ("geometric_mean")

and either truncated (``"tis"``: ``w = clip(rho, min_ratio, cap)``) or masked (``"mis"``: ``w = rho`` where
``min_ratio <= rho <= cap``, else 0, dropping the token or the whole sample). The weights multiply the per-token
policy loss (``token_weights`` of :func:`aligner.algorithms.grpo.grpo_loss`). :func:`mismatch_metrics` measures the
mismatch. Tensors are ``[B, T]`` with a mask of the valid tokens; masked positions may hold any value; the functions
are pure and return detached tensors. Allowed values: :data:`ROLLOUT_CORRECTIONS`, :data:`CORRECTION_LEVELS`,
:data:`SEQUENCE_RATIOS`.

Peers: veRL ``verl/trainer/ppo/rollout_corr_helper.py`` (``compute_rollout_correction_weights``: token, or sequence
as the product ``exp(sum)`` with the log clamped to +-20, truncated above; ``compute_offpolicy_metrics``), NeMo-RL
``nemo_rl/algorithms/loss/loss_functions.py`` (``truncated_importance_sampling_type`` "tis" = clamp to [min, max],
"icepop" = zero tokens outside [min, max], keep rho inside; "seq-mask-tis" masks samples on the geometric mean),
Yao et al., "Your efficient RL framework secretly brings you off-policy RL training" (TIS), and Liu et al., "When
speed kills stability" (MIS).
"""

from __future__ import annotations

import torch
from torch import Tensor

from aligner.algorithms.reinforce import masked_mean

__all__ = [
    "CORRECTION_LEVELS",
    "ROLLOUT_CORRECTIONS",
    "SAFETY_BOUND",
    "SEQUENCE_RATIOS",
    "log_importance_ratio",
    "mismatch_metrics",
    "rollout_correction_weights",
]

ROLLOUT_CORRECTIONS = ("tis", "mis")
CORRECTION_LEVELS = ("token", "sequence")
SEQUENCE_RATIOS = ("product", "geometric_mean")
# veRL's SAFETY_BOUND: log-ratios are clamped to +-20 before exp (exp(20) ~ 4.9e8) so a weight never overflows.
SAFETY_BOUND = 20.0


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; expected one of {allowed}")


def log_importance_ratio(
    trainer_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    level: str = "token",
    sequence_ratio: str = "product",
) -> Tensor:
    """``log rho`` ``[B, T]`` (float32 or wider, detached, 0 where masked; a sequence's value on each of its rows'
    tokens): ``p - q`` per token; per sequence ``sum_t m (p - q)`` ("product") or its mean over the valid tokens
    ("geometric_mean"); not clamped."""
    _check("level", level, CORRECTION_LEVELS)
    _check("sequence_ratio", sequence_ratio, SEQUENCE_RATIOS)
    if trainer_logprobs.shape != rollout_logprobs.shape or trainer_logprobs.shape != mask.shape:
        raise ValueError("trainer_logprobs, rollout_logprobs and mask must have the same shape [B, T]")
    dtype = torch.promote_types(trainer_logprobs.dtype, torch.float32)
    valid = mask.to(trainer_logprobs.device).bool()
    diff = (trainer_logprobs.detach().to(dtype) - rollout_logprobs.detach().to(dtype)).masked_fill(~valid, 0.0)
    if level == "token":
        return diff
    per_sample = diff.sum(dim=-1) if sequence_ratio == "product" else masked_mean(diff, valid, dim=-1)
    return per_sample[:, None] * valid


def rollout_correction_weights(
    trainer_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    method: str = "tis",
    level: str = "token",
    cap: float = 2.0,
    min_ratio: float = 0.0,
    sequence_ratio: str = "product",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Correction weights ``w`` ``[B, T]`` (detached, 0 where masked) and their stats (scalar tensors).

    ``rho = exp(clamp(log rho, -20, 20))`` (:func:`log_importance_ratio` at ``level``; the clamp is veRL's
    SAFETY_BOUND)::

        "tis": w = clip(rho, min_ratio, cap)                  truncated importance sampling
        "mis": w = rho * [min_ratio <= rho <= cap]            masked: out-of-range tokens / samples get 0

    At sequence level every token of a sample gets the sample's weight (a masked sample loses all its tokens).
    Stats, over the valid tokens ("token") or the samples with a valid token ("sequence"): ``share_corrected``:
    the share whose ``rho`` lay outside ``[min_ratio, cap]`` (truncated by "tis", masked by "mis");
    ``share_masked``: the share "mis" zeroed (0 for "tis"); ``weight_mean``: mean of ``w``; ``rho_min`` /
    ``rho_max``: of the (clamped) ``rho``. An empty mask gives zero weights and zero stats.

    Peers: veRL ``compute_rollout_correction_weights`` is "tis" with ``min_ratio = 0`` at token level and at
    sequence level with "product" (tested equal); its rejection sampling (``compute_rollout_rejection_mask``)
    returns a mask only, while "mis" keeps ``rho`` on the kept tokens as NeMo-RL's "icepop" does (tested equal).
    NeMo-RL's "tis" with ``truncated_importance_sampling_ratio_min`` is "tis" with ``min_ratio``; its
    "seq-mask-tis" masks samples by the geometric mean but keeps token-level weights: the product of this function's
    ``mis``/``sequence``/``geometric_mean`` mask (``w > 0``) with token-level ``rho``.
    """
    _check("method", method, ROLLOUT_CORRECTIONS)
    if cap <= 0 or min_ratio < 0 or min_ratio > cap:
        raise ValueError(f"need 0 <= min_ratio <= cap and cap > 0; got min_ratio={min_ratio}, cap={cap}")
    log_rho = log_importance_ratio(trainer_logprobs, rollout_logprobs, mask, level, sequence_ratio)
    valid = mask.to(log_rho.device).bool()
    rho = log_rho.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    outside = (rho < min_ratio) | (rho > cap)
    if method == "tis":
        weights = rho.clamp(min_ratio, cap)
        masked = torch.zeros_like(outside)
    else:
        weights = torch.where(outside, torch.zeros_like(rho), rho)
        masked = outside
    weights = weights * valid
    # Stats per unit of correction: tokens at token level, samples (their first valid token) at sequence level.
    if level == "token":
        unit = valid
    else:
        first = valid & (valid.cumsum(dim=-1) == 1)
        unit = first
    any_unit = bool(unit.any())
    stats = {
        "share_corrected": masked_mean(outside.to(rho.dtype), unit),
        "share_masked": masked_mean(masked.to(rho.dtype), unit),
        "weight_mean": masked_mean(weights, unit),
        "rho_min": rho[unit].min() if any_unit else rho.new_zeros(()),
        "rho_max": rho[unit].max() if any_unit else rho.new_zeros(()),
    }
    return weights, stats


def mismatch_metrics(trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the engine's log-probs ``q`` are from the trainer's ``p`` on the sampled tokens (scalar tensors).

    With ``d = p - q`` over the valid tokens of the batch (``N`` of them)::

        mismatch_kl        = sum m * (exp(d) - 1 - d) / N             k3 estimate of KL(pi_rollout || pi_train)
                                                                      (the tokens were sampled by the engine)
        mismatch_ppl_ratio = exp(sum m * (q - p) / N) = PPL_train / PPL_rollout, the perplexities of the batch's
                             tokens as one corpus (exp of minus the token-mean log-prob); 1 when they agree

    ``mismatch_kl`` equals veRL's ``compute_offpolicy_metrics`` ``k3_kl`` (tested). veRL's ``ppl_ratio`` is the
    mean over sequences of the per-sequence ratio ``exp(mean_t q - mean_t p)``: the same for one sequence, or
    for equal per-sequence ratios, in general not (a long sequence weighs more here). 0 and 1 for an empty mask.
    """
    log_ratio = log_importance_ratio(trainer_logprobs, rollout_logprobs, mask, "token")
    valid = mask.to(log_ratio.device).bool()
    return {
        "mismatch_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, valid),
        "mismatch_ppl_ratio": masked_mean(-log_ratio, valid).exp(),
    }
