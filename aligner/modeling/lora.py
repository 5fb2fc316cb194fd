"""LoRA adapters on the policy (peft, the optional `lora` extra).

    aligner train --config demo_assets/reinforce.yaml --set model.lora.r=8

With `model.lora.r > 0` the loaded policy is wrapped by `peft.get_peft_model`: the base weights are frozen and only
the adapters train. Since the base weights never change, the base model with the adapters disabled *is* the initial
policy, so `LoraReference` computes the KL reference with the same module and no copy of the weights is kept.
Checkpoints hold the adapters as a peft folder (`PeftModel.from_pretrained(base, folder)` loads it); the final
policy is merged into a plain Hugging Face folder that loads without peft.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from aligner.config import LoraConfig
from aligner.errors import ConfigError, ModelFolderError
from aligner.modeling.batches import ResponseBatch
from aligner.modeling.hf import save_policy
from aligner.modeling.logprobs import grouped_response_logprobs

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def require_peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora needs the optional extra: pip install 'aligner[lora]'") from None
    return peft


def _matches(module_name: str, target: str) -> bool:
    # peft's own rule for a list of names: the whole name or a dotted suffix of it.
    return module_name == target or module_name.endswith("." + target)


def wrap_with_lora(model: nn.Module, config: LoraConfig) -> nn.Module:
    """The policy wrapped with fresh adapters (B = 0, so it computes exactly what the base model does)."""
    peft = require_peft()
    names = [name for name, _ in model.named_modules()]
    unknown = [t for t in config.target_modules if not any(_matches(n, t) for n in names)]
    if unknown:
        linears = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ConfigError(
            f"model.lora.target_modules: {unknown} match no module of the policy (its Linear layers: {linears})"
        )
    lora_config = peft.LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with warnings.catch_warnings():
            # peft still asks for transformers' deprecated is_gradient_checkpointing; nothing for a user to act on.
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            return peft.get_peft_model(model, lora_config)
    except ValueError as err:  # a target peft cannot adapt (a whole decoder layer, a norm, ...)
        raise ConfigError(f"model.lora.target_modules: {err}") from None


class LoraReference:
    """The initial policy as the LoRA-wrapped policy with its adapters disabled: the same module, no weight copy.

    Same interface as `models.ReferencePolicy`. The model runs in eval mode (no adapter dropout, whose random draws
    would also shift the training RNG) and gets its training mode back afterwards.
    """

    def __init__(self, model: nn.Module):
        self.model = model

    def logprobs(self, batch: ResponseBatch) -> torch.Tensor:
        was_training = self.model.training
        self.model.eval()
        try:
            # Inference mode (cheaper per op than no_grad); the clone makes the result usable in autograd again.
            with torch.inference_mode(), self.model.disable_adapter():
                logprobs = grouped_response_logprobs(self.model, batch)
            return logprobs.clone()
        finally:
            self.model.train(was_training)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The base weights under their plain Hugging Face names (the policy's own tensors, not copies)."""
        base = self.model.get_base_model().state_dict()
        return {k.replace(".base_layer.", "."): v for k, v in base.items() if ".lora_" not in k}


def save_adapter(model: nn.Module, out_dir: str | Path) -> None:
    """The adapter weights and adapter_config.json (a peft folder; the base weights are the policy folder's)."""
    # The embeddings are frozen, never trained, so they need no copy in every checkpoint.
    model.save_pretrained(str(out_dir), safe_serialization=True, save_embedding_layers=False)


def read_adapter(folder: str | Path) -> dict[str, torch.Tensor]:
    """The adapter weights `save_adapter` wrote in `folder`."""
    from safetensors.torch import load_file

    path = Path(folder) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ModelFolderError(f"{path} not found: the checkpoint was not saved with model.lora")
    return load_file(path)


def load_adapter(model: nn.Module, folder: str | Path, weights: dict[str, torch.Tensor] | None = None) -> None:
    """Load adapter weights saved by `save_adapter` into the wrapped policy; every adapter tensor must be there.
    `weights`: what `read_adapter(folder)` returned, when they were read already."""
    peft = require_peft()
    result = peft.set_peft_model_state_dict(model, read_adapter(folder) if weights is None else weights)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"adapters in {folder} do not fit model.lora: missing {missing[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}"
        )


def save_merged_policy(model: nn.Module, tokenizer, out_dir: str | Path) -> None:
    """Merge the adapters into the base weights of a copy and save it as a plain Hugging Face folder."""
    # A copy, so the live policy keeps its adapters and frozen base (the reference) after the export.
    merged = copy.deepcopy(model).merge_and_unload()
    save_policy(merged, tokenizer, out_dir)


# --- LoRA on FSDP2 shards (`model.backend: fsdp`, aligner/trainers/policy_backends.py FsdpLoraBackend) ---

PEFT_PREFIX = "base_model.model."  # what peft's wrapper puts before the Hugging Face model's parameter names


def is_adapter(name: str) -> bool:
    """Whether the parameter called `name` in a peft-wrapped model is an adapter's (trained), not the base's."""
    return ".lora_" in name


def file_name(name: str) -> str | None:
    """The name in the policy folder's files of a peft-wrapped model's base parameter `name` (peft's prefix dropped,
    its `.base_layer` taken out); None for an adapter, which no file holds."""
    if is_adapter(name):
        return None
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def adapter_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters of a peft-wrapped model, by parameter name (its own tensors, not copies)."""
    return {name: param for name, param in model.named_parameters() if is_adapter(name)}


def merged_weights(
    model: nn.Module, weights: Iterator[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain Hugging Face weights of peft-wrapped `model` from a stream of its (name, whole parameter), e.g.
    `fsdp.full_weights`: each adapted layer's W + scaling * B @ A (transposed for fan_in_fan_out layers, GPT-2's
    Conv1D), as peft's `merge_and_unload` computes it (Hu et al. 2021, "LoRA", eq. 3: h = W0 x + B A x), under the
    folder's names (`file_name`). A layer's base weight and adapters are held until all three have come: at most
    one layer's worth beyond the stream's own."""
    layers = {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and hasattr(module, "base_layer") and "default" in module.lora_A
    }
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        layer = next(
            (p for p in (name.split(".lora_")[0], name.removesuffix(".base_layer.weight")) if p in layers), None
        )
        if layer is None or not (is_adapter(name) or name.endswith(".base_layer.weight")):
            yield file_name(name), tensor
            continue
        parts = pending.setdefault(layer, {})
        parts["A" if ".lora_A." in name else "B" if ".lora_B." in name else "W"] = tensor
        if len(parts) == 3:
            del pending[layer]
            module = layers[layer]
            delta = (parts["B"].float() @ parts["A"].float()) * module.scaling["default"]
            if getattr(module, "fan_in_fan_out", False):
                delta = delta.T
            yield file_name(layer + ".weight"), (parts["W"].float() + delta).to(parts["W"].dtype)
    if pending:
        raise RuntimeError(f"adapted layers without their base weight or adapters: {sorted(pending)[:3]}")
