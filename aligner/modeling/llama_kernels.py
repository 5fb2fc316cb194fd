"""Llama arithmetic on a model's own weights, shared by the decode step (aligner/generation/llama_decoder.py) and the
training forward (aligner/modeling/llama_forward.py): fused q/k/v and gate/up projections with the RMSNorm weights
and attention scaling folded in, RoPE, RMSNorm, and the check that a model can take this path.
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
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):  # sharded: only its modules' calls gather the weights (aligner/modeling/fsdp.py)
        return False
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "llama" or getattr(config, "pretraining_tp", 1) > 1:
        return False
    if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):  # the step hard-codes Llama's SiLU
        return False
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return False
    linears = [model.lm_head]
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    return all(type(m) is nn.Linear and not (m._forward_hooks or m._forward_pre_hooks) for m in linears)


def float32_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, computed in float32 whatever the scores' dtype (as transformers does)."""
    if scores.dtype == torch.float32:
        return scores.softmax(-1)
    return scores.softmax(-1, torch.float32).to(scores.dtype)


def residual_linear(x: torch.Tensor, inputs: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """x + linear(inputs), as one addmm when the layer has no bias (Llama's)."""
    if bias is None:
        return torch.addmm(x, inputs, weight.t())
    return x + F.linear(inputs, weight, bias)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in transformers' rotate_half convention; cos/sin broadcast over x's head dimension."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / RMS(x) without the norm's weight (folded into the next matmul); computed in float32 as transformers does."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], None, eps)
    return F.rms_norm(x.float(), x.shape[-1:], None, eps).to(x.dtype)


def attention_shape(config) -> tuple[int, int, int]:
    """(query heads, key/value heads, head size) of a Llama config (grouped-query attention and head_dim optional)."""
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    return num_heads, num_kv_heads, getattr(config, "head_dim", None) or config.hidden_size // num_heads


def folded_projections(layer: nn.Module, scaling: float) -> tuple:
    """A decoder layer's (qkv weight, qkv bias, gate_up weight, gate_up bias): q/k/v and gate/up fused, each
    RMSNorm's weight folded into the columns of the matmul reading its output, `scaling` into the query rows.

    Differentiable: gradients reach the projections and the norm weights alike."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv_weight, qkv_bias = fuse_linears(attn.q_proj, attn.k_proj, attn.v_proj, scales=[scaling, 1.0, 1.0])
    gate_up_weight, gate_up_bias = fuse_linears(mlp.gate_proj, mlp.up_proj)
    return (
        qkv_weight * layer.input_layernorm.weight,
        qkv_bias,
        gate_up_weight * layer.post_attention_layernorm.weight,
        gate_up_bias,
    )


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
