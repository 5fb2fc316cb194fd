"""Policy and tokenizer loading/saving in Hugging Face format, the frozen reference policy, and log-probs.

A policy folder is a plain Hugging Face folder (config.json + safetensors); what Aligner saves loads with
`AutoModelForCausalLM.from_pretrained(folder)` and nothing else.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from aligner.errors import ModelFolderError
from aligner.modeling.device import DTYPES


def check_model_dir(path: str | Path, what: str = "policy") -> Path:
    """Fail early, with the path in the message, when a folder is not a Hugging Face model folder."""
    path = Path(path)
    if not path.is_dir():
        raise ModelFolderError(f"{what} folder not found: {path}")
    if not (path / "config.json").is_file():
        raise ModelFolderError(f"{what} folder {path} has no config.json: not a Hugging Face model folder")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelFolderError(f"{what} folder {path} has no weights (*.safetensors)")
    return path


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        # Padding positions are always masked, so any id works; EOS is the usual choice.
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(
    path: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str = "eager",
) -> nn.Module:
    """The causal LM in a Hugging Face folder, in `dtype` (a DTYPES name or a torch dtype), on `device`."""
    from transformers import AutoModelForCausalLM

    check_model_dir(path)
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=DTYPES[dtype] if isinstance(dtype, str) else dtype, attn_implementation=attn_implementation
    )
    return model.to(device)


def save_policy(model: nn.Module, tokenizer, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))


def frozen_copy(model: nn.Module, dtype: torch.dtype | None = None, device: str | torch.device | None = None):
    """A copy of `model` for inference only: no gradients, eval mode, its parameters in `dtype` (default: theirs).

    Only parameters are cast: buffers such as the rotary embedding's `inv_freq` keep float32, as transformers keeps
    them when it loads a model in bfloat16 (a bfloat16 inv_freq would shift every rotary angle)."""
    frozen = copy.deepcopy(model)
    if device is not None:
        frozen.to(device)
    frozen.eval().requires_grad_(False)
    if dtype is not None:
        for param in frozen.parameters():
            param.data = param.data.to(dtype)
    return frozen


@torch.no_grad()
def copy_weights(target: nn.Module, source: nn.Module) -> None:
    """`target`'s parameters := `source`'s (same architecture; cast to `target`'s dtypes and devices)."""
    for mine, theirs in zip(target.parameters(), source.parameters(), strict=True):
        mine.copy_(theirs)


def eos_token_ids(model: nn.Module, tokenizer) -> list[int]:
    """Every id that ends a response: the generation config's EOS ids plus the tokenizer's."""
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("the tokenizer and the model define no EOS token: responses could never end")
    return sorted(ids)


def quiet_transformers() -> None:
    """No transformers progress bars or warnings in a run's output (e.g. "newly initialized: score.weight", expected
    when a reward model starts from a causal LM); errors still show."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
