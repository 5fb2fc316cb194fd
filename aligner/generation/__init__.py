"""Sampling responses from the policy: the engines behind `generation.engine` (docs/generation.md), the Llama decode
step with its KV cache, and token sampling.

The names below load on first use (PEP 562), so `aligner.generation.engines.vllm_available` stays importable without
torch (the service's config checks use it).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Generator": "aligner.generation.generator",
    "GenerationOutput": "aligner.generation.generator",
    "TorchGenerator": "aligner.generation.generator",
    "HFGenerator": "aligner.generation.hf_engine",
    "build_generator": "aligner.generation.engines",
    "vllm_available": "aligner.generation.engines",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
