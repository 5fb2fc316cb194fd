"""Log-probabilities of responses under a model, for training and the reference policy.

`grouped_response_logits` runs each distinct prompt once and its responses against it; Llama models with plain
projections take `aligner.modeling.llama_forward`, others transformers' forward.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from aligner.modeling.batches import ResponseBatch, position_ids_from_mask


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
    # advantages magnify; 1 and 2 data-parallel ranks then disagree (tests/aligner/test_distributed.py).
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


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
    arrangement without transformers' forward (`aligner.modeling.llama_forward`), which is faster.
    """
    from aligner.modeling import llama_forward

    if llama_forward.supports_fast_forward(model) and not _takes_transformers_forward(model):
        hidden = llama_forward.llama_grouped_hidden(model, batch)
        head, ids = model.lm_head, batch.response_ids
        return linear_token_logprobs(hidden.flatten(0, 1), head.weight, head.bias, ids.flatten()).view(ids.shape)
    return token_logprobs(grouped_response_logits(model, batch), batch.response_ids)


def _takes_transformers_forward(model: nn.Module) -> bool:
    """One call of transformers' forward over concatenated [prompt | response] rows: what activation checkpointing
    needs (its checkpointed layers), and what FSDP2 shards need, whose every forward is a collective: the grouped
    path's number of calls depends on the batch (two, or one when every response is one token), and ranks whose
    batches differ would wait on each other's gathers."""
    from torch.distributed.fsdp import FSDPModule

    return (model.training and _activation_checkpointing(model)) or isinstance(model, FSDPModule)


def grouped_response_logits(model: nn.Module, batch: ResponseBatch) -> torch.Tensor:
    """Float32 logits [B, T, V] predicting each response token, each distinct prompt run once (as
    `grouped_response_logprobs`, which PPO's entropy needs the whole distribution of)."""
    from transformers import DynamicCache

    from aligner.modeling import llama_forward  # it builds on this module's position_ids_from_mask

    t = batch.response_ids.shape[1]
    if _takes_transformers_forward(model):
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


# Rows of logits one chunk of `linear_token_logprobs` holds: ~8M float32 values (32 MB), below the heap's mmap
# threshold once `keep_freed_memory` has raised it, so every chunk reuses the same memory instead of page-faulting.
_CHUNK_VALUES = 1 << 23


def linear_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(hidden @ weight.T + bias)[targets]: float32 log-probs [N] of `targets` [N] under a vocabulary
    projection of `hidden` [N, H], without the [N, V] float32 logits that `token_logprobs` of `F.linear`'s output
    makes and keeps for the backward.

    The logits are made a chunk of rows at a time, in the autocast dtype when autocast is on (else the weight's):
    what `F.linear` gives under the same autocast. The forward keeps only the softmax, in that dtype, which is all
    the backward needs (d log p_t / d logits = onehot(t) - p): the exponentials run once, not twice, and no full
    float32 tensor of logits is written or read again. On SmolLM2's 49,152-token vocabulary this cut the projection's
    share of a bf16-mixed training step from about 1.1 s to 0.6 s. As in `token_logprobs`, every reduction runs
    along one row. A graph through it runs backward once (the kept softmax becomes the gradient, in place).
    """
    device_type = hidden.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias)):
        return _LinearTokenLogprobs.apply(hidden, weight, bias, targets, dtype)
    with torch.autocast(device_type, enabled=False):
        out, _ = _chunked_logprobs(hidden.to(dtype), weight.to(dtype), _cast(bias, dtype), targets, keep_softmax=False)
    return out


def _cast(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(dtype)


def _chunked_logprobs(h, w, b, targets, keep_softmax: bool):
    """(log-probs [N] float32, softmax [N, V] in h's dtype or None) of `targets` under logits h @ w.T + b."""
    rows, vocab = h.shape[0], w.shape[0]
    out = torch.empty(rows, dtype=torch.float32, device=h.device)
    probs = torch.empty(rows, vocab, dtype=h.dtype, device=h.device) if keep_softmax else None
    step = max(1, _CHUNK_VALUES // vocab)
    for start in range(0, rows, step):
        part = slice(start, start + step)
        logits = F.linear(h[part], w, b).float()
        target = logits.gather(-1, targets[part, None]).squeeze(-1)
        # logsumexp's own steps (max, exp of the shifted logits, sum, log, max added back), with the exponentials
        # kept: divided by their sum they are the softmax the backward needs.
        top = logits.amax(-1, keepdim=True)
        exp = logits.sub_(top).exp_()
        total = exp.sum(-1, keepdim=True)
        out[part] = target - total.log().add_(top).squeeze(-1)
        if probs is not None:
            probs[part] = exp.div_(total)
    return out, probs


class _LinearTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, dtype):
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            out, probs = _chunked_logprobs(h, w, _cast(bias, dtype), targets, keep_softmax=True)
        ctx.save_for_backward(h, w, targets, out, probs)
        ctx.has_bias, ctx.used = bias is not None, False
        ctx.dtypes = hidden.dtype, weight.dtype
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        if ctx.used:
            raise RuntimeError(
                "linear_token_logprobs: a graph through it runs backward once (the kept softmax becomes the gradient)"
            )
        ctx.used = True
        h, w, targets, out, probs = ctx.saved_tensors
        grad = grad_out.float()
        with torch.autocast(h.device.type, enabled=False):
            # d out_i / d logits_i = onehot(t_i) - softmax_i; the target's entry 1 - p_t from out itself, in float32,
            # where the kept softmax would round it (p_t near 1 leaves a small difference of two rounded numbers).
            grad_logits = probs.mul_(-grad[:, None].to(probs.dtype))
            # Indexing, not scatter_, which converts a whole bfloat16 tensor to float32 and back on the CPU.
            grad_logits[torch.arange(len(targets), device=targets.device), targets] = (grad * -torch.expm1(out)).to(
                probs.dtype
            )
            hidden_dtype, weight_dtype = ctx.dtypes
            grad_hidden = (grad_logits @ w).to(hidden_dtype) if ctx.needs_input_grad[0] else None
            grad_weight = (grad_logits.t() @ h).to(weight_dtype) if ctx.needs_input_grad[1] else None
            grad_bias = None
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_bias = grad_logits.float().sum(0).to(weight_dtype)
        return grad_hidden, grad_weight, grad_bias, None, None
