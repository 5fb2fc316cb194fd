"""FSDP2 building blocks for `model.backend: fsdp`: shard a Hugging Face causal LM over the ranks, load it rank by
rank, clip and step, gather full weights (generation, export) and save sharded checkpoints.

    torchrun --standalone --nproc_per_node 2 -m aligner.cli train --config run.yaml    # model.backend: fsdp

Every rank holds 1/world of each parameter, gradient and optimiser state, as a `DTensor` sharded on dim 0 (torch's
`fully_shard`, "FSDP2"). Each decoder layer is one FSDP unit: its parameters are all-gathered just before its
forward (and again for its backward) and freed after; its gradients are reduce-scattered after its backward. The
root unit holds the rest (embeddings, final norm, the head). Gradients are SUMMED over ranks, not averaged (FSDP2's
default): aligner's trainers divide each rank's loss by the count of the global batch (`distributed.py`), so the
sum is the single-process gradient.

One process (no torchrun) takes the same path on a process group of one rank (`init_process_group`), so the sharded
code, DCP checkpoints included, is the only code of the backend. The device mesh is the default group's world; gloo
runs it on the CPU, NCCL on CUDA.

Not composable with `aligner.modeling.llama_forward`: its fast path reads weights directly, without the module
calls whose hooks all-gather them; FSDP models must take transformers' forward (`is_sharded` tells them apart).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from aligner import distributed
from aligner.modeling.device import DTYPES

PRECISIONS = ("fp32", "bf16-mixed")
MODEL_KEY, OPTIMIZER_KEY = "model", "optimizer"


def init_process_group(device: torch.device) -> torch.device:
    """Join torchrun's process group, or, in a process torchrun did not start, make a group of one rank
    (`distributed.init(device, group_of_one=True)`). Returns the device this rank trains on. `fully_shard` and
    `torch.distributed.checkpoint` then run unchanged with one rank."""
    return distributed.init(device, group_of_one=True)


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` was sharded by `fully_shard` (its parameters are DTensors)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def reshard(model: nn.Module) -> nn.Module:
    """Free every unit's gathered parameters (`FSDPModule.reshard`), so `model.parameters()` are the DTensor shards
    again; returns `model`.

    FSDP2 keeps the ROOT unit's parameters gathered from its forward until the backward: after a forward under
    `torch.no_grad` (evaluation, reference log-probs, generation), which has no backward, `named_parameters` gives the
    root's full, unsharded tensors (in bfloat16 under bf16-mixed). An optimiser built then would hold those and never
    update the real shards (seen: the embedding and final norm silently frozen). The functions here that read
    parameters call it first; call it before building an optimiser on a model that has run forward."""
    for module in model.modules():
        if is_sharded(module):
            module.reshard()
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face causal LM: the modules whose class is named in `model._no_split_modules`
    (transformers' own list of blocks that must not be split over devices), else `model.model.layers`."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        layers = list(getattr(getattr(model, "model", None), "layers", None) or ())
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers found to shard (no _no_split_modules, no layers)")
    return layers


def shard_policy(
    model: nn.Module,
    precision: str = "fp32",
    cpu_offload: bool = False,
    activation_checkpointing: bool = False,
    device: torch.device | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Shard `model` in place with FSDP2 (`torch.distributed.fsdp.fully_shard`) over the default process group's
    world, one unit per decoder layer (`decoder_layers`) and the root; returns `model` (its class becomes an
    `FSDPModule` subclass, its parameters `DTensor`s sharded on dim 0, rows split as `torch.chunk` splits them).

    precision "bf16-mixed": `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`: the gathered
    parameters, and so every op of the forward, are bfloat16 (not autocast's mix: norms and softmax follow the
    model's own upcasts), gradients are reduced in float32 into the float32 shards. "fp32": no cast.
    cpu_offload: `CPUOffloadPolicy()`: shards, gradients and optimiser states stay in host memory, parameters go to
    the device for their unit's compute (a no-op on the CPU, where they already are).
    activation_checkpointing: transformers' `gradient_checkpointing_enable` (non-reentrant `torch.utils.checkpoint`
    per decoder layer), which FSDP2 composes with: the recomputation in the backward runs inside the unit's
    pre-backward all-gather. It also sends `grouped_response_logprobs` through transformers' forward.
    Tied weights (the head sharing the embedding's parameter) stay one parameter, in the root unit.
    reshard_after_forward (each layer unit's; FSDP2 keeps the root's gathered anyway): True frees a unit's gathered
    weights after its forward and gathers them again for its backward; False keeps them until the backward (one
    all-gather less a pass, the whole model gathered meanwhile: ZeRO-2's memory for the weights).
    `device`: the mesh's device type (default: where the parameters are; meta parameters: the CPU unless CUDA is
    initialised for this process). Needs a process group (`init_process_group`).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if not dist.is_initialized():
        raise RuntimeError("shard_policy needs a process group: call aligner.modeling.fsdp.init_process_group first")
    device_type = _mesh_device_type(model, device)
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy()
    if precision == "bf16-mixed":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if cpu_offload and device_type != "cpu" else OffloadPolicy()
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in decoder_layers(model):
        fully_shard(
            layer, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard_after_forward
        )
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    for module in model.modules():
        if is_sharded(module):
            # Sum, not FSDP2's mean over ranks: each rank's loss is already divided by the global batch's count.
            # A plain SUM reduction: a factor alone makes FSDP2 use PREMUL_SUM, which gloo lacks.
            divide = getattr(module, "set_gradient_divide_factor", None) or module.set_reduce_scatter_divide_factor
            divide(1.0)  # torch < 2.8 had only set_reduce_scatter_divide_factor
            if hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)
    return model


def offload_note(cpu_offload: bool, device: torch.device) -> str | None:
    """What a run warns about `model.fsdp.cpu_offload` on `device`, or None: on the CPU the shards already live in host
    memory, and torch refuses `CPUOffloadPolicy` on a CPU mesh, so the setting changes nothing there."""
    if cpu_offload and torch.device(device).type == "cpu":
        return "model.fsdp.cpu_offload: the shards are in host memory already on the CPU; the setting changes nothing"
    return None


def _mesh_device_type(model: nn.Module, device: torch.device | None) -> str:
    if device is not None:
        return torch.device(device).type
    param = next(model.parameters())
    if param.device.type != "meta":
        return param.device.type
    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


# --- Loading: each rank reads only its rows. ---


@dataclass
class LoadTally:
    """What `fill_from_safetensors` read on this rank: bytes in all, and the largest single read (bytes)."""

    bytes_read: int = 0
    largest_read: int = 0


def load_sharded_policy(
    policy_path: str | Path,
    device: torch.device,
    dtype: str | torch.dtype = "float32",
    precision: str = "fp32",
    cpu_offload: bool = False,
    activation_checkpointing: bool = False,
    attn_implementation: str = "eager",
    tally: LoadTally | None = None,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    file_name: Callable[[str], str | None] | None = None,
    whole: dict[str, torch.Tensor] | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """The policy folder's causal LM, sharded (`shard_policy`) with no rank ever holding a whole weight.

    The model is built on the meta device (`AutoModelForCausalLM.from_config` under `torch.device("meta")`: shapes,
    no storage), its parameters cast to `dtype`, sharded, given storage on `device` (`to_empty`), then each rank
    reads its own rows from the safetensors files (`fill_from_safetensors`), after the non-persistent buffers are
    recomputed (`recompute_buffers`). Needs a process group (`init_process_group`). Training mode, as
    `from_pretrained` leaves a model (eval mode) is not: call `.train()`. `tally` gets what this rank read.

    LoRA (`model.backend: fsdp` with `model.lora.r > 0`): `wrap` (peft's wrapper, `lora.wrap_with_lora`) is applied
    to the meta model before it is sharded, so each decoder layer's unit holds its frozen base weights and its
    adapters; its random draws are made on the meta device, under a forked RNG, and change nothing. `file_name` maps
    a parameter's name to its tensor's name in the files, None for a parameter they do not hold (`lora.file_name`),
    and `whole` gives those their whole initial values, of which each rank copies its rows (`fill_from_whole`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from aligner.modeling.hf import check_model_dir

    path = check_model_dir(policy_path)
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    config = AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
        if wrap is not None:
            with torch.random.fork_rng(devices=[]):
                model = wrap(model)
    for param in model.parameters():
        param.data = param.data.to(dtype)  # parameters only: buffers such as inv_freq stay float32
    shard_policy(model, precision, cpu_offload, activation_checkpointing, device, reshard_after_forward)
    offloaded = cpu_offload and device.type != "cpu"
    model.to_empty(device="cpu" if offloaded else device)
    recompute_buffers(model, device)  # first: re-initialising a module may touch its parameters too
    read = fill_from_safetensors(model, path, file_name)
    if whole is not None:
        fill_from_whole(model, whole)
    if tally is not None:
        tally.bytes_read, tally.largest_read = read.bytes_read, read.largest_read
    model.eval()
    return model


def shard_rows(num_rows: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of the rows of dim 0 that rank `rank` of `world` holds: `torch.chunk`'s split, which FSDP2 uses
    (chunks of ceil(rows / world); the last ranks may hold fewer rows, or none)."""
    size = math.ceil(num_rows / world) if num_rows else 0
    start = min(rank * size, num_rows)
    return start, min(start + size, num_rows)


def _safetensors_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (sharded folders list theirs in model.safetensors.index.json)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {name: path / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    where = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            where.update(dict.fromkeys(f.keys(), file))
    return where


@torch.no_grad()
def fill_from_safetensors(
    model: nn.Module, path: str | Path, file_name: Callable[[str], str | None] | None = None
) -> LoadTally:
    """Copy into each sharded parameter of `model` this rank's rows of the tensor of the same name in the folder's
    safetensors files, read with `safe_open(...).get_slice(name)[start:stop]` (only those bytes leave the file);
    cast to the parameter's dtype. A tied parameter is one parameter under its first name (the embedding's), which
    is the name such folders store. `file_name`: the name in the files of a parameter named otherwise (a peft
    wrapper's), None for one they do not hold (left as it is). Returns what this rank read."""
    from safetensors import safe_open

    path = Path(path)
    where = _safetensors_files(path)
    rank, world = dist.get_rank(), dist.get_world_size()
    tally = LoadTally()
    by_file: dict[Path, list[tuple[str, nn.Parameter]]] = {}
    for name, param in model.named_parameters():
        stored = name if file_name is None else file_name(name)
        if stored is None:
            continue
        if stored not in where:
            raise KeyError(f"{path}: no tensor {stored!r} in the safetensors files")
        by_file.setdefault(where[stored], []).append((stored, param))
    for file, params in by_file.items():
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name, param in params:
                local, start, stop = _local_rows(name, param, world, rank)
                if stop > start:
                    rows = f.get_slice(name)[start:stop]
                    tally.bytes_read += rows.numel() * rows.element_size()
                    tally.largest_read = max(tally.largest_read, rows.numel() * rows.element_size())
                    local.copy_(rows.view(local.shape))
    return tally


def _local_rows(name: str, param: torch.Tensor, world: int, rank: int) -> tuple[torch.Tensor, int, int]:
    """This rank's local tensor of `param` and the [start, stop) rows of the whole tensor it holds."""
    from torch.distributed.tensor import DTensor

    local = param.to_local() if isinstance(param, DTensor) else param.data
    num_rows = param.shape[0]
    start, stop = shard_rows(num_rows, world, rank) if isinstance(param, DTensor) else (0, num_rows)
    if local.shape[0] != stop - start:
        raise RuntimeError(f"{name}: local shard has {local.shape[0]} rows, expected {stop - start}")
    return local, start, stop


@torch.no_grad()
def fill_from_whole(model: nn.Module, whole: dict[str, torch.Tensor]) -> None:
    """Copy into each sharded parameter of `model` named in `whole` this rank's rows of its whole tensor there (the
    same on every rank: LoRA adapters initialised once, `FsdpLoraBackend`); every name must be a parameter."""
    params = dict(model.named_parameters())
    unknown = sorted(whole.keys() - params.keys())
    if unknown:
        raise KeyError(f"no parameters {unknown[:3]} in the sharded model")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, tensor in whole.items():
        local, start, stop = _local_rows(name, params[name], world, rank)
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise ValueError(f"{name}: whole tensor {tuple(tensor.shape)}, parameter {tuple(params[name].shape)}")
        if stop > start:
            local.copy_(tensor[start:stop])


@torch.no_grad()
def recompute_buffers(model: nn.Module, device: torch.device) -> None:
    """Recompute the non-persistent buffers (the rotary embedding's `inv_freq`) that `to_empty` left uninitialised:
    nothing in a checkpoint holds them. Each module owning one is re-initialised by transformers' `_init_weights`
    (what its own meta-device loading relies on), or, in versions whose `_init_weights` skips rotary modules, by
    the module's `rope_init_fn(config, device)`. The buffers are first filled with NaN, so one that neither
    recomputes is an error, not garbage. `_init_weights` may re-initialise the module's parameters as well: call it
    before the weights are loaded."""
    owners = [m for m in model.modules() if getattr(m, "_non_persistent_buffers_set", None)]
    for module in owners:
        for name in module._non_persistent_buffers_set:
            buffer = getattr(module, name)
            if buffer is not None and buffer.is_floating_point():
                buffer.fill_(float("nan"))
                buffer._is_hf_initialized = False
        module._is_hf_initialized = False
        init = getattr(model, "_init_weights", None)
        if init is not None:
            init(module)
        fn = getattr(module, "rope_init_fn", None)
        if fn is not None and torch.isnan(module.inv_freq).any():
            inv_freq, _ = fn(module.config, device)
            module.inv_freq.copy_(inv_freq)
            if "original_inv_freq" in module._buffers:
                module.original_inv_freq.copy_(inv_freq)
            elif hasattr(module, "original_inv_freq"):  # transformers 4: a plain attribute, left on the meta device
                module.original_inv_freq = module.inv_freq.clone()
        for name in module._non_persistent_buffers_set:
            buffer = getattr(module, name)
            if buffer is not None and buffer.is_floating_point() and torch.isnan(buffer).any():
                raise NotImplementedError(f"{type(module).__name__}.{name}: no way known to recompute this buffer")


# --- Optimisation ---


def clip_and_step(
    optimizer: torch.optim.Optimizer,
    parameters,
    max_grad_norm: float,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> torch.Tensor:
    """`aligner.trainers.loop.optimizer_step` for sharded parameters: clip the gradients to a global 2-norm of
    `max_grad_norm`, step the optimiser (then the scheduler, if given), drop the gradients; returns the norm before
    clipping, a plain 0-dim tensor, the same on every rank.

    The norm is over the whole gradient, every rank's shards: `torch.nn.utils.get_total_norm` of DTensor gradients is
    a DTensor pending a reduction over the mesh, `.full_tensor()` reduces it (sqrt of the summed squares), then
    `clip_grads_with_norm_` scales every shard by the same factor."""
    from torch.distributed.tensor import DTensor

    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_grad_norm, norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def prepare_pass(model: nn.Module, last: bool, sync_each_micro_batch: bool = True) -> None:
    """Set up `model` (sharded) for one forward-backward pass of an optimiser step's micro-batches: whether its
    backward reduce-scatters the gradients and frees the gathered weights (FSDP2's `set_requires_gradient_sync`,
    `set_reshard_after_backward`, on every unit). `sync_each_micro_batch`: every pass does (each micro-batch's
    gradients sharded at once); otherwise only the `last` pass, the others accumulating whole gradients (in the
    reduce dtype: float32 under bf16-mixed) on weights kept gathered, so a step takes one all-gather and one
    reduce-scatter whatever its number of micro-batches. Every rank must take as many passes, alike."""
    sync = sync_each_micro_batch or last
    model.set_requires_gradient_sync(sync)
    model.set_reshard_after_backward(sync)


# --- Full weights: generation refit and export ---


@dataclass
class GatherTally:
    """What `full_weights` held: the most bytes of gathered tensors alive at once, and the bytes it yielded."""

    peak_bytes: int = 0
    bytes_yielded: int = 0


def full_weights(
    model: nn.Module,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    tally: GatherTally | None = None,
    only: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for each parameter of `model` (names as `named_parameters` gives them: a tied weight once,
    under the embedding's name), gathered one at a time with `DTensor.full_tensor()` (an all-gather: EVERY rank
    must iterate it to the end, in step) and cast to `dtype` (default: its own) on `device`.

    Only one gathered parameter is alive inside the iterator at a time (in the shards' dtype, plus its cast while it
    is made): the full model in float32 never exists. What the caller keeps is its own business (a generation
    engine's copy, an export's dict); with one rank, and `dtype` and `device` the shards', a tensor may be a view
    of the live parameter (`full_tensor` of a 1-rank DTensor is its local tensor): clone what must outlive the next
    step. `tally.peak_bytes` gets the most bytes held at once by the iterator. `only`: gather just the parameters
    whose name it accepts (LoRA's adapters: the frozen base never changes); it must answer alike on every rank."""
    from torch.distributed.tensor import DTensor

    tally = tally if tally is not None else GatherTally()
    reshard(model)
    for name, param in model.named_parameters():
        if only is not None and not only(name):
            continue
        with torch.no_grad():
            if isinstance(param, DTensor):
                mesh_device = param.device_mesh.device_type
                if param.to_local().device.type != mesh_device:  # CPU-offloaded shards: gather on the mesh's device
                    param = param.to(mesh_device)
                full = param.full_tensor()
            else:
                full = param.detach()
            held = full.numel() * full.element_size()
            out = full.to(device=device, dtype=dtype or full.dtype)
            if out.data_ptr() != full.data_ptr():
                held += out.numel() * out.element_size()
            tally.peak_bytes = max(tally.peak_bytes, held)
            tally.bytes_yielded += out.numel() * out.element_size()
            del full
        yield name, out


def export_hf(
    model: nn.Module,
    folder: str | Path,
    tokenizer=None,
    dtype: torch.dtype | None = None,
    transform: Callable[[Iterator[tuple[str, torch.Tensor]]], Iterator[tuple[str, torch.Tensor]]] | None = None,
) -> GatherTally:
    """Write `model` as a Hugging Face folder that `AutoModelForCausalLM.from_pretrained(folder)` loads: config.json
    (+ generation_config.json), model.safetensors and the tokenizer, from rank 0. Every rank must call it (the
    weights are gathered with `full_weights`, into host memory; rank 0 keeps them, in `dtype`, default the
    parameters' own). A tied head is not written: the config says it is tied, as `save_pretrained` does. Returns
    the gather's tally. `transform`: maps the stream of gathered (name, tensor) to the one written, in the
    parameters' dtype before the cast to `dtype` (LoRA: `lora.merged_weights`, the adapters merged into plain
    Hugging Face weights); every rank runs it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    tally = GatherTally()
    main = dist.get_rank() == 0 if dist.is_initialized() else True
    state = {}
    stream = full_weights(model, None if transform else dtype, "cpu", tally)
    if transform is not None:
        stream = ((name, tensor.to(dtype or tensor.dtype)) for name, tensor in transform(stream))
    for name, tensor in stream:
        if main:
            state[name] = tensor.contiguous()
    if main:
        folder.mkdir(parents=True, exist_ok=True)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        config = model.config
        saved_dtype = getattr(config, "dtype", None)
        config.dtype = next(iter(state.values())).dtype if state else saved_dtype
        config.save_pretrained(str(folder))
        config.dtype = saved_dtype
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(folder))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder))
    distributed.barrier()
    return tally


# --- Sharded checkpoints (torch.distributed.checkpoint) ---


def save_checkpoint(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, folder: str | Path, trained_only: bool = False
) -> None:
    """Save the model's (and optimiser's) sharded state into `folder` with `torch.distributed.checkpoint.save`: each
    rank writes its own shards (files __<rank>_0.distcp) and rank 0 the metadata (.metadata). Every rank must call
    it. The state comes from `torch.distributed.checkpoint.state_dict.get_state_dict`, which keys the optimiser's
    state by parameter name, so a checkpoint loads into another world size (`load_checkpoint` reshards).
    `trained_only`: leave out the frozen parameters (LoRA's base, which the policy folder holds); load it with the
    same setting."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    reshard(model)
    options = _state_dict_options(trained_only)
    if optimizer is None:
        state = {MODEL_KEY: get_model_state_dict(model, options=options)}
    else:
        model_state, optim_state = get_state_dict(model, optimizer, options=options)
        state = {MODEL_KEY: model_state, OPTIMIZER_KEY: optim_state}
    dcp.save(state, checkpoint_id=str(folder))


def load_checkpoint(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, folder: str | Path, trained_only: bool = False
) -> None:
    """Load a `save_checkpoint` folder into `model` (and `optimizer`), sharded at any world size, the one it was saved
    at or another: `dcp.load` fills the state dicts `get_state_dict` gives for the current sharding, reading each
    rank's rows from whichever files hold them, and `set_state_dict` puts them in. Every rank must call it. An
    optimiser that has not stepped yet gets its state made first (get_state_dict does that). `trained_only`: as the
    folder was saved; the frozen parameters keep their values (DCP still refuses a folder lacking a trained one)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    reshard(model)
    options = _state_dict_options(trained_only)
    if optimizer is None:
        state = {MODEL_KEY: get_model_state_dict(model, options=options)}
        dcp.load(state, checkpoint_id=str(folder))
        set_model_state_dict(model, state[MODEL_KEY], options=options)
        return
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    state = {MODEL_KEY: model_state, OPTIMIZER_KEY: optim_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(
        model, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIMIZER_KEY], options=options
    )


def _state_dict_options(trained_only: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Not strict when the frozen parameters are left out: the model's own state dict would miss them.
    return StateDictOptions(ignore_frozen_params=trained_only, strict=not trained_only)
