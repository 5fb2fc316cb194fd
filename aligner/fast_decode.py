"""One-token decode steps for Llama-architecture models with a preallocated KV cache.

transformers' forward spends most of a one-token step on bookkeeping (mask building, cache objects, attention
dispatch), not on arithmetic: for a 2M-parameter policy on the CPU, decoding through it took about 3 ms a token
where the matmuls need well under 1 ms. `LlamaDecoder` runs the same layers of the same module (its Linear and
RMSNorm submodules, its rotary embedding, so every weight and RoPE variant is the model's own) with a cache
written in place and plain batched-matmul attention, which at these sizes is also faster on the CPU than the fused
`scaled_dot_product_attention` kernel for a single query.

Only `model_type == "llama"` takes this path (SmolLM2, TinyLlama, Llama 2/3 and the demo policy); other models
decode through transformers (`HFDecoder`). Both give the same logits up to float rounding
(tests/test_generation.py checks it).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def supports_fast_decode(model: nn.Module) -> bool:
    """A Llama whose projections are plain, hook-free Linear layers (not LoRA-wrapped, quantised or patched).

    The fast step reads their weights directly, so anything that changes what a module computes must send the
    model through transformers instead.
    """
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "llama" or getattr(config, "pretraining_tp", 1) > 1:
        return False
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return False
    linears = [model.lm_head]
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    return all(type(m) is nn.Linear and not (m._forward_hooks or m._forward_pre_hooks) for m in linears)


class HFDecoder:
    """Decode through transformers' forward, with its dynamic cache (any causal LM)."""

    def __init__(self, model: nn.Module, cache, prompt_mask: torch.Tensor, positions: torch.Tensor):
        self.model, self.cache = model, cache
        self.attention_mask = prompt_mask.long()
        self.positions = positions[:, -1:]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.attention_mask = torch.cat([self.attention_mask, torch.ones_like(self.attention_mask[:, :1])], dim=1)
        self.positions = self.positions + 1
        return self.model(
            input_ids=tokens[:, None],
            attention_mask=self.attention_mask,
            position_ids=self.positions,
            past_key_values=self.cache,
            use_cache=True,
        ).logits[:, -1]


class LlamaDecoder:
    """Decode a Llama model one token at a time from a prefilled transformers cache.

    The prefill's keys and values (already rotated) are copied once into tensors with room for `max_new_tokens`
    more positions; padding positions of the left-padded prompts are masked by an additive bias.
    """

    def __init__(self, model: nn.Module, cache, prompt_mask: torch.Tensor, positions: torch.Tensor, max_new: int):
        self.model = model
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        batch, prompt_len = prompt_mask.shape
        self.length = prompt_len
        self.keys, self.values = [], []
        for layer in cache.layers:
            k = layer.keys.new_empty(batch, self.num_kv_heads, prompt_len + max_new, self.head_dim)
            v = torch.empty_like(k)
            k[:, :, :prompt_len], v[:, :, :prompt_len] = layer.keys, layer.values
            self.keys.append(k)
            self.values.append(v)
        dtype = self.keys[0].dtype
        bias = torch.zeros(batch, prompt_len + max_new, dtype=dtype, device=prompt_mask.device)
        bias[:, :prompt_len].masked_fill_(~prompt_mask, torch.finfo(dtype).min)
        # One row per (sample, key/value head): the layout of the batched matmuls below.
        self.bias = (
            bias[:, None, None, :].expand(-1, self.num_kv_heads, -1, -1).reshape(batch * self.num_kv_heads, 1, -1)
        )
        # RoPE of every position the decode will visit, computed once.
        steps = torch.arange(1, max_new + 1, device=positions.device)
        future = positions[:, -1:] + steps[None, :]
        self.cos, self.sin = model.model.rotary_emb(self.keys[0], future)
        self.t = 0
        # A decode step is hundreds of tiny ops, each costing microseconds of dispatch whatever its size, so the
        # weights are rearranged once per generation (about 1 ms for 2M parameters; they change every optimiser
        # step) to need fewer ops: q, k and v in one matmul and gate and up in another instead of five; each
        # RMSNorm's weight folded into the columns of the matmul that reads its output; the attention scaling folded
        # into the query rows (RoPE is linear, so scaling before or after it is the same).
        scaling = self.head_dim**-0.5
        # Per layer, every tensor and number the step reads, so the loop does no module attribute lookups.
        self.layers = []
        for layer, keys, values in zip(model.model.layers, self.keys, self.values):
            attn, mlp = layer.self_attn, layer.mlp
            qkv_weight, qkv_bias = fuse_linears(attn.q_proj, attn.k_proj, attn.v_proj, scales=[scaling, 1.0, 1.0])
            gate_up_weight, gate_up_bias = fuse_linears(mlp.gate_proj, mlp.up_proj)
            self.layers.append(
                (
                    layer.input_layernorm.variance_epsilon,
                    qkv_weight * layer.input_layernorm.weight,
                    qkv_bias,
                    keys,
                    values,
                    attn.o_proj,
                    layer.post_attention_layernorm.variance_epsilon,
                    gate_up_weight * layer.post_attention_layernorm.weight,
                    gate_up_bias,
                    mlp.act_fn,
                    mlp.down_proj,
                )
            )
        head = model.lm_head
        self.head = (head.weight * model.model.norm.weight, head.bias)
        self.final_eps = model.model.norm.variance_epsilon
        self.embed = model.model.embed_tokens

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] after feeding one token per row."""
        batch, nh, nkv, d = tokens.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        x = self.embed(tokens)  # [B, H]
        cos, sin = self.cos[:, self.t, None], self.sin[:, self.t, None]  # [B, 1, d]
        pos, end = self.length, self.length + 1
        bias = self.bias[:, :, :end]
        for input_eps, qkv_w, qkv_b, keys, values, o_proj, post_eps, gate_up_w, gate_up_b, act, down in self.layers:
            qkv = F.linear(rms_normalize(x, input_eps), qkv_w, qkv_b).view(batch, nh + 2 * nkv, d)
            qk = apply_rope(qkv[:, : nh + nkv], cos, sin)  # queries and keys at once
            keys[:, :, pos] = qk[:, nh:]
            values[:, :, pos] = qkv[:, nh + nkv :]
            # Query heads j*group .. (j+1)*group-1 share key/value head j, as transformers' repeat_kv lays them out.
            q = qk[:, :nh].reshape(batch * nkv, nh // nkv, d)
            scores = torch.baddbmm(bias, q, keys[:, :, :end].reshape(batch * nkv, end, d).transpose(1, 2))
            probs = scores.softmax(-1) if q.dtype == torch.float32 else scores.softmax(-1, torch.float32).to(q.dtype)
            out = torch.bmm(probs, values[:, :, :end].reshape(batch * nkv, end, d)).view(batch, nh * d)
            x = _residual_linear(x, out, o_proj)
            gate, up = F.linear(rms_normalize(x, post_eps), gate_up_w, gate_up_b).chunk(2, dim=-1)
            x = _residual_linear(x, act(gate) * up, down)
        self.length += 1
        self.t += 1
        return F.linear(rms_normalize(x, self.final_eps), *self.head)


def _residual_linear(x: torch.Tensor, inputs: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """x + linear(inputs), as one addmm when the layer has no bias (Llama's)."""
    if linear.bias is None:
        return torch.addmm(x, inputs, linear.weight.t())
    return x + F.linear(inputs, linear.weight, linear.bias)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in transformers' rotate_half convention; cos/sin broadcast over x's head dimension."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / RMS(x) without the norm's weight (folded into the next matmul); computed in float32 as transformers does."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], None, eps)
    return F.rms_norm(x.float(), x.shape[-1:], None, eps).to(x.dtype)


def fuse_linears(*linears: nn.Linear, scales: list[float] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight and bias of one Linear computing the given ones side by side, each output optionally scaled."""
    scales = scales or [1.0] * len(linears)
    weight = torch.cat([lin.weight * s if s != 1.0 else lin.weight for lin, s in zip(linears, scales)])
    if all(lin.bias is None for lin in linears):
        return weight, None
    bias = torch.cat(
        [
            (lin.bias if lin.bias is not None else weight.new_zeros(lin.out_features)) * s
            for lin, s in zip(linears, scales)
        ]
    )
    return weight, bias
