"""aligner/trainers/rollout.py: the train_rollouts/ diagnostics of a step's samples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from aligner.trainers.rollout import rollout_diagnostics


def test_diagnostics_use_the_raw_rewards_lengths_in_tokens_and_the_prompt_groups():
    # 3 prompts x 2 samples: prompt 1's samples got the same reward; the reward grows with the length.
    gen = SimpleNamespace(
        response_lengths=torch.tensor([2, 4, 6, 6, 1, 9]), group_ids=torch.tensor([0, 0, 1, 1, 2, 2])
    )
    rewards = torch.tensor([0.2, 0.4, 0.6, 0.6, 0.1, 0.9])
    metrics = rollout_diagnostics(gen, rewards)
    assert list(metrics) == ["train_rollouts/reward_length_corr", "train_rollouts/frac_zero_std_groups"]
    assert metrics["train_rollouts/reward_length_corr"] == pytest.approx(1.0)
    assert metrics["train_rollouts/frac_zero_std_groups"] == pytest.approx(1 / 3)
    flipped = rollout_diagnostics(gen, -rewards)
    assert flipped["train_rollouts/reward_length_corr"] == pytest.approx(-1.0)
    constant = rollout_diagnostics(gen, torch.zeros(6))
    assert constant == {"train_rollouts/reward_length_corr": 0.0, "train_rollouts/frac_zero_std_groups": 1.0}


def test_throughput_counts_each_samples_prompt_and_response_tokens_per_second():
    from aligner.modeling.batches import ResponseBatch
    from aligner.trainers.rollout import throughput_metrics

    # 2 prompts of 3 and 1 tokens, 3 responses of 2, 4 and 1 tokens: 3+2 + 3+4 + 1+1 = 14 tokens, 3 samples, in 2 s
    batch = ResponseBatch(
        prompt_ids=torch.zeros(2, 3, dtype=torch.long),
        prompt_mask=torch.tensor([[True, True, True], [False, False, True]]),
        group=torch.tensor([0, 0, 1]),
        response_ids=torch.zeros(3, 4, dtype=torch.long),
        response_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool),
    )
    metrics = throughput_metrics(batch, 2.0)
    assert metrics == {"throughput/tokens_per_s": 7.0, "throughput/samples_per_s": 1.5}
