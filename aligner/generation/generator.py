"""Batched sampling of responses with a KV cache, behind a `Generator` interface other engines can implement.

`TorchGenerator` runs any Hugging Face causal LM in plain PyTorch: each distinct prompt is prefilled once and its
KV cache copied to its samples, then tokens are decoded one step at a time. It returns, per sample, the response
tokens, the policy's log-prob of each sampled token (of the unmodified distribution, whatever the temperature,
top-k/top-p, repetition penalty or greedy choice), and `is_end`: whether the response ended properly (EOS or an end
string) or was truncated.

A TensorRT-LLM or vLLM engine implements the same `Generator` protocol and refits its own weights copy in
`update_weights` after each optimiser step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from aligner.config import GenerationConfig
from aligner.generation.llama_decoder import HFDecoder, LlamaDecoder
from aligner.generation.sampling import sample_next
from aligner.modeling.batches import ResponseBatch, position_ids_from_mask
from aligner.modeling.hf import copy_weights, frozen_copy
from aligner.modeling.llama_kernels import supports_fast_decode


@dataclass
class GenerationOutput:
    """B = prompts x samples rows, prompt-major (all samples of prompt 0, then prompt 1, ...)."""

    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P] bool
    response_ids: torch.Tensor  # [B, T] right-padded
    response_mask: torch.Tensor  # [B, T] bool: tokens of the response, EOS included
    logprobs: torch.Tensor  # [B, T] float32 policy log-probs of the sampled tokens, 0 on padding
    is_end: torch.Tensor  # [B] bool
    group_ids: torch.Tensor  # [B] index of the prompt each sample answers
    responses: list[str]  # decoded response text

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    def response_batch(self) -> ResponseBatch:
        """The samples with each distinct prompt stored once (the first row of each group)."""
        size = self.group_ids.shape[0]
        rows = torch.arange(size, device=self.group_ids.device)
        first = torch.full((int(self.group_ids.max()) + 1,), size, device=rows.device)
        first = first.scatter_reduce(0, self.group_ids, rows, reduce="amin")
        return ResponseBatch(
            self.prompt_ids[first], self.prompt_mask[first], self.group_ids, self.response_ids, self.response_mask
        )


class Generator(Protocol):
    pad_id: int  # pads prompts on the left and responses on the right

    def generate(self, prompt_ids: list[list[int]], num_samples: int, seed: int) -> GenerationOutput:
        """Sample `num_samples` responses for each prompt; `seed` fixes the sampling noise."""
        ...

    def update_weights(self, model: nn.Module) -> None:
        """Called after each optimiser step: engines that hold their own copy of the weights refit it here."""
        ...


# generation.compile=auto compiles the decode step for runs of at least this many steps: a cold compilation (10-30 s
# on 2 cores) against ~30 ms saved a step on the benchmark's tiny policy.
AUTO_COMPILE_MIN_STEPS = 500


def resolve_compile(setting: bool | str, device: torch.device, max_steps: int) -> bool:
    """What `generation.compile` means for a run: true/false as given; auto compiles on the CPU, where a C++
    compiler is found, for runs of at least AUTO_COMPILE_MIN_STEPS steps (CUDA compiles only when asked)."""
    if setting != "auto":
        return bool(setting)
    has_compiler = any(shutil.which(name) for name in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++"))
    return device.type == "cpu" and max_steps >= AUTO_COMPILE_MIN_STEPS and has_compiler


def left_pad(sequences: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = True
    return ids.to(device), mask.to(device)


class TorchGenerator:
    """Sampling with the training model itself: a transformers prefill, then one-token decode steps.

    Llama-architecture models decode with `LlamaDecoder` (preallocated cache, about 2x faster on small models;
    with `generation.compile` true its step and the sampling are one compiled function; an unresolved `auto`, which
    the trainer resolves for its run length with `resolve_compile`, decodes eagerly), others with `HFDecoder`;
    `generation.fast_decode: false` forces the latter.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        config: GenerationConfig,
        eos_ids: list[int],
        weights_dtype: torch.dtype | None = None,
        own_weights: bool = False,
    ):
        self.tokenizer, self.config = tokenizer, config
        # With `weights_dtype` (model.precision: bf16-mixed) or `own_weights` (trainer.async_rollouts, which samples
        # while the training module is updated) generation runs on its own copy of the weights, in that dtype,
        # refreshed by `update_weights`; otherwise it shares the training module.
        self.own_weights = own_weights or weights_dtype is not None
        self.model = frozen_copy(model, weights_dtype) if self.own_weights else model
        self.eos_ids = torch.tensor(eos_ids, dtype=torch.long)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
        # An end string spans at most this many tokens (a token decodes to at least one byte).
        self._end_window = max((len(s.encode()) for s in config.end_strings), default=0) + 1

    def update_weights(self, model: nn.Module) -> None:
        if not self.own_weights:
            self.model = model  # shares the training module: nothing to copy
        else:
            copy_weights(self.model, model)

    def generate(self, prompt_ids: list[list[int]], num_samples: int, seed: int) -> GenerationOutput:
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        step = self.config.batch_size
        # Inference mode skips autograd's per-op bookkeeping (a decode step is hundreds of tiny ops); its tensors
        # are cloned on the way out because training later saves them for backward, which inference tensors refuse.
        with torch.inference_mode():
            chunks = [
                self._generate_chunk(prompt_ids[i : i + step], num_samples, generator, device)
                for i in range(0, len(prompt_ids), step)
            ]
            out = chunks[0] if len(chunks) == 1 else _concat(chunks, self.pad_id)
        tensors = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
        out = dataclasses.replace(out, **{k: v.clone() for k, v in tensors.items() if isinstance(v, torch.Tensor)})
        out.group_ids = torch.arange(len(prompt_ids), device=device).repeat_interleave(num_samples)
        return out

    def _generate_chunk(self, prompts, num_samples, generator, device) -> GenerationOutput:
        from transformers import DynamicCache

        cfg, model = self.config, self.model
        was_training = model.training
        model.eval()
        eos_ids = self.eos_ids.to(device)
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id, device)
        cache = DynamicCache(config=model.config)
        with contiguous_head_input(model):
            out = model(
                input_ids=prompt_ids,
                attention_mask=prompt_mask.long(),
                position_ids=position_ids_from_mask(prompt_mask),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        logits = out.logits[:, -1].repeat_interleave(num_samples, dim=0)
        if num_samples > 1:
            cache.batch_repeat_interleave(num_samples)
        prompt_ids = prompt_ids.repeat_interleave(num_samples, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(num_samples, dim=0)
        batch = prompt_ids.shape[0]
        positions = position_ids_from_mask(prompt_mask)
        if cfg.fast_decode and supports_fast_decode(model):
            compiled = cfg.compile is True  # "auto" is the trainer's to resolve
            decoder = LlamaDecoder(model, cache, prompt_mask, positions, cfg.max_new_tokens, compile=compiled)
        else:
            decoder = HFDecoder(model, cache, prompt_mask, positions)
        del cache

        eos_mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=device).index_fill_(0, eos_ids, True)
        seen = seen_tokens(prompt_ids, prompt_mask, logits.shape[-1]) if cfg.repetition_penalty != 1.0 else None
        sampling = (eos_mask, cfg.temperature, cfg.top_k, cfg.top_p, cfg.greedy, cfg.repetition_penalty, seen)
        ban_eos, allow_eos = torch.tensor(True, device=device), torch.tensor(False, device=device)
        tokens, logprobs = [], []
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        ended = torch.zeros(batch, dtype=torch.bool, device=device)
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        for t in range(cfg.max_new_tokens):
            uniform = torch.rand(batch, 1, generator=generator, device=device)
            ban = ban_eos if t < cfg.min_new_tokens else allow_eos
            if t == 0:
                next_tokens, token_logprobs = sample_next(logits, uniform, ban, *sampling)
            else:
                next_tokens, token_logprobs = decoder.step_and_sample(tokens[-1], uniform, ban, sampling)
            next_tokens = next_tokens.masked_fill(finished, self.pad_id)
            if seen is not None:
                seen.scatter_(1, next_tokens[:, None], True)  # in place: `sampling` holds this tensor
            tokens.append(next_tokens)
            logprobs.append(token_logprobs.masked_fill(finished, 0.0))
            lengths += ~finished
            now_ended = ~finished & eos_mask[next_tokens]
            if cfg.end_strings and t + 1 >= cfg.min_new_tokens:
                now_ended |= ~finished & self._hits_end_string(tokens, lengths)
            ended |= now_ended
            finished |= now_ended
            if finished.all():
                break
        model.train(was_training)

        response_ids = torch.stack(tokens, dim=1)
        response_mask = torch.arange(response_ids.shape[1], device=device)[None, :] < lengths[:, None]
        return GenerationOutput(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            logprobs=torch.stack(logprobs, dim=1),
            is_end=ended,
            group_ids=torch.empty(0, dtype=torch.long),
            responses=self.tokenizer.batch_decode(
                [ids[m].tolist() for ids, m in zip(response_ids, response_mask)], skip_special_tokens=True
            ),
        )

    def _hits_end_string(self, tokens: list[torch.Tensor], lengths: torch.Tensor) -> torch.Tensor:
        """Rows whose response now ends with one of the end strings (checked on the last few tokens only)."""
        window = torch.stack(tokens[-self._end_window :], dim=1).tolist()
        n = len(window[0])
        hits = []
        for row, length in zip(window, lengths.tolist()):
            text = self.tokenizer.decode(row[n - min(n, length) :], skip_special_tokens=True)
            hits.append(any(text.endswith(s) for s in self.config.end_strings))
        return torch.tensor(hits, device=lengths.device)


@contextlib.contextmanager
def contiguous_head_input(model: nn.Module):
    """Within it, `model`'s output projection gets its input made contiguous first.

    transformers slices the last position out of the prompts' hidden states ([G, 1, H], strided) for
    `logits_to_keep=1`; torch's matmul cannot fold that slice into one matrix, so it multiplies it as a batch against
    a copy of the [H, V] weight for every prompt: 8 x 576 x 49,152 values (0.3-0.8 s) on SmolLM2. Copying the G
    rows instead costs nothing.
    """
    head = model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda _, args: (args[0].contiguous(), *args[1:])) if head else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def seen_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] bool: the tokens of each prompt (its padding left out), where the repetition penalty applies."""
    ids = prompt_ids.masked_fill(~prompt_mask, vocab_size)  # padding goes to an extra column, dropped below
    seen = torch.zeros(prompt_ids.shape[0], vocab_size + 1, dtype=torch.bool, device=prompt_ids.device)
    return seen.scatter_(1, ids, True)[:, :vocab_size]


def select_samples(gen: GenerationOutput, keep: torch.Tensor) -> GenerationOutput:
    """The samples of `gen` where `keep` ([B] bool) holds, in order, their groups renumbered 0, 1, ... (a kept
    group keeps its samples together: `keep` is meant to hold or drop whole groups)."""
    rows = keep.nonzero().squeeze(-1)
    groups = gen.group_ids[rows]
    return GenerationOutput(
        prompt_ids=gen.prompt_ids[rows],
        prompt_mask=gen.prompt_mask[rows],
        response_ids=gen.response_ids[rows],
        response_mask=gen.response_mask[rows],
        logprobs=gen.logprobs[rows],
        is_end=gen.is_end[rows],
        group_ids=torch.unique_consecutive(groups, return_inverse=True)[1] if rows.numel() else groups,
        responses=[gen.responses[i] for i in rows.tolist()],
    )


def concat_samples(parts: list[GenerationOutput], pad_id: int) -> GenerationOutput:
    """`parts` one after the other, each part's groups after the previous part's (prompt-major order kept)."""
    if len(parts) == 1:
        return parts[0]
    out = _concat(parts, pad_id)
    offsets, ids = 0, []
    for part in parts:
        ids.append(part.group_ids + offsets)
        offsets += int(part.group_ids.max()) + 1 if part.group_ids.numel() else 0
    out.group_ids = torch.cat(ids)
    return out


def _concat(chunks: list[GenerationOutput], pad_id: int) -> GenerationOutput:
    """Join chunks whose prompt and response widths differ: prompts pad on the left, responses on the right."""
    p = max(c.prompt_ids.shape[1] for c in chunks)
    t = max(c.response_ids.shape[1] for c in chunks)

    def pad(x: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
        extra = width - x.shape[1]
        return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)

    return GenerationOutput(
        prompt_ids=torch.cat([pad(c.prompt_ids, p, pad_id, True) for c in chunks]),
        prompt_mask=torch.cat([pad(c.prompt_mask, p, False, True) for c in chunks]),
        response_ids=torch.cat([pad(c.response_ids, t, pad_id, False) for c in chunks]),
        response_mask=torch.cat([pad(c.response_mask, t, False, False) for c in chunks]),
        logprobs=torch.cat([pad(c.logprobs, t, 0.0, False) for c in chunks]),
        is_end=torch.cat([c.is_end for c in chunks]),
        group_ids=torch.empty(0, dtype=torch.long),
        responses=[r for c in chunks for r in c.responses],
    )
