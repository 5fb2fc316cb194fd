"""Run Megatron-Core on the CPU: the test-only redirection of the few `torch.cuda` calls it makes unconditionally.

Megatron-Core assumes a GPU: it places new tensors on `torch.cuda.current_device()` and keeps separate CUDA RNG
states for tensor-parallel regions. Redirecting those calls to the CPU lets the tests run the real Megatron layers
over gloo. Production never imports this module: there Megatron runs on CUDA with NCCL.

Pipeline parallelism (Megatron-Core 0.16.1) needs three more, each for one line of Megatron:
- `torch.cuda.synchronize()` -> no-op: p2p_communication.py waits for the device after sending activation shapes
  (`variable_seq_lengths`) and after each batched send/receive (`batch_p2p_sync`). On the CPU gloo's `wait()`
  has already finished the transfer.
- `torch.Tensor.cuda()` -> the tensor itself: with tied embeddings, LanguageModule.setup_embeddings_and_output_layer
  moves the last stage's copy of the embedding with `weight.data.cuda()` before all-reducing it.
- `device="cuda"` -> the CPU, inside the 1F1B pipeline schedule only: schedules.py creates its token counter with
  `torch.zeros([], dtype=torch.int, device="cuda")`. A TorchFunctionMode entered around
  `forward_backward_pipelining_without_interleaving` rewrites that argument (the literal "cuda" cannot be reached
  by patching `torch.cuda.current_device`).
Each was checked to be needed: without any one of them the pipeline-parallel test fails with "Torch not compiled
with CUDA enabled".
"""

from __future__ import annotations

import functools
import logging

import torch
from torch.overrides import TorchFunctionMode


class _CudaDeviceToCpu(TorchFunctionMode):
    """Tensors asked for on a CUDA device are made on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def _on_cpu(schedule):
    @functools.wraps(schedule)
    def run(*args, **kwargs):
        with _CudaDeviceToCpu():
            return schedule(*args, **kwargs)

    return run


def install() -> None:
    """Patch `torch.cuda` and Megatron's RNG helpers and pipeline schedules in this process (idempotent)."""
    import megatron.core.pipeline_parallel.schedules as schedules
    import megatron.core.tensor_parallel.random as mp_random

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    mp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda new_state, *args, **kwargs: torch.set_rng_state(new_state)
    # With the "CUDA" RNG being the CPU one, every forked initialisation trips Megatron's check that the CPU RNG
    # was left alone: a warning per weight that means nothing here.
    logging.getLogger(mp_random.__name__).setLevel(logging.ERROR)

    # Pipeline parallelism (see the module docstring).
    torch.cuda.synchronize = lambda device=None: None
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    schedule = schedules.forward_backward_pipelining_without_interleaving
    if not getattr(schedule, "_aligner_on_cpu", False):
        wrapped = _on_cpu(schedule)
        wrapped._aligner_on_cpu = True
        schedules.forward_backward_pipelining_without_interleaving = wrapped
