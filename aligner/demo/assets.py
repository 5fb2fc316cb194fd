"""Demo assets: everything a REINFORCE / RLOO run needs, built offline in under two minutes on two CPU cores.

    aligner demo-assets demo_assets
    aligner train --config demo_assets/reinforce.yaml

The task is a toy one whose reward a tiny model can learn to raise within a few dozen steps. Prompts ask to
describe a thing ("Describe the cat.", "Tell me about the old river."); the supervised (SFT) answers are one to
three short sentences whose adjectives are drawn half from a POSITIVE and half from a NEGATIVE list ("the cat is
happy and sad. it likes the sun."). The reward (`reward`, referred to as `aligner.demo:reward`) is the share of
positive over negative adjectives (minus 0.5 for a response that never names the prompt's subject), so the SFT
policy scores about 0 on average with a large spread between the samples of one prompt, which is what the
leave-one-out (RLOO) baseline needs; RL pushes it towards 1 (a throwaway RLOO loop with the settings of
reinforce.yaml, constant lr, went from about 0 to +0.7 in 60 steps and +0.8 in 100, in under a minute).

The folder holds:

    policy/               a tiny Llama (hidden 128, 4 layers, ~1M parameters) briefly SFT-trained on the task,
                          with its byte-level BPE tokenizer (vocab ~512, chat template), in safetensors
    prompts_train.jsonl   training prompts, as {"prompt": ...} lines and some {"messages": [...]} lines
    prompts_val.jsonl     validation prompts, disjoint from the training ones
    reinforce.yaml        a ready `aligner train` config (relative paths resolve against this folder)
    ppo.yaml              the same run with `algorithm: ppo`: a critic server started from reward_model/
    preferences_train.jsonl, preferences_val.jsonl
                          preference pairs {"prompt", "chosen", "rejected"}: two SFT-style responses (`make_response`)
                          to one chat-formatted prompt (train / validation prompts), chosen = the higher `reward`
    reward_model.yaml     the `aligner train-rm` config that made reward_model/
    reward_model/         a Bradley-Terry reward model (Llama sequence classifier, started from the SFT policy) that
                          orders about 96% of the validation pairs right: an alternative to `aligner.demo:reward`
                          (reward.model_path, or `aligner serve-reward --model reward_model`)

The build is deterministic: the same seed gives byte-identical tokenizer, prompt, preference and config files and
identical weights. The SFT and the reward-model training run on one torch thread: CPU matmuls may sum in another
order on another thread count, and on a busy shared 2-core machine two threads were several times slower than one
(on a quiet one, 1.6x faster).

An existing output folder is rebuilt in place when it holds nothing but what this command writes (and a `runs/`
folder of earlier training runs, which is left alone); any other non-empty folder is refused, so a mistyped path
cannot clobber unrelated files.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

from aligner.demo.sft import DEFAULT_SFT_STEPS, chat_prompt, new_policy, sample_policy, sft
from aligner.demo.task import (
    CHAT_FORM_EVERY,
    TRAIN_PAIRS_PER_PROMPT,
    VAL_PAIRS_PER_PROMPT,
    _prompt_line,
    all_prompts,
    make_examples,
    make_preference_pairs,
    reward,
    split_prompts,
)
from aligner.demo.templates import CONFIG_TEMPLATE, RM_CONFIG_TEMPLATE, ppo_config_text
from aligner.demo.tokenizer import TOKENIZER_CORPUS_SIZE, train_tokenizer

BUILD_THREADS = 1
DEFAULT_RM_STEPS = 150
RM_BATCH_SIZE = 16
RM_LR = "2.0e-3"  # as written in reward_model.yaml
OWN_ENTRIES = frozenset(
    {
        "policy",
        ".policy.partial",
        "prompts_train.jsonl",
        "prompts_val.jsonl",
        "reinforce.yaml",
        "ppo.yaml",
        "preferences_train.jsonl",
        "preferences_val.jsonl",
        "reward_model.yaml",
        "reward_model",
        "runs",
    }
)


def _write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _check_out_dir(out_dir: Path) -> None:
    from aligner.errors import AlignerError

    if out_dir.exists() and not out_dir.is_dir():
        raise AlignerError(f"{out_dir} exists and is not a folder")
    if out_dir.is_dir():
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in OWN_ENTRIES)
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise AlignerError(
                f"{out_dir} is not empty and not a demo-assets folder (it holds {shown}); give a new or empty folder"
            )


@contextlib.contextmanager
def _transformers_progress_bars(enabled: bool):
    """Let transformers show its own progress bars (saving shards) only when we show ours."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled and not enabled:
            hf_logging.enable_progress_bar()


def _status(progress: bool, message: str) -> None:
    if progress:
        print(f"[demo-assets] {message}", file=sys.stderr, flush=True)


def build_demo_assets(
    out_dir: Path,
    seed: int = 0,
    sft_steps: int | None = None,
    progress: bool = True,
    reward_model_steps: int | None = None,
) -> Path:
    """Build the demo folder (see the module docstring) and return the path of its reinforce.yaml.

    `sft_steps` and `reward_model_steps` shorten the supervised and the reward-model training (tests; 0 saves the
    untrained models); `progress` shows status lines, progress bars and, at the end of the SFT, the policy's mean
    reward and share of EOS-ended samples over 64 samples (a few seconds).
    An existing folder is rebuilt in place if it holds only files this function writes (and `runs/`).
    """
    import torch

    out_dir = Path(out_dir)
    steps = DEFAULT_SFT_STEPS if sft_steps is None else sft_steps
    rm_steps = DEFAULT_RM_STEPS if reward_model_steps is None else reward_model_steps
    if steps < 0:
        raise ValueError(f"sft_steps must be >= 0, got {steps}")
    if rm_steps < 0:
        raise ValueError(f"reward_model_steps must be >= 0, got {rm_steps}")
    _check_out_dir(out_dir)
    start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)

    pool = all_prompts()
    train_prompts, val_prompts = split_prompts(seed)
    for name, texts in (("prompts_train.jsonl", train_prompts), ("prompts_val.jsonl", val_prompts)):
        lines = [_prompt_line(t, chat_form=i % CHAT_FORM_EVERY == CHAT_FORM_EVERY - 1) for i, t in enumerate(texts)]
        _write_text(out_dir / name, "".join(lines))
    _status(progress, f"{len(train_prompts)} train and {len(val_prompts)} validation prompts written")

    rng = random.Random(f"demo-corpus-{seed}")
    corpus = make_examples(rng, pool, TOKENIZER_CORPUS_SIZE)
    tokenizer = train_tokenizer(text for example in corpus for text in example)
    _status(progress, f"tokenizer trained: {len(tokenizer)} tokens")

    pair_rng = random.Random(f"demo-preferences-{seed}")
    for name, texts, per_prompt in (
        ("preferences_train.jsonl", train_prompts, TRAIN_PAIRS_PER_PROMPT),
        ("preferences_val.jsonl", val_prompts, VAL_PAIRS_PER_PROMPT),
    ):
        pairs = make_preference_pairs(pair_rng, texts, per_prompt, lambda t: chat_prompt(tokenizer, t))
        _write_text(out_dir / name, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
    _status(
        progress,
        f"preference pairs written: {len(train_prompts) * TRAIN_PAIRS_PER_PROMPT} train, "
        f"{len(val_prompts) * VAL_PAIRS_PER_PROMPT} validation",
    )
    rm_config_path = out_dir / "reward_model.yaml"
    _write_text(rm_config_path, RM_CONFIG_TEMPLATE.format(lr=RM_LR, batch_size=RM_BATCH_SIZE, max_steps=rm_steps))

    partial = out_dir / ".policy.partial"
    shutil.rmtree(partial, ignore_errors=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = new_policy(tokenizer)
            n_params = sum(p.numel() for p in model.parameters())
            _status(progress, f"policy: Llama with {n_params / 1e6:.2f}M parameters; SFT for {steps} steps")
            loss = sft(model, tokenizer, random.Random(f"demo-sft-{seed}"), pool, steps, progress)
        with _transformers_progress_bars(progress):
            model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
        shutil.rmtree(out_dir / "policy", ignore_errors=True)
        os.replace(partial, out_dir / "policy")
        _status(progress, f"SFT loss {loss:.3f}; policy and tokenizer saved to {out_dir / 'policy'}")
        if progress:
            samples = sample_policy(model, tokenizer, val_prompts * 4, num_samples=1, seed=seed)
            rewards = reward([s[0] for s in samples], [s[1] for s in samples])
            eos_share = sum(s[2] for s in samples) / len(samples)
            _status(
                progress,
                f"SFT policy on {len(samples)} samples: mean reward {sum(rewards) / len(rewards):+.3f}, "
                f"{eos_share:.0%} end with EOS; e.g. {samples[0][1]!r}",
            )
        _train_demo_reward_model(out_dir, rm_config_path, rm_steps, progress)
    finally:
        torch.set_num_threads(threads)

    config_path = out_dir / "reinforce.yaml"
    _write_text(config_path, CONFIG_TEMPLATE)
    _write_text(out_dir / "ppo.yaml", ppo_config_text())
    _status(progress, f"done in {time.perf_counter() - start:.0f} s")
    return config_path


def _train_demo_reward_model(out_dir: Path, config_path: Path, steps: int, progress: bool) -> None:
    """Train DIR/reward_model with DIR/reward_model.yaml, starting from the SFT policy just saved."""
    from aligner.trainers.reward_model import load_rm_config, train_reward_model, validation_summary

    config = load_rm_config(config_path)
    config.trainer.progress_bar = progress
    shutil.rmtree(out_dir / "reward_model", ignore_errors=True)
    _status(progress, f"reward model: Bradley-Terry training for {steps} steps, from the SFT policy")
    with _transformers_progress_bars(progress):
        rm_dir = train_reward_model(config)
    _status(progress, f"reward model saved to {rm_dir}: {validation_summary(rm_dir)}")
