"""The trained policy behind one small interface, whatever holds its weights (docs/scaling.md "Backends").

- `hf`: the Hugging Face model itself, whole on every rank; gradients summed over ranks after the backward (DDP).
- `lora`: the same with peft adapters (`model.lora.r > 0`): only they train, the base doubles as the reference.
- `fsdp`: FSDP2 shards of the HF model train (each rank 1/world of every weight, gradient and AdamW state); a whole
  copy in the compute dtype generates and is refit from them after every step. `FsdpLoraBackend` with adapters.
- `megatron`: a Megatron-Core GPTModel shard trains (tensor/pipeline parallel); the HF model is refit from it after
  every step, for generation and checkpoints.

The REINFORCE and PPO trainers call the backend and never ask which one it is. Their lifecycle:

    backend = build_backend(config, device)
    policy = backend.load()                    # the HF module generation and the reference start from
    reference = backend.reference()            # the KL's anchor: the initial weights, before any checkpoint
    backend.prepare()                          # what trains is built (activation checkpointing, Megatron model)
    optimizer = adamw(backend.trainable_parameters(), ...)
    for micro_batch in backend.passes(micro_batches):   # every rank as many passes (sharded forwards are collectives)
        ...  loss of a forward of `backend.trained` on it, backward
    grad_norm = backend.step(optimizer, max_grad_norm)    # gradients reduced over ranks, clipped, one AdamW step
    backend.refit(generator)                   # the engine takes the new weights
    entries = backend.save(folder, optimizer, tokenizer)  # every rank: its part of a checkpoint; entries of its state
    loaded = backend.read(folder, state); backend.apply(folder, loaded, optimizer)   # resume, in two halves
    backend.export(folder, tokenizer)          # every rank: the final policy as a plain Hugging Face folder

Anchors: NeMo-Aligner's model hooks (`prepare_for_training_step`, `finish_training_step`, `get_loss_and_metrics`)
and its checkpoint callback; torchtune's checkpointer object. The checkpoint folder's common parts (state file,
RNG, atomic commit) stay the trainer's (aligner/trainers/checkpoint.py): a backend writes only its weights and
optimiser state, and reads back only what it wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from aligner import distributed
from aligner.config import TrainConfig
from aligner.durable import fsync_file
from aligner.errors import ConfigError
from aligner.metrics import MEMORY_REFIT_PEAK
from aligner.modeling.device import compute_dtype
from aligner.modeling.hf import load_policy, save_policy
from aligner.modeling.reference import ReferencePolicy
from aligner.run_layout import ADAPTER_DIR, MEGATRON_OPTIMIZER_FILE
from aligner.trainers.checkpoint import reading
from aligner.trainers.loop import optimizer_step

T = TypeVar("T")
POLICY_DIR = "policy"  # a checkpoint's Hugging Face folder of the policy (the LoRA backend's is ADAPTER_DIR)
BACKEND_KEY = "backend"  # the state file's record of the backend that wrote it
FSDP_DIR = "fsdp"  # backend fsdp: the torch.distributed.checkpoint folder of the shards and their AdamW state


class HfBackend:
    """`model.backend: hf`: the Hugging Face model trains whole on every rank; after the backward its gradients are
    summed over the ranks (`distributed.all_reduce_gradients`), so every rank takes the one-process step."""

    name = "hf"
    steps_itself = False  # MegatronBackend takes the whole rollout instead (`reinforce_step`)
    autocasts = True  # the training forward runs under model.precision's autocast (FSDP2 casts by itself)

    def __init__(self, config: TrainConfig):
        self.config = config
        self.device: torch.device | None = None  # `init_parallel`'s
        self.policy: nn.Module | None = None

    @classmethod
    def around(cls, config: TrainConfig, policy: nn.Module) -> HfBackend:
        """A backend for a policy that is already loaded (tests, and trainers that build their own)."""
        backend = cls(config)
        backend.device, backend.policy = next(policy.parameters()).device, policy
        return backend

    # ------------------------------------------------------------------------------------------------- build
    def init_parallel(self, device: torch.device) -> torch.device:
        """Join the process groups this backend trains over (torchrun's, `distributed.init`); the device this rank
        trains on."""
        self.device = distributed.init(device)
        return self.device

    def load(self) -> nn.Module:
        model = self.config.model
        self.policy = load_policy(model.policy_path, model.dtype, self.device, model.attn_implementation)
        return self.policy

    def reference(self):
        """The frozen initial policy (built before any checkpoint is applied: the KL is always to the SFT policy)."""
        return ReferencePolicy(self.policy, compute_dtype(self.config.model.precision))

    def prepare(self) -> None:
        if self.config.model.activation_checkpointing:
            self.policy.gradient_checkpointing_enable()

    @property
    def trained(self) -> nn.Module:
        """The module whose forward the loss runs (and whose log-probs a rollout takes when it computes them)."""
        return self.policy

    @property
    def rollout_module(self) -> nn.Module:
        """The module a rollout's policy log-probs come from (when generation's are not used)."""
        return self.trained

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.trained.parameters() if p.requires_grad]

    def same_on_every_rank(self) -> None:
        """Ranks load the same files, but randomly initialised weights (adapters) must match too."""
        distributed.broadcast_parameters(self.policy.parameters())

    # ------------------------------------------------------------------------------------------------- a step
    def passes(self, micro_batches: list[T]) -> Iterator[T]:
        """This rank's micro-batches of an optimiser step, each yielded for its forward and backward: consume it to
        the end. Here nothing more; a backend whose forward is a collective adds what keeps the ranks in step."""
        yield from micro_batches

    def step(self, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
        """Gradients summed over ranks, clipped to `max_grad_norm`, one optimiser step; their norm before clipping."""
        distributed.all_reduce_gradients(self.trained.parameters())
        return optimizer_step(optimizer, self.trained.parameters(), max_grad_norm).item()

    def memory_metrics(self) -> dict[str, float]:
        """What this backend measured of its memory in the step (GB)."""
        return {}

    def refit(self, generator) -> None:
        """The generation engine takes the policy's current weights."""
        generator.update_weights(self.policy)

    # ------------------------------------------------------------------------------------------------- checkpoints
    def save(self, folder: Path, optimizer: torch.optim.Optimizer, tokenizer) -> dict[str, Any]:
        """Every rank: write this backend's part of the checkpoint into `folder` (it exists); the entries for the
        state file (rank 0's are kept). Every rank holds the same weights and optimiser state: rank 0 writes them."""
        if distributed.is_main():
            self._save_weights(folder, tokenizer)
        return {BACKEND_KEY: self.name, "optimizer": optimizer.state_dict(), "megatron_layout": None}

    def _save_weights(self, folder: Path, tokenizer) -> None:
        save_policy(self.policy, tokenizer, folder / POLICY_DIR)

    def read(self, folder: Path, state: dict[str, Any]) -> dict[str, Any]:
        """Every file of checkpoint `folder` this rank needs, read before anything is applied (`UnreadableCheckpoint`
        when one cannot be loaded); a checkpoint of another backend is a ConfigError."""
        self._check_written_by(folder, state)
        return {"weights": self._read_weights(folder), "optimizer": state["optimizer"]}

    def _check_written_by(self, folder: Path, state: dict[str, Any]) -> None:
        written_by = state.get(BACKEND_KEY) or _older_backend(folder, state)
        if written_by != self.name:
            raise ConfigError(
                f"checkpoint {folder} was written with model.backend {written_by}; this run trains with "
                f"{self.name}: resume with the backend (and LoRA setting) that wrote it"
            )

    def _read_weights(self, folder: Path) -> dict[str, torch.Tensor]:
        from transformers import AutoModelForCausalLM

        with reading(POLICY_DIR):
            saved = AutoModelForCausalLM.from_pretrained(str(folder / POLICY_DIR), dtype=self.policy.dtype)
            return saved.state_dict()

    def apply(self, folder: Path, loaded: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        self.policy.load_state_dict(loaded.pop("weights"))
        optimizer.load_state_dict(loaded.pop("optimizer"))

    def export(self, folder: Path, tokenizer) -> None:
        """Every rank: the final policy as a plain Hugging Face folder (rank 0 writes it)."""
        if distributed.is_main():
            save_policy(self.policy, tokenizer, folder)


class LoraBackend(HfBackend):
    """`model.lora.r > 0` (with backend hf): peft adapters train, the base stays frozen; the base with the adapters
    disabled is the reference (no copy), and a checkpoint holds the adapters only (the base is policy_path's)."""

    name = "lora"

    def load(self) -> nn.Module:
        from aligner.modeling.lora import require_peft, wrap_with_lora

        require_peft()
        self.policy = wrap_with_lora(super().load(), self.config.model.lora)
        return self.policy

    def reference(self):
        from aligner.modeling.lora import LoraReference

        return LoraReference(self.policy)

    def _save_weights(self, folder: Path, tokenizer) -> None:
        from aligner.modeling.lora import save_adapter

        save_adapter(self.policy, folder / ADAPTER_DIR)

    def _read_weights(self, folder: Path) -> dict[str, torch.Tensor]:
        from aligner.modeling.lora import read_adapter

        with reading(ADAPTER_DIR):
            return read_adapter(folder / ADAPTER_DIR)

    def apply(self, folder: Path, loaded: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        from aligner.modeling.lora import load_adapter

        load_adapter(self.policy, folder / ADAPTER_DIR, loaded.pop("weights"))
        optimizer.load_state_dict(loaded.pop("optimizer"))

    def export(self, folder: Path, tokenizer) -> None:
        """The adapters merged into a copy of the base: a plain Hugging Face folder."""
        from aligner.modeling.lora import save_merged_policy

        if distributed.is_main():
            save_merged_policy(self.policy, tokenizer, folder)


class MegatronBackend(HfBackend):
    """`model.backend: megatron`: this rank's shard of a Megatron-Core GPTModel trains (one optimiser step per
    rollout, `megatron_reinforce_step`); the HF policy stays whole for generation and checkpoints, refit from the
    shards after every step, so it needs no gradients. Each rank's optimiser state is its shard's own file."""

    name = "megatron"
    steps_itself = True  # the trainer hands it the whole rollout (`reinforce_step`) instead of micro-batches

    def __init__(self, config: TrainConfig):
        super().__init__(config)
        self.megatron_model = None

    def init_parallel(self, device: torch.device) -> torch.device:
        """Megatron's TP/PP/DP groups over torchrun's process group, or one of a single process (world = TP x PP x
        DP)."""
        from megatron.core import parallel_state

        from aligner.modeling import megatron as mb

        self.device = distributed.init(device, group_of_one=True)
        model = self.config.model
        tp, pp = model.tensor_model_parallel_size, model.pipeline_model_parallel_size
        if distributed.world_size() % (tp * pp):
            raise ConfigError(
                f"the number of processes ({distributed.world_size()}) must be a multiple of "
                f"tensor_model_parallel_size * pipeline_model_parallel_size ({tp} * {pp})"
            )
        mb.init_megatron_parallel(tp, pp, seed=self.config.seed)
        leader = parallel_state.get_tensor_model_parallel_rank() == 0
        leader = leader and parallel_state.get_pipeline_model_parallel_rank() == 0
        distributed.set_data_parallel(
            parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size(), leader
        )
        return self.device

    def prepare(self) -> None:
        from aligner.modeling import megatron as mb

        model = self.config.model
        self.policy.requires_grad_(False)
        rng = torch.get_rng_state()  # Megatron's initialisation (overwritten by the HF weights) draws numbers
        self.megatron_model = mb.build_megatron_model(
            self.policy.config,
            self.policy.state_dict(),
            model.tensor_model_parallel_size,
            model.pipeline_model_parallel_size,
        )
        torch.set_rng_state(rng)

    @property
    def trained(self) -> nn.Module:
        return self.megatron_model

    @property
    def rollout_module(self) -> nn.Module:
        return self.policy  # whole, refit after every step

    def reinforce_step(self, optimizer: torch.optim.Optimizer, rollout, aggregation: str) -> dict[str, float]:
        """The REINFORCE step on this rank's shard: the normaliser summed over DP ranks, clipping over every shard
        and stage (`megatron_reinforce_step`)."""
        from aligner.modeling import megatron as mb

        optim = self.config.optim
        return mb.megatron_reinforce_step(
            self.megatron_model,
            optimizer,
            rollout.batch,
            rollout.advantages,
            rollout.loss_mask,
            aggregation,
            micro_batch_size=optim.micro_batch_size,
            max_grad_norm=optim.max_grad_norm,
        )

    def refit(self, generator) -> None:
        """The HF policy (generation, checkpoints) := the Megatron weights, gathered over TP and PP."""
        from aligner.modeling import megatron as mb

        self.policy.load_state_dict(mb.model_to_hf_state_dict(self.megatron_model, self.policy.config))
        generator.update_weights(self.policy)

    def layout(self) -> dict[str, int]:
        model = self.config.model
        return {
            "tensor_model_parallel_size": model.tensor_model_parallel_size,
            "pipeline_model_parallel_size": model.pipeline_model_parallel_size,
            "world_size": distributed.world_size(),
        }

    def save(self, folder: Path, optimizer: torch.optim.Optimizer, tokenizer) -> dict[str, Any]:
        """Each rank's optimiser holds the state of its own shard: every rank writes its file into the folder; rank 0
        the gathered HF weights."""
        own = folder / MEGATRON_OPTIMIZER_FILE.format(rank=distributed.rank())
        torch.save(optimizer.state_dict(), own)
        # Rank 0 fsyncs every file before the rename, but where the ranks span nodes (a network file system) only
        # the writer's own fsync surely reaches the disk.
        fsync_file(own)
        if distributed.is_main():
            self._save_weights(folder, tokenizer)
        return {BACKEND_KEY: self.name, "optimizer": None, "megatron_layout": self.layout()}

    def read(self, folder: Path, state: dict[str, Any]) -> dict[str, Any]:
        saved_layout = state.get("megatron_layout")
        if saved_layout is not None and saved_layout != self.layout():
            raise ConfigError(
                f"checkpoint {folder} was written with the Megatron layout {saved_layout}; this run has "
                f"{self.layout()}: resume with the same tensor/pipeline-parallel sizes and processes"
            )
        loaded = super().read(folder, state)
        own = MEGATRON_OPTIMIZER_FILE.format(rank=distributed.rank())
        with reading(own):
            loaded["optimizer"] = torch.load(folder / own, map_location=self.device, weights_only=False)
        return loaded

    def apply(self, folder: Path, loaded: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        from aligner.modeling import megatron as mb

        super().apply(folder, loaded, optimizer)
        # The shard from the checkpoint's HF weights (the conversion is exact), and this rank's own optimiser.
        mb.load_hf_weights(self.megatron_model, self.policy.state_dict(), self.policy.config)


class FsdpBackend(HfBackend):
    """`model.backend: fsdp`: FSDP2 shards (aligner/modeling/fsdp.py) train; each rank holds 1/world of every
    weight, gradient and AdamW state, loaded rank-locally from the policy folder's safetensors. Generation, the
    rollout's log-probs and the reference use a whole HF copy of the policy in the compute dtype (bf16 under
    bf16-mixed), refit after every step by gathering the shards one parameter at a time (the full model in float32
    never exists at once); the reference is a frozen copy of it kept on the CPU. One process runs it on a process
    group of one rank. Every forward of the shards is a collective: each rank runs as many passes as the rank with
    the most (`passes`). A checkpoint holds the shards and AdamW state as a
    torch.distributed.checkpoint folder (resumable at any number of processes: DCP reshards) and the gathered
    policy as a Hugging Face folder (for downloads)."""

    name = "fsdp"
    autocasts = False  # bf16-mixed: MixedPrecisionPolicy gathers bfloat16 parameters; autocast would mix again

    def __init__(self, config: TrainConfig):
        super().__init__(config)
        self.sharded: nn.Module | None = None
        self.refit_peak_bytes = 0  # the most gathered bytes the latest refit held at once

    def init_parallel(self, device: torch.device) -> torch.device:
        from aligner.modeling import fsdp

        self.device = fsdp.init_process_group(device)
        return self.device

    def load(self) -> nn.Module:
        self.sharded = self._load_shards()
        self.policy = self._load_copy()
        self.policy.requires_grad_(False)
        return self.policy

    def _load_shards(self, **lora) -> nn.Module:
        """This rank's shards of the policy folder, in training mode; `lora`: load_sharded_policy's LoRA arguments."""
        from aligner.modeling import fsdp

        model = self.config.model
        shards = fsdp.load_sharded_policy(
            model.policy_path,
            self.device,
            model.dtype,
            model.precision,
            cpu_offload=model.fsdp.cpu_offload,
            activation_checkpointing=model.activation_checkpointing,
            attn_implementation=model.attn_implementation,
            reshard_after_forward=model.fsdp.reshard_after_forward,
            **lora,
        )
        return shards.train()

    def _load_copy(self) -> nn.Module:
        """The whole policy, in the compute dtype (model.dtype under fp32)."""
        model = self.config.model
        dtype = compute_dtype(model.precision) or model.dtype
        return load_policy(model.policy_path, dtype, self.device, model.attn_implementation)

    def reference(self):
        return ReferencePolicy(self.policy, compute_dtype(self.config.model.precision))

    def prepare(self) -> None:
        """Activation checkpointing is applied when the shards are made (`load`)."""

    @property
    def trained(self) -> nn.Module:
        return self.sharded

    @property
    def rollout_module(self) -> nn.Module:
        return self.policy  # whole, refit after every step; its forward is no collective

    def trainable_parameters(self) -> list[nn.Parameter]:
        from aligner.modeling import fsdp

        fsdp.reshard(self.sharded)  # the shards themselves, not a gathered root left by a no-grad forward
        return super().trainable_parameters()

    def same_on_every_rank(self) -> None:
        """Every rank read its shards and its copy from the same files."""

    def passes(self, micro_batches: list[T]) -> Iterator[T]:
        """Every rank takes as many passes as the rank with the most micro-batches (asked before any pass: passes
        are collectives too), the extra ones idle: a forward and backward of one token with a zero loss, the
        collectives of a pass without a gradient. Each pass is prepared by `fsdp.prepare_pass`: with
        `model.fsdp.sync_each_micro_batch: false` only the last reduce-scatters the step's gradients."""
        from aligner.modeling import fsdp

        total = int(distributed.max_over_ranks({"passes": len(micro_batches)})["passes"])
        sync_each = self.config.model.fsdp.sync_each_micro_batch
        for index in range(total):
            fsdp.prepare_pass(self.sharded, last=index == total - 1, sync_each_micro_batch=sync_each)
            if index < len(micro_batches):
                yield micro_batches[index]
            else:
                token = torch.zeros(1, 1, dtype=torch.long, device=self.device)
                (self.sharded(input_ids=token).logits.sum() * 0).backward()

    def step(self, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
        """FSDP2 summed the gradients over ranks in the backward (reduce-scatter); clip over every shard and step."""
        from aligner.modeling import fsdp

        return fsdp.clip_and_step(optimizer, self.sharded.parameters(), max_grad_norm).item()

    def refit(self, generator) -> None:
        """The whole copy := the shards, gathered one parameter at a time; then the engine takes it."""
        from aligner.modeling import fsdp

        tally = fsdp.GatherTally()
        params = dict(self.policy.named_parameters())
        device = next(self.policy.parameters()).device
        with torch.no_grad():
            for name, full in fsdp.full_weights(self.sharded, self.policy.dtype, device, tally):
                params[name].copy_(full)
        self.refit_peak_bytes = tally.peak_bytes
        generator.update_weights(self.policy)

    def memory_metrics(self) -> dict[str, float]:
        return {MEMORY_REFIT_PEAK: self.refit_peak_bytes / 1e9}

    def save(self, folder: Path, optimizer: torch.optim.Optimizer, tokenizer) -> dict[str, Any]:
        """Every rank writes its shards and AdamW state (DCP), and fsyncs them; the gathered policy goes to policy/."""
        from aligner.modeling import fsdp

        fsdp.save_checkpoint(self.sharded, optimizer, folder / FSDP_DIR)
        for own in (folder / FSDP_DIR).glob(f"__{distributed.rank()}_*"):
            fsync_file(own)  # where ranks span nodes only the writer's fsync surely reaches the disk
        fsdp.export_hf(self.sharded, folder / POLICY_DIR, tokenizer)
        return {BACKEND_KEY: self.name, "optimizer": None, "megatron_layout": None}

    def read(self, folder: Path, state: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint's files were verified against its manifest; DCP reads the shards as it applies them."""
        self._check_written_by(folder, state)
        with reading(FSDP_DIR):
            if not (folder / FSDP_DIR / ".metadata").is_file():
                raise FileNotFoundError(f"{FSDP_DIR}/.metadata")
        return {}

    def apply(self, folder: Path, loaded: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        from aligner.modeling import fsdp

        fsdp.load_checkpoint(self.sharded, optimizer, folder / FSDP_DIR)

    def export(self, folder: Path, tokenizer) -> None:
        """Every rank: the shards gathered into a Hugging Face folder, in model.dtype (rank 0 writes it)."""
        from aligner.modeling import fsdp

        fsdp.export_hf(self.sharded, folder, tokenizer)


class FsdpLoraBackend(FsdpBackend):
    """`model.backend: fsdp` with `model.lora.r > 0`: peft's wrapper is applied to the meta model before it is
    sharded, so each decoder layer's FSDP2 unit holds its frozen base shards and its adapters' shards; only the
    adapters train (the optimiser gets them alone, FSDP2 reduce-scatters only their gradients).

    The whole copy is what LoraBackend trains: the policy in the compute dtype, peft-wrapped, its adapters drawn by
    peft from the seed exactly as LoraBackend draws them (float32: peft keeps adapters of a bf16 base in float32),
    broadcast from rank 0, and copied row by row into the shards. It serves generation and the rollout's log-probs
    unmerged, as LoraBackend's policy does, and with its adapters disabled it is the reference (`LoraReference`):
    no second copy of the base. A refit gathers the adapters alone, the base never changes.

    A checkpoint holds the adapters' shards and AdamW state (DCP, as FsdpBackend; the frozen base is the policy
    folder's) and the adapters as a peft folder (ADAPTER_DIR, as LoraBackend). The final policy is the gathered
    shards merged (W + scaling * B @ A) into a plain Hugging Face folder in model.dtype."""

    name = "fsdp-lora"

    def load(self) -> nn.Module:
        from aligner.modeling import lora

        lora.require_peft()
        settings = self.config.model.lora
        # The copy first: its adapters take the seed's first draws, as LoraBackend's do.
        self.policy = lora.wrap_with_lora(self._load_copy(), settings)
        adapters = lora.adapter_weights(self.policy)
        distributed.broadcast_parameters(adapters.values())
        self.sharded = self._load_shards(
            wrap=lambda meta: lora.wrap_with_lora(meta, settings),
            file_name=lora.file_name,
            whole={name: a.detach() for name, a in adapters.items()},
        )
        self.policy.requires_grad_(False)
        return self.policy

    def reference(self):
        from aligner.modeling.lora import LoraReference

        return LoraReference(self.policy)

    def refit(self, generator) -> None:
        """The copy's adapters := the shards' (gathered one at a time); then the engine takes it."""
        from aligner.modeling import fsdp, lora

        tally = fsdp.GatherTally()
        adapters = lora.adapter_weights(self.policy)
        with torch.no_grad():
            for name, full in fsdp.full_weights(self.sharded, None, self.device, tally, only=lora.is_adapter):
                adapters[name].copy_(full)
        self.refit_peak_bytes = tally.peak_bytes
        generator.update_weights(self.policy)

    def save(self, folder: Path, optimizer: torch.optim.Optimizer, tokenizer) -> dict[str, Any]:
        """Every rank writes its adapter shards and their AdamW state (DCP); rank 0 the copy's adapters (the shards',
        as of the latest refit) as a peft folder. Resuming reads the DCP folder alone: the trainer's refit then gives
        the copy the adapters."""
        from aligner.modeling import fsdp
        from aligner.modeling.lora import save_adapter

        fsdp.save_checkpoint(self.sharded, optimizer, folder / FSDP_DIR, trained_only=True)
        for own in (folder / FSDP_DIR).glob(f"__{distributed.rank()}_*"):
            fsync_file(own)
        if distributed.is_main():
            save_adapter(self.policy, folder / ADAPTER_DIR)
        return {BACKEND_KEY: self.name, "optimizer": None, "megatron_layout": None}

    def apply(self, folder: Path, loaded: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        from aligner.modeling import fsdp

        fsdp.load_checkpoint(self.sharded, optimizer, folder / FSDP_DIR, trained_only=True)

    def export(self, folder: Path, tokenizer) -> None:
        """Every rank: the shards gathered and merged (`lora.merged_weights`) into a Hugging Face folder, in
        model.dtype (rank 0 writes it)."""
        from aligner.modeling import fsdp, lora

        fsdp.export_hf(self.sharded, folder, tokenizer, transform=lambda w: lora.merged_weights(self.sharded, w))


def _older_backend(folder: Path, state: dict[str, Any]) -> str:
    """The backend of a checkpoint written before the state file recorded it."""
    if state.get("megatron_layout") is not None:
        return MegatronBackend.name
    return LoraBackend.name if (folder / ADAPTER_DIR).is_dir() else HfBackend.name


def build_backend(config: TrainConfig) -> HfBackend:
    """The backend `config.model` asks for (its combinations are checked by aligner/config.py); it joins its process
    groups and picks its device in `init_parallel`."""
    model = config.model
    if model.backend == "megatron":
        return MegatronBackend(config)
    if model.backend == "fsdp":
        return FsdpLoraBackend(config) if model.lora.r > 0 else FsdpBackend(config)
    return LoraBackend(config) if model.lora.r > 0 else HfBackend(config)
