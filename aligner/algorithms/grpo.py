"""The GRPO family (GRPO, Dr.GRPO, DAPO, GSPO, CISPO, REINFORCE++): the pure tensor functions.

For a prompt the policy samples a group of responses; each gets a scalar reward ``r_i``. The advantage of a sample
is its reward against a baseline of its group, optionally divided by a reward spread (the contract of
:func:`grpo_advantages`)::

    A_i = (r_i - b_i) / s_i      b_i: "rloo" | "group_mean" | "none";  s_i: "group" | "batch" | "none" std (+ eps)

or, for REINFORCE++ (:func:`reinforce_pp_advantages`), per token: the KL to the reference folded into per-token
rewards, the return from each token, whitened over every valid token of the batch. The policy is trained on the
ratio to the rollout's (old) policy, clipped (PPO, DAPO's clip-higher, dual clip), per token or per sequence (GSPO),
or as CISPO's clipped stop-gradient weight on the log-prob (:func:`per_token_policy_loss`); an optional KL-to-the-
reference term is added per token (GRPO's ``kl_in: loss``, :func:`kl_loss_term`), and the per-token loss is reduced
to a scalar by one of :data:`LOSS_AGGREGATIONS` (:func:`aggregate_loss`) under the ``normalizer`` contract: pass
:func:`loss_normalizer` of the WHOLE batch to every micro-batch and the micro-batch losses (and gradients) sum to
the loss of the batch. :func:`grpo_loss` chains the three. DAPO's soft overlong penalty and the zero-spread groups
dynamic sampling drops are here too.

Tensors are ``[B]`` per sample or ``[B, T]`` per response token, right-padded, with a mask (bool, 0/1 or float)
marking the valid tokens. Every function is pure (no state, no in-place change of its inputs); masked positions may
hold any value (``inf``, ``NaN``): they reach neither the results nor the gradients. Advantages, old and rollout
log-probs and weights are constants (detached); gradients flow through ``logprobs`` only. Allowed string values are
the tuples :data:`ADVANTAGE_BASELINES`, :data:`REWARD_SCALINGS`, :data:`LOSS_AGGREGATIONS`, :data:`POLICY_LOSSES`,
:data:`IMPORTANCE_LEVELS` and :data:`KL_ESTIMATORS`. Peers are cited per function (veRL
``verl/trainer/ppo/core_algos.py``, TRL ``trl/trainer/grpo_trainer.py``, NeMo-RL
``nemo_rl/algorithms/loss/loss_functions.py``); tests/aligner/algorithms/test_grpo.py checks each against a
transcription of the peer's code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aligner.algorithms.diagnostics import ZERO_SPREAD_ATOL
from aligner.algorithms.reinforce import KL_ESTIMATORS, kl_estimate, masked_mean, rloo_baseline

__all__ = [
    "ADVANTAGE_BASELINES",
    "IMPORTANCE_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "REWARD_SCALINGS",
    "REWARD_STD_EPS",
    "aggregate_loss",
    "group_reward_moments",
    "grpo_advantages",
    "grpo_loss",
    "importance_ratio",
    "kl_loss_term",
    "loss_normalizer",
    "masked_whiten",
    "overlong_penalty",
    "per_token_kl_estimate",
    "per_token_policy_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_returns",
    "zero_spread_groups",
]

ADVANTAGE_BASELINES = ("rloo", "group_mean", "none")
REWARD_SCALINGS = ("group", "batch", "none")
REWARD_STD_EPS = 1e-6  # added to a reward std before dividing by it (veRL's grpo epsilon)
# The first three are reinforce.LOSS_AGGREGATIONS (same definitions); veRL's loss_agg_mode names, in order:
# token-mean, seq-mean-token-mean, (NeMo-Aligner), seq-mean-token-sum, seq-mean-token-sum-norm.
LOSS_AGGREGATIONS = ("token_mean", "seq_mean", "nemo", "seq_mean_token_sum", "seq_mean_token_sum_norm")
POLICY_LOSSES = ("clip", "cispo")
IMPORTANCE_LEVELS = ("token", "sequence")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; expected one of {allowed}")


def _acc_dtype(like: Tensor) -> torch.dtype:
    return like.dtype if like.device.type == "mps" else torch.float64


def _zero_masked(values: Tensor, weights: Tensor) -> Tensor:
    return values.masked_fill(weights == 0, 0)


# ------------------------------------------------------------------------------------------------------ advantages


def group_reward_moments(
    rewards: Tensor, group_ids: Tensor, is_end: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample statistics of its group's counted rewards: ``(n, mean, std, spread)``, each ``[B]`` in float64.

    The counted samples are those with ``is_end`` (every sample when ``is_end`` is None): a truncated sample's
    reward (possibly NaN) never enters a statistic, as in :func:`aligner.algorithms.reinforce.rloo_baseline`. With
    ``G(i)`` the counted members of ``i``'s group: ``n = |G(i)|``, ``mean = sum r_j / max(n, 1)``, ``std`` the
    unbiased (Bessel) standard deviation ``sqrt(sum (r_j - mean)^2 / (n - 1))`` as TRL's ``nanstd`` and veRL's
    ``torch.std`` (0 when ``n < 2``), ``spread = max r_j - min r_j`` (0 when ``n == 0``). Group ids need not be
    contiguous or start at 0.
    """
    if (
        rewards.dim() != 1
        or group_ids.shape != rewards.shape
        or (is_end is not None and is_end.shape != rewards.shape)
    ):
        raise ValueError("rewards, group_ids and is_end must all have the same 1-D shape [B]")
    acc = _acc_dtype(rewards)
    device = rewards.device
    counted = torch.ones_like(rewards, dtype=torch.bool) if is_end is None else is_end.to(device).bool()
    _, group = torch.unique(group_ids.to(device), return_inverse=True)
    size = int(group.max()) + 1 if group.numel() else 0
    r = torch.where(counted, rewards.detach().to(acc), torch.zeros((), dtype=acc, device=device))
    n = torch.zeros(size, dtype=acc, device=device).index_add_(0, group, counted.to(acc))
    mean = torch.zeros(size, dtype=acc, device=device).index_add_(0, group, r) / n.clamp_min(1)
    dev = torch.where(counted, r - mean[group], torch.zeros((), dtype=acc, device=device))
    ss = torch.zeros(size, dtype=acc, device=device).index_add_(0, group, dev.square())
    std = torch.where(n >= 2, (ss / (n - 1).clamp_min(1)).sqrt(), torch.zeros((), dtype=acc, device=device))
    inf = torch.tensor(torch.inf, dtype=acc, device=device)
    high = torch.full((size,), -torch.inf, dtype=acc, device=device)
    high = high.scatter_reduce(0, group, torch.where(counted, r, -inf), "amax")
    low = torch.full((size,), torch.inf, dtype=acc, device=device).scatter_reduce(
        0, group, torch.where(counted, r, inf), "amin"
    )
    spread = torch.where(n >= 1, high - low, torch.zeros((), dtype=acc, device=device))
    return n[group], mean[group], std[group], spread[group]


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    is_end: Tensor | None = None,
    baseline: str = "group_mean",
    scale_rewards: str = "group",
    eps: float = REWARD_STD_EPS,
) -> Tensor:
    """Sequence-level advantages ``[B]`` (dtype of ``rewards``, detached) of the GRPO family.

    ``A_i = (r_i - b_i) / s_i`` with, over the counted members of ``i``'s group (see :func:`group_reward_moments`;
    ``is_end`` None counts every sample, as TRL and veRL do)::

        baseline "rloo":       b_i = rloo_baseline(r, group_ids, is_end)      (RLOO, unchanged; ended samples only)
        baseline "group_mean": b_i = mean_{j in G(i)} r_j  if n >= 2, else r_i    (GRPO; the mean includes i)
        baseline "none":       b_i = 0                                            (raw rewards, e.g. REINFORCE)
        scale "group":  s_i = std_{G(i)}(r) + eps  (unbiased)   "batch": s_i = std_batch(r) + eps   "none": s_i = 1

    ``std_batch`` is the unbiased std of the counted rewards of the whole batch (TRL's ``scale_rewards="batch"``:
    the std of the rewards, not of the centred advantages). A std of 0 (fewer than two counted samples, or equal
    rewards) gives ``s_i = 1``: nothing to scale by. A counted sample of a group whose counted rewards are all equal
    (zero spread) gets exactly 0 with a baseline (its ``r_i - mean`` would otherwise be a float rounding residue,
    e.g. ``0.1 - mean(0.1, 0.1, 0.1) = -1.4e-17``, blown up by ``1 / eps`` in TRL and veRL). A truncated sample
    (``is_end`` False) is scored against the ended ones (its own reward never enters ``b`` or ``s``), as RLOO does;
    ``group_mean`` needs at least two ended samples, like ``rloo``.

    Peers: GRPO (Shao et al. 2024, arXiv:2402.03300) ``(r - mean) / std``; Dr.GRPO (Liu et al. 2025,
    arXiv:2503.20783) drops the std (``scale_rewards="none"``). TRL ``_generate_and_score_completions``:
    ``(r - mean_g) / (nanstd + 1e-4)`` for "group" / "batch"; veRL ``compute_grpo_outcome_advantage``:
    ``(r - mean_g) / (torch.std + 1e-6)`` and ``compute_rloo_outcome_advantage``. They agree with this on groups
    of two or more samples with spread; they differ on a group of ONE sample, where veRL uses mean 0 and std 1
    (``A = r / (1 + eps)``) and TRL gives 0 (as here), and on zero-spread groups (rounding residue vs exact 0).
    """
    _check_choice("baseline", baseline, ADVANTAGE_BASELINES)
    _check_choice("scale_rewards", scale_rewards, REWARD_SCALINGS)
    n, mean, std, spread = group_reward_moments(rewards, group_ids, is_end)
    acc = mean.dtype
    counted = torch.ones_like(rewards, dtype=torch.bool) if is_end is None else is_end.to(rewards.device).bool()
    r = rewards.detach().to(acc)
    if baseline == "rloo":
        b = rloo_baseline(rewards.detach().to(acc), group_ids, counted)
    elif baseline == "group_mean":
        b = torch.where(n >= 2, mean, r)
    else:
        b = torch.zeros_like(r)
    one = torch.ones((), dtype=acc, device=r.device)
    if scale_rewards == "group":
        scale = torch.where(std > 0, std + eps, one)
    elif scale_rewards == "batch":
        kept = r[counted]
        batch_std = kept.std() if kept.numel() >= 2 else torch.zeros((), dtype=acc, device=r.device)
        scale = torch.where(batch_std > 0, batch_std + eps, one).expand_as(r)
    else:
        scale = one.expand_as(r)
    advantages = (r - b) / scale
    if baseline != "none":
        advantages = torch.where(counted & (spread == 0), torch.zeros_like(advantages), advantages)
    return advantages.to(rewards.dtype)


def per_token_kl_estimate(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    estimator: str = "k3",
    input_clamp: float | None = None,
    output_clamp: float | None = None,
) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by ``pi``, ``[B, T]``, 0 at masked positions.

    With ``d = logprobs - ref_logprobs`` (first clamped to ``[-input_clamp, input_clamp]`` when given):
    ``"k1"``: ``d``; ``"abs"``: ``|d|``; ``"k2"``: ``0.5 * d^2``; ``"k3"``: ``exp(-d) - 1 + d`` (Schulman 2020,
    "Approximating KL divergence"); then clamped to ``[-output_clamp, output_clamp]`` when given. k1, abs and k3
    equal :func:`aligner.algorithms.ppo.per_token_kl`. The gradient flows through ``logprobs``
    (and ``ref_logprobs`` if it has one); a clamp cuts it where it binds.

    Peers: veRL ``kl_penalty_forward`` ("k2"/"mse" = ``0.5 * d^2``; "low_var_kl"/"k3" with the input clamped to
    +-20 and the output to +-10: pass ``input_clamp=20, output_clamp=10``); NeMo-RL ``calculate_kl`` (k1/k2/k3,
    ``input_clamp_value`` 20 / ``output_clamp_value`` 10 by default there, off by default here so that the
    estimates stay exact).
    """
    _check_choice("KL estimator", estimator, KL_ESTIMATORS)
    if logprobs.shape != ref_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError("logprobs, ref_logprobs and mask must have the same shape")
    valid = mask.to(logprobs.device).bool()
    diff = torch.where(valid, logprobs - ref_logprobs.to(logprobs.dtype), torch.zeros_like(logprobs))
    if input_clamp is not None:
        diff = diff.clamp(-input_clamp, input_clamp)
    per_token = kl_estimate(diff, estimator)
    if output_clamp is not None:
        per_token = per_token.clamp(-output_clamp, output_clamp)
    return per_token * valid


def reinforce_pp_advantages(
    rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float = 0.0,
    estimator: str = "k1",
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ token-level ``(advantages, returns)``, both ``[B, T]``, 0 at masked positions, detached.

    Per token the KL to the reference is folded into the reward, the sequence reward goes to the last valid token,
    the return runs backwards within the response, and the returns are whitened over every valid token of the
    batch::

        r_{i,t} = -kl_coef * k_{i,t} + [t = last_i] * rewards_i          k: per_token_kl_estimate(.., estimator)
        G_{i,t} = r_{i,t} + gamma * G_{i,t+1}                               (0 past the last valid token)
        A = (G - mean(G)) * rsqrt(var(G) + eps)                             mean, var over the valid tokens; var
                                                                            unbiased (Bessel), as veRL's
                                                                            masked_whiten; 0 for < 2 tokens

    Hu et al. 2025 (REINFORCE++, arXiv:2501.03262); veRL ``compute_reinforce_plus_plus_outcome_advantage`` on
    ``token_level_rewards = scores - beta * kld`` (``apply_kl_penalty`` in ray_trainer.py, whose default
    estimator is "kl" = k1, computed with the rollout-time ``old_log_probs``: pass those as ``logprobs``). Equal to
    veRL's on valid tokens (tested); one difference: with fewer than two valid tokens veRL raises, this returns 0.
    """
    returns = reinforce_pp_returns(rewards, logprobs, ref_logprobs, mask, kl_coef, estimator, gamma)
    return masked_whiten(returns, mask, eps), returns


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) * rsqrt(var + eps)`` where ``mask`` holds, 0 elsewhere; mean and unbiased (Bessel) variance over
    the masked elements, as veRL's ``masked_whiten``; zeros for fewer than two elements. Detached."""
    with torch.no_grad():
        valid = mask.to(values.device).bool()
        count = valid.sum()
        if count < 2:
            return torch.zeros_like(values)
        mu = masked_mean(values, valid)
        var = masked_mean((values - mu).square(), valid) * count / (count - 1)
        return (values - mu) * torch.rsqrt(var + eps) * valid


def reinforce_pp_returns(
    rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float = 0.0,
    estimator: str = "k1",
    gamma: float = 1.0,
) -> Tensor:
    """REINFORCE++'s returns ``G`` ``[B, T]`` before the whitening (:func:`reinforce_pp_advantages`), detached: the
    trainer whitens them over every rank's tokens (``aligner.distributed.global_masked_whiten``)."""
    if logprobs.dim() != 2 or logprobs.shape != mask.shape or rewards.shape != logprobs.shape[:1]:
        raise ValueError("expected rewards [B], logprobs / ref_logprobs / mask [B, T]")
    with torch.no_grad():
        valid = mask.to(logprobs.device).bool()
        per_token = -kl_coef * per_token_kl_estimate(logprobs.detach(), ref_logprobs.detach(), valid, estimator)
        positions = torch.arange(valid.shape[1], device=valid.device)
        last = torch.where(valid, positions, -1).amax(dim=1)
        is_last = (positions[None, :] == last[:, None]) & valid
        token_rewards = per_token + is_last * rewards.detach().to(per_token.dtype)[:, None]
        returns = torch.zeros_like(token_rewards)
        running = torch.zeros_like(token_rewards[:, 0])
        for t in range(token_rewards.shape[1] - 1, -1, -1):
            running = (token_rewards[:, t] + gamma * running) * valid[:, t]
            returns[:, t] = running
        return returns


# ----------------------------------------------------------------------------------------------- loss aggregation


def loss_normalizer(mask: Tensor, aggregation: str = "token_mean") -> Tensor:
    """The denominator ``D`` of :func:`aggregate_loss` for ``mask`` (``[B, T]``): a float tensor, not clamped.

    ``"token_mean"``: the valid tokens ``sum m``; ``"seq_mean"`` and ``"seq_mean_token_sum"``: the samples with at
    least one valid token; ``"nemo"`` and ``"seq_mean_token_sum_norm"``: the rows ``B``. Computed over the WHOLE
    batch and passed as ``normalizer`` to every micro-batch, it makes the micro-batch losses sum to the batch's
    (for "nemo" with equal micro-batches ``B = B_micro * M``, NeMo-Aligner's mean of micro-batch means).
    """
    _check_choice("aggregation", aggregation, LOSS_AGGREGATIONS)
    weights = mask.to(torch.get_default_dtype() if not mask.is_floating_point() else mask.dtype)
    if aggregation == "token_mean":
        return weights.sum()
    if aggregation in ("seq_mean", "seq_mean_token_sum"):
        return (weights.sum(dim=-1) > 0).sum().to(weights.dtype)
    return torch.tensor(float(mask.shape[0]), dtype=weights.dtype, device=mask.device)


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    aggregation: str = "token_mean",
    normalizer: float | Tensor | None = None,
    horizon: int | None = None,
) -> Tensor:
    """Reduce a per-token loss ``l`` (``[B, T]``) to a scalar; ``m`` the mask, ``n_i = sum_t m_{i,t}``::

        "token_mean":              sum_{i,t} m l / D                      every valid token weighs the same
        "seq_mean":                sum_i (sum_t m l / max(n_i, 1)) / D    every sample weighs the same
        "nemo":                    as seq_mean, D counting every row      NeMo-Aligner's micro-batch mean
        "seq_mean_token_sum":      sum_{i,t} m l / D                      D samples; long samples weigh more
        "seq_mean_token_sum_norm": sum_{i,t} m l / (D * H)                Dr.GRPO: constant D = B rows, H horizon

    ``D = max(loss_normalizer(mask, aggregation), 1)``, or ``max(normalizer, 1)`` when given (the count over the
    whole batch for micro-batching, see :func:`loss_normalizer`). ``H = horizon``: a constant, e.g. the rollout's
    ``max_new_tokens`` (default ``T = mask.shape[-1]``, veRL's default; pass the constant when micro-batches are
    padded to different lengths). The first three equal :func:`aligner.algorithms.reinforce.reinforce_loss`'s
    aggregations (tested). A masked ``l`` may be ``inf`` or ``NaN``; an empty mask gives 0, attached to the graph.

    Peers: veRL ``agg_loss`` (token-mean, seq-mean-token-mean, seq-mean-token-sum with ``global_batch_size`` =
    sequences with a token, seq-mean-token-sum-norm ``= sum / loss_scale_factor`` with no division by the rows,
    i.e. this times ``B`` (tested); its dp_actor then multiplies each micro-batch's loss by
    ``1 / gradient_accumulation``, which leaves it a factor micro-batch size above this); TRL ``loss_type``: "grpo"
    = seq_mean, "bnpo" = token_mean, "dapo" = token_mean over the global token count, "dr_grpo" = ``sum / (B *
    max_completion_length)`` = seq_mean_token_sum_norm with ``horizon = max_completion_length`` (tested).
    """
    _check_choice("aggregation", aggregation, LOSS_AGGREGATIONS)
    if per_token.dim() != 2 or mask.shape != per_token.shape:
        raise ValueError(f"expected per_token and mask [B, T]; got {tuple(per_token.shape)}, {tuple(mask.shape)}")
    weights = mask.to(device=per_token.device, dtype=per_token.dtype)
    terms = _zero_masked(per_token, weights) * weights
    if aggregation in ("seq_mean", "nemo"):
        total = (terms.sum(dim=-1) / weights.sum(dim=-1).clamp_min(1)).sum()
    else:
        total = terms.sum()
    if aggregation == "seq_mean_token_sum_norm":
        length = mask.shape[-1] if horizon is None else horizon
        if length <= 0:
            raise ValueError(f"horizon must be positive; got {length}")
        total = total / length
    count = loss_normalizer(weights, aggregation) if normalizer is None else normalizer
    count = torch.as_tensor(count, dtype=per_token.dtype, device=per_token.device)
    return total / count.clamp_min(1)


# ---------------------------------------------------------------------------------------------------- policy loss


def importance_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """Importance ratio to the rollout's (old) policy, ``[B, T]``, with the gradient of ``logprobs``; 1 where masked.

    ``"token"``: ``rho_{i,t} = exp(logp_{i,t} - old_{i,t})`` (PPO / GRPO). ``"sequence"`` (GSPO, Zheng et al.
    2025, arXiv:2507.18071): the sample's length-normalised ratio ``s_i = exp(mean_t (logp - old))`` over its
    valid tokens, built per token as GSPO-token's ``s_{i,t} = sg[s_i] * pi_t / sg[pi_t]``, i.e.
    ``exp(sg[log s_i] + logp_t - sg[logp_t])``: the value is ``s_i`` on every token and the gradient of token t is
    ``s_i * grad logp_t``. That is veRL's ``compute_policy_loss_gspo`` (which also clamps ``log s_{i,t}`` at 10;
    not here). TRL's ``importance_sampling_level="sequence"`` and NeMo-RL's ``sequence_level_importance_ratios``
    keep the gradient through the mean instead (``grad s_i = s_i * mean_t grad logp_t`` on each token); summed
    over a sample's tokens by any aggregation that weighs them equally, the two gradients are the same (tested).
    """
    _check_choice("importance level", level, IMPORTANCE_LEVELS)
    weights = mask.to(device=logprobs.device, dtype=logprobs.dtype)
    lp = _zero_masked(logprobs, weights)
    log_ratio = lp - _zero_masked(old_logprobs.detach().to(logprobs.dtype), weights)
    if level == "token":
        return log_ratio.exp()
    seq_log_ratio = masked_mean(log_ratio.detach(), weights, dim=-1)
    return ((seq_log_ratio[:, None] + lp - lp.detach()) * (weights != 0)).exp()


def per_token_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    policy_loss: str = "clip",
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    clip_ratio_c: float | None = None,
    importance_level: str = "token",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token policy loss ``[B, T]`` (0 where masked) and its statistics (detached scalar tensors).

    ``rho`` = :func:`importance_ratio` at ``importance_level``, ``A`` the advantages (``[B]`` per sample, broadcast
    over the tokens, or ``[B, T]`` per token), ``eh = epsilon_high`` (default ``epsilon_low``)::

        "clip":  l = max(-A * rho, -A * clip(rho, 1 - epsilon_low, 1 + eh))      PPO; eh > epsilon_low: DAPO's
                                                                                clip-higher (arXiv:2503.14476)
                 with clip_ratio_c (> 1, dual clip, Ye et al. arXiv:1912.09729): l = min(l, -A * c) where A < 0
        "cispo": l = -sg[clip(rho, 1 - epsilon_low, 1 + eh)] * A * logp          CISPO (MiniMax-M1,
                                                                                arXiv:2506.13585)

    With "clip" a clipped token has no gradient; with "cispo" every valid token keeps ``-w * A * grad logp``.
    Stats over the valid tokens (0 when there are none): ``clip_frac_low`` / ``clip_frac_high``: the share of tokens
    with ``rho < 1 - epsilon_low`` and ``A < 0`` / ``rho > 1 + eh`` and ``A > 0`` ("clip": the ones whose gradient
    the clip removed, TRL's ``clip_ratio/low_mean`` / ``high_mean``) or, for "cispo", whose weight was clipped
    regardless of the sign of A (veRL's ``ratio != clipped_ratio``); ``clip_frac_dual``: ``A < 0`` and
    ``rho > c`` (veRL's ``pg_clipfrac_lower``); ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` of ``rho``. At
    sequence level the stats count each token of a sample (TRL counts samples).

    Peers: veRL ``compute_policy_loss_vanilla`` (clip_ratio_low / high / c; it clamps ``logp - old`` to +-20
    first), ``compute_policy_loss_cispo`` (clip on both sides, as here); NeMo-RL ``ClippedPGLossFn`` (ratio_clip_min
    / max / c, use_cispo); TRL ``_compute_loss`` (epsilon / epsilon_high; its "cispo" caps only above, at the
    absolute value ``epsilon_high``, not ``1 + epsilon_high``). Dual clip with "cispo" is refused, as NeMo-RL does.
    """
    _check_choice("policy_loss", policy_loss, POLICY_LOSSES)
    if epsilon_high is None:
        epsilon_high = epsilon_low
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c must be > 1; got {clip_ratio_c}")
        if policy_loss == "cispo":
            raise ValueError("clip_ratio_c (dual clip) does not apply to policy_loss 'cispo'")
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError("logprobs, old_logprobs and mask must all be [B, T]")
    if advantages.shape == logprobs.shape[:1]:
        advantages = advantages[:, None]
    elif advantages.shape != logprobs.shape:
        raise ValueError(f"advantages must be [B] or [B, T]; got {tuple(advantages.shape)}")
    weights = mask.to(device=logprobs.device, dtype=logprobs.dtype)
    adv = _zero_masked(advantages.detach().to(logprobs.dtype).expand_as(logprobs), weights)
    ratio = importance_ratio(logprobs, old_logprobs, weights, importance_level)
    clipped_ratio = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)
    low, high = ratio < 1.0 - epsilon_low, ratio > 1.0 + epsilon_high
    dual = torch.zeros_like(low)
    if policy_loss == "clip":
        loss = torch.maximum(-adv * ratio, -adv * clipped_ratio)
        low, high = low & (adv < 0), high & (adv > 0)
        if clip_ratio_c is not None:
            dual = (adv < 0) & (ratio > clip_ratio_c)
            loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    else:
        loss = -clipped_ratio.detach() * adv * _zero_masked(logprobs, weights)
    loss = loss * weights
    valid = weights != 0
    with torch.no_grad():
        r = ratio.detach()
        any_valid = bool(valid.any())
        stats = {
            "clip_frac_low": masked_mean(low.to(r.dtype), weights),
            "clip_frac_high": masked_mean(high.to(r.dtype), weights),
            "clip_frac_dual": masked_mean(dual.to(r.dtype), weights),
            "ratio_mean": masked_mean(r, weights),
            "ratio_min": r[valid].min() if any_valid else r.new_zeros(()),
            "ratio_max": r[valid].max() if any_valid else r.new_zeros(()),
        }
    return loss, stats


def kl_loss_term(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float,
    estimator: str = "k3",
    input_clamp: float | None = None,
    output_clamp: float | None = None,
) -> Tensor:
    """GRPO's KL-in-loss term per token, ``kl_coef * k_t`` (``[B, T]``, 0 where masked), with the gradient of
    ``logprobs``: :func:`per_token_kl_estimate`, k3 by default as in the GRPO paper (eq. 4). Added to the per-token
    policy loss before aggregation (TRL: ``per_token_loss + beta * per_token_kl``; veRL aggregates its
    ``kl_loss`` with the same ``agg_loss`` and adds ``kl_loss_coef`` times it, which is the same by linearity)."""
    return kl_coef * per_token_kl_estimate(logprobs, ref_logprobs, mask, estimator, input_clamp, output_clamp)


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    policy_loss: str = "clip",
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    clip_ratio_c: float | None = None,
    importance_level: str = "token",
    aggregation: str = "token_mean",
    normalizer: float | Tensor | None = None,
    horizon: int | None = None,
    token_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    kl_input_clamp: float | None = None,
    kl_output_clamp: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO-family loss (a scalar) and its stats: ``aggregate(w * l_pg + kl_coef * k)``.

    ``l_pg`` = :func:`per_token_policy_loss`, ``w`` = ``token_weights`` (``[B, T]`` or ``[B]``, detached; e.g. the
    rollout correction of :mod:`aligner.algorithms.rollout_correction`), which weigh the policy term only, as veRL
    (``pg_losses * rollout_is_weights``), TRL (``per_token_loss * importance_sampling_ratio`` before the KL) and
    NeMo-RL do; ``k`` = :func:`kl_loss_term` when ``kl_coef != 0`` (needs ``ref_logprobs``; ``kl_estimator`` and
    the clamps are those of :func:`per_token_kl_estimate`, veRL's ``kl_loss`` being k3 clamped 20 / 10 as
    "low_var_kl"); the aggregation is
    :func:`aggregate_loss` with its ``normalizer`` and ``horizon``. Stats: those of the policy loss, plus ``kl``
    (token mean of ``k / kl_coef`` over the valid tokens) when the KL term is on.
    """
    clip = {"epsilon_low": epsilon_low, "epsilon_high": epsilon_high, "clip_ratio_c": clip_ratio_c}
    per_token, stats = per_token_policy_loss(
        logprobs, old_logprobs, advantages, mask, policy_loss, importance_level=importance_level, **clip
    )
    if token_weights is not None:
        w = token_weights.detach().to(device=per_token.device, dtype=per_token.dtype)
        per_token = per_token * (w[:, None] if w.dim() == 1 else w)
    if kl_coef != 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef is set but no ref_logprobs were given")
        term = kl_loss_term(logprobs, ref_logprobs, mask, kl_coef, kl_estimator, kl_input_clamp, kl_output_clamp)
        per_token = per_token + term
        stats["kl"] = masked_mean(term.detach() / kl_coef, mask.to(term.device))
    return aggregate_loss(per_token, mask, aggregation, normalizer, horizon), stats


# ---------------------------------------------------------------------------------------------------------- DAPO


def overlong_penalty(
    lengths: Tensor, max_new_tokens: int, overlong_buffer: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO's soft overlong punishment ``[B]`` (float, <= 0), added to the rewards; ``L`` the response lengths::

        0                                                     if L <= max_new_tokens - overlong_buffer
        -penalty_factor * (L - (max_new_tokens - overlong_buffer)) / overlong_buffer   in the buffer
        -penalty_factor                                       if L > max_new_tokens

    DAPO (Yu et al. 2025, arXiv:2503.14476), eq. 13 (``L_max = max_new_tokens``, ``L_cache = overlong_buffer``);
    veRL ``DAPORewardManager``: ``min(-(L - (max_resp_len - len)) / len * penalty_factor, 0)``, the same for
    ``L <= max_new_tokens`` (it never caps at -1: generation cannot exceed the limit). ``overlong_buffer = 0``
    turns it off (zeros).
    """
    if overlong_buffer < 0 or overlong_buffer > max_new_tokens:
        raise ValueError(f"overlong_buffer must be in [0, max_new_tokens]; got {overlong_buffer}")
    lengths = lengths.to(torch.get_default_dtype() if not lengths.is_floating_point() else lengths.dtype)
    if overlong_buffer == 0:
        return torch.zeros_like(lengths)
    exceed = lengths - (max_new_tokens - overlong_buffer)
    return -penalty_factor * (exceed / overlong_buffer).clamp(0.0, 1.0)


def zero_spread_groups(rewards: Tensor, group_ids: Tensor, atol: float = ZERO_SPREAD_ATOL) -> Tensor:
    """``[B]`` bool: True for the samples whose group's rewards all lie within ``atol`` of each other (max - min <=
    atol), the groups GRPO / RLOO learn nothing from and DAPO's dynamic sampling drops (keep ``~mask``). The same
    test as :func:`aligner.algorithms.diagnostics.zero_spread_fraction` (whose value is the share of groups this
    marks); veRL's ``filter_groups`` keeps groups whose metric std is > 0, i.e. ``atol = 0``."""
    _n, _mean, _std, spread = group_reward_moments(rewards, group_ids)
    return spread <= atol
