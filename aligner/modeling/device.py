"""Device, dtype and precision choice, and glibc allocator tuning for CPU training."""

from __future__ import annotations

import contextlib
import ctypes
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from aligner.modeling import cpu

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# model.precision -> the dtype computations run in (None: the weights' own dtype).
COMPUTE_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16-mixed": torch.bfloat16}


def compute_dtype(precision: str) -> torch.dtype | None:
    """The dtype `model.precision` computes in, or None when it computes in the weights' dtype."""
    return COMPUTE_DTYPES[precision]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast to `precision`'s compute dtype on `device` (matmuls in bfloat16, reductions and norms in float32, the
    float32 master weights cast once per forward), or nothing for fp32."""
    dtype = compute_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def bf16_pays(device: torch.device) -> bool:
    """Whether bfloat16 products on `device` run faster than float32: CUDA with bf16 (Ampere and later), or a CPU
    where `aligner.modeling.cpu.bf16_products_pay` says so (measured, not read off the kernels it has). Elsewhere
    bf16-mixed multiplies in float32 on bfloat16 inputs (`bf16_emulation`)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu.bf16_products_pay()
    return False


class BFloat16MatmulsInFloat32(TorchDispatchMode):
    """Matrix products of bfloat16 tensors computed in float32 and rounded to bfloat16, every other op untouched.

    That is what bfloat16 hardware computes (bfloat16 inputs, float32 accumulation, a bfloat16 result), and what
    torch's own CPU kernel computes too, but at float32 speed: where oneDNN has no bfloat16 kernels (a CPU without
    AVX-512 BF16 or AMX) torch multiplies bfloat16 in a generic loop, measured 60x slower than float32 on one AVX2
    core (1.3 against 78 GFLOP/s). The mode sees the backward's products as well as the forward's.
    """

    # linear and matmul reach the mode whole where no gradient is recorded (generation, the reference), their
    # decompositions where one is.
    OPS = frozenset(
        {
            torch.ops.aten.linear.default,
            torch.ops.aten.matmul.default,
            torch.ops.aten.mm.default,
            torch.ops.aten.addmm.default,
            torch.ops.aten.bmm.default,
            torch.ops.aten.baddbmm.default,
            torch.ops.aten.mv.default,
            torch.ops.aten.addmv.default,
        }
    )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.OPS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
            return func(*wide, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


def emulates_bf16_products(precision: str, device: torch.device) -> bool:
    """Whether `precision` computes in bfloat16 on a CPU where bfloat16 products do not pay (`bf16_emulation`)."""
    return compute_dtype(precision) == torch.bfloat16 and device.type == "cpu" and not bf16_pays(device)


def bf16_note(precision: str, device: torch.device) -> str | None:
    """What a run warns about `precision` on `device`: bfloat16 that does not pay there, or None."""
    if compute_dtype(precision) != torch.bfloat16 or bf16_pays(device):
        return None
    if emulates_bf16_products(precision, device):
        return (
            f"model.precision {precision}: on this CPU {cpu.bf16_reason()}; its matrix products run in float32 on "
            "bfloat16 inputs (the same results at float32's speed): fp32 is as fast here"
        )
    return f"model.precision {precision}: {device} has no fast bfloat16; it runs emulated, slower than fp32"


def bf16_emulation(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """What `precision` computes under on `device`: `BFloat16MatmulsInFloat32` where `emulates_bf16_products`, else
    nothing. A dispatch mode is the calling thread's own: every thread that runs the model (a background generator's
    too) enters it."""
    return BFloat16MatmulsInFloat32() if emulates_bf16_products(precision, device) else contextlib.nullcontext()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device is {name!r} but no CUDA device is available (use 'cpu' or 'auto')")
    return device


# glibc's mallopt parameters, and the largest mmap threshold it accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
# Free memory at the top of the heap that glibc keeps rather than returning it to the system.
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Stop glibc from unmapping freed blocks over 128 KB (Linux with glibc only; True when applied).

    A training step allocates and frees the same activation-sized buffers hundreds of times; by default each one
    larger than 128 KB is a fresh mmap, zeroed by the kernel page by page, then unmapped: thousands of page faults a
    step. Raising the mmap threshold lets the heap reuse blocks up to its 32 MB maximum; turning mmap off (M_MMAP_MAX
    0) does the same for the larger ones (a model's vocabulary-sized gradients and softmax), and the trim threshold
    keeps up to 1 GB of freed heap top. Measured on the bench workload: 10-20% off a step on the CPU, and about 0.3 s
    more of a SmolLM2 step for the blocks over 32 MB. Memory freed by the process is kept for reuse rather than
    returned to the system.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        return all([bool(libc.mallopt(param, value)) for param, value in settings])
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False


def peak_memory_bytes(device: torch.device) -> int:
    """The most memory this process held on `device` since the last call: CUDA's allocator peak (reset here, so
    each call covers the time since the one before); on the CPU the process's peak resident size so far (the
    kernel's ru_maxrss, which cannot be reset)."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
