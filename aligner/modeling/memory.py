"""Memory planning: the bytes one process of a run holds, by backend and number of processes, without loading weights.

    shape = model_shape("models/sft")                      # config.json on the meta device + safetensors headers
    plan = estimate_for_config(train_config, world_size=2)   # -> MemoryEstimate: device and host bytes, by part
    print(format_table(planning_table()))                    # 1B / 8B / 70B Llama on 8 x 80 GB

The contract: every figure is an estimate from the formulas below (each function's docstring gives its formula and
source), made for Aligner's own arrangement of the training state (aligner/trainers/reinforce.py): the policy's
weights in `model.dtype` with AdamW's two moments in the same dtype (torch keeps optimiser state like its parameter),
`model.precision: bf16-mixed` computing under autocast on those float32 weights (so they are the master weights:
there is no other copy), the reference policy kept in host memory and moved to the device only for its pass
(aligner/modeling/reference.py; none with LoRA), generation on its own bfloat16 copy with bf16-mixed (aligner/
generation/engines.py). A step has three phases; the device's peak is what stays for the whole step plus the largest
of the phases' own: generation (its KV cache), the reference pass (the reference's weights) and training (gradients,
autocast's cast weights, FSDP's gathered units, activations). Pure: nothing here touches a device except
`device_memory`, which asks.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aligner.config import TrainConfig

GB = 1e9  # decimal gigabytes, as GPU memory is sold (an "80 GB" H100 holds 79.6e9 usable bytes: see `device_memory`)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# safetensors dtype names -> bytes: only the count of elements is used, the names just have to be known.
_SAFETENSORS_DTYPES = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"}
# aligner/modeling/logprobs.py computes the log-prob head a chunk of ~8M float32 logits at a time: the logits cost
# a chunk and its softmax, never more, however long micro-batch x sequence x vocabulary.
LOGITS_CHUNK_VALUES = 1 << 23
BACKENDS = ("hf", "fsdp", "megatron")


@dataclass(frozen=True)
class ModelShape:
    """What the formulas need of a causal LM: its parameter count and the sizes its activations follow."""

    parameters: int  # every parameter once (tied embeddings once), as `sum(p.numel() for p in model.parameters())`
    layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    layer_parameters: int  # one decoder layer's: what FSDP gathers per unit
    # (module name, in_features, out_features) of every nn.Linear: what LoRA can target.
    linears: tuple[tuple[str, int, int], ...] = field(default=(), repr=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def root_parameters(self) -> int:
        """Parameters outside the decoder layers (embeddings, final norm, LM head): FSDP's root unit."""
        return self.parameters - self.layers * self.layer_parameters


def shape_from_config(config: Any) -> ModelShape:
    """The shape of the causal LM a transformers `config` describes, built on the meta device: no memory, no
    weights (`AutoModelForCausalLM.from_config` under `torch.device("meta")`)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(text.num_hidden_layers)
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers]
    layer = sum(p.numel() for p in stacks[0][0].parameters()) if stacks else 0
    heads = int(text.num_attention_heads)
    linears = tuple(
        (name, m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    )
    return ModelShape(
        parameters=sum(p.numel() for p in model.parameters()),
        layers=layers,
        hidden_size=int(text.hidden_size),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        vocab_size=int(text.vocab_size),
        layer_parameters=layer,
        linears=linears,
    )


def safetensors_header(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in the folder's *.safetensors files, read from their headers alone (the format: an
    8-byte little-endian header length, then a JSON header giving each tensor's dtype and shape). ValueError when
    there are none or a header cannot be read."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} holds no *.safetensors file")
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        with path.open("rb") as handle:
            head = handle.read(8)
            if len(head) != 8:
                raise ValueError(f"{path.name} is not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", head)
            if length > 100 * 1024 * 1024:
                raise ValueError(f"{path.name}: a header of {length} bytes is not believable")
            try:
                header = json.loads(handle.read(length))
                for name, entry in header.items():
                    if name == "__metadata__":
                        continue
                    if entry["dtype"] not in _SAFETENSORS_DTYPES:
                        raise ValueError(f"unknown dtype {entry['dtype']!r}")
                    shapes[name] = tuple(int(n) for n in entry["shape"])
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise ValueError(f"{path.name}: unreadable safetensors header ({err})") from None
    return shapes


def safetensors_parameters(folder: str | Path) -> int:
    """Elements stored in the folder's *.safetensors files (`safetensors_header`): the model's parameters, tied
    weights once, as transformers saves them once."""
    return sum(math.prod(shape) for shape in safetensors_header(folder).values())


# A decoder layer's tensors: "<stack>.<index>.<rest>", the stack named as transformers' models name it.
_LAYER_NAME = re.compile(r"^(.*?\b(?:layers|h|blocks|layer))\.(\d+)\.")


def _config_size(config: dict[str, Any], *names: str) -> int:
    for name in names:
        if isinstance(config.get(name), int):
            return config[name]
    raise ValueError(f"config.json does not state {names[0]}")


def model_shape(folder: str | Path) -> ModelShape:
    """The shape of the model in a Hugging Face folder without loading anything heavy (no torch: the API calls it):
    sizes from its config.json (the text model's, for a multimodal config), parameters, one decoder layer's and the
    2-D weights LoRA can target from its safetensors headers, what will be loaded. ValueError when either is
    unreadable or the config leaves a size unstated."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder}: unreadable config.json ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{folder}: config.json is not an object")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = _config_size(text, "num_hidden_layers", "n_layer", "num_layers")
    heads = _config_size(text, "num_attention_heads", "n_head")
    shapes = safetensors_header(folder)
    stacks: dict[str, dict[int, int]] = {}
    for name, shape in shapes.items():
        if match := _LAYER_NAME.match(name):
            per_layer = stacks.setdefault(match.group(1), {})
            index = int(match.group(2))
            per_layer[index] = per_layer.get(index, 0) + math.prod(shape)
    parameters = sum(math.prod(shape) for shape in shapes.values())
    stack = max(stacks.values(), key=len, default={})
    layer = stack.get(0, parameters // max(layers, 1))
    linears = tuple(
        (name.removesuffix(".weight"), shape[1], shape[0])
        for name, shape in shapes.items()
        if name.endswith(".weight") and len(shape) == 2
    )
    return ModelShape(
        parameters=parameters,
        layers=layers,
        hidden_size=_config_size(text, "hidden_size", "n_embd", "d_model"),
        num_attention_heads=heads,
        num_key_value_heads=text.get("num_key_value_heads") or heads,
        vocab_size=_config_size(text, "vocab_size"),
        layer_parameters=layer,
        linears=linears,
    )


def lora_parameters(shape: ModelShape, r: int, target_modules: Iterable[str]) -> int:
    """Parameters LoRA adds (the only trainable ones): r x (in + out) for each nn.Linear whose name is a target or
    ends with "." + a target (peft's rule for a list of names, aligner/modeling/lora.py): A is r x in, B is out x r
    (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", section 4.1)."""
    targets = list(target_modules)
    total = 0
    for name, fan_in, fan_out in shape.linears:
        if any(name == t or name.endswith("." + t) for t in targets):
            total += r * (fan_in + fan_out)
    return total


def activation_bytes(
    shape: ModelShape,
    tokens: int,
    seq_len: int,
    compute_bytes: int,
    checkpointing: bool,
    tensor_parallel: int = 1,
    layers: int | None = None,
    attention_scores: bool = True,
) -> int:
    """Bytes of the activations kept for the backward of one micro-batch of `tokens` tokens (rows x `seq_len`).

    Per layer and token, Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    eq. 1-2) count h x (34 + 5 a s / h) bytes for 16-bit activations (h hidden size, a heads, s sequence length),
    and h x (10 + 24 / t + 5 a s / (h t)) under tensor parallelism t; the 5 a s term is the attention scores,
    softmax and its dropout mask, which an eager attention keeps (Aligner's default `attn_implementation`) and a
    fused one does not (`attention_scores=False`). Their 34 counts a GPT layer with a 4h MLP; Llama's SwiGLU MLP is
    of the same order: an approximation, not a count. float32 compute doubles it (x compute_bytes / 2). With
    activation checkpointing (full recomputation) a layer keeps only its input, 2 h bytes a token in 16-bit, and one
    layer's full activations live again during its recomputation. Add the last hidden states and the log-prob
    head's float32 logits and their softmax, a chunk of at most LOGITS_CHUNK_VALUES at a time.
    """
    h, a, t = shape.hidden_size, shape.num_attention_heads, tensor_parallel
    layers = shape.layers if layers is None else layers
    scores = 5 * a * seq_len / t if attention_scores else 0.0
    full = tokens * (h * (10 + 24 / t) + scores) * compute_bytes / 2  # one layer, kept whole
    # Checkpointing keeps each layer's input (2 h bytes a token in 16-bit) and one layer whole while it recomputes.
    kept = layers * tokens * 2 * h * compute_bytes / 2 + full if checkpointing else layers * full
    logits = 2 * 4 * min(tokens * shape.vocab_size, LOGITS_CHUNK_VALUES)
    return int(kept + tokens * h * compute_bytes + logits)


def kv_cache_bytes(shape: ModelShape, rows: int, seq_len: int, dtype_bytes: int) -> int:
    """The decoder's KV cache: 2 (keys and values) x layers x KV heads x head size x dtype bytes per token, for
    `rows` sequences of `seq_len` tokens (aligner/generation/llama_decoder.py preallocates it whole)."""
    return 2 * shape.layers * shape.num_key_value_heads * shape.head_dim * dtype_bytes * rows * seq_len


@dataclass(frozen=True)
class MemoryEstimate:
    """One process's memory: `device` and `host` parts (name -> bytes), and the device's peak over a step."""

    backend: str
    world_size: int
    device: dict[str, int]  # parts held on the device; those named in `phases` only during their phase
    host: dict[str, int]
    phases: dict[str, tuple[str, ...]]  # phase -> the device parts that live only during it
    trainable_parameters: int

    @property
    def persistent_bytes(self) -> int:
        passing = {part for parts in self.phases.values() for part in parts}
        return sum(v for k, v in self.device.items() if k not in passing)

    @property
    def per_rank_bytes(self) -> int:
        """The device's peak: what stays all step plus the largest phase's own parts."""
        peaks = [sum(self.device[p] for p in parts) for parts in self.phases.values()] or [0]
        return self.persistent_bytes + max(peaks)

    @property
    def host_bytes(self) -> int:
        return sum(self.host.values())

    def fits(self, device_bytes: float) -> bool:
        return self.per_rank_bytes <= device_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "world_size": self.world_size,
            "per_rank_bytes": self.per_rank_bytes,
            "host_bytes_per_rank": self.host_bytes,
            "trainable_parameters": self.trainable_parameters,
            "device_parts": dict(self.device),
            "host_parts": dict(self.host),
        }


def training_memory(
    shape: ModelShape,
    *,
    backend: str = "hf",
    world_size: int = 1,
    dtype: str = "float32",
    precision: str = "fp32",
    lora_r: int = 0,
    lora_targets: Iterable[str] = (),
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    micro_batch_size: int = 8,
    seq_len: int = 576,
    generation_rows: int = 32,
    generation_engine: str = "torch",
    vllm_kv_cache_bytes: int = 256 << 20,
    async_rollouts: bool = False,
    attention_scores: bool = True,
    shard_copies: bool = False,
    reshard_after_forward: bool = True,
    sync_each_micro_batch: bool = True,
) -> MemoryEstimate:
    """One process's bytes for training `shape` with `backend` on `world_size` processes.

    N parameters, T trainable (N, or LoRA's adapters: `lora_parameters`), w bytes per element of `dtype`:
    - weights N w, gradients T w, AdamW's two moments 2 T w (Loshchilov and Hutter 2019; torch keeps them in the
      parameter's dtype). In float32 that is 16 bytes a parameter: ZeRO's count for mixed-precision Adam
      (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", section 3.1:
      2 + 2 fp16 weights and gradients + 12 fp32 master weights and moments) reached another way, as Aligner's
      bf16-mixed keeps no 16-bit weights but casts under autocast. Gradients live only in the training phase
      (aligner/trainers/loop.py drops them after each step).
    - bf16-mixed: autocast's cache of bfloat16 casts of the trainable weights during the forward and backward,
      2 T (torch.autocast caches casts of leaf tensors that require grad), and generation's own bfloat16 copy,
      2 N (aligner/generation/engines.py; also `async_rollouts`, in w). vLLM holds its own copy and its KV cache.
    - the reference policy: N x (2 with bf16-mixed, else w) in host memory, on the device only during its pass
      (aligner/modeling/reference.py); nothing with LoRA (the base with adapters off is the reference).
    - generation's KV cache (`kv_cache_bytes`) for `generation_rows` sequences; activations (`activation_bytes`)
      for one micro-batch of micro_batch_size x seq_len tokens.
    Backends:
    - hf: every process holds all of it (data parallel, as DDP).
    - fsdp: weights, gradients and moments / world_size (FSDP2 shards each parameter over the processes: the
      PyTorch FSDP docs, and ZeRO stage 3's (2 + 2 + K) N / Nd), plus the gathered units at once: the root (embedding
      and LM head) and two decoder layers (the one computing and the one prefetched) in the compute dtype, and one
      layer's unsharded gradient in float32 before its reduce-scatter. `reshard_after_forward=False` keeps every layer
      gathered from its forward to its backward: all N weights in the compute dtype during a pass (ZeRO-2's
      weights). `sync_each_micro_batch=False` keeps them gathered over the step's micro-batches and accumulates the
      whole gradient, T x (4 under bf16-mixed: FSDP2 accumulates in the reduce dtype, float32; else w), before its
      one reduce-scatter. Generation works on full weights (the config's
      contract), so its copy (compute dtype) stays whole. With cpu_offload the shards, their gradients and moments
      live in host memory (torch's CPUOffloadPolicy): the device holds the gathered units, activations and
      generation's weights.
    - megatron: weights, gradients and moments / (TP x PP) (Shoeybi et al. 2019, Narayanan et al. 2021: each of TP
      ranks holds 1/TP of every layer, each of PP stages 1/PP of the layers; no distributed optimiser), activations
      with Korthikanti's tensor-parallel count, the first stage holding PP micro-batches of its L/PP layers (1F1B),
      and a whole HF replica in model.dtype on every rank, which generates and is refit after each step.
    `shard_copies`: what generation's weights and the reference would cost sharded like the training state (over
    world_size for fsdp, TP x PP for megatron): a planning figure for a design Aligner does not have yet.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (one of {', '.join(BACKENDS)})")
    n, w = shape.parameters, DTYPE_BYTES[dtype]
    mixed = precision == "bf16-mixed"
    compute = 2 if mixed else w
    adapters = lora_parameters(shape, lora_r, lora_targets) if lora_r > 0 else 0
    trainable = adapters or n
    tokens = micro_batch_size * seq_len
    device: dict[str, int] = {}
    host: dict[str, int] = {}
    phases: dict[str, tuple[str, ...]] = {"generation": ("kv_cache",), "reference": (), "training": ()}

    def state(share: float) -> dict[str, int]:
        return {
            "weights": int((n + adapters) * w / share),
            "gradients": int(trainable * w / share),
            "optimizer": int(2 * trainable * w / share),
        }

    split = {"hf": 1, "fsdp": world_size, "megatron": tensor_parallel * pipeline_parallel}[backend]
    copies = split if shard_copies else 1  # how many ways generation's weights and the reference are split
    if backend == "megatron":
        device.update(state(split))
        device["hf_replica"] = n * w // copies  # generation's model: every rank's own, refit after each step
        layers_held = (shape.layers // pipeline_parallel) * pipeline_parallel
        device["activations"] = activation_bytes(
            shape, tokens, seq_len, compute, False, tensor_parallel, layers_held, attention_scores
        )
    else:
        shards = state(world_size if backend == "fsdp" else 1)
        if backend == "fsdp" and cpu_offload:
            host.update({f"{k}_shard": v for k, v in shards.items()})
        else:
            device.update(shards)
        if backend == "fsdp":
            gathered = shape.root_parameters + 2 * shape.layer_parameters
            if not (reshard_after_forward and sync_each_micro_batch):
                gathered = n + adapters
            device["gathered_units"] = gathered * compute + shape.layer_parameters * 4
            if not sync_each_micro_batch:
                device["unsharded_gradients"] = trainable * (4 if mixed else w)
        if mixed and backend == "hf":  # FSDP's mixed precision gathers bfloat16 units instead (above)
            device["autocast_weights"] = 2 * trainable
        device["activations"] = activation_bytes(
            shape, tokens, seq_len, compute, activation_checkpointing, 1, None, attention_scores
        )
        if backend == "fsdp" or mixed or async_rollouts or generation_engine == "vllm":
            device["generation_weights"] = n * compute // copies
    if generation_engine == "vllm":
        device["kv_cache"] = vllm_kv_cache_bytes  # reserved for the whole run
        phases["generation"] = ()
    else:
        device["kv_cache"] = kv_cache_bytes(shape, generation_rows, seq_len, compute)
    if not adapters:
        reference = n * (2 if mixed else w) // copies
        host["reference"] = reference
        device["reference"] = reference
        phases["reference"] = ("reference",)
    train = ["activations"]
    train += [part for part in ("gradients", "gathered_units", "unsharded_gradients") if part in device]
    if "autocast_weights" in device:
        train.append("autocast_weights")
    phases["training"] = tuple(train)
    return MemoryEstimate(backend, world_size, device, host, phases, trainable)


def estimate_for_config(config: TrainConfig, world_size: int, shape: ModelShape | None = None) -> MemoryEstimate:
    """`training_memory` for a resolved TrainConfig run on `world_size` processes: its policy folder's shape (or
    `shape`), backend, dtypes, LoRA, micro-batch and the longest sequence (data.max_prompt_length +
    generation.max_new_tokens); generation's rows are a data-parallel rank's share of the step's samples, at most
    generation.batch_size prompts at once. Not counted: an in-process reward model (reward.model_path), the extra
    validation rewards' models and a PPO critic server started beside the trainer."""
    model = config.model
    shape = shape or model_shape(model.policy_path)
    reinforce = config.reinforce
    # Prompts go by data-parallel rank: the ranks of one Megatron TP x PP group sample the same rollouts.
    group = model.tensor_model_parallel_size * model.pipeline_model_parallel_size if model.backend == "megatron" else 1
    data_parallel = max(1, world_size // group)
    prompts = min(math.ceil(reinforce.num_prompts_per_step / data_parallel), config.generation.batch_size)
    return training_memory(
        shape,
        backend=model.backend,
        world_size=world_size,
        dtype=model.dtype,
        precision=model.precision,
        lora_r=model.lora.r,
        lora_targets=model.lora.target_modules,
        activation_checkpointing=model.activation_checkpointing,
        cpu_offload=model.fsdp.cpu_offload,
        reshard_after_forward=model.fsdp.reshard_after_forward,
        sync_each_micro_batch=model.fsdp.sync_each_micro_batch,
        tensor_parallel=model.tensor_model_parallel_size,
        pipeline_parallel=model.pipeline_model_parallel_size,
        micro_batch_size=config.optim.micro_batch_size,
        seq_len=config.data.max_prompt_length + config.generation.max_new_tokens,
        generation_rows=prompts * reinforce.num_rollouts_per_prompt,
        generation_engine=config.generation.engine,
        vllm_kv_cache_bytes=config.generation.kv_cache_memory_mb << 20,
        async_rollouts=config.trainer.async_rollouts > 0,
        attention_scores=model.attn_implementation == "eager",
    )


@dataclass(frozen=True)
class DeviceMemory:
    """The memory of one worker device: bytes, where the figure came from, and whether a job's processes share it
    (a CPU host's RAM) or each has its own (a GPU each)."""

    bytes: int
    source: str
    shared: bool


def device_memory(declared_gb: float | None = None) -> DeviceMemory:
    """`declared_gb` (ALIGNER_WORKER_DEVICE_MEMORY_GB: one device each process) when given, else measured here: CUDA
    device 0's total memory (`cuda_device_memory`), else this host's RAM (shared by all of a job's processes)."""
    if declared_gb is not None:
        return DeviceMemory(int(declared_gb * GB), "declared", shared=False)
    cuda = cuda_device_memory()
    if cuda is not None:
        return DeviceMemory(cuda[0], f"measured: {cuda[1]}", shared=False)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceMemory(int(ram), "measured: host RAM", shared=True)


def cuda_device_memory() -> tuple[int, str] | None:
    """(total bytes, name) of CUDA device 0 (the first of CUDA_VISIBLE_DEVICES), asked of `nvidia-smi` rather than
    torch, which the API does not load; None without an NVIDIA GPU or driver."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[0].strip() if visible is not None else "0"
    if not first or first.startswith("-"):
        return None  # CUDA_VISIBLE_DEVICES hides every device
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total,name", "--format=csv,noheader,nounits", "-i", first],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        mib, name = out.strip().splitlines()[0].split(",", 1)
        return int(mib) * (1 << 20), name.strip()
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def needed_bytes(estimate: MemoryEstimate, device: DeviceMemory) -> int:
    """What `device` must hold for the job: one process's peak on its own device, or, where the processes share the
    host's RAM, every process's device and host parts together."""
    if device.shared:
        return estimate.world_size * (estimate.per_rank_bytes + estimate.host_bytes)
    return estimate.per_rank_bytes


# ----------------------------------------------------------------------------------------------- planning table

# Llama 3.2 1B, Llama 3.1 8B and Llama 3.1 70B (their published config.json sizes).
LLAMA_SHAPES = {
    "1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
    "70B": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}  # fmt: skip

# (label, backend, training_memory's settings) of the table's rows; megatron refuses bf16-mixed: float32 there.
PLAN_SETUPS = (
    ("hf (DDP)", "hf", {}),
    ("fsdp", "fsdp", {}),
    ("fsdp + cpu_offload", "fsdp", {"cpu_offload": True}),
    ("megatron TP=8", "megatron", {"tensor_parallel": 8, "precision": "fp32"}),
)


def llama_shape(name: str) -> ModelShape:
    """The shape of a Llama of `LLAMA_SHAPES` (built on the meta device)."""
    from transformers import LlamaConfig

    return shape_from_config(LlamaConfig(**LLAMA_SHAPES[name]))


def planning_table(
    models: Iterable[str] = ("1B", "8B", "70B"),
    devices: int = 8,
    device_gb: float = 80.0,
    precision: str = "bf16-mixed",
    micro_batch_size: int = 1,
    seq_len: int = 1024,
    generation_rows: int = 32,
    activation_checkpointing: bool = True,
) -> list[dict[str, Any]]:
    """Per-rank device GB of each Llama of `models` under each of PLAN_SETUPS on `devices` x `device_gb` GB
    (`training_memory`, float32 weights with `precision`, full fine-tuning), and whether it fits. Each row: model,
    parameters, setup, per_rank_gb, host_gb (per rank), generation_gb (the part that is generation's own weights:
    the replica every backend keeps whole), fits, and sharded_copies_gb / sharded_copies_fit: the same with
    generation's weights and the reference sharded like the training state (`shard_copies`)."""
    rows = []
    for name in models:
        shape = llama_shape(name)
        for label, backend, extra in PLAN_SETUPS:
            settings = {"precision": precision, **extra}
            common = dict(
                backend=backend,
                world_size=devices,
                micro_batch_size=micro_batch_size,
                seq_len=seq_len,
                generation_rows=generation_rows,
                activation_checkpointing=activation_checkpointing,
                **settings,
            )
            plan = training_memory(shape, **common)
            sharded = training_memory(shape, shard_copies=True, **common).per_rank_bytes
            replica = plan.device.get("generation_weights", 0) + plan.device.get("hf_replica", 0)
            rows.append(
                {
                    "model": name,
                    "parameters": shape.parameters,
                    "setup": label,
                    "per_rank_gb": plan.per_rank_bytes / GB,
                    "host_gb": plan.host_bytes / GB,
                    "generation_gb": replica / GB,
                    "fits": plan.per_rank_bytes <= device_gb * GB,
                    "sharded_copies_gb": sharded / GB,
                    "sharded_copies_fit": sharded <= device_gb * GB,
                }
            )
    return rows


def format_table(rows: list[dict[str, Any]], device_gb: float = 80.0) -> str:
    """`planning_table`'s rows as a Markdown table."""
    lines = [
        f"| model | parameters | setup | GB per rank | of which generation's weights | host GB per rank | "
        f"fits {device_gb:g} GB | GB per rank, copies sharded | fits so |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['parameters'] / 1e9:.2f}B | {row['setup']} | {row['per_rank_gb']:.1f} | "
            f"{row['generation_gb']:.1f} | {row['host_gb']:.1f} | {'yes' if row['fits'] else 'no'} | "
            f"{row['sharded_copies_gb']:.1f} | {'yes' if row['sharded_copies_fit'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(format_table(planning_table()), end="")
