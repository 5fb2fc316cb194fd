"""Tiny causal LMs of architectures other than Llama, built from configs with the tiny policy's tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

# A window shorter than the test prompts plus responses, so Gemma's sliding-window layers really slide.
SLIDING_WINDOW = 4
ARCHITECTURES = ("qwen2", "gemma2", "gemma3")


def tiny_causal_lm(architecture: str, tokenizer, seed: int = 0, **overrides):
    """A ~50k-parameter model of `architecture`: Qwen2 (q/k/v biases); Gemma2 (tied embeddings, attention and
    final logit soft-capping, a sliding-window layer); Gemma3 text (q/k norms, a sliding-window layer)."""
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    gemma = dict(head_dim=8, sliding_window=SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"])
    builders = {
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**{**common, **overrides})),
        "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**{**common, **gemma, **overrides})),
        "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(**{**common, **gemma, **overrides})),
    }
    torch.manual_seed(seed)
    return builders[architecture]()


def save_tiny_causal_lm(architecture: str, tokenizer, out_dir: Path, **overrides) -> Path:
    """`tiny_causal_lm` and the tokenizer saved as a Hugging Face folder (a policy_path)."""
    tiny_causal_lm(architecture, tokenizer, **overrides).save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir
