"""Policy and tokenizer loading/saving in Hugging Face format, the frozen reference policy, and log-probs.

A policy folder is a plain Hugging Face folder (config.json + safetensors); what Aligner saves loads with
`AutoModelForCausalLM.from_pretrained(folder)` and nothing else.
"""

from __future__ import annotations

import copy
import ctypes
import sys
from dataclasses import dataclass
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


# glibc's mallopt parameters, and the largest mmap threshold it accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Stop glibc from unmapping every freed block over 128 KB (Linux with glibc only; True when applied).

    A training step allocates and frees the same activation-sized buffers hundreds of times; by default each one
    larger than 128 KB is a fresh mmap, zeroed by the kernel page by page, then unmapped: thousands of page faults a
    step. Raising the mmap and trim thresholds lets the heap reuse them. Measured on the bench workload: 10-20% off
    a step on the CPU. Memory freed by the process is kept for reuse rather than returned to the system.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, 4 * MMAP_THRESHOLD_MAX)
        )
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False


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
    return token_logprobs(_response_logits(model, input_ids, attention_mask, num_response_tokens), input_ids)


def _response_logits(model: nn.Module, input_ids, attention_mask, num_response_tokens: int) -> torch.Tensor:
    """Float32 logits [B, T, V] predicting the last T tokens of each [prompt | response] row."""
    return model(
        input_ids=input_ids[:, :-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids_from_mask(attention_mask)[:, :-1],
        use_cache=False,
        logits_to_keep=num_response_tokens,
    ).logits.float()


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-probs [B, T] of the last T tokens of `ids` under logits [B, T, V]."""
    targets = ids[:, -logits.shape[1] :]
    # Not cross_entropy, though it is twice as fast here: its rounding of a row depends on the row's place in the
    # batch, and at the first step the KL (generation's log-probs against these) is pure rounding, which whitened
    # advantages magnify; 1 and 2 data-parallel ranks then disagree (tests/test_distributed.py).
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


@dataclass
class ResponseBatch:
    """B responses to G distinct prompts, each prompt stored once: the input of every log-prob computation."""

    prompt_ids: torch.Tensor  # [G, P] left-padded
    prompt_mask: torch.Tensor  # [G, P] bool
    group: torch.Tensor  # [B] the prompt (row of prompt_ids) each response answers
    response_ids: torch.Tensor  # [B, T] right-padded
    response_mask: torch.Tensor  # [B, T] bool

    def subset(self, rows: slice) -> ResponseBatch:
        """The responses `rows` with only their prompts, and without columns that are padding in every row."""
        used, group = torch.unique(self.group[rows], return_inverse=True)
        prompt_mask = self.prompt_mask[used]
        first = int(prompt_mask.any(0).long().argmax())
        response_mask = self.response_mask[rows]
        t = max(1, int(response_mask.sum(-1).max()))
        prompt_ids, prompt_mask = self.prompt_ids[used, first:], prompt_mask[:, first:]
        return ResponseBatch(prompt_ids, prompt_mask, group, self.response_ids[rows, :t], response_mask[:, :t])

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[prompt | response] rows (input ids, attention mask), each prompt repeated for its responses."""
        return (
            torch.cat([self.prompt_ids[self.group], self.response_ids], dim=1),
            torch.cat([self.prompt_mask[self.group], self.response_mask], dim=1),
        )


def _activation_checkpointing(model: nn.Module) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (deprecated) to is_activation_checkpointing. Asked of the
    # instance, not its class, so a peft wrapper forwards it to its base model.
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def grouped_response_logprobs(model: nn.Module, batch: ResponseBatch) -> torch.Tensor:
    """Log-probs [B, T] of the response tokens under `model`, each distinct prompt computed once.

    The prompts run first and fill a KV cache; its rows are gathered per response (`index_select`, which gradients
    flow back through), then every response runs against its prompt's keys and values. With k responses per prompt
    this spares (k - 1) prompt forwards and backwards: on the bench workload (8 prompts x 4) ~15% of a training step.
    The result equals `response_logprobs` on the concatenated rows up to float rounding. Gradient checkpointing
    disables transformers' cache, so with it the rows are concatenated instead. Llama models take the same
    arrangement without transformers' forward (`aligner.llama_forward`), which is faster.
    """
    return token_logprobs(grouped_response_logits(model, batch), batch.response_ids)


def grouped_response_logits(model: nn.Module, batch: ResponseBatch) -> torch.Tensor:
    """Float32 logits [B, T, V] predicting each response token, each distinct prompt run once (as
    `grouped_response_logprobs`, which PPO's entropy needs the whole distribution of)."""
    from transformers import DynamicCache

    from aligner import llama_forward  # it builds on this module's position_ids_from_mask

    t = batch.response_ids.shape[1]
    if model.training and _activation_checkpointing(model):
        input_ids, attention_mask = batch.sequences()
        return _response_logits(model, input_ids, attention_mask, t)
    if llama_forward.supports_fast_forward(model):
        return llama_forward.llama_grouped_logits(model, batch)
    cache = DynamicCache(config=model.config)
    prompt_out = model(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask.long(),
        position_ids=position_ids_from_mask(batch.prompt_mask),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = prompt_out.logits[:, -1:].index_select(0, batch.group)  # predicts each response's first token
    if t > 1:
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(0, batch.group)
            layer.values = layer.values.index_select(0, batch.group)
        prompt_lengths = batch.prompt_mask.sum(-1).index_select(0, batch.group)
        positions = prompt_lengths[:, None] + torch.arange(t - 1, device=prompt_lengths.device)[None, :]
        rest = model(
            input_ids=batch.response_ids[:, :-1],
            attention_mask=torch.cat([batch.prompt_mask[batch.group], batch.response_mask[:, :-1]], dim=1).long(),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).logits
        logits = torch.cat([logits, rest], dim=1)
    return logits.float()


class ReferencePolicy:
    """A frozen copy of the initial policy, kept in CPU memory and moved to the device only to compute log-probs.

    This is NeMo-Aligner's arrangement: on a GPU the reference costs no device memory between uses.
    """

    def __init__(self, policy: nn.Module):
        self.model = copy.deepcopy(policy).to("cpu").eval()
        self.model.requires_grad_(False)

    def logprobs(self, batch: ResponseBatch) -> torch.Tensor:
        device = batch.response_ids.device
        if device.type != "cpu":
            self.model.to(device)
        try:
            # Inference mode (cheaper per op than no_grad); the clone makes the result usable in autograd again.
            with torch.inference_mode():
                logprobs = grouped_response_logprobs(self.model, batch)
            return logprobs.clone()
        finally:
            if device.type != "cpu":
                self.model.to("cpu")

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()
