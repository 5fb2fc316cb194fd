"""Tiny causal LMs of architectures other than Llama, built from configs with the tiny policy's tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

# A window shorter than the test prompts plus responses, so Gemma's sliding-window layers really slide.
SLIDING_WINDOW = 4
ARCHITECTURES = ("qwen2", "gemma2", "gemma3")


# The tiny policy's shape (tests/conftest.py builds it as a Llama), shared by every tiny architecture here.
TINY_SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def tokenizer_fields(tokenizer) -> dict:
    """A config's vocabulary size and special ids for `tokenizer`."""
    return dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def tiny_causal_lm(architecture: str, tokenizer, seed: int = 0, **overrides):
    """A ~50k-parameter model of `architecture`: Llama; Qwen2 (q/k/v biases); Gemma (scaled embeddings, GeLU);
    Gemma2 (tied embeddings, attention and final logit soft-capping, a sliding-window layer); Gemma3 text (q/k norms,
    a sliding-window layer). `overrides` replace config fields (e.g. a larger shape)."""
    import transformers

    common = {**TINY_SHAPE, **tokenizer_fields(tokenizer)}
    sliding = dict(head_dim=8, sliding_window=SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"])
    config_class, model_class, extra = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
        "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM, {}),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM, sliding),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, sliding),
    }[architecture]
    torch.manual_seed(seed)
    return model_class(config_class(**{**common, **extra, **overrides}))


def save_tiny_causal_lm(architecture: str, tokenizer, out_dir: Path, **overrides) -> Path:
    """`tiny_causal_lm` and the tokenizer saved as a Hugging Face folder (a policy_path)."""
    tiny_causal_lm(architecture, tokenizer, **overrides).save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir
