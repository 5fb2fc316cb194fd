"""Reward-model training: a Bradley-Terry sequence classifier from preference pairs.

    aligner train-rm --config demo_assets/reward_model.yaml [--set optim.lr=1e-4 ...]

Preference files are JSONL, one pair a line: `{"prompt": str, "chosen": str, "rejected": str}` (other keys are
ignored). The text a pair member is scored on is exactly `prompt + chosen` or `prompt + rejected`, string
concatenation, the same text `aligner.rewards.ModelRewardClient` scores during REINFORCE; so write the prompt as the
policy sees it (chat template applied, as `aligner train` formats it). Both files are read and checked completely
before any model loads; a bad line is reported as `file:line: reason`.

The model is `AutoModelForSequenceClassification` with one label, initialised from `model.init_path` (a causal LM,
e.g. the SFT policy, whose body it keeps, with a new score head; or a sequence classifier). It reads the last
non-padding token of `prompt + response` and outputs one scalar. A step: `optim.batch_size` pairs, chosen and
rejected texts in one forward (micro-batches of `optim.micro_batch_size` pairs with gradient accumulation), the
Bradley-Terry loss `-log sigmoid(r_chosen - r_rejected)` (aligner/algorithms/bradley_terry.py), AdamW with linear
warmup then linear decay to 0, gradient clipping. Validation (before the first step, as step 0, every
`trainer.val_check_interval` steps and at the end) scores every validation pair.

`output_dir` is the reward model itself, a plain Hugging Face folder, plus two files of the run:

    config.json, model.safetensors, tokenizer files   AutoModelForSequenceClassification.from_pretrained(output_dir),
                                                      ModelRewardClient(output_dir), aligner serve-reward
    metrics.jsonl       one JSON object per step: train/{loss, accuracy, margin, grad_norm, lr} and, at validation
                        steps, val/{loss, accuracy, margin}
    train_config.yaml   the resolved config (absolute paths, every default)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator

from aligner.algorithms.bradley_terry import bradley_terry_loss, preference_accuracy, preference_margin
from aligner.config import Section, save_config
from aligner.data.preferences import TokenizedPairs, pad_right, read_preference_file, tokenize_pairs
from aligner.data.prompts import PromptSampler
from aligner.errors import ModelFolderError
from aligner.metrics import (
    RM_TRAIN_ACCURACY,
    RM_TRAIN_GRAD_NORM,
    RM_TRAIN_LOSS,
    RM_TRAIN_LR,
    RM_TRAIN_MARGIN,
    RM_VAL_ACCURACY,
    RM_VAL_LOSS,
    RM_VAL_MARGIN,
)
from aligner.run_layout import METRICS_FILE
from aligner.trainers.loop import adamw, is_validation_step, optimizer_step
from aligner.trainers.run_log import RunLog, read_jsonl
from aligner.trainers.schedule import lr_scheduler

CONFIG_FILE = "train_config.yaml"

# ---------------------------------------------------------------------------------------------------------------
# Config


class RMModelConfig(Section):
    """The network to train and where it runs."""

    init_path: str = Field(
        description="Hugging Face folder (config + safetensors) to start from: a causal LM (e.g. the SFT policy; "
        "its body is kept and a new one-output score head added) or a sequence-classification model."
    )
    tokenizer_path: str | None = Field(None, description="Tokenizer folder; defaults to init_path.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Training dtype of the model.")
    device: str = Field("auto", description="'auto' (CUDA when available, else CPU), 'cpu', 'cuda', 'cuda:1', ...")


class RMDataConfig(Section):
    """Preference files: JSONL with {"prompt": str, "chosen": str, "rejected": str} per line."""

    train_file: str = Field(description="JSONL file of training preference pairs.")
    val_file: str = Field(description="JSONL file of validation preference pairs.")
    max_length: int = Field(
        512, ge=2, description="Longest prompt + response in tokens; longer texts keep their last max_length tokens."
    )


class RMOptimConfig(Section):
    """AdamW with linear warmup then linear decay to 0, gradient clipping, batches of pairs."""

    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup from 0 over this many steps.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    batch_size: int = Field(16, ge=1, description="Preference pairs per optimiser step (2x as many texts).")
    micro_batch_size: int | None = Field(
        None, ge=1, description="Pairs per forward/backward, gradients accumulate; default: batch_size."
    )


class RMTrainerConfig(Section):
    """How long to train, how often to validate, what to show."""

    max_steps: int | None = Field(
        None,
        ge=0,
        description="Optimiser steps of the run (0: validate and save the initial model); give this or epochs.",
    )
    epochs: float | None = Field(
        None, gt=0, description="Passes over the training pairs (rounded up to whole steps); default 1."
    )
    val_check_interval: int = Field(50, ge=1, description="Validate every this many steps (and at 0 and the end).")
    progress_bar: bool = Field(True, description="Show a progress bar on the terminal.")

    @model_validator(mode="after")
    def _one_length(self) -> RMTrainerConfig:
        if self.max_steps is not None and self.epochs is not None:
            raise ValueError("give trainer.max_steps or trainer.epochs, not both")
        return self


class RewardModelTrainConfig(Section):
    """A whole reward-model training run (`aligner train-rm`)."""

    output_dir: str = Field(
        "reward_model", description="The trained reward model (Hugging Face folder), metrics.jsonl, train_config.yaml."
    )
    seed: int = Field(1234, description="Seeds the score head's initialisation and the order of the pairs.")
    model: RMModelConfig
    data: RMDataConfig
    optim: RMOptimConfig = Field(default_factory=RMOptimConfig)
    trainer: RMTrainerConfig = Field(default_factory=RMTrainerConfig)


# Fields holding paths, resolved against the config file's folder when relative.
RM_PATH_FIELDS = (
    ("output_dir",),
    ("model", "init_path"),
    ("model", "tokenizer_path"),
    ("data", "train_file"),
    ("data", "val_file"),
)


def load_rm_config(path: str | Path, overrides: list[str] | None = None) -> RewardModelTrainConfig:
    """Load a `train-rm` YAML config (relative paths against its folder), apply `key=value` overrides, validate."""
    from aligner.config import load_config

    return load_config(path, overrides, schema=RewardModelTrainConfig, path_fields=RM_PATH_FIELDS)


# ---------------------------------------------------------------------------------------------------------------
# Model


def load_rm_tokenizer(path: str | Path):
    """The tokenizer, with a pad token (its own, else EOS) and right padding, as the reward model is scored."""
    from transformers import AutoTokenizer

    from aligner.errors import AlignerError

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise AlignerError(f"the tokenizer in {path} has neither a pad nor an EOS token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def load_reward_model(path: str | Path, pad_token_id: int, dtype: str = "float32"):
    """A one-output sequence classifier initialised from the Hugging Face folder `path`, `pad_token_id` set.

    A causal LM keeps its body and gets a new score head (drawn from torch's global RNG); a classifier with
    another number of labels gets a new head too.
    """
    from transformers import AutoModelForSequenceClassification

    from aligner.errors import AlignerError
    from aligner.modeling.device import DTYPES
    from aligner.modeling.hf import check_model_dir

    check_model_dir(path, what="model.init_path")
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            str(path),
            num_labels=1,
            pad_token_id=pad_token_id,
            dtype=DTYPES[dtype],
            attn_implementation="eager",
            ignore_mismatched_sizes=True,
        )
    except ValueError as err:  # an architecture without a sequence-classification head
        raise AlignerError(f"model.init_path {path}: cannot build a sequence classifier from it ({err})") from None
    model.config.pad_token_id = pad_token_id
    return model


def _score_pairs(model, chosen: list[list[int]], rejected: list[list[int]], pad_id: int, device):
    """Rewards [n] of the chosen and [n] of the rejected texts, from one forward over all 2n texts."""
    ids, mask = pad_right(chosen + rejected, pad_id)
    rewards = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits[:, 0]
    return rewards[: len(chosen)].float(), rewards[len(chosen) :].float()


@torch.no_grad()
def evaluate(model, data: TokenizedPairs, pad_id: int, device, batch_size: int) -> dict[str, float]:
    """val/loss, val/accuracy and val/margin over every pair of `data`."""
    model.eval()
    chosen, rejected = [], []
    for start in range(0, len(data), batch_size):
        rows = slice(start, start + batch_size)
        c, r = _score_pairs(model, data.chosen[rows], data.rejected[rows], pad_id, device)
        chosen.append(c)
        rejected.append(r)
    c, r = torch.cat(chosen), torch.cat(rejected)
    return {
        RM_VAL_LOSS: bradley_terry_loss(c, r).item(),
        RM_VAL_ACCURACY: preference_accuracy(c, r),
        RM_VAL_MARGIN: preference_margin(c, r),
    }


# ---------------------------------------------------------------------------------------------------------------
# Training


def num_training_steps(config: RewardModelTrainConfig, num_pairs: int) -> int:
    """trainer.max_steps, or trainer.epochs (default 1) passes over `num_pairs`, rounded up to whole steps."""
    if config.trainer.max_steps is not None:
        return config.trainer.max_steps
    epochs = config.trainer.epochs if config.trainer.epochs is not None else 1.0
    return max(1, math.ceil(epochs * num_pairs / config.optim.batch_size))


def _check_output_dir(config: RewardModelTrainConfig) -> Path:
    from aligner.errors import AlignerError

    out = Path(config.output_dir)
    if out.exists() and not out.is_dir():
        raise AlignerError(f"output_dir {out} exists and is not a folder")
    for field in ("init_path", "tokenizer_path"):
        value = getattr(config.model, field)
        if value is not None and out.resolve() == Path(value).resolve():
            raise AlignerError(f"output_dir is model.{field} ({out}): the trained model would overwrite its own start")
    return out


def train_reward_model(config: RewardModelTrainConfig) -> Path:
    """Train a reward model as `config` says and save it (Hugging Face format) in `output_dir`; return that folder.

    Deterministic for a seed on the CPU with a fixed number of torch threads. The global torch RNG state is
    restored afterwards.
    """
    from tqdm.auto import tqdm

    from aligner.errors import AlignerError
    from aligner.modeling.device import resolve_device
    from aligner.modeling.hf import check_model_dir, quiet_transformers

    # Input that can be wrong is checked before any model loads.
    out_dir = _check_output_dir(config)
    train_pairs = read_preference_file(config.data.train_file)
    val_pairs = read_preference_file(config.data.val_file)
    check_model_dir(config.model.init_path, what="model.init_path")
    if config.model.tokenizer_path is not None and not Path(config.model.tokenizer_path).is_dir():
        raise ModelFolderError(f"model.tokenizer_path folder not found: {config.model.tokenizer_path}")
    try:
        device = resolve_device(config.model.device)
    except (ValueError, RuntimeError) as err:
        raise AlignerError(str(err)) from None

    quiet_transformers()
    tokenizer = load_rm_tokenizer(config.model.tokenizer_path or config.model.init_path)
    train_data = tokenize_pairs(train_pairs, tokenizer, config.data.max_length)
    val_data = tokenize_pairs(val_pairs, tokenizer, config.data.max_length)
    for name, data in (("training", train_data), ("validation", val_data)):
        if data.num_truncated:
            print(
                f"{data.num_truncated} {name} pairs kept only their last {config.data.max_length} tokens "
                "(data.max_length)",
                file=sys.stderr,
            )
    pad_id = tokenizer.pad_token_id
    max_steps = num_training_steps(config, len(train_data))
    cfg_optim = config.optim
    micro = min(cfg_optim.micro_batch_size or cfg_optim.batch_size, cfg_optim.batch_size)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = load_reward_model(config.model.init_path, pad_id, config.model.dtype).to(device)
        optimizer = adamw(model.parameters(), cfg_optim, device)
        scheduler = lr_scheduler(optimizer, cfg_optim.warmup_steps, max_steps, decay="linear")
        # Seeded, reshuffled every epoch; a batch running past an epoch's end continues into the next.
        sampler = PromptSampler(len(train_data), config.seed, shuffle=True)

        out_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, out_dir / CONFIG_FILE)
        log = RunLog(out_dir)
        log.log_metrics(0, evaluate(model, val_data, pad_id, device, micro))
        bar = tqdm(total=max_steps, desc="train-rm", disable=not config.trainer.progress_bar, dynamic_ncols=True)
        for step in range(1, max_steps + 1):
            model.train()
            indices = sampler.next_batch(cfg_optim.batch_size)
            lr = optimizer.param_groups[0]["lr"]
            chosen_all, rejected_all = [], []
            for start in range(0, len(indices), micro):
                rows = indices[start : start + micro]
                c, r = _score_pairs(
                    model, [train_data.chosen[i] for i in rows], [train_data.rejected[i] for i in rows], pad_id, device
                )
                # Each micro-batch's mean, weighted by its share of the batch: the gradients sum to the batch mean's.
                (bradley_terry_loss(c, r) * (len(rows) / len(indices))).backward()
                chosen_all.append(c.detach())
                rejected_all.append(r.detach())
            grad_norm = optimizer_step(optimizer, model.parameters(), cfg_optim.max_grad_norm, scheduler)
            c, r = torch.cat(chosen_all), torch.cat(rejected_all)
            metrics = {
                RM_TRAIN_LOSS: bradley_terry_loss(c, r).item(),
                RM_TRAIN_ACCURACY: preference_accuracy(c, r),
                RM_TRAIN_MARGIN: preference_margin(c, r),
                RM_TRAIN_GRAD_NORM: grad_norm.item(),
                RM_TRAIN_LR: lr,
            }
            if is_validation_step(step, config.trainer.val_check_interval, max_steps):
                metrics.update(evaluate(model, val_data, pad_id, device, micro))
            log.log_metrics(step, metrics)
            postfix = {"loss": f"{metrics[RM_TRAIN_LOSS]:.3f}", "acc": f"{metrics[RM_TRAIN_ACCURACY]:.2f}"}
            if RM_VAL_ACCURACY in metrics:
                postfix["val_acc"] = f"{metrics[RM_VAL_ACCURACY]:.2f}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(1)
        bar.close()

    model.eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def validation_summary(out_dir: str | Path) -> str:
    """One line: the last validation accuracy, loss and margin of a train-rm run, and the first (step 0) accuracy."""
    rows = [r for r in read_jsonl(Path(out_dir) / METRICS_FILE) if RM_VAL_ACCURACY in r]
    if not rows:
        return "no validation was run"
    first, last = rows[0], rows[-1]
    return (
        f"validation accuracy {last[RM_VAL_ACCURACY]:.3f} at step {last['step']} (step 0: "
        f"{first[RM_VAL_ACCURACY]:.3f}); loss {last[RM_VAL_LOSS]:.3f}, margin {last[RM_VAL_MARGIN]:+.3f}"
    )
