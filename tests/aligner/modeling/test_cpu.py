"""The one seam for CPU capabilities: its answers, the measured bf16 probe and its cache, and the ISA switches that
make any machine answer as an older CPU does."""

import json
import os
import subprocess
import sys

import pytest
import torch

from aligner.modeling import cpu

pytestmark = pytest.mark.cpu_sensitive


@pytest.fixture
def probe_home(tmp_path, monkeypatch):
    """An empty probe cache and no answer set by the environment."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(cpu.BF16_ENV, raising=False)
    cpu._cached_rates.cache_clear()
    yield tmp_path
    cpu._cached_rates.cache_clear()


def with_kernels(monkeypatch, kernels: bool) -> None:
    monkeypatch.setattr(cpu, "cpu_capabilities", lambda: cpu.CpuCapabilities("Test CPU", "AVX512", kernels, 2))


@pytest.mark.parametrize(("answer", "pays"), [("fast", True), ("slow", False), (" Slow ", False)])
def test_the_environment_sets_the_answer_without_measuring(answer, pays, monkeypatch):
    monkeypatch.setenv(cpu.BF16_ENV, answer)
    monkeypatch.setattr(cpu, "measure_matmul_rates", lambda: pytest.fail("measured although the answer was set"))
    assert cpu.bf16_products_pay() is pays
    assert cpu.BF16_ENV in cpu.bf16_reason()


def test_an_unknown_answer_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(cpu.BF16_ENV, "maybe")
    with pytest.raises(ValueError, match="fast, slow"):
        cpu.bf16_products_pay()


def test_without_bfloat16_kernels_bfloat16_never_pays_and_nothing_is_measured(probe_home, monkeypatch):
    with_kernels(monkeypatch, False)
    monkeypatch.setattr(cpu, "measure_matmul_rates", lambda: pytest.fail("measured without kernels"))
    assert cpu.matmul_rates() is None and not cpu.bf16_products_pay()
    assert cpu.bf16_reason() == "this CPU has no bfloat16 kernels"


@pytest.mark.parametrize(
    ("fp32", "bf16", "pays"),
    # AMX Xeon 7x, AVX-512 BF16 EPYC 2.5x, AVX-512 BF16 Xeon without AMX 0.54x (NOTES.md); 1.2x is not enough to pay
    # for the casts of bf16-mixed.
    [(357.0, 2630.0, True), (162.0, 403.0, True), (229.0, 124.0, False), (100.0, 120.0, False)],
)
def test_with_kernels_the_measured_rates_decide_and_are_measured_once_per_machine(
    probe_home, monkeypatch, fp32, bf16, pays
):
    with_kernels(monkeypatch, True)
    calls = []

    def measure():
        calls.append(1)
        return cpu.MatmulRates(fp32, bf16, torch.get_num_threads())

    monkeypatch.setattr(cpu, "measure_matmul_rates", measure)
    assert cpu.bf16_products_pay() is pays
    assert f"measured {bf16:.0f} GFLOP/s against {fp32:.0f}" in cpu.bf16_reason()
    # A new process on the same machine reads the file instead of measuring.
    cpu._cached_rates.cache_clear()
    assert cpu.bf16_products_pay() is pays and len(calls) == 1
    saved = json.loads(cpu.probe_cache_path().read_text())
    assert [rates["bf16_gflops"] for rates in saved.values()] == [bf16]
    assert cpu.probe_cache_path().parent.parent == probe_home


def test_a_corrupt_cache_is_measured_again(probe_home, monkeypatch):
    with_kernels(monkeypatch, True)
    cpu.probe_cache_path().parent.mkdir(parents=True)
    cpu.probe_cache_path().write_text("{not json")
    monkeypatch.setattr(cpu, "measure_matmul_rates", lambda: cpu.MatmulRates(100.0, 300.0, 1))
    assert cpu.bf16_products_pay()
    assert len(json.loads(cpu.probe_cache_path().read_text())) == 1


def test_the_probe_times_both_dtypes_on_the_current_threads(monkeypatch):
    monkeypatch.setattr(cpu, "PROBE_SIZE", 128)  # without bfloat16 kernels the full size takes seconds
    rates = cpu.measure_matmul_rates()
    assert rates.fp32_gflops > 0 and rates.bf16_gflops > 0
    assert rates.threads == torch.get_num_threads()


def test_the_isa_switches_make_this_machine_answer_as_a_cpu_without_bfloat16_kernels(tmp_path):
    """ONEDNN_MAX_CPU_ISA=AVX2 turns oneDNN's bfloat16 kernels off (AVX-512 BF16 and AMX included) and
    ATEN_CPU_CAPABILITY=avx2 torch's AVX-512 kernels: `make test` runs the CPU-sensitive tests under both answers."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "XDG_CACHE_HOME": str(tmp_path)}
    env.pop(cpu.BF16_ENV, None)
    code = (
        "from aligner.modeling import cpu; c = cpu.cpu_capabilities(); "
        "print(c.isa, c.bf16_kernels, cpu.bf16_products_pay())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    isa, kernels, pays = out.split()
    assert isa in {"AVX2", "DEFAULT"} and kernels == "False" and pays == "False"
    assert not (tmp_path / "aligner").exists()  # nothing to measure without kernels
