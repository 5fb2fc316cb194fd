"""Megatron-Core backend: a Hugging Face Llama as a tensor/pipeline-parallel Megatron `GPTModel`, and REINFORCE on it.

Needs the optional extra (`pip install 'aligner[megatron]'`, Megatron-Core 0.16) and, in production, CUDA with
NCCL: one process per GPU, started by torchrun, e.g. for tensor parallel 2 on one node::

    torchrun --nproc_per_node 2 your_script.py     # which calls init_megatron_parallel(tp=2) first

    init_megatron_parallel(tensor_model_parallel_size=2, seed=1234)
    model = build_megatron_model(hf_model.config, hf_model.state_dict(), tensor_model_parallel_size=2)
    logprobs = megatron_response_logprobs(model, batch)                 # == models.response_logprobs
    megatron_reinforce_step(model, optimizer, batch, advantages, loss_mask)
    hf_model.load_state_dict(model_to_hf_state_dict(model, hf_model.config))   # refit the generation model

With pipeline parallelism (e.g. 4 GPUs: tp 2 x pp 2) pass pipeline_model_parallel_size to both calls, and a
micro_batch_size to the log-probs and the step so that the stages overlap; every rank passes the same batch.

Megatron-Core places tensors on `torch.cuda.current_device()` and keeps CUDA RNG states, so on a CPU it runs only
under the test shim (tests/helpers/megatron_shim.py), which redirects those calls; the tests run tensor parallel 2,
pipeline parallel 2 and data parallel 2 over gloo:

    .venv/bin/python -m pytest tests/aligner/modeling/test_megatron.py -q

Layout (Megatron's local, non-TransformerEngine layer spec): q, k and v are fused into `linear_qkv`, grouped per
query group as [q heads of the group | k | v]; gate and up are fused into `linear_fc1` as [gate | up]; the layer norms
stay separate modules (`input_layernorm`, `pre_mlp_layernorm`; only the TransformerEngine spec folds them into
`layer_norm_weight`). Tensor parallelism splits the fused weights per query group / per FFN column, `linear_proj` and
`linear_fc2` over their inputs, and the embedding and output layer over the vocabulary. Pipeline parallelism gives
stage s the layers s * n / pp ... (s + 1) * n / pp - 1 (numbered from 0 in its own state dict), the embedding to the
first stage and the final norm and output layer to the last; with tied embeddings the last stage keeps Megatron's
copy of the embedding as `output_layer.weight`, whose gradient is summed with the first stage's after each backward.
Micro-batches run through Megatron's 1F1B schedule (`get_forward_backward_func`); the last stage computes the
log-probs and the loss, and broadcasts what the caller gets (log-probs, loss) to the other stages.

Not implemented: virtual (interleaved) pipeline stages, layer counts that do not divide by the pipeline size,
vocabularies that do not divide by the tensor-parallel size (Megatron's vocabulary padding would change the softmax),
rope scaling other than 'default'.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from aligner.algorithms.reinforce import reinforce_loss
from aligner.metrics import GRAD_NORM, LOSS
from aligner.modeling.batches import ResponseBatch

MISSING_EXTRA = "model.backend=megatron needs the optional extra: pip install 'aligner[megatron]'"


def megatron_available() -> bool:
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        return False
    return True


def _require_megatron() -> None:
    if not megatron_available():
        raise ImportError(MISSING_EXTRA)


# ----------------------------------------------------------------------------------------------- parallel state
def init_megatron_parallel(tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1, seed: int = 0):
    """Create Megatron's process groups (torch.distributed must be initialised, e.g. by torchrun) and seed its RNGs.

    Every rank gets the same `seed` for the replicated weights; Megatron derives a per-TP-rank seed for the sharded
    regions. The world size must be a multiple of tp * pp; the remaining factor is data parallelism.
    """
    _require_megatron()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: start the processes with torchrun")
    world = dist.get_world_size()
    if world % (tensor_model_parallel_size * pipeline_model_parallel_size):
        raise ValueError(
            f"world size {world} does not divide by tensor_model_parallel_size * pipeline_model_parallel_size "
            f"({tensor_model_parallel_size} * {pipeline_model_parallel_size})"
        )
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size, pipeline_model_parallel_size)
    model_parallel_cuda_manual_seed(seed)


def _tp_group_info() -> tuple[Any, int, int]:
    from megatron.core import parallel_state

    return (
        parallel_state.get_tensor_model_parallel_group(),
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_world_size(),
    )


def _pp_group_info() -> tuple[Any, int, int]:
    from megatron.core import parallel_state

    return (
        parallel_state.get_pipeline_model_parallel_group(),
        parallel_state.get_pipeline_model_parallel_rank(),
        parallel_state.get_pipeline_model_parallel_world_size(),
    )


# ----------------------------------------------------------------------------------------------- model
def _rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise NotImplementedError(f"rope_type {rope_type!r} is not supported by the Megatron backend (only 'default')")
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def _head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def _has_bias(hf_config) -> bool:
    # Megatron has one switch for the biases of every linear layer; Llama has one for attention and one for the MLP.
    attention, mlp = bool(getattr(hf_config, "attention_bias", False)), bool(getattr(hf_config, "mlp_bias", False))
    if attention != mlp:
        raise NotImplementedError("attention_bias and mlp_bias must be equal for the Megatron backend")
    return attention


def _check_shapes(hf_config, tp: int, pp: int) -> None:
    if getattr(hf_config, "model_type", "llama") != "llama":
        raise NotImplementedError(f"the Megatron backend converts Llama models only, not {hf_config.model_type!r}")
    if hf_config.num_hidden_layers % pp:
        raise ValueError(
            f"num_hidden_layers ({hf_config.num_hidden_layers}) must divide by pipeline_model_parallel_size ({pp})"
        )
    kv_heads = hf_config.num_key_value_heads or hf_config.num_attention_heads
    for name, value in (
        ("num_key_value_heads", kv_heads),
        ("intermediate_size", hf_config.intermediate_size),
        ("vocab_size", hf_config.vocab_size),
    ):
        if value % tp:
            raise ValueError(f"{name} ({value}) must divide by tensor_model_parallel_size ({tp})")


def megatron_config_from_hf(hf_config, tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1):
    """The `TransformerConfig` of a Hugging Face `LlamaConfig`: RMSNorm, SwiGLU, rotary, GQA, no dropout."""
    _require_megatron()
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    _check_shapes(hf_config, tp, pp)
    dtype = getattr(hf_config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if hf_config.hidden_act != "silu":
        raise NotImplementedError(f"hidden_act {hf_config.hidden_act!r}: the Megatron backend supports silu only")
    return TransformerConfig(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads or hf_config.num_attention_heads,
        kv_channels=_head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=_has_bias(hf_config),
        # RL needs the policy's exact log-probs: Llama trains without dropout, and so does this backend.
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        # Pipeline stages exchange activations of this dtype. Micro-batches are trimmed to their own longest row, so
        # the shapes vary: Megatron then sends each tensor's shape ahead of it.
        pipeline_dtype=dtype,
        variable_seq_lengths=pp > 1,
        # There are no experts; Megatron refuses variable_seq_lengths with its default MoE dispatcher all the same.
        moe_token_dispatcher_type="alltoall" if pp > 1 else "allgather",
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        # The fused kernels need CUDA extensions (apex, TransformerEngine) that the plain wheel does not ship.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        # Megatron's own default ("full") only triggers its deprecation warning; [] means the same.
        cuda_graph_scope=[],
        # perform_initialization stays on although the weights are then overwritten: without it Megatron does not
        # mark its sharded weights `tensor_model_parallel`, and the gradient norm would count them once.
    )


def build_megatron_model(
    hf_config,
    hf_state: dict[str, torch.Tensor] | None = None,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
):
    """A `GPTModel` (local layer spec) for this process's tensor-parallel rank and pipeline stage, loaded from
    `hf_state` (the whole HF state dict, on every rank) when given.

    `init_megatron_parallel` must have run with the same sizes.
    """
    _require_megatron()
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = megatron_config_from_hf(hf_config, tensor_model_parallel_size, pipeline_model_parallel_size)
    for name, wanted, size in (
        ("tensor_model_parallel_size", tensor_model_parallel_size, _tp_group_info()[2]),
        ("pipeline_model_parallel_size", pipeline_model_parallel_size, _pp_group_info()[2]),
    ):
        if size != wanted:
            raise ValueError(
                f"{name} is {wanted} but Megatron's process groups were initialised with {size} "
                "(call init_megatron_parallel with the same sizes)"
            )
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=_rope_theta(hf_config),
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )
    if hf_state is not None:
        load_hf_weights(model, hf_state, hf_config)
    return model


def load_hf_weights(model, hf_state: dict[str, torch.Tensor], hf_config) -> None:
    """Copy a full HF state dict into this rank's shards of `model`; every weight of the model must be covered."""
    _, rank, size = _tp_group_info()
    _, stage, stages = _pp_group_info()
    shards = hf_to_megatron_state_dict(hf_state, hf_config, rank, size, stage, stages)
    expected = {k for k in model.state_dict() if not k.endswith("._extra_state")}
    if set(shards) != expected:
        raise ValueError(
            f"converted weights do not match the Megatron model: missing {sorted(expected - set(shards))}, "
            f"unexpected {sorted(set(shards) - expected)}"
        )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in shards.items():
            params[name].copy_(value)


# ----------------------------------------------------------------------------------------------- conversion
def _layer_prefixes(i: int, local: int | None = None) -> tuple[str, str]:
    """HF's prefix of global layer i, and Megatron's, numbered within the pipeline stage (`local`, default i)."""
    return f"model.layers.{i}.", f"decoder.layers.{i if local is None else local}."


def stage_layers(hf_config, pp_rank: int = 0, pp_size: int = 1) -> range:
    """The global indices of the layers of pipeline stage `pp_rank`: an equal, contiguous share per stage."""
    per_stage = hf_config.num_hidden_layers // pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def _tied(hf_config) -> bool:
    return bool(getattr(hf_config, "tie_word_embeddings", False))


def _qkv_groups(hf_config) -> tuple[int, int, int]:
    heads = hf_config.num_attention_heads
    groups = hf_config.num_key_value_heads or heads
    return groups, heads // groups, _head_dim(hf_config)


def hf_to_megatron_state_dict(
    hf_state: dict[str, torch.Tensor],
    hf_config,
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
) -> dict[str, torch.Tensor]:
    """The Megatron `GPTModel` weights of tensor-parallel rank `tp_rank` of `tp_size` in pipeline stage `pp_rank` of
    `pp_size`, from a Llama HF state dict.

    Global layer i goes to stage i // (n / pp) as its layer i % (n / pp); the embedding to the first stage, the final
    norm and output layer to the last (with tied embeddings and pp > 1, the embedding again, as Megatron's copy in
    `output_layer.weight`). Pure tensor reshuffling (no process groups needed); the tensors are new copies.
    """
    _check_shapes(hf_config, tp_size, pp_size)
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    groups, per_group, d = _qkv_groups(hf_config)
    bias = _has_bias(hf_config)

    def rows(t: torch.Tensor) -> torch.Tensor:  # column-parallel: split the outputs
        return t.chunk(tp_size, dim=0)[tp_rank].clone()

    def cols(t: torch.Tensor) -> torch.Tensor:  # row-parallel: split the inputs
        return t.chunk(tp_size, dim=-1)[tp_rank].clone()

    out = {"embedding.word_embeddings.weight": rows(hf_state["model.embed_tokens.weight"])} if first else {}
    for local, i in enumerate(stage_layers(hf_config, pp_rank, pp_size)):
        hf, mg = _layer_prefixes(i, local)
        attn, mlp = hf + "self_attn.", hf + "mlp."
        out[mg + "input_layernorm.weight"] = hf_state[hf + "input_layernorm.weight"].clone()
        out[mg + "pre_mlp_layernorm.weight"] = hf_state[hf + "post_attention_layernorm.weight"].clone()
        for suffix in ("weight", "bias") if bias else ("weight",):
            q = hf_state[attn + "q_proj." + suffix]
            k = hf_state[attn + "k_proj." + suffix]
            v = hf_state[attn + "v_proj." + suffix]
            rest = q.shape[1:]
            qkv = torch.cat(
                [q.reshape(groups, per_group * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)],
                dim=1,
            ).reshape(groups * (per_group + 2) * d, *rest)
            out[mg + "self_attention.linear_qkv." + suffix] = rows(qkv)
            gate, up = hf_state[mlp + "gate_proj." + suffix], hf_state[mlp + "up_proj." + suffix]
            out[mg + "mlp.linear_fc1." + suffix] = torch.cat([rows(gate), rows(up)], dim=0)
        out[mg + "self_attention.linear_proj.weight"] = cols(hf_state[attn + "o_proj.weight"])
        out[mg + "mlp.linear_fc2.weight"] = cols(hf_state[mlp + "down_proj.weight"])
        if bias:
            # Row-parallel biases are added once, after the all-reduce: every rank holds all of it.
            out[mg + "self_attention.linear_proj.bias"] = hf_state[attn + "o_proj.bias"].clone()
            out[mg + "mlp.linear_fc2.bias"] = hf_state[mlp + "down_proj.bias"].clone()
    if last:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"].clone()
        if not _tied(hf_config):
            out["output_layer.weight"] = rows(hf_state["lm_head.weight"])
        elif not first:
            out["output_layer.weight"] = rows(hf_state["model.embed_tokens.weight"])
    return out


def merge_pipeline_stages(stage_states: list[dict[str, torch.Tensor]], hf_config) -> dict[str, torch.Tensor]:
    """One whole-model Megatron state dict from the state dicts of every pipeline stage (one tensor-parallel rank),
    in stage order: layers renumbered globally, the last stage's copy of a tied embedding dropped.

    The inverse of `hf_to_megatron_state_dict`'s split over stages; `megatron_to_hf_state_dict` takes the result.
    """
    pp_size = len(stage_states)
    _check_shapes(hf_config, 1, pp_size)
    out: dict[str, torch.Tensor] = {}
    for stage, state in enumerate(stage_states):
        layers = stage_layers(hf_config, stage, pp_size)
        for key, value in state.items():
            if key.startswith("decoder.layers."):
                local, rest = key[len("decoder.layers.") :].split(".", 1)
                key = f"decoder.layers.{layers[int(local)]}.{rest}"
            elif key == "output_layer.weight" and _tied(hf_config):
                continue  # Megatron's copy of the embedding on the last stage
            if key in out:
                raise ValueError(f"{key} is in more than one pipeline stage")
            out[key] = value
    return out


def megatron_to_hf_state_dict(tp_states: list[dict[str, torch.Tensor]], hf_config) -> dict[str, torch.Tensor]:
    """The Llama HF state dict from the whole-model Megatron state dicts of every tensor-parallel rank, in rank order
    (with pipeline parallelism, each first merged over the stages by `merge_pipeline_stages`).

    The exact inverse of `hf_to_megatron_state_dict`: HF -> Megatron -> HF gives identical tensors.
    """
    tp_size = len(tp_states)
    _check_shapes(hf_config, tp_size, 1)
    groups, per_group, d = _qkv_groups(hf_config)
    bias = _has_bias(hf_config)

    def rows(key: str) -> torch.Tensor:
        return torch.cat([s[key] for s in tp_states], dim=0)

    def cols(key: str) -> torch.Tensor:
        return torch.cat([s[key] for s in tp_states], dim=-1)

    def replicated(key: str) -> torch.Tensor:
        return tp_states[0][key].clone()

    out = {"model.embed_tokens.weight": rows("embedding.word_embeddings.weight")}
    for i in range(hf_config.num_hidden_layers):
        hf, mg = _layer_prefixes(i)
        attn, mlp = hf + "self_attn.", hf + "mlp."
        out[hf + "input_layernorm.weight"] = replicated(mg + "input_layernorm.weight")
        out[hf + "post_attention_layernorm.weight"] = replicated(mg + "pre_mlp_layernorm.weight")
        for suffix in ("weight", "bias") if bias else ("weight",):
            qkv = rows(mg + "self_attention.linear_qkv." + suffix)
            rest = qkv.shape[1:]
            q, k, v = qkv.reshape(groups, (per_group + 2) * d, *rest).split([per_group * d, d, d], dim=1)
            out[attn + "q_proj." + suffix] = q.reshape(groups * per_group * d, *rest).contiguous()
            out[attn + "k_proj." + suffix] = k.reshape(groups * d, *rest).contiguous()
            out[attn + "v_proj." + suffix] = v.reshape(groups * d, *rest).contiguous()
            halves = [s[mg + "mlp.linear_fc1." + suffix].chunk(2, dim=0) for s in tp_states]
            out[mlp + "gate_proj." + suffix] = torch.cat([h[0] for h in halves], dim=0)
            out[mlp + "up_proj." + suffix] = torch.cat([h[1] for h in halves], dim=0)
        out[attn + "o_proj.weight"] = cols(mg + "self_attention.linear_proj.weight")
        out[mlp + "down_proj.weight"] = cols(mg + "mlp.linear_fc2.weight")
        if bias:
            out[attn + "o_proj.bias"] = replicated(mg + "self_attention.linear_proj.bias")
            out[mlp + "down_proj.bias"] = replicated(mg + "mlp.linear_fc2.bias")
    out["model.norm.weight"] = replicated("decoder.final_layernorm.weight")
    if _tied(hf_config):
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    else:
        out["lm_head.weight"] = rows("output_layer.weight")
    return out


def model_to_hf_state_dict(model, hf_config) -> dict[str, torch.Tensor]:
    """The full HF state dict of a tensor/pipeline-parallel `model`, gathered over its TP group and then over its
    pipeline stages; every rank gets all of it."""
    group, _, size = _tp_group_info()
    pp_group, _, stages = _pp_group_info()
    local = {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("._extra_state")}
    if size == 1:
        tp_states = [{k: v.clone() for k, v in local.items()}]
    else:
        tp_states = [{} for _ in range(size)]
        for key, value in local.items():
            parts = [torch.empty_like(value) for _ in range(size)]
            dist.all_gather(parts, value.contiguous(), group=group)
            for state, part in zip(tp_states, parts):
                state[key] = part
    if stages > 1:
        # Stages hold different tensors: exchanged as pickled objects, through the CPU.
        per_stage: list[Any] = [None] * stages
        dist.all_gather_object(per_stage, [{k: v.cpu() for k, v in s.items()} for s in tp_states], group=pp_group)
        tp_states = [merge_pipeline_stages([s[rank] for s in per_stage], hf_config) for rank in range(size)]
    return megatron_to_hf_state_dict(tp_states, hf_config)


# ----------------------------------------------------------------------------------------------- log-probs
def _model_inputs(batch: ResponseBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's inputs for `batch` (token ids, positions, causal mask) and where each response token's logits are.

    Megatron's rotary embedding numbers positions 0..L-1 and ignores `position_ids`, so each row is first shifted
    left past its prompt padding: [prompt | response | padding] then needs only a causal mask and has HF's positions
    exactly.
    """
    input_ids, _ = batch.sequences()
    b, length = input_ids.shape
    t = batch.response_ids.shape[1]
    prompt_lengths = batch.prompt_mask.sum(-1).index_select(0, batch.group)
    left_pad = batch.prompt_ids.shape[1] - prompt_lengths
    columns = torch.arange(length, device=input_ids.device)
    source = columns[None, :] + left_pad[:, None]
    aligned = input_ids.gather(1, source.clamp(max=length - 1)).masked_fill(source >= length, 0)
    causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).triu(1)[None, None]
    # Response token j of row i sits at column prompt_length_i + j and is predicted from the column before it.
    where = prompt_lengths[:, None] - 1 + torch.arange(t, device=input_ids.device)[None, :]
    return aligned, columns[None, :].expand(b, length), causal, where  # causal: True = masked (Megatron's convention)


def _response_logprobs(logits: torch.Tensor, batch: ResponseBatch, where: torch.Tensor) -> torch.Tensor:
    """Log-probs [B, T] from the output layer's logits [B, L, V / tp]: the vocabulary stays split over tensor-parallel
    ranks; Megatron's vocab-parallel cross entropy gives each token's -log-prob (and the right gradient per shard)."""
    from megatron.core import tensor_parallel

    b, t = where.shape
    logits = logits.gather(1, where[:, :, None].expand(b, t, logits.shape[-1])).float()
    return -tensor_parallel.vocab_parallel_cross_entropy(logits, batch.response_ids)


def _micro_batches(batch: ResponseBatch, micro_batch_size: int | None) -> list[tuple[slice, ResponseBatch]]:
    size = batch.response_ids.shape[0]
    step = micro_batch_size or size
    return [(slice(start, start + step), batch.subset(slice(start, start + step))) for start in range(0, size, step)]


def _run_pipeline(model, micro: list[tuple[slice, ResponseBatch]], loss_of=None) -> list:
    """Megatron's pipeline schedule (1F1B) over the micro-batches; every stage of the pipeline calls it alike.

    Without `loss_of`, forward only: the last stage returns each micro-batch's log-probs, the others []. With
    `loss_of(rows, logprobs) -> loss`, also backward: the last stage returns {"loss", "logprobs"} per micro-batch.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    forward_only = loss_of is None
    batches = iter(micro)

    def forward_step(data_iterator, model):
        rows, sub = next(data_iterator)
        ids, positions, causal, where = _model_inputs(sub)
        # Only the first stage reads the ids; the others get the previous stage's activations from the schedule.
        output = model(input_ids=ids, position_ids=positions, attention_mask=causal)

        def loss_func(logits: torch.Tensor, non_loss_data: bool = False):
            logprobs = _response_logprobs(logits, sub, where)
            if forward_only:
                return logprobs.detach()
            loss = loss_of(rows, logprobs)
            # The schedule divides each micro-batch's loss by the number of micro-batches, and `loss_of` already
            # carries the step's normaliser: undo the division.
            return loss * len(micro), {"loss": loss.detach(), "logprobs": logprobs.detach()}

        return output, loss_func

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=batches,
        model=model,
        num_microbatches=len(micro),
        # Ignored with variable_seq_lengths (set for pp > 1): the stages exchange each activation's shape.
        seq_length=max(sub.prompt_ids.shape[1] + sub.response_ids.shape[1] for _, sub in micro),
        micro_batch_size=max(sub.response_ids.shape[0] for _, sub in micro),
        forward_only=forward_only,
        collect_non_loss_data=forward_only,
    )


def _from_last_stage(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as the last pipeline stage has it, on every stage (the others pass one of the same shape and dtype)."""
    from megatron.core import parallel_state

    pp_group, _, stages = _pp_group_info()
    if stages > 1:
        dist.broadcast(tensor, src=parallel_state.get_pipeline_model_parallel_last_rank(), group=pp_group)
    return tensor


def _place(parts: list[torch.Tensor], micro: list[tuple[slice, ResponseBatch]], shape, device) -> torch.Tensor:
    """The micro-batches' [b, t_i] log-probs in one [B, T] tensor, zero past each micro-batch's own length."""
    out = torch.zeros(shape, dtype=torch.float32, device=device)
    for (rows, _), part in zip(micro, parts):
        out[rows, : part.shape[1]] = part
    return out


def megatron_response_logprobs(model, batch: ResponseBatch, micro_batch_size: int | None = None) -> torch.Tensor:
    """Log-probs [B, T] of the response tokens under a Megatron `GPTModel`: `models.response_logprobs`'s result.

    Without pipeline parallelism, one forward (differentiable). With it, a forward-only pass of Megatron's schedule in
    micro-batches of `micro_batch_size` rows (default: one): the last stage computes the log-probs and broadcasts
    them, so every stage returns them (not differentiable; `megatron_reinforce_step` trains).
    """
    _, _, stages = _pp_group_info()
    if stages == 1 and micro_batch_size is None:
        ids, positions, causal, where = _model_inputs(batch)
        return _response_logprobs(model(input_ids=ids, position_ids=positions, attention_mask=causal), batch, where)
    micro = _micro_batches(batch, micro_batch_size)
    if stages == 1:
        parts = [megatron_response_logprobs(model, sub) for _, sub in micro]
    else:
        parts = _run_pipeline(model, micro)
    out = _place(parts, micro, batch.response_ids.shape, batch.response_ids.device)
    return _from_last_stage(out) if stages > 1 else out


# ----------------------------------------------------------------------------------------------- optimisation
def _sync_tied_embedding_grads(model) -> None:
    """With tied embeddings and pp > 1, sum the gradients of the embedding (first stage) and of its copy in the
    output layer (last stage), as Megatron's `finalize_model_grads` does: both copies then take the same step."""
    from megatron.core import parallel_state

    if not getattr(model, "share_embeddings_and_output_weights", False) or _pp_group_info()[2] == 1:
        return
    if parallel_state.is_rank_in_embedding_group():
        weight = model.shared_embedding_or_output_weight()
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())


def _grad_norm(model) -> torch.Tensor:
    """The global gradient norm over all TP shards and pipeline stages: sharded parameters counted on every TP rank,
    replicated ones once, and the last stage's copy of a tied embedding not at all (Megatron marks it `shared`)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    params = [p for p in model.parameters() if p.grad is not None]
    total = torch.zeros((), dtype=torch.float32, device=params[0].device if params else None)
    for p in params:
        if param_is_not_tensor_parallel_duplicate(p) and not getattr(p, "shared", False):
            total = total + p.grad.detach().float().pow(2).sum()
    if parallel_state.get_model_parallel_group().size() > 1:
        dist.all_reduce(total, group=parallel_state.get_model_parallel_group())
    return total.sqrt()


def megatron_reinforce_step(
    model,
    optimizer: torch.optim.Optimizer,
    batch: ResponseBatch,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    aggregation: str = "token_mean",
    micro_batch_size: int | None = None,
    max_grad_norm: float | None = None,
) -> dict[str, float]:
    """One REINFORCE optimiser step of a Megatron model: the trainer's `optimise`, on Megatron.

    Every tensor-parallel rank and pipeline stage passes the same batch. Data-parallel ranks pass their own
    responses: the loss is normalised by the count over all of them, and gradients are summed over the data-parallel
    group, so the step equals one on the concatenated batch. Under tensor parallelism the gradients of sharded weights
    are complete locally, and those of replicated weights (the norms) are identical on every rank because their inputs
    and the incoming gradients are (Megatron's column-parallel layers all-reduce the input gradient): no extra
    reduction. Under pipeline parallelism the micro-batches go through Megatron's 1F1B schedule, the last stage
    computes the loss, and the returned loss and gradient norm are those of the whole model on every rank.
    """
    from megatron.core import parallel_state

    dp_group = parallel_state.get_data_parallel_group()
    dp_size = dp_group.size()
    _, _, stages = _pp_group_info()
    count = loss_mask.sum() if aggregation == "token_mean" else (loss_mask.sum(-1) > 0).sum()
    count = count.float()
    if dp_size > 1:
        dist.all_reduce(count, group=dp_group)
    normalizer = count.clamp(min=1)

    def loss_of(rows: slice, logprobs: torch.Tensor) -> torch.Tensor:
        return reinforce_loss(
            logprobs, advantages[rows], loss_mask[rows, : logprobs.shape[1]], aggregation, normalizer
        )

    model.train()
    optimizer.zero_grad(set_to_none=True)
    micro = _micro_batches(batch, micro_batch_size)
    total_loss = torch.zeros((), dtype=torch.float32, device=batch.response_ids.device)
    if stages == 1:
        for rows, sub in micro:
            loss = loss_of(rows, megatron_response_logprobs(model, sub))
            loss.backward()
            total_loss += loss.detach().float()
    else:
        for out in _run_pipeline(model, micro, loss_of):  # [] except on the last stage
            total_loss += out["loss"].float()
        _from_last_stage(total_loss)
        _sync_tied_embedding_grads(model)
    if dp_size > 1:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=dp_group)
        dist.all_reduce(total_loss, group=dp_group)
    grad_norm = _grad_norm(model)
    if max_grad_norm is not None:
        # clip_grad_norm_'s rule, with the norm taken over all shards and stages.
        scale = (max_grad_norm / (grad_norm + 1e-6)).clamp(max=1.0)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.dtype))
    optimizer.step()
    return {LOSS: total_loss.item(), GRAD_NORM: grad_norm.item()}
