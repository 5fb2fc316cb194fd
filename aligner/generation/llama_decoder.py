"""One-token decode steps for Llama-architecture models with a preallocated KV cache, eager or compiled.

transformers' forward spends most of a one-token step on bookkeeping (mask building, cache objects, attention
dispatch), not on arithmetic: for a 2M-parameter policy on the CPU, decoding through it took about 3 ms a token
where the matmuls need well under 1 ms. `LlamaDecoder` runs the model's own weights and rotary embedding (so every
RoPE variant is the model's) with a cache written in place and plain batched-matmul attention, which at these sizes
is also faster on the CPU than the fused `scaled_dot_product_attention` kernel for a single query.

Its step (`llama_decode_step`) has static shapes: it attends over the whole preallocated cache with the unwritten
positions masked, and takes the position as a tensor. So `generation.compile` can compile it once, together with
the choice of the next token (`aligner.generation.sampling.sample_next`), and reuse that code for every token
and, since the weights are inputs, after every optimiser step.

Only `model_type == "llama"` takes this path (SmolLM2, TinyLlama, Llama 2/3 and the demo policy); other models
decode through transformers (`HFDecoder`). Both give the same logits up to float rounding
(tests/aligner/generation/test_generator.py checks it, and that the compiled step samples the eager step's tokens).
"""

from __future__ import annotations

import functools
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

from aligner.generation.sampling import sample_next
from aligner.modeling.llama_kernels import (
    apply_rope,
    attention_shape,
    float32_softmax,
    folded_projections,
    residual_linear,
    rms_normalize,
)


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

    def step_and_sample(self, tokens, uniform, ban_eos, sampling: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed `tokens`, then choose the next ones: `sample_next(logits, uniform, ban_eos, *sampling)`."""
        return sample_next(self.step(tokens), uniform, ban_eos, *sampling)


# With generation.compile the cache length is rounded up to this, so prompts of different lengths share one
# compiled step (a new shape costs a compilation; a 64-position block costs little attention).
COMPILED_CACHE_BLOCK = 64


class LlamaDecoder:
    """Decode a Llama model one token at a time from a prefilled transformers cache.

    The prefill's keys and values (already rotated) are copied once into zeroed tensors with room for
    `max_new_tokens` more positions. Every step attends over the whole preallocated cache, the positions not yet
    written and the left padding of the prompts masked by an additive bias: the step's shapes never change, so
    with `compile=True` it is compiled once (torch.compile) together with the sampling of the next token. Eagerly
    the wasted attention over empty positions costs about what slicing a growing cache would.
    """

    def __init__(
        self,
        model: nn.Module,
        cache,
        prompt_mask: torch.Tensor,
        positions: torch.Tensor,
        max_new: int,
        compile: bool = False,
    ):
        self.shape = num_heads, num_kv_heads, head_dim = attention_shape(model.config)
        self.compile = compile
        batch, prompt_len = prompt_mask.shape
        size = prompt_len + max_new
        if compile:
            size = -(-size // COMPILED_CACHE_BLOCK) * COMPILED_CACHE_BLOCK
        device = prompt_mask.device
        keys, values = [], []
        for layer in cache.layers:
            k = layer.keys.new_zeros(batch, num_kv_heads, size, head_dim)  # zeros: empty slots meet 0 probability
            v = torch.zeros_like(k)
            k[:, :, :prompt_len], v[:, :, :prompt_len] = layer.keys, layer.values
            keys.append(k)
            values.append(v)
        dtype = keys[0].dtype
        bias = torch.zeros(batch, size, dtype=dtype, device=device)
        bias[:, :prompt_len].masked_fill_(~prompt_mask, torch.finfo(dtype).min)
        # One row per (sample, key/value head): the layout of the batched matmuls of the step.
        self.bias = bias[:, None, None, :].expand(-1, num_kv_heads, -1, -1).reshape(batch * num_kv_heads, 1, -1)
        self.key_positions = torch.arange(size, device=device)
        self.prompt_len = torch.tensor(prompt_len, device=device)
        # RoPE of every position the decode will visit, computed once.
        steps = torch.arange(1, max_new + 1, device=positions.device)
        self.cos, self.sin = model.model.rotary_emb(keys[0], positions[:, -1:] + steps[None, :])
        self.t = 0
        # A decode step is hundreds of tiny ops, each costing microseconds of dispatch whatever its size, so the
        # weights are rearranged once per generation (about 1 ms for 2M parameters; they change every optimiser
        # step) to need fewer ops: q, k and v in one matmul and gate and up in another instead of five; each
        # RMSNorm's weight folded into the columns of the matmul that reads its output; the attention scaling folded
        # into the query rows (RoPE is linear, so scaling before or after it is the same).
        self.layers = []
        for layer, k, v in zip(model.model.layers, keys, values):
            attn, mlp = layer.self_attn, layer.mlp
            qkv_weight, qkv_bias, gate_up_weight, gate_up_bias = folded_projections(layer, head_dim**-0.5)
            self.layers.append(
                (
                    layer.input_layernorm.variance_epsilon,
                    qkv_weight,
                    qkv_bias,
                    k,
                    v,
                    attn.o_proj.weight,
                    attn.o_proj.bias,
                    layer.post_attention_layernorm.variance_epsilon,
                    gate_up_weight,
                    gate_up_bias,
                    mlp.down_proj.weight,
                    mlp.down_proj.bias,
                )
            )
        head = model.lm_head
        self.head = (head.weight * model.model.norm.weight, head.bias, model.model.norm.variance_epsilon)
        self.embed = model.model.embed_tokens.weight

    def _inputs(self, tokens: torch.Tensor) -> tuple:
        step = torch.tensor(self.t, device=tokens.device)
        self.t += 1
        rope = (self.cos, self.sin)
        return (tokens, step, self.embed, self.layers, self.head, self.bias, self.key_positions, self.prompt_len, rope)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] after feeding one token per row."""
        return llama_decode_step(*self._inputs(tokens), self.shape)

    @torch.no_grad()
    def step_and_sample(self, tokens, uniform, ban_eos, sampling: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed `tokens`, then choose the next ones: `sample_next(logits, uniform, ban_eos, *sampling)`."""
        if not self.compile:
            return sample_next(self.step(tokens), uniform, ban_eos, *sampling)
        compiled, inputs = compiled_decode_and_sample(), self._inputs(tokens)
        key = (tokens.shape[0], self.key_positions.shape[0], self.embed.dtype, self.embed.device, self.shape)
        if key in _COMPILED_SHAPES:
            return compiled(inputs, self.shape, uniform, ban_eos, sampling)
        print(
            f"generation.compile: compiling the decode step for {tokens.shape[0]} rows x {key[1]} cache positions "
            "(the first time for this shape; torch.compile caches it on disk)",
            file=sys.stderr,
        )
        start = time.perf_counter()
        try:
            out = compiled(inputs, self.shape, uniform, ban_eos, sampling)
        except Exception as err:  # noqa: BLE001 - inductor raises many kinds; the message says what to do
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RuntimeError(
                f"generation.compile: torch.compile of the decode step failed ({first_line}); it needs a working "
                "C++ compiler on the CPU (or Triton on CUDA). Set generation.compile=false to decode without it."
            ) from err
        _COMPILED_SHAPES.add(key)
        print(f"generation.compile: compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        return out


# Shapes this process has compiled the step for: the first call of a new one is announced and timed.
_COMPILED_SHAPES: set[tuple] = set()


def llama_decode_step(tokens, step, embed, layers, head, bias, key_positions, prompt_len, rope, shape):
    """Logits [B, V] of a Llama after one more token per row, its keys and values written into the caches at
    position `prompt_len + step` (both 0-dim tensors, so a compiled step serves every position)."""
    batch, (nh, nkv, d) = tokens.shape[0], shape
    x = embed[tokens]  # [B, H]
    cos, sin = rope[0].index_select(1, step), rope[1].index_select(1, step)  # [B, 1, d]
    position = prompt_len + step
    size = key_positions.shape[0]
    bias = bias.masked_fill(key_positions > position, torch.finfo(bias.dtype).min)
    for input_eps, qkv_w, qkv_b, keys, values, o_w, o_b, post_eps, gate_up_w, gate_up_b, down_w, down_b in layers:
        qkv = F.linear(rms_normalize(x, input_eps), qkv_w, qkv_b).view(batch, nh + 2 * nkv, d)
        qk = apply_rope(qkv[:, : nh + nkv], cos, sin)  # queries and keys at once
        keys.index_copy_(2, position.view(1), qk[:, nh:, None])
        values.index_copy_(2, position.view(1), qkv[:, nh + nkv :, None])
        # Query heads j*group .. (j+1)*group-1 share key/value head j, as transformers' repeat_kv lays them out.
        q = qk[:, :nh].reshape(batch * nkv, nh // nkv, d)
        out = _attend(q, keys.view(batch * nkv, size, d), values.view(batch * nkv, size, d), bias)
        out = out.view(batch, nh * d)
        x = residual_linear(x, out, o_w, o_b)
        gate, up = F.linear(rms_normalize(x, post_eps), gate_up_w, gate_up_b).chunk(2, dim=-1)
        x = residual_linear(x, F.silu(gate) * up, down_w, down_b)
    head_w, head_b, final_eps = head
    return F.linear(rms_normalize(x, final_eps), head_w, head_b)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T + bias) v for rows of a few queries [R, G, d] against keys and values [R, S, d]."""
    if torch.compiler.is_compiling():
        # Compiled, broadcast products and sums become one fused loop each, where the batched matmuls of a single
        # query against a short cache are hundreds of tiny GEMM calls.
        probs = float32_softmax((q[:, :, None, :] * k[:, None, :, :]).sum(-1) + bias)
        return (probs[:, :, :, None] * v[:, None, :, :]).sum(-2)
    return torch.bmm(float32_softmax(torch.baddbmm(bias, q, k.transpose(1, 2))), v)


def _decode_and_sample(decode_inputs: tuple, shape, uniform, ban_eos, sampling: tuple):
    return sample_next(llama_decode_step(*decode_inputs, shape), uniform, ban_eos, *sampling)


@functools.cache
def compiled_decode_and_sample():
    """`llama_decode_step` plus `sample_next` as one torch.compile'd function (built once per process).

    Weights and caches are inputs, not constants, so an optimiser step reuses the compiled code; a new batch size or
    cache length compiles again once, after which dynamo treats that dimension as dynamic.
    """
    # cpp_wrapper: the compiled code calls its kernels from C++ rather than from a Python wrapper, which at ~40
    # small kernels a token saved about a tenth of the generation time more (measured alternately in one process).
    return torch.compile(_decode_and_sample, fullgraph=True, options={"cpp_wrapper": True})
