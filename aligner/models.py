"""Policy and tokenizer loading/saving in Hugging Face format, the frozen reference policy, and log-probs.

A policy folder is a plain Hugging Face folder (config.json + safetensors); what Aligner saves loads with
`AutoModelForCausalLM.from_pretrained(folder)` and nothing else.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device is {name!r} but no CUDA device is available (use 'cpu' or 'auto')")
    return device


def check_model_dir(path: str | Path, what: str = "policy") -> Path:
    """Fail early, with the path in the message, when a folder is not a Hugging Face model folder."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{what} folder not found: {path}")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{what} folder {path} has no config.json: not a Hugging Face model folder")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise FileNotFoundError(f"{what} folder {path} has no weights (*.safetensors)")
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
    path: str | Path, dtype: str = "float32", device: str | torch.device = "cpu", attn_implementation: str = "eager"
) -> nn.Module:
    from transformers import AutoModelForCausalLM

    check_model_dir(path)
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=DTYPES[dtype], attn_implementation=attn_implementation
    )
    return model.to(device)


def save_policy(model: nn.Module, tokenizer, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))


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


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int
) -> torch.Tensor:
    """Log-probs [B, T] of the last T tokens of each row (the response), under `model`.

    Rows are [left-padded prompt | right-padded response]; only the response positions' logits are computed,
    which saves most of the vocabulary projection for long prompts.
    """
    t = num_response_tokens
    logits = model(
        input_ids=input_ids[:, :-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids_from_mask(attention_mask)[:, :-1],
        use_cache=False,
        logits_to_keep=t,
    ).logits.float()
    targets = input_ids[:, -t:]
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


class ReferencePolicy:
    """A frozen copy of the initial policy, kept in CPU memory and moved to the device only to compute log-probs.

    This is NeMo-Aligner's arrangement: on a GPU the reference costs no device memory between uses.
    """

    def __init__(self, policy: nn.Module):
        self.model = copy.deepcopy(policy).to("cpu").eval()
        self.model.requires_grad_(False)

    @torch.no_grad()
    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int):
        device = input_ids.device
        if device.type != "cpu":
            self.model.to(device)
        try:
            return response_logprobs(self.model, input_ids, attention_mask, num_response_tokens)
        finally:
            if device.type != "cpu":
                self.model.to("cpu")

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()
