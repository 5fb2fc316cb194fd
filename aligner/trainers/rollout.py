"""What REINFORCE and PPO make alike of a step's samples: each sample's prompt, the rows logged to samples.jsonl,
and the train_rollouts/ metrics they share."""

from __future__ import annotations

from typing import Any

import torch

from aligner import distributed
from aligner.algorithms.diagnostics import reward_length_correlation, zero_spread_fraction
from aligner.algorithms.pass_at_k import grouped_mean_at_k, grouped_pass_at_k
from aligner.generation.generator import GenerationOutput
from aligner.metrics import (
    INIT_POLICY_KL,
    REWARD_LENGTH_CORR,
    SAMPLES_PER_S,
    TOKENS_PER_S,
    TRAIN_PROPERLY_ENDED,
    TRAIN_RESPONSE_LENGTH,
    TRAIN_REWARD,
    TRAIN_REWARD_WITH_KL,
    VAL_MEAN_AT_K,
    VAL_PASS_AT_1,
    VAL_PASS_AT_K,
    ZERO_SPREAD_GROUPS,
)
from aligner.modeling.batches import ResponseBatch


def sample_prompt_indices(gen: GenerationOutput, prompt_indices: list[int]) -> list[int]:
    """The dataset index of each sample's prompt (generation numbers a prompt by its place in `prompt_indices`)."""
    return [prompt_indices[g] for g in gen.group_ids.tolist()]


def rollout_metrics(
    gen: GenerationOutput,
    rewards: torch.Tensor,
    rewards_with_kl: torch.Tensor,
    kl: torch.Tensor,
    extra: dict[str, float],
) -> dict[str, float]:
    """Means over the samples ([B] tensors); `extra` (the algorithm's own) goes after the KL, as metrics.jsonl has
    always ordered them. The diagnostics (`rollout_diagnostics`) come last."""
    return {
        TRAIN_REWARD: rewards.mean().item(),
        TRAIN_REWARD_WITH_KL: rewards_with_kl.mean().item(),
        INIT_POLICY_KL: kl.mean().item(),
        **extra,
        TRAIN_RESPONSE_LENGTH: gen.response_lengths.float().mean().item(),
        TRAIN_PROPERLY_ENDED: gen.is_end.float().mean().item(),
        **rollout_diagnostics(gen, rewards),
    }


def pass_metrics(rewards: torch.Tensor, group_ids: torch.Tensor, k: int, threshold: float) -> dict[str, float]:
    """val/pass@1, val/pass@k and val/mean@k of this rank's validation samples, k a prompt (`group_ids`), means over
    its prompts (weigh by prompts to average over ranks): a sample passes when its reward is at least `threshold`;
    pass@k is the unbiased estimator 1 - C(n - c, k) / C(n, k) (aligner/algorithms/pass_at_k.py)."""
    passed = rewards.detach() >= threshold
    return {
        VAL_PASS_AT_1: grouped_pass_at_k(passed, group_ids, 1)[1].mean().item(),
        VAL_PASS_AT_K: grouped_pass_at_k(passed, group_ids, k)[1].mean().item(),
        VAL_MEAN_AT_K: grouped_mean_at_k(rewards, group_ids, k)[1].mean().item(),
    }


def rollout_diagnostics(gen: GenerationOutput, rewards: torch.Tensor) -> dict[str, float]:
    """The correlation of the raw `rewards` (not KL-shaped) with the response lengths in tokens, and the share of
    prompts whose samples all got the same reward (aligner/algorithms/diagnostics.py), over the global batch: under
    torchrun every rank's rewards, lengths and prompts are gathered (three numbers a sample), so every rank holds
    the whole batch's values and averaging them over ranks leaves them as they are."""
    mine = (rewards.detach().double().cpu(), gen.response_lengths.cpu(), gen.group_ids.cpu())
    # Ranks of one model-parallel group hold the same samples: their data-parallel leader speaks for them.
    parts = [part for leader, part in distributed.all_gather_objects((distributed.is_dp_leader(), mine)) if leader]
    groups, offset = [], 0
    for _, _, group_ids in parts:  # each rank numbers its own prompts from 0: number them after the previous ranks'
        groups.append(group_ids + offset)
        offset += int(group_ids.max()) + 1 if group_ids.numel() else 0
    all_rewards = torch.cat([r for r, _, _ in parts])
    lengths = torch.cat([n for _, n, _ in parts])
    return {
        REWARD_LENGTH_CORR: reward_length_correlation(all_rewards, lengths),
        ZERO_SPREAD_GROUPS: zero_spread_fraction(all_rewards, torch.cat(groups)),
    }


def sample_rows(
    step: int,
    split: str,
    prompts: list[str],
    gen: GenerationOutput,
    rewards: torch.Tensor,
    kl: torch.Tensor,
    advantages: torch.Tensor | None,
    extra_rewards: dict[str, torch.Tensor] | None = None,
) -> list[dict[str, Any]]:
    """One samples.jsonl row per sample; `advantages` is None for validation samples. `extra_rewards` (validation:
    {name: [B] rewards}) gives the rows `"extra_rewards": {name: value}`."""
    rows = []
    for i, (prompt, response) in enumerate(zip(prompts, gen.responses)):
        rows.append(
            {
                "step": step,
                "split": split,
                "prompt": prompt,
                "response": response,
                "reward": float(rewards[i]),
                "kl": float(kl[i]),
                "advantage": None if advantages is None else float(advantages[i]),
                "is_end": bool(gen.is_end[i]),
                "response_length": int(gen.response_lengths[i]),
            }
        )
        if extra_rewards:
            rows[-1]["extra_rewards"] = {name: float(values[i]) for name, values in extra_rewards.items()}
    return rows


def throughput_metrics(batch: ResponseBatch, seconds: float) -> dict[str, float]:
    """NeMo-RL's throughput of a step that took `seconds` (its slowest rank's `timers/step`): tokens trained (each
    sample's prompt and response tokens, every rank's) per second per process, and samples per second."""
    prompt_tokens = batch.prompt_mask.sum(-1)[batch.group].sum()
    # On the batch's device: NCCL reduces CUDA tensors only.
    counts = torch.stack([prompt_tokens + batch.response_mask.sum(), batch.group.new_tensor(batch.group.numel())])
    tokens, samples = distributed.all_reduce_sum(counts.to(torch.float64)).tolist()
    seconds = max(seconds, 1e-9)
    return {
        TOKENS_PER_S: tokens / seconds / distributed.world_size(),
        SAMPLES_PER_S: samples / seconds,
    }
