"""What this CPU can do, asked in one place: the code branches on `cpu_capabilities()` and `bf16_products_pay()`
only, so a test sets the answer it needs on any machine (docs/performance.md, "Precision on the CPU").

- `cpu_capabilities()`: torch's vector ISA (`ATEN_CPU_CAPABILITY` switches it), whether oneDNN has bfloat16 kernels
  (`ONEDNN_MAX_CPU_ISA=AVX2` switches them off on an AVX-512 BF16 CPU), the CPU's model name and its usable cores.
- `bf16_products_pay()`: whether bfloat16 matrix products run clearly faster than float32 here. Having bfloat16
  kernels does not say so (measured: 7x on a Xeon with AMX, 2.5x on an AMD EPYC with AVX-512 BF16, 0.54x on a Xeon
  with AVX-512 BF16 and no AMX), so it is measured once per machine, ISA and thread count (`measure_matmul_rates`,
  about 0.1 s) and the answer cached in `~/.cache/aligner/cpu_probe.json`.
- `ALIGNER_CPU_BF16=fast|slow` sets `bf16_products_pay()`'s answer without measuring: for tests, and for a user who
  knows better than a 0.1 s probe. It passes to trainers a worker starts (aligner/processes.py).
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

BF16_ENV = "ALIGNER_CPU_BF16"  # "fast" | "slow": bf16_products_pay()'s answer, not measured
BF16_ANSWERS = {"fast": True, "slow": False}
# bfloat16 must beat float32 by this much to pay: bf16-mixed also casts the float32 weights to bfloat16 each forward
# and keeps float32 reductions, which the probe's bare products do not count.
BF16_MIN_SPEEDUP = 1.25
PROBE_SIZE = 1024  # a [1024 x 1024] @ [1024 x 1024] product: 2.1 GFLOP, 10-50 ms where bfloat16 has kernels
PROBE_REPEATS = 3


@dataclass(frozen=True)
class CpuCapabilities:
    model: str  # the CPU's model name (/proc/cpuinfo), "" where unknown
    isa: str  # torch's vector kernels: "AVX512", "AVX2", "DEFAULT", ... (ATEN_CPU_CAPABILITY switches them)
    bf16_kernels: bool  # oneDNN multiplies bfloat16 natively (AVX-512 BF16 or AMX; ONEDNN_MAX_CPU_ISA limits it)
    cores: int  # the cores this process may run on


@dataclass(frozen=True)
class MatmulRates:
    """GFLOP/s of a float32 and a bfloat16 square product on `threads` threads."""

    fp32_gflops: float
    bf16_gflops: float
    threads: int

    @property
    def bf16_pays(self) -> bool:
        return self.bf16_gflops >= BF16_MIN_SPEEDUP * self.fp32_gflops

    def describe(self) -> str:
        return (
            f"bfloat16 products measured {self.bf16_gflops:.0f} GFLOP/s against {self.fp32_gflops:.0f} for float32 "
            f"on {self.threads} thread{'s' if self.threads != 1 else ''}"
        )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


@functools.cache
def cpu_capabilities() -> CpuCapabilities:
    """This process's CPU, as torch and oneDNN see it (they read their ISA switches once, at first use)."""
    kernels = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return CpuCapabilities(_cpu_model(), torch.backends.cpu.get_cpu_capability(), bool(kernels), cores)


def _gflops(dtype: torch.dtype) -> float:
    a = torch.randn(PROBE_SIZE, PROBE_SIZE).to(dtype)
    b = torch.randn(PROBE_SIZE, PROBE_SIZE).to(dtype)
    a @ b  # oneDNN picks and caches its kernel on the first call
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * PROBE_SIZE**3 / best / 1e9


def measure_matmul_rates() -> MatmulRates:
    """Times the probe's product in both dtypes now, on torch's current thread count (best of 3 each)."""
    return MatmulRates(_gflops(torch.float32), _gflops(torch.bfloat16), torch.get_num_threads())


def probe_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "aligner" / "cpu_probe.json"


def _probe_key(caps: CpuCapabilities, threads: int) -> str:
    return f"{caps.model}|{caps.isa}|bf16_kernels={caps.bf16_kernels}|torch={torch.__version__}|threads={threads}"


@functools.cache
def _cached_rates(key: str) -> MatmulRates:
    path = probe_cache_path()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    try:
        return MatmulRates(**known[key])
    except (KeyError, TypeError):
        pass
    rates = measure_matmul_rates()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**known, key: asdict(rates)}, indent=1))
        os.replace(tmp, path)
    except OSError:  # a read-only home: measure again next time
        pass
    return rates


def matmul_rates() -> MatmulRates | None:
    """This machine's measured rates on the current thread count (cached), or None where no measurement is needed:
    without bfloat16 kernels bfloat16 never pays (torch's generic loop is ~60x slower than float32)."""
    caps = cpu_capabilities()
    if not caps.bf16_kernels:
        return None
    return _cached_rates(_probe_key(caps, torch.get_num_threads()))


def _env_answer() -> bool | None:
    """`ALIGNER_CPU_BF16`'s answer, or None when it is unset."""
    answer = os.environ.get(BF16_ENV, "").strip().lower()
    if not answer:
        return None
    if answer not in BF16_ANSWERS:
        raise ValueError(f"{BF16_ENV} must be one of {', '.join(BF16_ANSWERS)} or unset, not {answer!r}")
    return BF16_ANSWERS[answer]


def bf16_products_pay() -> bool:
    """Whether bfloat16 matrix products are worth running on this CPU: `ALIGNER_CPU_BF16` if set, else measured."""
    if (answer := _env_answer()) is not None:
        return answer
    rates = matmul_rates()
    return rates is not None and rates.bf16_pays


def bf16_reason() -> str:
    """Why `bf16_products_pay()` answered as it did, for a run's warning."""
    if _env_answer() is not None:
        return f"{BF16_ENV}={os.environ[BF16_ENV].strip()} says so"
    rates = matmul_rates()
    if rates is None:
        return "this CPU has no bfloat16 kernels"
    return rates.describe()
