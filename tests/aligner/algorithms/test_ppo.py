"""Tests of aligner.algorithms.ppo against values worked out by hand (the arithmetic is in the comments).

Run: .venv/bin/python -m pytest tests/aligner/algorithms/test_ppo.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from aligner.algorithms.ppo import (
    clipped_value_loss,
    entropy_from_logits,
    gae,
    normalize_advantages,
    per_token_kl,
    per_token_rewards,
    ppo_actor_loss,
)
from aligner.algorithms.reinforce import response_loss_mask

INF = float("inf")
NAN = float("nan")


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# --------------------------------------------------------------------------------------- per-token KL and rewards

LOGP = [[-1.0, -2.0, -3.0], [-0.5, -1.0, -INF]]
REF = [[-1.5, -1.0, -3.0], [-1.0, -1.0, 5.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
# d = logp - ref: row 0 [0.5, -1.0, 0.0]; row 1 [0.5, 0.0, (masked)]


def test_per_token_kl_estimators():
    # abs: |d|
    assert_close(per_token_kl(t(LOGP), t(REF), t(MASK)), t([[0.5, 1.0, 0.0], [0.5, 0.0, 0.0]]))
    # k1: d
    assert_close(per_token_kl(t(LOGP), t(REF), t(MASK), absolute=False), t([[0.5, -1.0, 0.0], [0.5, 0.0, 0.0]]))
    # k3: exp(-d) - 1 + d: d = 0.5 -> e^-0.5 - 0.5 = 0.10653066; d = -1 -> e - 2 = 0.71828183; d = 0 -> 0
    k3 = per_token_kl(t(LOGP), t(REF), t(MASK), estimator="k3")
    assert_close(k3, t([[0.10653066, 0.71828183, 0.0], [0.10653066, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        per_token_kl(t(LOGP), t(REF), t(MASK), estimator="k4")
    with pytest.raises(ValueError, match="same shape"):
        per_token_kl(t(LOGP), t(REF), t([1, 1, 1]))


def test_per_token_rewards_hand_values():
    rewards = t([2.0, -1.0])
    out = per_token_rewards(rewards, t(LOGP), t(REF), t(MASK), kl_coef=0.1)
    # row 0: -0.1 * [0.5, 1.0, 0.0] = [-0.05, -0.1, 0], reward 2 on the last valid token (index 2) -> [-0.05, -0.1, 2]
    # row 1: -0.1 * [0.5, 0.0] = [-0.05, 0], reward -1 on index 1; index 2 is padding -> [-0.05, -1, 0]
    assert_close(out, t([[-0.05, -0.1, 2.0], [-0.05, -1.0, 0.0]]))
    # k1: row 0 penalties -0.1 * [0.5, -1.0, 0] = [-0.05, +0.1, 0]
    out_k1 = per_token_rewards(rewards, t(LOGP), t(REF), t(MASK), kl_coef=0.1, absolute=False)
    assert_close(out_k1[0], t([-0.05, 0.1, 2.0]))
    # no penalty: only the sequence rewards remain
    assert_close(per_token_rewards(rewards, t(LOGP), t(REF), t(MASK), kl_coef=0.0), t([[0, 0, 2.0], [0, -1.0, 0]]))


def test_per_token_rewards_default_coefficient_and_edge_rows():
    logp, ref = t([[-1.0, -2.0, -3.0, 0.0]] * 3), t([[-2.0, -2.0, -2.0, 0.0]] * 3)
    mask = t([[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]])  # a prompt position first; an empty row; one token
    out = per_token_rewards(t([1.0, 5.0, 3.0]), logp, ref, mask)
    # default kl_coef 0.01, abs KL |d| = [1, 0, 1, 0]
    # row 0: index 0 masked -> 0; index 1: -0.01 * 0 = 0; index 2 (last valid): -0.01 * 1 + 1 = 0.99
    # row 1: no valid token -> zeros, the reward 5 has nowhere to go
    # row 2: index 0 only: -0.01 * 1 + 3 = 2.99
    assert_close(out, t([[0, 0, 0.99, 0], [0, 0, 0, 0], [2.99, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"rewards must be \[B\]"):
        per_token_rewards(t([1.0]), logp, ref, mask)


# ----------------------------------------------------------------------------------------------------------- GAE


def test_gae_hand_values():
    # gamma 1, lambda 0.5, r = [0, 0, 1], V = [0.5, 0.5, 0.5]
    # delta_2 = 1 + 0 - 0.5 = 0.5 (V after the end is 0)  A_2 = 0.5
    # delta_1 = 0 + 0.5 - 0.5 = 0                          A_1 = 0 + 0.5 * 0.5 = 0.25
    # delta_0 = 0                                          A_0 = 0.5 * 0.25 = 0.125
    # returns = A + V = [0.625, 0.75, 1.0]
    adv, ret = gae(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.5, 0.5]]), t([[1, 1, 1]]), gamma=1.0, lam=0.5)
    assert_close(adv, t([[0.125, 0.25, 0.5]]))
    assert_close(ret, t([[0.625, 0.75, 1.0]]))

    # gamma 0.5, lambda 1, r = [1, 0, 2], V = [1, 2, 1]
    # delta_2 = 2 - 1 = 1                 A_2 = 1
    # delta_1 = 0 + 0.5 * 1 - 2 = -1.5    A_1 = -1.5 + 0.5 * 1 = -1
    # delta_0 = 1 + 0.5 * 2 - 1 = 1       A_0 = 1 + 0.5 * -1 = 0.5
    # returns [1.5, 1, 2] = the discounted Monte-Carlo returns: 2; 0 + 0.5 * 2 = 1; 1 + 0.5 * 1 = 1.5
    adv, ret = gae(t([[1.0, 0.0, 2.0]]), t([[1.0, 2.0, 1.0]]), t([[1, 1, 1]]), gamma=0.5, lam=1.0)
    assert_close(adv, t([[0.5, -1.0, 1.0]]))
    assert_close(ret, t([[1.5, 1.0, 2.0]]))


def test_gae_right_padding_bootstraps_zero_and_ignores_garbage():
    rewards = t([[0.0, 0.0, 1.0, 5.0], [0.0, 1.0, 7.0, NAN]])
    values = t([[0.5, 0.5, 0.5, 99.0], [0.5, 0.5, NAN, INF]])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # row 0 is the first hand example plus one padded position (0 in the results)
    # row 1 ends at index 1: delta_1 = 1 + 0 (not the NaN value after it) - 0.5 = 0.5, A_1 = 0.5;
    #   delta_0 = 0 + 0.5 - 0.5 = 0, A_0 = 0.5 * 0.5 = 0.25; returns [0.75, 1.0]
    assert_close(adv, t([[0.125, 0.25, 0.5, 0.0], [0.25, 0.5, 0.0, 0.0]]))
    assert_close(ret, t([[0.625, 0.75, 1.0, 0.0], [0.75, 1.0, 0.0, 0.0]]))


def test_gae_prompt_positions_are_zero_and_defaults_are_nemos():
    # mask [0, 1, 1]: index 0 is a prompt position. Defaults gamma 1, lambda 0.95; r = [9, 0, 1], V = [3, 0.2, 0.4]
    # delta_2 = 1 - 0.4 = 0.6                 A_2 = 0.6
    # delta_1 = 0 + 0.4 - 0.2 = 0.2           A_1 = 0.2 + 0.95 * 0.6 = 0.77
    # index 0 is masked: 0 in the results; returns [0, 0.97, 1.0]
    adv, ret = gae(t([[9.0, 0.0, 1.0]]), t([[3.0, 0.2, 0.4]]), t([[0, 1, 1]]))
    assert_close(adv, t([[0.0, 0.77, 0.6]]))
    assert_close(ret, t([[0.0, 0.97, 1.0]]))


def test_gae_lambda_limits():
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 6), torch.randn(3, 6)
    mask = t([[1] * 6, [1] * 4 + [0] * 2, [0] + [1] * 3 + [0] * 2])
    # lambda 1, gamma 1: returns are the plain sums of the rewards still to come, up to the end of the response
    _, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    masked_r = rewards * mask
    mc = masked_r.flip(1).cumsum(1).flip(1) * mask
    assert_close(ret, mc)
    # lambda 0: one-step TD errors, r_t + gamma * V_{t+1} - V_t, V_{t+1} = 0 after the last valid token
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.0)
    v = values * mask
    next_v = torch.cat([v[:, 1:], torch.zeros(3, 1)], dim=1)
    assert_close(adv, (masked_r + 0.9 * next_v - v) * mask)


def test_gae_carries_no_gradient_and_keeps_dtype():
    values = torch.ones(1, 2, dtype=torch.float64, requires_grad=True)
    adv, ret = gae(torch.ones(1, 2), values, torch.ones(1, 2, dtype=torch.bool))
    assert not adv.requires_grad and not ret.requires_grad
    assert adv.dtype == ret.dtype == torch.float64
    with pytest.raises(ValueError, match="same shape"):
        gae(torch.ones(1, 2), torch.ones(1, 3), torch.ones(1, 2))


# ---------------------------------------------------------------------------------------------- normalisation


def test_normalize_advantages_hand_values():
    adv = t([[1.0, 2.0, 100.0], [3.0, NAN, INF]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    # valid: 1, 2, 3 -> mean 2, population variance (1 + 0 + 1) / 3 = 2/3, 1 / sqrt(2/3 + 1e-8) = 1.2247449
    out = normalize_advantages(adv, mask)
    s = 1.0 / math.sqrt(2.0 / 3.0 + 1e-8)
    assert_close(out, t([[-s, 0.0, 0.0], [s, 0.0, 0.0]]))


def test_normalize_advantages_degenerate_masks():
    # one valid token: variance 0 -> (3 - 3) * 1e4 = 0; empty mask: zeros; never NaN
    assert_close(normalize_advantages(t([[3.0, 7.0]]), t([[1, 0]])), t([[0.0, 0.0]]))
    assert_close(normalize_advantages(t([[3.0, 7.0]]), t([[0, 0]])), t([[0.0, 0.0]]))
    assert_close(normalize_advantages(t([[4.0, 4.0]]), t([[1, 1]])), t([[0.0, 0.0]]))


# ------------------------------------------------------------------------------------------------------ entropy


def test_entropy_from_logits_hand_values():
    # uniform over 4 tokens: log 4 = 1.3862944; logits [0, ln 3] -> p = [1/4, 3/4],
    # H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3465736 + 0.2157616 = 0.5623351
    logits = t([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -INF, -INF]]])
    assert_close(entropy_from_logits(logits), t([[math.log(4.0), 0.5623351]]))


def test_entropy_of_filtered_logits_has_a_finite_gradient():
    logits = t([[[2.0, -INF, 0.5]]]).requires_grad_()
    entropy_from_logits(logits).sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 0, 1] == 0


# ------------------------------------------------------------------------------------------------ actor loss

RATIOS = [[1.0, 1.5, 0.5, 1.1, 0.5, 1.0]]
ADV = [[1.0, 1.0, -1.0, -1.0, 1.0, NAN]]
ACTOR_MASK = [[1, 1, 1, 1, 1, 0]]


def actor_inputs():
    logprobs = torch.log(t(RATIOS))  # old log-probs 0: the ratio is exp(logprobs)
    logprobs[0, 5] = -INF  # a masked position may hold anything
    return logprobs.requires_grad_(), torch.zeros(1, 6), t(ADV), t(ACTOR_MASK)


def test_ppo_actor_loss_hand_values_and_gradients():
    logprobs, old, adv, mask = actor_inputs()
    loss, clip_fraction = ppo_actor_loss(logprobs, old, adv, mask, ratio_eps=0.2)
    # per token max(-A rho, -A clip(rho, 0.8, 1.2)):
    #   rho 1.0, A +1: max(-1, -1)     = -1
    #   rho 1.5, A +1: max(-1.5, -1.2) = -1.2  clipped
    #   rho 0.5, A -1: max(0.5, 0.8)   = 0.8   clipped
    #   rho 1.1, A -1: max(1.1, 1.1)   = 1.1   inside the range: not clipped
    #   rho 0.5, A +1: max(-0.5, -0.8) = -0.5  the clip is not the pessimistic side: not clipped
    # loss = (-1 - 1.2 + 0.8 + 1.1 - 0.5) / 5 = -0.8 / 5 = -0.16; clip fraction 2 / 5
    assert_close(loss, t(-0.16))
    assert_close(clip_fraction, t(0.4))
    assert not clip_fraction.requires_grad
    loss.backward()
    # d/dlogp of -A * rho / 5 = -A * rho / 5 where unclipped, 0 where clipped or masked:
    #   -1 * 1 / 5 = -0.2; 0; 0; +1 * 1.1 / 5 = 0.22; -1 * 0.5 / 5 = -0.1; 0
    assert_close(logprobs.grad, t([[-0.2, 0.0, 0.0, 0.22, -0.1, 0.0]]))


def test_ppo_actor_loss_at_ratio_one_is_the_policy_gradient():
    logprobs = t([[-1.0, -2.0, -0.5]]).requires_grad_()
    adv, mask = t([[2.0, -1.0, 4.0]]), t([[1, 1, 0]])
    loss, clip_fraction = ppo_actor_loss(logprobs, logprobs.detach(), adv, mask)
    # rho = 1: loss = -(2 - 1) / 2 = -0.5, gradient -A / 2 on valid tokens
    assert_close(loss, t(-0.5))
    assert_close(clip_fraction, t(0.0))
    loss.backward()
    assert_close(logprobs.grad, t([[-1.0, 0.5, 0.0]]))


def test_ppo_actor_loss_entropy_bonus():
    logprobs, old, adv, mask = actor_inputs()
    entropy = t([[1.0, 2.0, 3.0, 4.0, 5.0, NAN]])
    loss, _ = ppo_actor_loss(logprobs, old, adv, mask, entropy=entropy, entropy_bonus=0.1)
    # -0.16 - 0.1 * (1 + 2 + 3 + 4 + 5) / 5 = -0.16 - 0.3 = -0.46
    assert_close(loss, t(-0.46))
    with pytest.raises(ValueError, match="entropy_bonus is set"):
        ppo_actor_loss(logprobs, old, adv, mask, entropy_bonus=0.1)


def test_ppo_actor_loss_micro_batches_sum_to_the_batch():
    torch.manual_seed(0)
    logprobs = (torch.randn(4, 5) * 0.3 - 1).requires_grad_()
    old, adv = torch.randn(4, 5) * 0.3 - 1, torch.randn(4, 5)
    mask = t([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    whole, whole_clip = ppo_actor_loss(logprobs, old, adv, mask)
    n = mask.sum()
    parts = [
        ppo_actor_loss(logprobs[rows], old[rows], adv[rows], mask[rows], normalizer=n) for rows in ([0, 1], [2, 3])
    ]
    assert_close(parts[0][0] + parts[1][0], whole)
    assert_close(parts[0][1] + parts[1][1], whole_clip)
    # an empty mask gives 0, not NaN, still attached to the graph
    empty, _ = ppo_actor_loss(logprobs, old, adv, torch.zeros(4, 5))
    assert empty.item() == 0 and empty.requires_grad


# ------------------------------------------------------------------------------------------------ value loss


def value_inputs():
    values = t([[1.0, 2.0, 0.0, NAN]]).requires_grad_()
    old = t([[1.0, 1.0, 1.0, INF]])
    returns = t([[2.0, 1.5, 0.0, NAN]])
    return values, old, returns, t([[1, 1, 1, 0]])


def test_clipped_value_loss_hand_values_and_gradients():
    values, old, returns, mask = value_inputs()
    loss = clipped_value_loss(values, old, returns, mask, clip=0.2)
    # V 1, old 1, G 2:   clipped V 1:   max((1 - 2)^2, (1 - 2)^2)       = 1
    # V 2, old 1, G 1.5: clipped V 1.2: max((2 - 1.5)^2, (1.2 - 1.5)^2) = max(0.25, 0.09) = 0.25
    # V 0, old 1, G 0:   clipped V 0.8: max((0 - 0)^2, (0.8 - 0)^2)     = 0.64 (the clipped term is worse)
    # loss = 0.5 * (1 + 0.25 + 0.64) / 3 = 0.315
    assert_close(loss, t(0.315))
    loss.backward()
    # d/dV: 0.5 * 2 * (1 - 2) / 3 = -1/3; 0.5 * 2 * (2 - 1.5) / 3 = 1/6; 0 (clipped term, saturated); 0 (masked)
    assert_close(values.grad, t([[-1 / 3, 1 / 6, 0.0, 0.0]]))


def test_clipped_value_loss_without_clipping_and_with_a_normalizer():
    values, old, returns, mask = value_inputs()
    # clip 0: 0.5 * (1 + 0.25 + 0) / 3 = 0.2083333
    assert_close(clipped_value_loss(values, old, returns, mask, clip=0.0), t(0.625 / 3))
    # a normalizer of 6 (tokens of a larger batch): 0.5 * 1.89 / 6 = 0.1575
    assert_close(clipped_value_loss(values, old, returns, mask, normalizer=6), t(0.1575))
    assert clipped_value_loss(values, old, returns, torch.zeros(1, 4)).item() == 0
    with pytest.raises(ValueError, match="same shape"):
        clipped_value_loss(values, old[:, :3], returns, mask)


def test_actor_loss_without_truncated_samples_is_nemos_is_end_masked_mean():
    # Ratio 1 everywhere (logprobs == old): the loss is -mean(A) over the tokens kept. Sample 1 was truncated.
    logprobs = t([[-1.0, -2.0], [-1.0, -1.0], [-0.5, -3.0]])
    advantages = t([[1.0, 3.0], [10.0, 10.0], [-2.0, 0.0]])
    mask, is_end = t([[1, 1], [1, 1], [1, 0]]), torch.tensor([True, False, True])
    kept = response_loss_mask(mask, is_end, exclude_truncated=True)
    loss, _ = ppo_actor_loss(logprobs, logprobs, advantages, kept)
    # NeMo: masked_mean(max(-A rho, -A clip(rho)), mask * is_end) = -(1 + 3 - 2) / 3 = -2/3
    assert_close(loss, t(-2 / 3))
    # With the truncated sample: -(1 + 3 + 10 + 10 - 2) / 5 = -22/5
    assert_close(ppo_actor_loss(logprobs, logprobs, advantages, mask)[0], t(-22 / 5))
