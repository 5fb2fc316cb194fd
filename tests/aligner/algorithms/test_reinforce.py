"""Tests of aligner.algorithms.reinforce against values worked out by hand (the arithmetic is in the comments).

Run: .venv/bin/python -m pytest tests/aligner/algorithms -q
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from aligner.algorithms.reinforce import (
    advantages_from_baseline,
    kl_penalty,
    masked_mean,
    nemo_reinforce_loss,
    reinforce_loss,
    response_loss_mask,
    rewards_with_kl,
    rloo_baseline,
    truncated_importance_weights,
)

INF = float("inf")


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# ----------------------------------------------------------------------------------------------------- masked_mean


def test_masked_mean_hand_values():
    values = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, False, True], [False, False, False]])
    # all: (1 + 3) / 2 = 2
    assert_close(masked_mean(values, mask), t(2.0))
    # per row: row 0 (1 + 3) / 2 = 2; row 1 empty -> 0 / max(0, 1) = 0
    assert_close(masked_mean(values, mask, dim=-1), t([2.0, 0.0]))
    # per column: 1 / 1 = 1; 0 / max(0, 1) = 0; 3 / 1 = 3
    assert_close(masked_mean(values, mask, dim=0), t([1.0, 0.0, 3.0]))


def test_masked_mean_ignores_non_finite_masked_entries_and_empty_mask():
    values = t([[1.0, INF, float("nan")], [-INF, 2.0, 4.0]]).requires_grad_()
    mask = t([[1, 0, 0], [0, 1, 1]])  # 0/1 float mask
    out = masked_mean(values, mask, dim=1)
    # row 0: 1 / 1 = 1; row 1: (2 + 4) / 2 = 3
    assert_close(out, t([1.0, 3.0]))
    out.sum().backward()
    # d/dv of the row means: 1/1 on row 0's valid token, 1/2 on row 1's, 0 on masked ones (no NaN)
    assert_close(values.grad, t([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]]))
    assert_close(masked_mean(values, torch.zeros(2, 3, dtype=torch.bool)), t(0.0))


# ------------------------------------------------------------------------------------------------------ kl_penalty

LOGP = [[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]]
REF = [[-1.5, -1.0, -0.5], [-0.1, -0.2, 5.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
# d = logp - ref: row 0 [0.5, -1.0, 0.0]; row 1 [-0.2, -0.5, (masked)]


def test_kl_penalty_k1():
    out = kl_penalty(t(LOGP), t(REF), torch.tensor(MASK), absolute=False)
    # row 0: (0.5 - 1.0 + 0.0) / 3 = -1/6; row 1: (-0.2 - 0.5) / 2 = -0.35
    assert_close(out, t([-1.0 / 6.0, -0.35]))
    assert_close(kl_penalty(t(LOGP), t(REF), torch.tensor(MASK), absolute=True, estimator="k1"), out)


def test_kl_penalty_abs_is_default():
    # row 0: (0.5 + 1.0 + 0.0) / 3 = 0.5; row 1: (0.2 + 0.5) / 2 = 0.35
    expected = t([0.5, 0.35])
    assert_close(kl_penalty(t(LOGP), t(REF), torch.tensor(MASK)), expected)
    assert_close(kl_penalty(t(LOGP), t(REF), torch.tensor(MASK), absolute=False, estimator="abs"), expected)


def test_kl_penalty_k3():
    out = kl_penalty(t(LOGP), t(REF), torch.tensor(MASK), estimator="k3")
    # k3 = exp(r) - 1 - r with r = ref - logp = -d
    # row 0: r = [-0.5, 1.0, 0.0]: (0.60653066 - 1 + 0.5) + (2.71828183 - 1 - 1) + 0
    #        = 0.10653066 + 0.71828183 + 0 = 0.82481249; / 3 = 0.27493750
    # row 1: r = [0.2, 0.5]: (1.22140276 - 1.2) + (1.64872127 - 1.5) = 0.02140276 + 0.14872127 = 0.17012403; / 2
    assert_close(out, t([0.27493750, 0.08506201]), atol=1e-6, rtol=1e-6)


def test_kl_penalty_k3_non_negative():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 16, generator=gen, dtype=torch.float64) * 3
    ref = torch.randn(64, 16, generator=gen, dtype=torch.float64) * 3
    mask = torch.rand(64, 16, generator=gen) > 0.3
    out = kl_penalty(logp, ref, mask, estimator="k3")
    assert (out >= 0).all()
    # equality when the policies agree
    assert_close(kl_penalty(logp, logp.clone(), mask, estimator="k3"), torch.zeros(64, dtype=torch.float64))


@pytest.mark.parametrize("estimator", ["k1", "abs", "k3"])
def test_kl_penalty_empty_row_and_non_finite_padding(estimator):
    logp = t([[-1.0, -INF], [-INF, -INF]]).requires_grad_()
    ref = t([[-1.0, 0.0], [-INF, 3.0]])
    mask = torch.tensor([[True, False], [False, False]])
    out = kl_penalty(logp, ref, mask, estimator=estimator)
    # row 0: d = 0 on its single valid token -> 0; row 1: no valid tokens -> 0 (not NaN)
    assert_close(out, t([0.0, 0.0]))
    out.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert_close(logp.grad[:, 1], t([0.0, 0.0]))
    assert_close(logp.grad[1], t([0.0, 0.0]))


def test_kl_penalty_k2_is_half_the_squared_log_ratio():
    # d = logp - ref per valid token; k2 = d^2 / 2, then the mean over each row's valid tokens.
    logp, ref, mask = t([[-1.0, -2.0, -3.0]]), t([[-1.5, -1.0, 9.0]]), torch.tensor([[1, 1, 0]])
    assert_close(kl_penalty(logp, ref, mask, estimator="k2"), t([(0.5**2 / 2 + 1.0**2 / 2) / 2]))


def test_kl_penalty_unknown_estimator():
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(t(LOGP), t(REF), torch.tensor(MASK), estimator="k4")


def test_kl_penalty_shape_mismatch():
    with pytest.raises(ValueError):
        kl_penalty(t(LOGP), t(REF), torch.ones(2, 2))


# ------------------------------------------------------------------------------------------------- rewards_with_kl


def test_rewards_with_kl():
    # [1.0 - 0.1 * 0.2, -0.5 - 0.1 * 3.0] = [0.98, -0.8]
    assert_close(rewards_with_kl(t([1.0, -0.5]), t([0.2, 3.0]), 0.1), t([0.98, -0.8]))
    # coefficient 0: rewards unchanged
    assert_close(rewards_with_kl(t([1.0, -0.5]), t([0.2, 3.0]), 0.0), t([1.0, -0.5]))


# --------------------------------------------------------------------------------------------------- rloo_baseline


def test_rloo_baseline_single_group_all_ended():
    rewards = t([1.0, 2.0, 3.0, 6.0])
    out = rloo_baseline(rewards, torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool))
    # total 12: [(12 - 1) / 3, (12 - 2) / 3, (12 - 3) / 3, (12 - 6) / 3] = [11/3, 10/3, 3, 2]
    assert_close(out, t([11.0 / 3.0, 10.0 / 3.0, 3.0, 2.0]))


def test_rloo_baseline_non_contiguous_groups_with_truncation():
    group_ids = torch.tensor([7, 3, 7, 5, 3, 7, 5, 3])
    rewards = t([1.0, 2.0, 4.0, 10.0, 6.0, 7.0, 20.0, 9.0])
    is_end = torch.tensor([True, True, True, True, True, False, False, True])
    out = rloo_baseline(rewards, group_ids, is_end)
    # group 7 = samples 0, 2, 5; ended: 0 (1.0), 2 (4.0); 5 (7.0) truncated
    #   b0 = 4.0; b2 = 1.0; b5 = mean of all ended = (1 + 4) / 2 = 2.5 (its own 7.0 never counts)
    # group 3 = samples 1, 4, 7 (2.0, 6.0, 9.0), all ended
    #   b1 = (6 + 9) / 2 = 7.5; b4 = (2 + 9) / 2 = 5.5; b7 = (2 + 6) / 2 = 4.0
    # group 5 = samples 3, 6; only sample 3 ended -> baseline = own reward: b3 = 10.0, b6 = 20.0
    assert_close(out, t([4.0, 7.5, 1.0, 10.0, 5.5, 2.5, 20.0, 4.0]))
    # advantages: 0 for the whole group 5
    adv = advantages_from_baseline(rewards, out)
    assert_close(adv[[3, 6]], t([0.0, 0.0]))


def test_rloo_baseline_group_with_one_ended_sample():
    rewards = t([3.0, 5.0, 8.0])
    out = rloo_baseline(rewards, torch.tensor([1, 1, 1]), torch.tensor([False, True, False]))
    # only one sample ended: every baseline equals the sample's own reward
    assert_close(out, rewards)
    # no sample ended, and groups of one sample: same
    assert_close(rloo_baseline(rewards, torch.tensor([1, 1, 1]), torch.zeros(3, dtype=torch.bool)), rewards)
    assert_close(rloo_baseline(rewards, torch.tensor([0, 1, 2]), torch.ones(3, dtype=torch.bool)), rewards)


def test_rloo_baseline_truncated_reward_does_not_leak():
    # the truncated sample's reward (NaN here) must not enter the baselines of the others
    rewards = t([1.0, 3.0, float("nan")])
    out = rloo_baseline(rewards, torch.tensor([0, 0, 0]), torch.tensor([True, True, False]))
    # b0 = 3; b1 = 1; b2 = (1 + 3) / 2 = 2
    assert_close(out, t([3.0, 1.0, 2.0]))


def test_rloo_advantages_sum_to_zero_per_fully_ended_group():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(12, generator=gen, dtype=torch.float64)
    group_ids = torch.arange(12) % 3  # interleaved groups of 4
    adv = advantages_from_baseline(rewards, rloo_baseline(rewards, group_ids, torch.ones(12, dtype=torch.bool)))
    # sum_i (r_i - (S - r_i) / (k - 1)) = S - (k S - S) / (k - 1) = 0
    sums = torch.zeros(3, dtype=torch.float64).index_add_(0, group_ids, adv)
    assert_close(sums, torch.zeros(3, dtype=torch.float64))


def test_rloo_baseline_no_cancellation_in_float32():
    rewards = t([1e8, 1.0, 2.0])
    out = rloo_baseline(rewards, torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool))
    # b0 = (1 + 2) / 2 = 1.5 exactly; a float32 "sum - own" would give (1e8 + 3 -> 1e8) - 1e8 = 0
    assert out[0].item() == 1.5
    assert out.dtype == torch.float32


def test_rloo_baseline_empty_batch_and_bad_shape():
    empty = rloo_baseline(t([]), torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.bool))
    assert empty.shape == (0,)
    with pytest.raises(ValueError):
        rloo_baseline(t([1.0, 2.0]), torch.tensor([0]), torch.tensor([True, True]))


# -------------------------------------------------------------------------------------- advantages_from_baseline


def test_advantages_from_baseline_plain():
    # [2 - 1, 4 - 1, 9 - 2] = [1, 3, 7]
    assert_close(advantages_from_baseline(t([2.0, 4.0, 9.0]), t([1.0, 1.0, 2.0])), t([1.0, 3.0, 7.0]))


def test_advantages_from_baseline_normalize():
    # a = [1, 3]: mean 2, population std sqrt(((-1)^2 + 1^2) / 2) = 1 -> [-1, 1]
    # (the unbiased std sqrt(2) would give [-0.7071, 0.7071])
    out = advantages_from_baseline(t([1.0, 3.0]), t([0.0, 0.0]), normalize=True)
    assert_close(out, t([-1.0, 1.0]))
    # a = [1, 3, 7]: mean 11/3, deviations [-8/3, -2/3, 10/3],
    # var = (64 + 4 + 100) / 9 / 3 = 168/27, std = 2.49443826 -> [-1.06904497, -0.26726124, 1.33630621]
    out = advantages_from_baseline(t([2.0, 4.0, 9.0]), t([1.0, 1.0, 2.0]), normalize=True)
    assert_close(out, t([-1.06904497, -0.26726124, 1.33630621]))


def test_advantages_from_baseline_normalize_degenerate():
    # a single sample: a - mean = 0, no NaN
    assert_close(advantages_from_baseline(t([5.0]), t([2.0]), normalize=True), t([0.0]))
    # equal advantages: 0 / (0 + eps) = 0
    assert_close(advantages_from_baseline(t([2.0, 2.0, 2.0]), t([0.0, 0.0, 0.0]), normalize=True), t([0.0] * 3))


# ---------------------------------------------------------------------------------------------- response_loss_mask


def test_response_loss_mask():
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    is_end = torch.tensor([True, False, True])
    out = response_loss_mask(mask, is_end)
    assert out.dtype == torch.float32
    assert_close(out, t([[1, 1, 0], [1, 0, 0], [1, 1, 1]]))
    # exclude_truncated: row 1 (is_end False) zeroed
    assert_close(response_loss_mask(mask, is_end, exclude_truncated=True), t([[1, 1, 0], [0, 0, 0], [1, 1, 1]]))
    # a float mask keeps its dtype
    out64 = response_loss_mask(mask.double(), is_end, exclude_truncated=True)
    assert out64.dtype == torch.float64


# -------------------------------------------------------------------------------------------------- reinforce_loss

LP = [[-1.0, -2.0, -3.0], [-0.5, -4.0, -100.0]]
LP_MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [2.0, -1.0]
# per-token -logp * A: row 0 [2, 4, 6] (sum 12, 3 tokens); row 1 [-0.5, -4.0, (masked)] (sum -4.5, 2 tokens)


def test_reinforce_loss_token_mean():
    # (12 - 4.5) / 5 = 1.5
    assert_close(reinforce_loss(t(LP), t(ADV), t(LP_MASK)), t(1.5))
    # normalizer 10 replaces the 5 tokens: 7.5 / 10 = 0.75
    assert_close(reinforce_loss(t(LP), t(ADV), t(LP_MASK), normalizer=10), t(0.75))
    assert_close(reinforce_loss(t(LP), t(ADV), t(LP_MASK), normalizer=torch.tensor(10.0)), t(0.75))


def test_reinforce_loss_seq_mean():
    # row means 12/3 = 4 and -4.5/2 = -2.25: (4 - 2.25) / 2 = 0.875
    assert_close(reinforce_loss(t(LP), t(ADV), t(LP_MASK), aggregation="seq_mean"), t(0.875))
    # an extra sample without valid tokens adds 0 and is not counted: still 0.875 (token_mean still 1.5)
    lp = t([*LP, [-1.0, -1.0, -1.0]])
    adv = t([*ADV, 5.0])
    mask = t([*LP_MASK, [0, 0, 0]])
    assert_close(reinforce_loss(lp, adv, mask, aggregation="seq_mean"), t(0.875))
    assert_close(reinforce_loss(lp, adv, mask, aggregation="token_mean"), t(1.5))
    # normalizer 4 replaces the 2 samples: 1.75 / 4 = 0.4375
    assert_close(reinforce_loss(lp, adv, mask, aggregation="seq_mean", normalizer=4.0), t(0.4375))


def test_reinforce_loss_grad_token_mean():
    logprobs = t(LP).requires_grad_()
    advantages = t(ADV).requires_grad_()
    reinforce_loss(logprobs, advantages, torch.tensor(LP_MASK, dtype=torch.bool)).backward()
    # d/dlogp = -A_i / 5 on valid tokens: row 0 -2/5 = -0.4, row 1 1/5 = 0.2; 0 on the masked token
    assert_close(logprobs.grad, t([[-0.4, -0.4, -0.4], [0.2, 0.2, 0.0]]))
    # advantages are constants
    assert advantages.grad is None


def test_reinforce_loss_grad_token_mean_random():
    gen = torch.Generator().manual_seed(2)
    logprobs = (-torch.rand(4, 6, generator=gen, dtype=torch.float64) * 5).requires_grad_()
    advantages = torch.randn(4, generator=gen, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=gen) > 0.4
    mask[0] = False
    reinforce_loss(logprobs, advantages, mask).backward()
    expected = torch.where(mask, -advantages[:, None] / mask.sum(), torch.zeros((), dtype=torch.float64))
    assert_close(logprobs.grad, expected)


def test_reinforce_loss_grad_seq_mean():
    logprobs = t(LP).requires_grad_()
    reinforce_loss(logprobs, t(ADV), t(LP_MASK), aggregation="seq_mean").backward()
    # d/dlogp = -A_i / (n_i * 2): row 0 -2 / (3 * 2) = -1/3; row 1 1 / (2 * 2) = 0.25
    assert_close(logprobs.grad, t([[-1.0 / 3.0] * 3, [0.25, 0.25, 0.0]]))


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "nemo"])
def test_reinforce_loss_all_zero_mask(aggregation):
    logprobs = t(LP).requires_grad_()
    loss = reinforce_loss(logprobs, t(ADV), torch.zeros(2, 3), aggregation=aggregation)
    assert_close(loss, t(0.0))
    assert loss.grad_fn is not None
    loss.backward()
    assert_close(logprobs.grad, torch.zeros(2, 3))


def test_reinforce_loss_masked_minus_inf_logprob():
    logprobs = t([[-1.0, -INF]]).requires_grad_()
    loss = reinforce_loss(logprobs, t([2.0]), t([[1, 0]]))
    # -(-1) * 2 / 1 = 2
    assert_close(loss, t(2.0))
    loss.backward()
    assert_close(logprobs.grad, t([[-2.0, 0.0]]))


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_reinforce_loss_gradient_accumulation(aggregation):
    gen = torch.Generator().manual_seed(3)
    batch, length = 7, 5
    base = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 4
    advantages = torch.randn(batch, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([5, 3, 0, 1, 4, 2, 5])
    mask = torch.arange(length)[None, :] < lengths[:, None]

    full_lp = base.clone().requires_grad_()
    full = reinforce_loss(full_lp, advantages, mask, aggregation=aggregation)
    full.backward()

    # global counts: 5 + 3 + 0 + 1 + 4 + 2 + 5 = 20 valid tokens; 6 samples with a valid token
    counts = {"token_mean": mask.sum(), "seq_mean": (mask.sum(dim=-1) > 0).sum()}
    assert counts["token_mean"].item() == 20 and counts["seq_mean"].item() == 6
    normalizer = counts[aggregation]
    micro_lp = base.clone().requires_grad_()
    total = torch.zeros((), dtype=torch.float64)
    for sl in (slice(0, 2), slice(2, 5), slice(5, 7)):
        loss = reinforce_loss(micro_lp[sl], advantages[sl], mask[sl], aggregation=aggregation, normalizer=normalizer)
        loss.backward()
        total = total + loss.detach()

    assert_close(total, full.detach())
    assert_close(micro_lp.grad, full_lp.grad)


# -------------------------------------------------------------------------------------------- nemo_reinforce_loss


def test_nemo_reinforce_loss_hand_values():
    # Three samples; sample 2 was truncated (is_end False), sample 1 has one token.
    logprobs = t([[-1.0, -3.0, -2.0], [-4.0, -9.0, -9.0], [-0.5, -0.5, -0.5]]).requires_grad_()
    mask = t([[1, 1, 1], [1, 0, 0], [1, 1, 1]])
    rewards_with_kl, baseline = t([2.0, -1.0, 5.0]), t([1.0, 1.0, 0.0])  # advantages 1, -2, 5
    is_end = torch.tensor([True, True, False])
    loss = nemo_reinforce_loss(logprobs, rewards_with_kl, baseline, mask, is_end, num_micro_batches=2)
    # l_0 = (1 + 3 + 2) * 1 / 3 = 2;  l_1 = 4 * (-2) / 1 = -8;  l_2 = 0 (truncated)
    # loss = (2 - 8 + 0) / (B * M) = -6 / (3 * 2) = -1
    assert_close(loss, t(-1.0))
    loss.backward()
    # d loss / d logprobs_{i,t} = -A_i * is_end_i * m_{i,t} / n_i / (B * M):  row 0: -1 / 3 / 6 = -1/18;
    # row 1: 2 / 1 / 6 = 1/3 on its one token; row 2: 0
    assert_close(logprobs.grad, t([[-1 / 18] * 3, [1 / 3, 0.0, 0.0], [0.0] * 3]))


def test_nemo_aggregation_differs_from_token_mean_and_seq_mean():
    # The same batch with every sample ended: nemo = seq_mean only when every sample has a token; here sample 1 has
    # none, which nemo counts (divides by B = 2) and seq_mean does not (divides by 1).
    logprobs, advantages, mask = t([[-1.0, -3.0], [-2.0, -2.0]]), t([1.0, 1.0]), t([[1, 1], [0, 0]])
    # per-sample token means: (1 + 3) / 2 = 2 and 0
    assert_close(reinforce_loss(logprobs, advantages, mask, "nemo"), t(1.0))  # (2 + 0) / 2
    assert_close(reinforce_loss(logprobs, advantages, mask, "seq_mean"), t(2.0))  # 2 / 1
    # token_mean weighs tokens: with a longer second sample the two differ.
    mask = t([[1, 0], [1, 1]])  # means 1 and 2: nemo (1 + 2) / 2 = 1.5; token_mean (1 + 2 + 2) / 3 = 5/3
    assert_close(reinforce_loss(logprobs, advantages, mask, "nemo"), t(1.5))
    assert_close(reinforce_loss(logprobs, advantages, mask, "token_mean"), t(5 / 3))


def test_nemo_micro_batches_sum_to_the_mean_of_micro_batch_means():
    gen = torch.Generator().manual_seed(5)
    base = -torch.rand(6, 4, generator=gen, dtype=torch.float64) * 3
    rewards, baseline = torch.randn(6, generator=gen, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    mask = torch.arange(4)[None, :] < torch.tensor([4, 2, 1, 3, 0, 4])[:, None]
    is_end = torch.tensor([True, False, True, True, True, False])
    lp = base.clone().requires_grad_()
    total = sum(
        nemo_reinforce_loss(lp[sl], rewards[sl], baseline[sl], mask[sl], is_end[sl], num_micro_batches=3)
        for sl in (slice(0, 2), slice(2, 4), slice(4, 6))
    )
    # NeMo's formula written out: per micro-batch the mean over its 2 samples of is_end * token mean, then the mean
    # over the 3 micro-batches.
    ref_lp = base.clone().requires_grad_()
    per_sample = (-ref_lp * (rewards - baseline)[:, None] * mask).sum(-1) / mask.sum(-1).clamp(min=1) * is_end
    reference = per_sample.view(3, 2).mean(-1).mean()
    assert_close(total, reference)
    total.backward()
    reference.backward()
    assert_close(lp.grad, ref_lp.grad)


def test_reinforce_loss_errors():
    with pytest.raises(ValueError, match="aggregation"):
        reinforce_loss(t(LP), t(ADV), t(LP_MASK), aggregation="sum")
    with pytest.raises(ValueError):
        reinforce_loss(t(LP), t([1.0, 2.0, 3.0]), t(LP_MASK))


# ------------------------------------------------------------------------------------------------------- dtypes


def test_float64_preserved():
    f64 = torch.float64
    logp, ref, mask = t(LOGP, f64), t(REF, f64), torch.tensor(MASK)
    for estimator in ("k1", "abs", "k3"):
        assert kl_penalty(logp, ref, mask, estimator=estimator).dtype == f64
    rewards = t([1.0, 2.0, 3.0, 6.0], f64)
    kl = t([0.1, 0.2, 0.3, 0.4], f64)
    assert rewards_with_kl(rewards, kl, 0.05).dtype == f64
    baseline = rloo_baseline(rewards, torch.tensor([0, 1, 0, 1]), torch.ones(4, dtype=torch.bool))
    assert baseline.dtype == f64
    # groups {0: 1, 3}, {1: 2, 6}: baselines [3, 6, 1, 2]
    assert_close(baseline, t([3.0, 6.0, 1.0, 2.0], f64))
    assert advantages_from_baseline(rewards, baseline).dtype == f64
    assert advantages_from_baseline(rewards, baseline, normalize=True).dtype == f64
    assert masked_mean(logp, mask).dtype == f64
    for aggregation in ("token_mean", "seq_mean"):
        loss = reinforce_loss(t(LP, f64), t(ADV, f64), torch.tensor(LP_MASK), aggregation=aggregation)
        assert loss.dtype == f64


def test_truncated_importance_weights_by_hand():
    """w = min(exp(logp - logp_behaviour), cap), 0 on masked tokens; detached."""
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, 0.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -2.5, -0.5], [-2.0, -3.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    weights = truncated_importance_weights(logprobs, behaviour, mask, cap=2.0)
    expected = torch.tensor([[1.0, 1.6487213, 0.0], [2.0, 1.0, 0.0]])  # exp(0.5) = 1.6487, exp(1) = 2.72 capped at 2
    assert_close(weights, expected)
    assert not weights.requires_grad


def test_token_weights_scale_each_tokens_term_not_the_counts():
    """With weights w the loss is sum(-w * logp * A * m) / D, D the same count as without them."""
    logprobs = torch.tensor([[-1.0, -2.0, -4.0], [-0.5, -1.5, -2.5]], requires_grad=True)
    advantages = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    weights = torch.tensor([[0.5, 2.0, 7.0], [1.0, 1.0, 0.0]])
    for aggregation in ("token_mean", "seq_mean"):
        loss = reinforce_loss(logprobs, advantages, mask, aggregation, token_weights=weights)
        terms = -logprobs.detach() * advantages[:, None] * mask * weights
        per_sample_means = (terms[0].sum() / 2 + terms[1].sum() / 3) / 2
        expected = terms.sum() / 5 if aggregation == "token_mean" else per_sample_means
        assert_close(loss, expected)
    ones = reinforce_loss(logprobs, advantages, mask, token_weights=torch.ones(2, 3))
    assert_close(ones, reinforce_loss(logprobs, advantages, mask))
