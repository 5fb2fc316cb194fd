"""Tests of aligner.algorithms.grpo: hand-worked values (arithmetic in the comments) and transcriptions of the peers'
definitions (veRL verl/trainer/ppo/core_algos.py, TRL trl/trainer/grpo_trainer.py, NeMo-RL loss_functions.py).

Run: .venv/bin/python -m pytest tests/aligner/algorithms -q
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from torch.testing import assert_close

from aligner.algorithms.diagnostics import zero_spread_fraction
from aligner.algorithms.grpo import (
    LOSS_AGGREGATIONS,
    aggregate_loss,
    group_reward_moments,
    grpo_advantages,
    grpo_loss,
    importance_ratio,
    kl_loss_term,
    loss_normalizer,
    overlong_penalty,
    per_token_kl_estimate,
    per_token_policy_loss,
    reinforce_pp_advantages,
    zero_spread_groups,
)
from aligner.algorithms.ppo import per_token_kl
from aligner.algorithms.reinforce import advantages_from_baseline, reinforce_loss, rloo_baseline

INF = float("inf")
LN = math.log


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# A small ragged batch: group 0 has spread, group 1 none, group 2 two samples; sample 2 is truncated in some tests.
REWARDS = [1.0, 0.0, 0.0, 0.5, 0.5, 1.0, 3.0]
GROUPS = [0, 0, 0, 1, 1, 2, 2]


# ------------------------------------------------------------------------------------------------------ advantages


def test_group_reward_moments_hand_values():
    n, mean, std, spread = group_reward_moments(t(REWARDS), torch.tensor(GROUPS))
    # group 0: mean 1/3, deviations [2/3, -1/3, -1/3], sum sq 6/9, unbiased var (6/9) / 2 = 1/3
    # group 1: mean 0.5, std 0; group 2: mean 2, deviations [-1, 1], var 2 / 1 = 2
    assert_close(n, t([3, 3, 3, 2, 2, 2, 2], torch.float64))
    assert_close(mean, t([1 / 3] * 3 + [0.5, 0.5, 2.0, 2.0], torch.float64))
    assert_close(std, t([math.sqrt(1 / 3)] * 3 + [0.0, 0.0, math.sqrt(2), math.sqrt(2)], torch.float64))
    assert_close(spread, t([1.0] * 3 + [0.0, 0.0, 2.0, 2.0], torch.float64))


def test_grpo_advantages_group_mean_group_scale():
    out = grpo_advantages(t(REWARDS), torch.tensor(GROUPS), eps=0.0)
    # group 0: [2/3, -1/3, -1/3] / sqrt(1/3) = [1.1547005, -0.5773503, -0.5773503]; group 1: zero spread -> 0
    # group 2: [-1, 1] / sqrt(2) = [-0.7071068, 0.7071068]
    assert_close(out, t([1.1547005, -0.5773503, -0.5773503, 0.0, 0.0, -0.7071068, 0.7071068]))
    assert out.dtype == torch.float32


def test_grpo_advantages_rloo_and_none_baselines():
    r, g = t(REWARDS), torch.tensor(GROUPS)
    # rloo: group 0 b = [0, 0.5, 0.5] -> [1, -0.5, -0.5]; group 2 b = [3, 1] -> [-2, 2]
    rloo = grpo_advantages(r, g, baseline="rloo", scale_rewards="none")
    assert_close(rloo, t([1.0, -0.5, -0.5, 0.0, 0.0, -2.0, 2.0]))
    # it is the existing RLOO composition, unchanged
    assert_close(rloo, advantages_from_baseline(r, rloo_baseline(r, g, torch.ones(7, dtype=torch.bool))))
    # rloo scaled by the group std: group 0 [1, -.5, -.5] / sqrt(1/3); group 2 [-2, 2] / sqrt(2)
    rloo_scaled = grpo_advantages(r, g, baseline="rloo", scale_rewards="group", eps=0.0)
    assert_close(rloo_scaled, t([1.7320508, -0.8660254, -0.8660254, 0.0, 0.0, -1.4142136, 1.4142136]))
    # none: the raw rewards (no group to be zero-spread against)
    assert_close(grpo_advantages(r, g, baseline="none", scale_rewards="none"), r)


def test_grpo_advantages_batch_scale():
    # batch mean 6/7; squared deviations sum 6.3571429; unbiased var / 6 = 1.0595238; std 1.0293317
    out = grpo_advantages(t(REWARDS), torch.tensor(GROUPS), scale_rewards="batch", eps=0.0)
    std = 1.0293317
    expected = [2 / 3 / std, -1 / 3 / std, -1 / 3 / std, 0.0, 0.0, -1 / std, 1 / std]
    assert_close(out, t(expected))


def test_grpo_advantages_truncated_sample_excluded_from_statistics():
    rewards = t([1.0, 0.0, float("nan"), 0.5, 0.5, 1.0, 3.0])
    is_end = torch.tensor([True, True, False, True, True, True, True])
    out = grpo_advantages(rewards, torch.tensor(GROUPS), is_end, eps=0.0)
    # group 0 counts samples 0, 1 only: mean 0.5, std sqrt(0.5) = 0.7071068 -> [0.5, -0.5] / 0.7071068;
    # the truncated sample's NaN reached no one else; its own advantage is NaN (its reward is)
    assert_close(out[[0, 1, 3, 4, 5, 6]], t([0.7071068, -0.7071068, 0.0, 0.0, -0.7071068, 0.7071068]))
    assert torch.isnan(out[2])
    rewards[2] = 0.0
    out = grpo_advantages(rewards, torch.tensor(GROUPS), is_end, eps=0.0)
    # truncated, reward 0, scored against the ended mean 0.5: -0.5 / 0.7071068
    assert_close(out[2], t(-0.7071068))
    # a group with a single ended sample: baseline = own reward (like rloo), advantage 0 for every member
    one = grpo_advantages(t([2.0, 5.0]), torch.tensor([0, 0]), torch.tensor([True, False]))
    assert_close(one, t([0.0, 0.0]))


def test_grpo_advantages_zero_spread_is_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in floating point: the residue must not survive (and be blown up by 1 / eps)
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7], dtype=torch.float64)
    for baseline in ("rloo", "group_mean"):
        for scale in ("group", "batch", "none"):
            out = grpo_advantages(rewards, torch.tensor([0, 0, 0, 1, 1]), baseline=baseline, scale_rewards=scale)
            assert (out == 0).all(), (baseline, scale, out)


def _trl_advantages(rewards, num_generations, scale_rewards, eps=1e-4):
    # TRL _generate_and_score_completions ("sum_then_normalize"), with nanstd = unbiased std
    mean_grouped = rewards.view(-1, num_generations).mean(dim=1).repeat_interleave(num_generations, dim=0)
    if scale_rewards in ("group", "none"):
        std = rewards.view(-1, num_generations).std(dim=1).repeat_interleave(num_generations, dim=0)
    else:
        std = rewards.std().expand_as(rewards)
    advantages = rewards - mean_grouped
    if scale_rewards != "none":
        advantages = advantages / (std + eps)
    return advantages


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_advantages_match_trl(scale):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(12, generator=gen, dtype=torch.float64)
    rewards[4:8] = 0.5  # a zero-spread group (0.5 is exact: TRL's residue is 0 too)
    group_ids = torch.arange(12) // 4
    ours = grpo_advantages(rewards, group_ids, baseline="group_mean", scale_rewards=scale, eps=1e-4)
    assert_close(ours, _trl_advantages(rewards, 4, scale))


def _verl_grpo(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    # veRL compute_grpo_outcome_advantage (its per-index loop, on sequence scores)
    scores = scores.clone()
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
            id2std[idx] = torch.std(torch.stack(id2score[idx]))
    for i in range(scores.shape[0]):
        if norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores


def _verl_rloo(scores, index):
    # veRL compute_rloo_outcome_advantage
    scores = scores.clone()
    id2score, id2mean = defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        id2mean[idx] = torch.tensor(0.0) if len(id2score[idx]) == 1 else torch.mean(torch.stack(id2score[idx]))
    for i in range(scores.shape[0]):
        n = len(id2score[index[i]])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
    return scores


def test_grpo_advantages_match_verl_and_differ_on_single_sample_groups():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(9, generator=gen, dtype=torch.float64)
    index = [3, 7, 3, 7, 3, 9, 9, 9, 5]  # non-contiguous groups of 3, 2, 3 and a group of one (sample 8)
    ids = torch.tensor(index)
    ours = grpo_advantages(rewards, ids, eps=1e-6)
    verl = _verl_grpo(rewards, index)
    assert_close(ours[:8], verl[:8])
    assert_close(grpo_advantages(rewards, ids, scale_rewards="none")[:8], _verl_grpo(rewards, index, 1e-6, False)[:8])
    # group of one: veRL uses mean 0, std 1 -> r / (1 + eps); here (and in TRL) 0
    assert_close(verl[8], rewards[8] / (1 + 1e-6))
    assert ours[8].item() == 0.0
    rloo, verl_rloo = grpo_advantages(rewards, ids, baseline="rloo", scale_rewards="none"), _verl_rloo(rewards, index)
    assert_close(rloo[:8], verl_rloo[:8])
    # veRL's rloo leaves a group of one its raw score; rloo_baseline gives it baseline = own reward, advantage 0
    assert_close(verl_rloo[8], rewards[8])
    assert rloo[8].item() == 0.0


def test_grpo_advantages_rejects_unknown_values():
    with pytest.raises(ValueError, match="baseline"):
        grpo_advantages(t(REWARDS), torch.tensor(GROUPS), baseline="mean")
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo_advantages(t(REWARDS), torch.tensor(GROUPS), scale_rewards="std")


# ---------------------------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_hand_values():
    logprobs = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -INF]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, returns = reinforce_pp_advantages(t([1.0, -1.0]), logprobs, logprobs.clone(), mask, kl_coef=0.1)
    # no KL (same log-probs), gamma 1: returns row 0 [1, 1, 1], row 1 [-1, -1, (masked 0)]
    assert_close(returns, t([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]))
    # 5 valid values: mean 0.2, deviations [.8, .8, .8, -1.2, -1.2], sum sq 4.8, unbiased var 4.8 / 4 = 1.2
    # rsqrt(1.2) = 0.9128709: 0.8 -> 0.7302967, -1.2 -> -1.0954451
    assert_close(adv, t([[0.7302967] * 3, [-1.0954451, -1.0954451, 0.0]]))


def test_reinforce_pp_kl_folded_into_rewards():
    logprobs = t([[-1.0, -2.0]])
    ref = t([[-1.5, -1.0]])
    _adv, returns = reinforce_pp_advantages(t([1.0]), logprobs, ref, t([[1, 1]]), kl_coef=0.1, gamma=0.5)
    # k1: d = [0.5, -1.0] -> r = [-0.05, 0.1 + 1.0] = [-0.05, 1.1]; G_1 = 1.1, G_0 = -0.05 + 0.5 * 1.1 = 0.5
    assert_close(returns, t([[0.5, 1.1]]))


def _verl_reinforce_pp(token_level_rewards, response_mask, gamma):
    # veRL compute_reinforce_plus_plus_outcome_advantage with verl_F.masked_whiten (unbiased var, rsqrt(var + 1e-8))
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    for i in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, i] + gamma * running_return
        returns[:, i] = running_return
        running_return = running_return * response_mask[:, i]
    mean = (returns * response_mask).sum() / response_mask.sum()
    var = (((returns - mean) ** 2) * response_mask).sum() / response_mask.sum()
    var = var * response_mask.sum() / (response_mask.sum() - 1)
    return (returns - mean) * torch.rsqrt(var + 1e-8) * response_mask


def test_reinforce_pp_matches_verl():
    gen = torch.Generator().manual_seed(2)
    old = -torch.rand(5, 6, generator=gen, dtype=torch.float64) * 3
    ref = -torch.rand(5, 6, generator=gen, dtype=torch.float64) * 3
    scores = torch.randn(5, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([6, 3, 1, 4, 6])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).double()
    # veRL's apply_kl_penalty (kl_penalty="kl" = k1) and the score on the last valid token
    token_scores = torch.zeros_like(old)
    token_scores[torch.arange(5), lengths - 1] = scores
    token_level_rewards = token_scores - 0.05 * (old - ref) * mask
    ours, _ = reinforce_pp_advantages(scores, old, ref, mask, kl_coef=0.05, estimator="k1", gamma=0.9)
    assert_close(ours, _verl_reinforce_pp(token_level_rewards, mask, 0.9))


# ------------------------------------------------------------------------------------------------------------ KL


def test_per_token_kl_estimate_k2_and_clamps():
    logp, ref, mask = t([[-1.0, -2.0, -0.5]]), t([[-1.5, -1.0, -0.5]]), t([[1, 1, 0]])
    # d = [0.5, -1.0, (masked)]: k2 = 0.5 d^2 = [0.125, 0.5, 0]
    assert_close(per_token_kl_estimate(logp, ref, mask, "k2"), t([[0.125, 0.5, 0.0]]))
    # output clamp 0.3: [0.125, 0.3, 0]; input clamp 0.6 on d: [0.5, -0.6] -> k2 [0.125, 0.18]
    assert_close(per_token_kl_estimate(logp, ref, mask, "k2", output_clamp=0.3), t([[0.125, 0.3, 0.0]]))
    assert_close(per_token_kl_estimate(logp, ref, mask, "k2", input_clamp=0.6), t([[0.125, 0.18, 0.0]]))
    with pytest.raises(ValueError, match="estimator"):
        per_token_kl_estimate(logp, ref, mask, "k4")


@pytest.mark.parametrize("estimator", ["k1", "abs", "k3"])
def test_per_token_kl_estimate_equals_ppo_per_token_kl(estimator):
    gen = torch.Generator().manual_seed(3)
    logp, ref = torch.randn(4, 5, generator=gen) * 2, torch.randn(4, 5, generator=gen) * 2
    mask = torch.rand(4, 5, generator=gen) > 0.3
    assert_close(per_token_kl_estimate(logp, ref, mask, estimator), per_token_kl(logp, ref, mask, estimator=estimator))


def _verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    # veRL kl_penalty_forward
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)  # low_var_kl
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def test_per_token_kl_estimate_matches_verl_k2_and_low_var_kl():
    logp = t([[-1.0, -30.0, -0.2, -2.0]])
    ref = t([[-1.3, -0.1, -25.0, -2.0]])  # d = [0.3, -29.9, 24.8, 0]: both clamps bind
    mask = torch.ones(1, 4)
    assert_close(per_token_kl_estimate(logp, ref, mask, "k2"), _verl_kl_penalty_forward(logp, ref, "k2"))
    ours = per_token_kl_estimate(logp, ref, mask, "k3", input_clamp=20, output_clamp=10)
    assert_close(ours, _verl_kl_penalty_forward(logp, ref, "low_var_kl"))


def test_kl_loss_term_is_coef_times_k3_with_gradient():
    logp = t([[-1.0, -2.0]]).requires_grad_()
    ref = t([[-1.5, -1.0]])
    term = kl_loss_term(logp, ref, t([[1, 1]]), kl_coef=0.1)
    # k3 = exp(-d) - 1 + d, d = [0.5, -1]: [0.1065307, 0.7182818]; times 0.1
    assert_close(term, t([[0.01065307, 0.07182818]]))
    term.sum().backward()
    # d k3 / d logp = 1 - exp(-d): [1 - 0.6065307, 1 - 2.7182818] times 0.1
    assert_close(logp.grad, t([[0.03934693, -0.17182818]]))


# ------------------------------------------------------------------------------------------------ aggregation

PT = [[1.0, 2.0, 3.0], [4.0, 5.0, INF], [7.0, 7.0, 7.0]]
PT_MASK = [[1, 1, 1], [1, 1, 0], [0, 0, 0]]  # two lengths and an empty row


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("token_mean", 15 / 5),  # (6 + 9) / 5 tokens
        ("seq_mean", (2.0 + 4.5) / 2),  # per-row means 6/3, 9/2 over the 2 rows with a token
        ("nemo", (2.0 + 4.5) / 3),  # the same over all 3 rows
        ("seq_mean_token_sum", 15 / 2),  # row sums 6 + 9 over 2 rows with a token
        ("seq_mean_token_sum_norm", 15 / (3 * 3)),  # over B = 3 rows times horizon T = 3
    ],
)
def test_aggregate_loss_hand_values(aggregation, expected):
    assert_close(aggregate_loss(t(PT), t(PT_MASK), aggregation), t(expected))


def test_aggregate_loss_horizon_and_normalizer():
    # Dr.GRPO with horizon 4: 15 / (3 * 4) = 1.25; normalizer 10 replaces D: 15 / (10 * 4) = 0.375
    assert_close(aggregate_loss(t(PT), t(PT_MASK), "seq_mean_token_sum_norm", horizon=4), t(1.25))
    assert_close(aggregate_loss(t(PT), t(PT_MASK), "seq_mean_token_sum_norm", 10, horizon=4), t(0.375))
    assert_close(aggregate_loss(t(PT), t(PT_MASK), "seq_mean_token_sum", normalizer=5), t(3.0))
    with pytest.raises(ValueError, match="aggregation"):
        aggregate_loss(t(PT), t(PT_MASK), "seq-mean-token-sum")


@pytest.mark.parametrize("aggregation", LOSS_AGGREGATIONS)
def test_aggregate_loss_empty_mask_is_zero_and_attached(aggregation):
    x = t(PT).requires_grad_()
    loss = aggregate_loss(x, torch.zeros(3, 3), aggregation)
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert (x.grad == 0).all()


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "nemo"])
def test_aggregate_loss_equals_reinforce_loss(aggregation):
    gen = torch.Generator().manual_seed(4)
    logprobs = -torch.rand(5, 4, generator=gen, dtype=torch.float64) * 3
    advantages = torch.randn(5, generator=gen, dtype=torch.float64)
    mask = torch.arange(4)[None, :] < torch.tensor([4, 1, 0, 3, 2])[:, None]
    ours = aggregate_loss(-logprobs * advantages[:, None], mask, aggregation)
    assert_close(ours, reinforce_loss(logprobs, advantages, mask, aggregation))
    assert_close(ours, reinforce_loss(logprobs, advantages, mask, aggregation, normalizer=None))


@pytest.mark.parametrize("aggregation", LOSS_AGGREGATIONS)
def test_aggregate_loss_micro_batches_sum_to_one_batch(aggregation):
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = torch.arange(5)[None, :] < torch.tensor([5, 3, 0, 1, 4, 2])[:, None]
    full_x = base.clone().requires_grad_()
    full = aggregate_loss(full_x * full_x, mask, aggregation, horizon=8)
    full.backward()
    # "nemo" needs equal micro-batches (its D counts rows: B = B_micro * M); the others any split
    splits = (
        [slice(0, 2), slice(2, 4), slice(4, 6)] if aggregation == "nemo" else [slice(0, 1), slice(1, 4), slice(4, 6)]
    )
    normalizer = loss_normalizer(mask, aggregation)
    micro_x = base.clone().requires_grad_()
    total = torch.zeros((), dtype=torch.float64)
    for sl in splits:
        x = micro_x[sl]
        loss = aggregate_loss(x * x, mask[sl], aggregation, normalizer=normalizer, horizon=8)
        loss.backward()
        total = total + loss.detach()
    assert_close(total, full.detach())
    assert_close(micro_x.grad, full_x.grad)


def _verl_agg_loss(loss_mat, loss_mask, loss_agg_mode):
    # veRL agg_loss (dp_size 1, global counts None)
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    return torch.sum(torch.sum(loss_mat * loss_mask, dim=-1)) / loss_mask.shape[-1]  # seq-mean-token-sum-norm


def test_aggregate_loss_matches_verl_and_trl_dr_grpo():
    gen = torch.Generator().manual_seed(6)
    loss_mat = torch.randn(4, 6, generator=gen)
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 2, 0, 5])[:, None]).float()
    for ours, theirs in [
        ("token_mean", "token-mean"),
        ("seq_mean", "seq-mean-token-mean"),
        ("seq_mean_token_sum", "seq-mean-token-sum"),
    ]:
        assert_close(aggregate_loss(loss_mat, mask, ours), _verl_agg_loss(loss_mat, mask, theirs))
    # veRL's seq-mean-token-sum-norm divides by H only; its actor then scales by 1 / (gradient accumulation), i.e.
    # by rows: the same as ours times B
    norm = aggregate_loss(loss_mat, mask, "seq_mean_token_sum_norm")
    assert_close(norm * 4, _verl_agg_loss(loss_mat, mask, "seq-mean-token-sum-norm"))
    # TRL dr_grpo: (per_token_loss * mask).sum() / (B * max_completion_length)
    trl = (loss_mat * mask).sum() / (loss_mat.size(0) * 16)
    assert_close(aggregate_loss(loss_mat, mask, "seq_mean_token_sum_norm", horizon=16), trl)


# ----------------------------------------------------------------------------------------------- policy loss

# ratios [[1.5, 0.5], [0.5, 4.0]]; advantages [1, -1]; eps_low 0.2, eps_high 0.28 (DAPO's clip-higher)
OLD = [[-1.0, -2.0], [-0.5, -3.0]]
RHO = [[1.5, 0.5], [0.5, 4.0]]
ADV = [1.0, -1.0]


def _logprobs():
    old = t(OLD)
    return (old + torch.log(t(RHO))).requires_grad_(), old


def test_policy_loss_clip_higher_hand_values():
    logp, old = _logprobs()
    per_token, stats = per_token_policy_loss(logp, old, t(ADV), torch.ones(2, 2), epsilon_low=0.2, epsilon_high=0.28)
    # row 0, A = 1:  rho 1.5 -> max(-1.5, -1.28) = -1.28 (clipped high); rho 0.5 -> max(-0.5, -0.8) = -0.5
    # row 1, A = -1: rho 0.5 -> max(0.5, 0.8) = 0.8 (clipped low);       rho 4.0 -> max(4.0, 1.28) = 4.0
    assert_close(per_token, t([[-1.28, -0.5], [0.8, 4.0]]))
    loss = aggregate_loss(per_token, torch.ones(2, 2))
    assert_close(loss, t(3.02 / 4))
    loss.backward()
    # clipped tokens get no gradient; d(-A rho)/d logp = -A rho: -0.5 / 4 and 4 / 4
    assert_close(logp.grad, t([[0.0, -0.125], [0.0, 1.0]]))
    assert_close(stats["clip_frac_low"], t(0.25))
    assert_close(stats["clip_frac_high"], t(0.25))
    assert_close(stats["clip_frac_dual"], t(0.0))
    assert_close(stats["ratio_mean"], t(1.625))
    assert_close(stats["ratio_min"], t(0.5))
    assert_close(stats["ratio_max"], t(4.0))


def test_policy_loss_dual_clip():
    logp, old = _logprobs()
    per_token, stats = per_token_policy_loss(
        logp, old, t(ADV), torch.ones(2, 2), epsilon_low=0.2, epsilon_high=0.28, clip_ratio_c=3.0
    )
    # row 1 token 1: A < 0 and rho 4 > c: min(4.0, -A * c = 3.0) = 3, constant
    assert_close(per_token, t([[-1.28, -0.5], [0.8, 3.0]]))
    assert_close(stats["clip_frac_dual"], t(0.25))
    aggregate_loss(per_token, torch.ones(2, 2)).backward()
    assert_close(logp.grad, t([[0.0, -0.125], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="clip_ratio_c"):
        per_token_policy_loss(logp, old, t(ADV), torch.ones(2, 2), clip_ratio_c=1.0)


def test_policy_loss_cispo_keeps_gradient_on_clipped_tokens():
    logp, old = _logprobs()
    per_token, stats = per_token_policy_loss(
        logp, old, t(ADV), torch.ones(2, 2), "cispo", epsilon_low=0.2, epsilon_high=0.28
    )
    # w = sg[clip(rho, 0.8, 1.28)] = [[1.28, 0.8], [0.8, 1.28]]; l = -w * A * logp
    w = t([[1.28, 0.8], [0.8, 1.28]])
    assert_close(per_token, -w * t(ADV)[:, None] * logp.detach())
    aggregate_loss(per_token, torch.ones(2, 2)).backward()
    # every token keeps -w * A / 4, the clipped ones included
    assert_close(logp.grad, t([[-0.32, -0.2], [0.2, 0.32]]))
    assert (logp.grad != 0).all()
    # weights clipped: rho < 0.8 at (0, 1), (1, 0); rho > 1.28 at (0, 0), (1, 1)
    assert_close(stats["clip_frac_low"], t(0.5))
    assert_close(stats["clip_frac_high"], t(0.5))
    with pytest.raises(ValueError, match="cispo"):
        per_token_policy_loss(logp, old, t(ADV), torch.ones(2, 2), "cispo", clip_ratio_c=3.0)


def test_policy_loss_sequence_level_gspo_hand_values():
    logp, old = _logprobs()
    mask = torch.ones(2, 2)
    ratio = importance_ratio(logp, old, mask, "sequence")
    # s_0 = exp(mean(ln 1.5, ln 0.5)) = sqrt(0.75) = 0.8660254; s_1 = sqrt(0.5 * 4) = 1.4142136
    assert_close(ratio, t([[0.8660254] * 2, [1.4142136] * 2]))
    per_token, _ = per_token_policy_loss(logp, old, t(ADV), mask, importance_level="sequence", epsilon_high=0.28)
    # row 0 (A = 1): s inside [0.8, 1.28] -> -0.8660254; row 1 (A = -1): max(1.4142, 1.28) = 1.4142136
    loss = aggregate_loss(per_token, mask, "seq_mean")
    assert_close(loss, t((-0.8660254 + 1.4142136) / 2))
    loss.backward()
    # token t of sample i: -A_i * s_i * grad logp_t / (n_i * 2): row 0 -0.8660254 / 4; row 1 1.4142136 / 4
    assert_close(logp.grad, t([[-0.21650635] * 2, [0.3535534] * 2]))


def _trl_grpo_per_token_loss(per_token_logps, old_per_token_logps, advantages, mask, eps_low, eps_high, level):
    # TRL _compute_loss, loss_type "grpo"/"bnpo"/"dapo" branch
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    advantages = advantages.unsqueeze(1)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


def _ragged_policy_batch(seed):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(5, 6, generator=gen, dtype=torch.float64) * 3
    logp = old + torch.randn(5, 6, generator=gen, dtype=torch.float64) * 0.4
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    adv[2] = 0.0  # a zero-spread group's sample
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 2, 4, 1, 5])[:, None]).double()
    return logp, old, adv, mask


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_policy_loss_matches_trl(level, aggregation):
    logp, old, adv, mask = _ragged_policy_batch(7)
    ours_lp = logp.clone().requires_grad_()
    clip = {"epsilon_low": 0.2, "epsilon_high": 0.28}
    per_token, _ = per_token_policy_loss(ours_lp, old, adv, mask, importance_level=level, **clip)
    ours = aggregate_loss(per_token, mask, aggregation)
    ours.backward()
    trl_lp = logp.clone().requires_grad_()
    trl_tok = _trl_grpo_per_token_loss(trl_lp, old, adv, mask, 0.2, 0.28, level).expand_as(mask)
    if aggregation == "seq_mean":  # TRL "grpo"
        trl = ((trl_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    else:  # TRL "bnpo"
        trl = (trl_tok * mask).sum() / mask.sum().clamp(min=1.0)
    trl.backward()
    # same value; at sequence level the gradient too although TRL keeps it through the mean (see importance_ratio)
    assert_close(ours, trl)
    assert_close(ours_lp.grad, trl_lp.grad)


def _verl_vanilla(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high, clip_ratio_c):
    # veRL compute_policy_loss_vanilla (token-mean)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = (torch.gt(pg_losses2, pg_losses1).float() * response_mask).sum() / response_mask.sum()
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    lower = torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float()
    pg_clipfrac_lower = (lower * response_mask).sum() / response_mask.sum()
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return (pg_losses * response_mask).sum() / response_mask.sum(), pg_clipfrac, pg_clipfrac_lower


def _verl_gspo(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high):
    # veRL compute_policy_loss_gspo (seq-mean-token-mean)
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    seq_importance_ratio = torch.exp(torch.clamp(log_seq_importance_ratio, max=10.0))
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    seq_losses = (pg_losses * response_mask).sum(-1) / (response_mask.sum(-1) + 1e-8)
    return seq_losses.mean()


def _verl_cispo(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high):
    # veRL compute_policy_loss_cispo (token-mean)
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    clipped_ratio_sg = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    pg_losses = -clipped_ratio_sg * advantages * log_prob
    return (pg_losses * response_mask).sum() / response_mask.sum()


def test_policy_loss_matches_verl_vanilla_gspo_cispo():
    logp, old, adv, mask = _ragged_policy_batch(8)
    logp = logp + torch.tensor([1.0, 0.0, 0.0, 1.5, -1.5, 0.0])  # ratios ~e past the dual clip c = 1.8
    adv[0] = -1.0  # a negative advantage on them
    token_adv = adv[:, None] * torch.linspace(0.5, 1.5, 6, dtype=torch.float64)  # token-level advantages [B, T]
    cases = [
        (dict(clip_ratio_c=1.8), "token_mean", lambda lp: _verl_vanilla(old, lp, token_adv, mask, 0.2, 0.28, 1.8)[0]),
        (dict(importance_level="sequence"), "seq_mean", lambda lp: _verl_gspo(old, lp, token_adv, mask, 0.2, 0.28)),
        (dict(policy_loss="cispo"), "token_mean", lambda lp: _verl_cispo(old, lp, token_adv, mask, 0.2, 0.28)),
    ]
    for kwargs, aggregation, verl in cases:
        ours_lp, verl_lp = logp.clone().requires_grad_(), logp.clone().requires_grad_()
        per_token, stats = per_token_policy_loss(ours_lp, old, token_adv, mask, epsilon_high=0.28, **kwargs)
        ours = aggregate_loss(per_token, mask, aggregation)
        theirs = verl(verl_lp)
        ours.backward()
        theirs.backward()
        assert_close(ours, theirs)
        assert_close(ours_lp.grad, verl_lp.grad)
    _, clipfrac, clipfrac_lower = _verl_vanilla(old, logp, token_adv, mask, 0.2, 0.28, 1.8)
    _, stats = per_token_policy_loss(logp, old, token_adv, mask, epsilon_high=0.28, clip_ratio_c=1.8)
    assert_close(stats["clip_frac_low"] + stats["clip_frac_high"], clipfrac)
    assert_close(stats["clip_frac_dual"], clipfrac_lower)
    assert stats["clip_frac_dual"] > 0


def test_policy_loss_token_advantages_broadcast_and_masked_minus_inf():
    logp, old, adv, mask = _ragged_policy_batch(9)
    logp = logp.masked_fill(mask == 0, -INF).requires_grad_()
    a, _ = per_token_policy_loss(logp, old, adv, mask)
    b, _ = per_token_policy_loss(logp, old, adv[:, None].expand(5, 6), mask)
    assert_close(a, b)
    aggregate_loss(a, mask).backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[mask == 0] == 0).all()
    with pytest.raises(ValueError, match="advantages"):
        per_token_policy_loss(logp, old, adv[:3], mask)


def test_policy_loss_empty_mask_stats():
    logp, old = _logprobs()
    _, stats = per_token_policy_loss(logp, old, t(ADV), torch.zeros(2, 2))
    assert all(v.item() == 0.0 for v in stats.values())


def test_grpo_loss_with_kl_and_weights_matches_trl():
    logp, old, adv, mask = _ragged_policy_batch(10)
    ref = old - 0.3
    weights = torch.rand(5, 6, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    ours_lp = logp.clone().requires_grad_()
    kwargs = {"epsilon_high": 0.28, "aggregation": "seq_mean", "ref_logprobs": ref, "kl_coef": 0.04}
    ours, stats = grpo_loss(ours_lp, old, adv, mask, token_weights=weights, **kwargs)
    ours.backward()
    # TRL "grpo": per_token_loss * importance_sampling_ratio + beta * k3, then the mean of the per-sequence means
    trl_lp = logp.clone().requires_grad_()
    per_token_loss = _trl_grpo_per_token_loss(trl_lp, old, adv, mask, 0.2, 0.28, "token") * weights
    per_token_kl = torch.exp(ref - trl_lp) - (ref - trl_lp) - 1
    per_token_loss = per_token_loss + 0.04 * per_token_kl
    trl = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    trl.backward()
    assert_close(ours, trl)
    assert_close(ours_lp.grad, trl_lp.grad)
    assert_close(stats["kl"], (per_token_kl.detach() * mask).sum() / mask.sum())
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logp, old, adv, mask, kl_coef=0.1)
    # the KL clamps reach the term: an output clamp of 0 leaves the policy loss alone
    clamped, _ = grpo_loss(logp, old, adv, mask, ref_logprobs=ref, kl_coef=0.04, kl_output_clamp=0.0)
    assert_close(clamped, grpo_loss(logp, old, adv, mask)[0])


def test_grpo_loss_micro_batches_sum_to_one_batch():
    logp, old, adv, mask = _ragged_policy_batch(12)
    for aggregation in LOSS_AGGREGATIONS:
        kwargs = dict(aggregation=aggregation, horizon=6, ref_logprobs=old - 0.1, kl_coef=0.1, clip_ratio_c=3.0)
        full_lp = logp.clone().requires_grad_()
        full, _ = grpo_loss(full_lp, old, adv, mask, **kwargs)
        full.backward()
        normalizer = loss_normalizer(mask, aggregation)
        micro_lp = logp.clone().requires_grad_()
        total = 0.0
        splits = (slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4), slice(4, 5))  # equal, as "nemo" needs
        for sl in splits:
            micro_kwargs = {**kwargs, "ref_logprobs": (old - 0.1)[sl], "normalizer": normalizer}
            loss, _ = grpo_loss(micro_lp[sl], old[sl], adv[sl], mask[sl], **micro_kwargs)
            loss.backward()
            total = total + loss.detach()
        assert_close(total, full.detach())
        assert_close(micro_lp.grad, full_lp.grad)


# ---------------------------------------------------------------------------------------------------------- DAPO


def test_overlong_penalty_hand_values_and_verl():
    lengths = torch.tensor([3, 6, 7, 9, 10, 12])
    # max 10, buffer 4: expected length 6; exceed [-3, 0, 1, 3, 4, 6] / 4 -> [0, 0, -.25, -.75, -1, -1 (capped)]
    out = overlong_penalty(lengths, max_new_tokens=10, overlong_buffer=4, penalty_factor=0.5)
    assert_close(out, t([0.0, 0.0, -0.125, -0.375, -0.5, -0.5]))
    # veRL DAPORewardManager: min(-exceed_len / overlong_buffer_len * penalty_factor, 0), for lengths <= max
    verl = [min(-(n - (10 - 4)) / 4 * 0.5, 0) for n in lengths.tolist()]
    assert_close(out[:5], t(verl[:5]))
    assert_close(overlong_penalty(lengths, 10, 0), torch.zeros(6))
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 10, 11)


def test_zero_spread_groups():
    rewards = t([1.0, 1.0, 0.0, 2.0, 2.0 + 1e-8, 5.0, 3.0], torch.float64)
    group_ids = torch.tensor([4, 4, 9, 7, 7, 9, 2])
    # group 4: equal; group 9: 0 vs 5; group 7: within atol; group 2: a single sample (no spread)
    mask = zero_spread_groups(rewards, group_ids)
    assert mask.tolist() == [True, True, False, True, True, False, True]
    assert zero_spread_fraction(rewards, group_ids) == 3 / 4
    assert zero_spread_groups(rewards, group_ids, atol=0.0).tolist() == [True, True, False, False, False, False, True]
