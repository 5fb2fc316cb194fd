"""Will a job fit the worker's device? The memory check of every `POST /api/v1/jobs`, the dry run's included.

`memory_check(train, num_processes)` estimates one process's memory for the job's backend and number of processes
(aligner/modeling/memory.py: the formulas, in docs/scaling.md "Memory: which backend fits") from the policy
folder's config.json and safetensors headers (no torch, no weights read), and compares it with one worker device:
`WORKER_DEVICE_MEMORY_GB` (ALIGNER_WORKER_DEVICE_MEMORY_GB; each process has a device of that size), else measured
on the API's host once per process: CUDA device 0, else the host's RAM, which all of a job's processes then share
(their device and host parts together must fit). It returns the dry run's `memory` (null when the policy's shape
cannot be read: a stand-in folder, unreadable headers; the cheap checks say what is wrong with the folder) and, for
a job that does not fit, the 422's errors: under `config.model.backend`, or `num_processes` when more processes of
the same backend would fit, a reason with the numbers and what would fit ("needs 37.2 GB per process with backend
hf on 1 process; the worker's device has 24.0 GB (declared): use model.backend fsdp with num_processes 2 (18.6 GB
each)"). The API's own limit on processes (1 to 8, webapp/schemas.py) bounds what it suggests.
"""

from __future__ import annotations

import functools
from typing import Any

from flask import current_app

from aligner.config import TrainConfig
from aligner.modeling.memory import (
    GB,
    DeviceMemory,
    ModelShape,
    device_memory,
    estimate_for_config,
    model_shape,
    needed_bytes,
)

MAX_PROCESSES = 8  # JobIn.num_processes' range
BACKEND_FIELD, PROCESSES_FIELD = "config.model.backend", "num_processes"


def size_text(count: float) -> str:
    """Bytes as the messages give them: GB (1e9) to one decimal, MB under a tenth of a GB."""
    return f"{count / GB:.1f} GB" if count >= GB / 10 else f"{count / 1e6:.1f} MB"


@functools.cache
def _measured() -> DeviceMemory:
    return device_memory(None)


def worker_device() -> DeviceMemory:
    """One worker device's memory: the app's WORKER_DEVICE_MEMORY_GB, else measured here (once per process)."""
    declared = current_app.config.get("WORKER_DEVICE_MEMORY_GB")
    return device_memory(declared) if declared is not None else _measured()


def _needs(train: TrainConfig, shape: ModelShape, device: DeviceMemory, processes: int, **model: Any) -> int:
    """Bytes `device` must hold for `train` on `processes` processes, with `model` settings changed (backend,
    activation_checkpointing, fsdp_cpu_offload)."""
    changed = train.model_copy(deep=True)
    offload = model.pop("fsdp_cpu_offload", None)
    for key, value in model.items():
        setattr(changed.model, key, value)
    if offload is not None:
        changed.model.fsdp.cpu_offload = offload
    return needed_bytes(estimate_for_config(changed, processes, shape), device)


def _alternatives(train: TrainConfig, shape: ModelShape, device: DeviceMemory, processes: int) -> tuple[str, str]:
    """(field, advice): the first of these that fits: activation checkpointing with the same backend and processes;
    backend fsdp with more processes (the same backend's processes under `num_processes`); fsdp with cpu_offload."""
    model = train.model
    fits = device.bytes
    each = "each" if not device.shared else "together"
    if not model.activation_checkpointing and model.backend != "megatron":
        need = _needs(train, shape, device, processes, activation_checkpointing=True)
        if need <= fits:
            return BACKEND_FIELD, f"set model.activation_checkpointing true ({size_text(need)})"
    first = processes + 1 if model.backend == "fsdp" else max(2, processes)
    for count in range(first, MAX_PROCESSES + 1):
        need = _needs(train, shape, device, count, backend="fsdp", fsdp_cpu_offload=False)
        if need <= fits:
            field = PROCESSES_FIELD if model.backend == "fsdp" else BACKEND_FIELD
            advice = f"use num_processes {count}" if model.backend == "fsdp" else "use model.backend fsdp with"
            advice = advice if model.backend == "fsdp" else f"{advice} num_processes {count}"
            return field, f"{advice} ({size_text(need)} {each})"
    for count in range(max(2, processes), MAX_PROCESSES + 1):
        need = _needs(train, shape, device, count, backend="fsdp", fsdp_cpu_offload=True)
        if need <= fits:
            return BACKEND_FIELD, (
                f"use model.backend fsdp with model.fsdp.cpu_offload true and num_processes {count} "
                f"({size_text(need)} {each} on the device, the rest in host memory)"
            )
    return BACKEND_FIELD, (
        f"no backend fits on up to {MAX_PROCESSES} processes: train LoRA adapters (model.lora.r), a smaller "
        "policy, shorter sequences or a smaller optim.micro_batch_size, or use a worker with more memory"
    )


def memory_check(train: TrainConfig, num_processes: int) -> tuple[dict[str, Any] | None, dict[str, list[str]]]:
    """(the dry run's `memory`, or None when the policy's shape cannot be read; the 422's errors, empty when the job
    fits)."""
    try:
        shape = model_shape(train.model.policy_path)
    except ValueError:
        return None, {}
    device = worker_device()
    estimate = estimate_for_config(train, num_processes, shape)
    need = needed_bytes(estimate, device)
    plan = {
        **estimate.as_dict(),
        "needed_bytes": need,
        "device_bytes": device.bytes,
        "device_source": device.source,
        "device_shared": device.shared,
        "fits": need <= device.bytes,
    }
    if plan["fits"]:
        return plan, {}
    field, advice = _alternatives(train, shape, device, num_processes)
    processes = f"{num_processes} process{'es' if num_processes > 1 else ''}"
    per = "per process" if not device.shared else f"for its {processes} together"
    where = "device" if not device.shared else "host (its processes share its RAM)"
    reason = (
        f"needs {size_text(need)} {per} with backend {train.model.backend} on {processes}; the worker's {where} "
        f"has {size_text(device.bytes)} ({device.source}): {advice}"
    )
    return plan, {field: [reason]}
