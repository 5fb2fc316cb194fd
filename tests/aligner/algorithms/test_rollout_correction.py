"""Tests of aligner.algorithms.rollout_correction: hand-worked values and transcriptions of veRL's
verl/trainer/ppo/rollout_corr_helper.py and NeMo-RL's nemo_rl/algorithms/loss/loss_functions.py.

Run: .venv/bin/python -m pytest tests/aligner/algorithms -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from aligner.algorithms.rollout_correction import log_importance_ratio, mismatch_metrics, rollout_correction_weights

LN = math.log
INF = float("inf")


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# trainer - rollout log-probs: row 0 [ln 3, ln 0.5, ln 1] (3 tokens), row 1 [ln 0.2, ln 1.5, (masked)] (2 tokens)
ROLLOUT = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -INF]]
DIFF = [[LN(3.0), LN(0.5), 0.0], [LN(0.2), LN(1.5), 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def _pair():
    rollout = t(ROLLOUT)
    trainer = rollout.masked_fill(t(MASK) == 0, 0.0) + t(DIFF)
    return trainer.masked_fill(t(MASK) == 0, INF), rollout  # garbage at the masked position on both sides


def test_token_tis_and_mis_hand_values():
    trainer, rollout = _pair()
    w, stats = rollout_correction_weights(trainer, rollout, t(MASK), "tis", "token", cap=2.0, min_ratio=0.5)
    # rho = [[3, 0.5, 1], [0.2, 1.5, -]]: clip to [0.5, 2] -> [[2, 0.5, 1], [0.5, 1.5, 0]]
    assert_close(w, t([[2.0, 0.5, 1.0], [0.5, 1.5, 0.0]]))
    # outside [0.5, 2]: 3 and 0.2 (0.5 is inside: the bounds are inclusive) -> 2 of 5 tokens
    assert_close(stats["share_corrected"], t(0.4))
    assert_close(stats["share_masked"], t(0.0))
    assert_close(stats["weight_mean"], t(5.5 / 5))
    assert_close(stats["rho_min"], t(0.2))
    assert_close(stats["rho_max"], t(3.0))
    w, stats = rollout_correction_weights(trainer, rollout, t(MASK), "mis", "token", cap=2.0, min_ratio=0.5)
    # masked: the out-of-range tokens get 0, the others keep rho
    assert_close(w, t([[0.0, 0.5, 1.0], [0.0, 1.5, 0.0]]))
    assert_close(stats["share_masked"], t(0.4))
    assert not w.requires_grad


def test_sequence_level_product_and_geometric_mean():
    trainer, rollout = _pair()
    # product: row 0 3 * 0.5 * 1 = 1.5; row 1 0.2 * 1.5 = 0.3
    log_rho = log_importance_ratio(trainer, rollout, t(MASK), "sequence")
    assert_close(log_rho, t([[LN(1.5)] * 3, [LN(0.3), LN(0.3), 0.0]]))
    w, stats = rollout_correction_weights(trainer, rollout, t(MASK), "tis", "sequence", cap=2.0, min_ratio=0.5)
    # tis: [1.5, clip(0.3) = 0.5] on every valid token; stats per sample: 1 of 2 corrected
    assert_close(w, t([[1.5] * 3, [0.5, 0.5, 0.0]]))
    assert_close(stats["share_corrected"], t(0.5))
    assert_close(stats["weight_mean"], t(1.0))
    w, stats = rollout_correction_weights(trainer, rollout, t(MASK), "mis", "sequence", cap=2.0, min_ratio=0.5)
    # mis: sample 1 (0.3 < 0.5) dropped whole
    assert_close(w, t([[1.5] * 3, [0.0, 0.0, 0.0]]))
    assert_close(stats["share_masked"], t(0.5))
    # geometric mean: 1.5^(1/3) = 1.1447142, 0.3^(1/2) = 0.5477226, both inside [0.5, 2]
    w, _ = rollout_correction_weights(trainer, rollout, t(MASK), "mis", "sequence", 2.0, 0.5, "geometric_mean")
    assert_close(w, t([[1.1447142] * 3, [0.5477226, 0.5477226, 0.0]]))


def test_rollout_correction_rejects_bad_arguments_and_empty_mask():
    trainer, rollout = _pair()
    with pytest.raises(ValueError, match="method"):
        rollout_correction_weights(trainer, rollout, t(MASK), "icepop")
    with pytest.raises(ValueError, match="level"):
        rollout_correction_weights(trainer, rollout, t(MASK), "tis", "seq")
    with pytest.raises(ValueError, match="min_ratio"):
        rollout_correction_weights(trainer, rollout, t(MASK), "tis", cap=1.0, min_ratio=2.0)
    w, stats = rollout_correction_weights(trainer, rollout, torch.zeros(2, 3), "mis", "sequence")
    assert (w == 0).all() and all(v.item() == 0 for v in stats.values())


def _verl_is_weights(log_ratio, response_mask, rollout_is, threshold):
    # veRL compute_rollout_correction_weights (no batch normalisation)
    if rollout_is == "token":
        weights = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        log_ratio_sum = (log_ratio * response_mask).sum(-1).unsqueeze(-1)
        weights = torch.exp(torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).expand_as(log_ratio)
    weights = weights * response_mask
    return weights.clamp(max=threshold).detach()


def _nemo_icepop(prev_logprobs, generation_logprobs, ratio_min, ratio_max):
    # NeMo-RL ClippedPGLossFn, token-level correction, truncated_importance_sampling_type "icepop"
    weights = torch.nan_to_num(torch.exp(prev_logprobs - generation_logprobs), nan=0.0, posinf=0.0, neginf=0.0)
    kept = (weights >= ratio_min) & (weights <= ratio_max)
    return torch.where(kept, weights, torch.zeros_like(weights))


def _random_pair(seed):
    gen = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(6, 7, generator=gen, dtype=torch.float64) * 4
    trainer = rollout + torch.randn(6, 7, generator=gen, dtype=torch.float64) * 0.6
    trainer[0, 0] = rollout[0, 0] + 30.0  # past veRL's safety bound
    mask = (torch.arange(7)[None, :] < torch.tensor([7, 3, 1, 5, 7, 2])[:, None]).double()
    return trainer, rollout, mask


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_matches_verl(level):
    trainer, rollout, mask = _random_pair(0)
    ours, _ = rollout_correction_weights(trainer, rollout, mask, "tis", level, cap=2.0)
    assert_close(ours, _verl_is_weights(trainer - rollout, mask, level, 2.0))


def test_mis_matches_nemo_icepop():
    trainer, rollout, mask = _random_pair(1)
    ours, stats = rollout_correction_weights(trainer, rollout, mask, "mis", "token", cap=1.5, min_ratio=0.6)
    assert_close(ours, _nemo_icepop(trainer, rollout, 0.6, 1.5) * mask)
    assert 0 < stats["share_masked"] < 1


def test_mismatch_metrics_hand_values_and_verl():
    trainer, rollout = _pair()
    metrics = mismatch_metrics(trainer, rollout, t(MASK))
    # k3 = exp(d) - 1 - d: 3 - 1 - ln 3 = 0.9013877; 0.5 - 1 + ln 2 = 0.1931472; 0; 0.2 - 1 - ln 0.2 = 0.8094379;
    # 1.5 - 1 - ln 1.5 = 0.0945349; sum 1.9985077 / 5 = 0.3997015
    assert_close(metrics["mismatch_kl"], t(0.3997015))
    # sum d = ln(3 * 0.5 * 1 * 0.2 * 1.5) = ln 0.45; exp(-ln(0.45) / 5) = 0.45^-0.2 = 1.1731667
    assert_close(metrics["mismatch_ppl_ratio"], t(1.1731667))
    # veRL compute_offpolicy_metrics: k3_kl = masked_mean(exp(log_ratio) - log_ratio - 1), log_ratio = old - rollout
    trainer_r, rollout_r, mask = _random_pair(2)
    log_ratio = trainer_r - rollout_r
    verl_k3 = ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum() / mask.sum()
    assert_close(mismatch_metrics(trainer_r, rollout_r, mask)["mismatch_kl"], verl_k3)
    # veRL ppl_ratio = mean over sequences of exp(mean_t rollout - mean_t trainer): equal on one sequence
    one = slice(3, 4)
    per_seq = ((rollout_r[one] - trainer_r[one]) * mask[one]).sum(-1) / mask[one].sum(-1)
    assert_close(mismatch_metrics(trainer_r[one], rollout_r[one], mask[one])["mismatch_ppl_ratio"], per_seq.exp()[0])
    # and agreeing engines give 0 and 1
    same = mismatch_metrics(rollout_r, rollout_r.clone(), mask)
    assert same["mismatch_kl"].item() == 0.0 and same["mismatch_ppl_ratio"].item() == 1.0
