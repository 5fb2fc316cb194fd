"""`try_reward`: sample a few responses from the policy and score them with the run's reward, before training.

What `aligner try-reward` prints and the service's `POST /api/v1/rewards/try` answers: for the first
`num_prompts` prompts of `data.train_file`, `num_samples` responses each (the run's generation settings, sampling
seeded by `seed`), their rewards, each prompt's group statistics, and what would make the run learn nothing or
learn the wrong thing (aligner/algorithms/diagnostics.py): groups with zero spread give RLOO no signal, a reward
that follows response length invites padding.

A reward that raises, or returns the wrong count, NaN/inf or non-numbers, is a `RewardError` whose message says
which and why.

With `step_batch` (prompts, samples per prompt: one generation batch of a training step), the try also times a
batch that wide, warm (after the try's own generation): its first token and STEP_TIMING_TOKENS decode steps. A
step's generation costs about that per decode step whatever the try's own few samples cost, since a batch decodes
its rows together (webapp/dry_run.py estimates a step from it).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from aligner.algorithms.diagnostics import (
    ZERO_SPREAD_ATOL,
    group_reward_stats,
    reward_length_correlation,
    zero_spread_fraction,
)
from aligner.config import TrainConfig
from aligner.errors import AlignerError, PromptDataError, RewardError
from aligner.rewards.interface import check_rewards

# |corr(reward, length)| at or above this is worth a warning: the reward may pay for length rather than content.
LENGTH_CORR_WARNING = 0.8
# Decode steps of the timing generation of `step_batch`: enough to average, few enough for a big batch on a CPU.
STEP_TIMING_TOKENS = 8
STEP_TIMING_RUNS = 3  # each timing is the fastest of this many runs


def _reward_source(config: TrainConfig) -> str:
    reward = config.reward
    if reward.server_url:
        return "the reward server"
    return "the reward function" if reward.function else "the reward model"


def _score(client, prompts: list[str], responses: list[str], metadata: list[dict], source: str) -> torch.Tensor:
    try:
        return client.submit(prompts, responses, metadata).result()
    except AlignerError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of the user's reward becomes a message, not a traceback
        detail = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        raise RewardError(f"{source} raised {type(err).__name__}{': ' + detail if detail else ''}") from None


def warnings_for(frac_zero: float, num_groups: int, corr: float, truncated: int, num_samples: int) -> list[str]:
    """Plain-words warnings about a batch's rewards (empty when nothing looks wrong)."""
    out = []
    if num_groups and frac_zero >= 1.0:
        out.append("every group has zero spread: RLOO gets no learning signal")
    elif frac_zero > 0:
        zero = round(frac_zero * num_groups)
        out.append(f"{zero} of {num_groups} groups have zero spread: they give RLOO no learning signal")
    if abs(corr) >= LENGTH_CORR_WARNING:
        out.append(f"reward correlates with length ({corr:.2f})")
    if truncated:
        out.append(f"{truncated} of {num_samples} responses were cut at generation.max_new_tokens")
    return out


def try_reward(
    config: TrainConfig, num_prompts: int = 4, num_samples: int = 4, step_batch: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Score `num_samples` sampled responses to each of the first `num_prompts` training prompts.

    Returns {"samples": [{group, prompt, response, reward, length}], "groups": [{group, prompt, mean, std,
    zero_spread}], "reward_length_corr", "frac_zero_std_groups", "seconds", "warnings", "timings": {"load_s",
    "generate_s", "score_s", "max_length"}} (timings: what a step-time estimate scales from); with `step_batch`,
    timings also has "batch_start_s" and "decode_step_s": a generation batch of that many prompts x samples takes
    batch_start_s for its first token and decode_step_s for each next one."""
    from aligner.data.prompts import build_prompt_dataset, read_prompt_file
    from aligner.generation.engines import build_generator
    from aligner.modeling.device import bf16_emulation, resolve_device
    from aligner.modeling.hf import eos_token_ids, load_policy, load_tokenizer, quiet_transformers
    from aligner.rewards.build import build_reward_client

    if num_prompts < 1 or num_samples < 1:
        raise ValueError("num_prompts and num_samples must be at least 1")
    if config.reward is None:
        raise RewardError("the config has no reward section: there is no reward to try")
    start = time.perf_counter()
    records = read_prompt_file(config.data.train_file)[:num_prompts]
    if not records:
        raise PromptDataError(f"{config.data.train_file} holds no prompts")
    device = resolve_device(config.model.device)
    if config.model.num_threads:
        torch.set_num_threads(config.model.num_threads)
    quiet_transformers()
    source = _reward_source(config)
    client = build_reward_client(
        config.reward, device=device, tokenizer_path=config.model.tokenizer_path or config.model.policy_path
    )
    try:
        tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.policy_path)
        data = build_prompt_dataset(records, tokenizer, config.data.apply_chat_template, config.data.max_prompt_length)
        policy = load_policy(config.model.policy_path, config.model.dtype, device, config.model.attn_implementation)
        # Compiling costs more than a try's few decode steps save.
        generation = config.generation.model_copy(update={"compile": False})
        generator = build_generator(
            config.model_copy(update={"generation": generation}), policy, tokenizer, eos_token_ids(policy, tokenizer)
        )
        loaded = time.perf_counter()
        with bf16_emulation(config.model.precision, device):
            gen = generator.generate(data.token_ids, num_samples, seed=config.seed)
        generated = time.perf_counter()
        group_ids = gen.group_ids.cpu()
        prompts = [data.texts[int(g)] for g in group_ids]
        metadata = [data.metadata[int(g)] for g in group_ids]
        rewards = _score(client, prompts, gen.responses, metadata, source).flatten().cpu()
        scored = time.perf_counter()
        batch = {} if step_batch is None else _time_step_batch(config, policy, tokenizer, data, step_batch, device)
    finally:
        client.close()
    rewards = check_rewards(rewards.tolist(), len(prompts), source)  # model and server rewards are checked here
    lengths = gen.response_lengths.cpu()
    means, stds, spread = group_reward_stats(rewards, group_ids)
    frac_zero = zero_spread_fraction(rewards, group_ids)
    corr = reward_length_correlation(rewards, lengths)
    truncated = int((~gen.is_end.cpu()).sum())
    return {
        "samples": [
            {
                "group": int(g),
                "prompt": prompts[i],
                "response": gen.responses[i],
                "reward": float(rewards[i]),
                "length": int(lengths[i]),
            }
            for i, g in enumerate(group_ids.tolist())
        ],
        "groups": [
            {
                "group": g,
                "prompt": data.texts[g],
                "mean": float(means[g]),
                "std": float(stds[g]),
                "zero_spread": bool(spread[g] <= ZERO_SPREAD_ATOL),
            }
            for g in range(len(data))
        ],
        "reward_length_corr": corr,
        "frac_zero_std_groups": frac_zero,
        "seconds": time.perf_counter() - start,
        "warnings": warnings_for(frac_zero, len(data), corr, truncated, len(prompts)),
        "timings": {
            "load_s": loaded - start,
            "generate_s": generated - loaded,
            "score_s": scored - generated,
            "max_length": int(lengths.max()) if lengths.numel() else 0,
            **batch,
        },
    }


def _time_step_batch(config: TrainConfig, policy, tokenizer, data, step_batch: tuple[int, int], device) -> dict:
    """{"batch_start_s", "decode_step_s"} of a generation batch of `step_batch` (prompts, samples each; the try's
    first prompt that many times): the seconds of a 1-token generation (the prompts' pass, the call's overhead), and
    of each further decode step, from one of 1 + STEP_TIMING_TOKENS tokens (none may end early: the batch stays
    that wide). The short one runs first: it also warms the batch's shapes up. Each is the fastest of STEP_TIMING_RUNS
    runs: the least disturbed by whatever else the machine runs (one run on a busy machine read 2x a step)."""
    from aligner.generation.engines import build_generator
    from aligner.modeling.device import bf16_emulation
    from aligner.modeling.hf import eos_token_ids

    prompts, samples = step_batch
    seconds = []
    for tokens in (1, 1 + STEP_TIMING_TOKENS):
        timed = config.generation.model_copy(
            update={"compile": False, "max_new_tokens": tokens, "min_new_tokens": tokens}
        )
        generator = build_generator(
            config.model_copy(update={"generation": timed}), policy, tokenizer, eos_token_ids(policy, tokenizer)
        )
        runs = []
        for _ in range(STEP_TIMING_RUNS):
            start = time.perf_counter()
            with bf16_emulation(config.model.precision, device):
                generator.generate([data.token_ids[0]] * prompts, samples, seed=config.seed)
            runs.append(time.perf_counter() - start)
        seconds.append(min(runs))
    return {"batch_start_s": seconds[0], "decode_step_s": max(0.0, seconds[1] - seconds[0]) / STEP_TIMING_TOKENS}


def format_table(result: dict[str, Any], width: int = 60) -> str:
    """`try_reward`'s result as text: one line a sample under its prompt, then the statistics and warnings."""

    def clip(text: str) -> str:
        text = text.replace("\n", "\\n")
        return text if len(text) <= width else text[: width - 3] + "..."

    lines = []
    for group in result["groups"]:
        flag = "  ZERO SPREAD" if group["zero_spread"] else ""
        lines.append(f"prompt {group['group']}: {clip(group['prompt'])}")
        lines.append(f"  mean {group['mean']:+.4f}  std {group['std']:.4f}{flag}")
        for sample in result["samples"]:
            if sample["group"] == group["group"]:
                lines.append(f"  {sample['reward']:+9.4f}  {sample['length']:4d} tok  {clip(sample['response'])}")
    corr = result["reward_length_corr"]
    lines.append(
        f"reward-length correlation {corr:+.3f}; groups with zero spread {result['frac_zero_std_groups']:.0%}; "
        f"{result['seconds']:.1f} s"
    )
    lines += [f"warning: {w}" for w in result["warnings"]]
    return "\n".join(lines)
