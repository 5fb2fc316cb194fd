"""Response logits of a Llama-architecture model from its weights, for training and the reference policy.

    .venv/bin/python -m pytest tests/aligner/modeling/test_llama_forward.py   # same values and gradients

Training and the reference policy run a model over [prompt | response] rows: about half of a RLOO step on a small
model. transformers' forward does that in two calls (the distinct prompts into a cache, then the responses), each
building masks and cache objects and running each projection separately. `llama_grouped_logits` runs the same
arithmetic on one flat matrix of tokens, the G distinct prompts' and the B responses' (each prompt once, as
`aligner.modeling.logprobs.grouped_response_logits` does), so every projection is one matmul over both; q, k and v
come out of one matmul and gate and up of another, each RMSNorm's weight and the attention scaling folded into the
matmul that reads them (as in the decode step, `aligner.generation.llama_decoder`). Autograd differentiates it like
any torch code: gradients reach every parameter of the model, the folded norm weights included.

It takes the model's own rotary embedding (every RoPE variant is the model's) and applies to the models
`supports_fast_forward` accepts: Llama with plain Linear projections (not LoRA-wrapped or patched), SiLU, no
tensor-parallel split and, in training, no attention dropout. Others, and models training with activation
checkpointing, go through transformers. tests/aligner/modeling/test_llama_forward.py checks both give the same
logits and gradients (grouped-query attention, biases, left-padded prompts of different lengths).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from aligner.modeling.batches import position_ids_from_mask
from aligner.modeling.llama_kernels import (
    apply_rope,
    attention_shape,
    float32_softmax,
    folded_projections,
    residual_linear,
    rms_normalize,
    supports_fast_decode,
)


def supports_fast_forward(model: nn.Module) -> bool:
    """Whether `llama_grouped_logits` computes what transformers' forward would for `model` in its current mode."""
    if not supports_fast_decode(model):
        return False
    return not (model.training and getattr(model.config, "attention_dropout", 0.0))


def llama_grouped_logits(model: nn.Module, batch) -> torch.Tensor:
    """Float32 logits [B, T, V] predicting each response token of `batch` (a `ResponseBatch`)."""
    head = model.lm_head
    return F.linear(llama_grouped_hidden(model, batch), head.weight, head.bias).float()


def llama_grouped_hidden(model: nn.Module, batch) -> torch.Tensor:
    """The final normalised hidden states [B, T, H] that the vocabulary projection (`model.lm_head`) turns into the
    logits predicting each response token of `batch` (a `ResponseBatch`).

    Row layout of the flat token matrix: the G left-padded prompts (G x P), then the B responses without their last
    token (B x (T - 1)); response b attends to its prompt's keys (`batch.group[b]`) and, causally, to its own.
    """
    inner = model.model
    num_heads, num_kv, head_dim = attention_shape(model.config)
    prompt_ids, prompt_mask, group = batch.prompt_ids, batch.prompt_mask, batch.group
    (num_prompts, prompt_len), (num_responses, width) = prompt_ids.shape, batch.response_ids.shape
    fed = width - 1  # response tokens fed in: the last one is only predicted
    device = prompt_ids.device

    ids = torch.cat([prompt_ids.reshape(-1), batch.response_ids[:, :fed].reshape(-1)])
    prompt_positions = position_ids_from_mask(prompt_mask)
    response_positions = prompt_mask.sum(-1).index_select(0, group)[:, None] + torch.arange(fed, device=device)
    positions = torch.cat([prompt_positions.reshape(-1), response_positions.reshape(-1)])
    embed = inner.embed_tokens
    # padding_idx as transformers' Embedding has it: that row gets no gradient, even where a response samples it.
    x = F.embedding(ids, embed.weight, embed.padding_idx)  # [N, H]
    cos, sin = inner.rotary_emb(x, positions[None])
    cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [N, 1, head_dim]: broadcast over heads
    prompt_bias, response_bias = _attention_biases(prompt_mask, group, batch.response_mask[:, :fed], x.dtype)

    # Shapes spelled out, not -1: with one-token responses nothing of them is fed (fed == 0, empty tensors).
    rows = [num_prompts * prompt_len, num_responses * fed]
    kv_shapes = [(num_prompts, prompt_len, num_kv, head_dim), (num_responses, fed, num_kv, head_dim)]
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv_weight, qkv_bias, gate_up_weight, gate_up_bias = folded_projections(layer, head_dim**-0.5)
        qkv = F.linear(rms_normalize(x, layer.input_layernorm.variance_epsilon), qkv_weight, qkv_bias)
        # split, not slicing: its backward is one concatenation, where each slice's would zero a whole gradient.
        qk, v = qkv.view(-1, num_heads + 2 * num_kv, head_dim).split([num_heads + num_kv, num_kv], dim=1)
        q, k = apply_rope(qk, cos, sin).split([num_heads, num_kv], dim=1)  # queries and keys rotated at once
        prompt_q, response_q = q.split(rows)
        prompt_k, response_k = (t.view(shape).transpose(1, 2) for t, shape in zip(k.split(rows), kv_shapes))
        prompt_v, response_v = (t.view(shape).transpose(1, 2) for t, shape in zip(v.split(rows), kv_shapes))
        out = torch.cat(
            [
                _attention(prompt_q, prompt_k, prompt_v, prompt_bias),
                _attention(
                    response_q,
                    torch.cat([prompt_k.index_select(0, group), response_k], dim=2),
                    torch.cat([prompt_v.index_select(0, group), response_v], dim=2),
                    response_bias,
                ),
            ]
        )
        x = residual_linear(x, out, attn.o_proj.weight, attn.o_proj.bias)
        normed = rms_normalize(x, layer.post_attention_layernorm.variance_epsilon)
        gate, up = F.linear(normed, gate_up_weight, gate_up_bias).chunk(2, dim=-1)
        x = residual_linear(x, F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)

    # Each response's first token is predicted at its prompt's last position (prompts are left-padded).
    prompt_x, response_x = x.split(rows)
    last = prompt_x.view(num_prompts, prompt_len, -1)[:, -1].index_select(0, group)[:, None]
    hidden = torch.cat([last, response_x.view(num_responses, fed, x.shape[-1])], dim=1)
    # The norm's weight scales the hidden states, not the [V, H] projection: B x T rows are fewer than V.
    return rms_normalize(hidden, inner.norm.variance_epsilon) * inner.norm.weight


def _attention_biases(prompt_mask: torch.Tensor, group: torch.Tensor, fed_mask: torch.Tensor, dtype: torch.dtype):
    """Additive masks: prompts [G, P, P] (causal, padding keys masked), responses [B, T-1, P + T-1] (their prompt's
    real tokens, then causal over their own real tokens: padding keys masked as transformers masks them, so even the
    unused outputs at padding positions are transformers')."""
    num_prompts, prompt_len = prompt_mask.shape
    fed = fed_mask.shape[1]
    device, lowest = prompt_mask.device, torch.finfo(dtype).min
    causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=device).tril()
    prompt_keep = causal[None] & prompt_mask[:, None, :]
    own = torch.ones(fed, fed, dtype=torch.bool, device=device).tril()[None] & fed_mask[:, None, :]
    response_keep = torch.cat([prompt_mask.index_select(0, group)[:, None, :].expand(-1, fed, -1), own], dim=2)
    prompt_bias = torch.zeros(prompt_keep.shape, dtype=dtype, device=device).masked_fill_(~prompt_keep, lowest)
    response_bias = torch.zeros(response_keep.shape, dtype=dtype, device=device).masked_fill_(~response_keep, lowest)
    return prompt_bias, response_bias


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T + bias) v: queries [R * L, H_q, d] in row-major token order, keys and values [R, H_kv, S, d],
    bias [R, L, S]; returns [R * L, H_q * d].

    Query heads j*n .. (j+1)*n-1 share key/value head j, as transformers' repeat_kv lays them out; their queries are
    stacked along the query axis so one batched matmul per key/value head serves the group.
    """
    rows, num_kv, keys, head_dim = k.shape
    num_heads = q.shape[1]
    n = num_heads // num_kv
    length = q.shape[0] // rows
    q = q.view(rows, length, num_kv, n, head_dim).permute(0, 2, 3, 1, 4).reshape(rows, num_kv, n * length, head_dim)
    scores = torch.matmul(q, k.transpose(-1, -2)).view(rows, num_kv, n, length, keys) + bias[:, None, None]
    out = torch.matmul(float32_softmax(scores).view(rows, num_kv, n * length, keys), v)
    return (
        out.view(rows, num_kv, n, length, head_dim).permute(0, 3, 1, 2, 4).reshape(rows * length, num_heads * head_dim)
    )
