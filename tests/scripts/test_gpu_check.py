"""The GPU check (bench/gpu_check.py, scripts/gpu_check.sh) on the CPU: its JSON, its arithmetic, and that one failing
case is recorded while the others still run. The GPU figures themselves need the device machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402

from aligner.metrics import TIMER_GENERATE, TIMER_STEP, TIMER_TRAIN, TOKENS_PER_S, TRAIN_RESPONSE_LENGTH  # noqa: E402


@pytest.mark.slow(45)
def test_tiny_check_times_each_case_and_records_a_failing_one(tmp_path, monkeypatch):
    # A case whose config the trainer refuses, between two good ones: its error is kept and the next case runs.
    broken = gpu_check.Case(("model.no_such_field=1",))
    monkeypatch.setitem(gpu_check.CASES, "broken", broken)
    monkeypatch.setenv("OUT", str(tmp_path / "not-here"))  # --out wins over $OUT
    out = tmp_path / "check.json"
    argv = ["--tiny", "--device", "cpu", "--cases", "torch-engine,broken,hf-engine", "--out", str(out)]
    gpu_check.main(argv)

    report = json.loads(out.read_text())
    assert not (tmp_path / "not-here").exists()
    assert list(report["cases"]) == ["torch-engine", "broken", "hf-engine"]
    assert report["model"]["parameters"] > 0 and report["environment"]["torch"]
    workload = report["workload"]
    samples = workload["prompts"] * workload["samples"]
    assert workload["samples_per_step"] == samples
    for name in ("torch-engine", "hf-engine"):
        case = report["cases"][name]
        assert case["status"] == "ok", case["error"]
        assert case["engine"] == name.removesuffix("-engine") and case["gpus"] == 1
        assert case["steps_measured"] == workload["steps"] - workload["warmup_steps"]
        assert case["step_s"] > 0 and {"generate", "train", "logprobs"} <= set(case["phases_s"])
        # min_new_tokens = max_new_tokens: every response has the same length, so the work is fixed.
        assert case["response_tokens_mean"] == workload["new_tokens"]
        assert case["tokens_per_step"] == workload["prompt_tokens_per_step"] + samples * workload["new_tokens"]
        assert case["tokens_per_s_per_gpu"] == pytest.approx(
            case["tokens_per_step"] / (case["step_s"] * case["gpus"]), rel=1e-12
        )
        # The trainer counts the same tokens over the same step time.
        assert case["tokens_per_s_per_gpu"] == pytest.approx(case["trainer_tokens_per_s_per_gpu"], rel=1e-9)
        assert case["peak_memory_bytes"] is None and case["peak_rss_bytes"] > 0  # no CUDA here
        assert (tmp_path / f"check-{name}.log").exists()
    failed = report["cases"]["broken"]
    assert failed["status"] == "failed" and failed["step_s"] is None
    assert "exit status 2" in failed["error"] and "model.no_such_field: unknown field" in failed["error"]
    assert str(tmp_path) not in failed["error"] and str(REPO) not in failed["error"]


def test_figures_leave_out_the_warm_up_and_follow_nemo_rls_definition():
    workload = gpu_check.Workload(prompts=2, samples=3, new_tokens=10, prompt_sentences=1, micro_batch=6, steps=3)
    rows = [
        {
            "step": 1,
            TIMER_STEP: 9.0,
            TIMER_GENERATE: 8.0,
            TIMER_TRAIN: 1.0,
            TRAIN_RESPONSE_LENGTH: 10.0,
            TOKENS_PER_S: 1,
        },
        {
            "step": 2,
            TIMER_STEP: 2.0,
            TIMER_GENERATE: 1.5,
            TIMER_TRAIN: 0.5,
            TRAIN_RESPONSE_LENGTH: 9.0,
            TOKENS_PER_S: 2,
        },
        {
            "step": 3,
            TIMER_STEP: 4.0,
            TIMER_GENERATE: 2.5,
            TIMER_TRAIN: 1.5,
            TRAIN_RESPONSE_LENGTH: 10.0,
            TOKENS_PER_S: 4,
        },
        {"step": 3, "val/rewards": 0.5},  # a row without timers is not a step
    ]
    result = gpu_check.CaseResult(gpus=2)
    gpu_check.summarise(rows, 1, prompt_tokens=7, workload=workload, result=result)
    assert result.steps_measured == 2 and result.step_s_each == [2.0, 4.0] and result.step_s == 3.0
    assert result.phases_s == {"generate": 2.0, "train": 1.0}
    # 7 prompt tokens x 3 samples each, plus 6 samples x 9.5 response tokens on average
    assert result.tokens_per_step == 7 * 3 + 6 * 9.5
    assert result.tokens_per_s_per_gpu == pytest.approx((7 * 3 + 6 * 9.5) / (3.0 * 2))
    assert result.trainer_tokens_per_s_per_gpu == 3.0


def test_distributed_cases_run_under_torchrun_with_one_process(tmp_path):
    def command(name):
        return gpu_check.case_command(
            name, tmp_path / "c.yaml", tmp_path / "run", tmp_path / "m.json", "bf16-mixed", False
        )

    plain, megatron = command("hf-engine"), command("megatron-tp1")
    assert plain[0] == sys.executable and plain[2:4] == [gpu_check.WRAPPER_FLAG, str(tmp_path / "m.json")]
    assert "model.precision=bf16-mixed" in plain and "generation.engine=hf" in plain
    assert megatron[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    # Megatron refuses bf16-mixed (aligner.config): bfloat16 weights instead.
    assert "model.precision=fp32" in megatron and "model.dtype=bfloat16" in megatron
    assert "--keep-saves" not in megatron
    assert "--nproc_per_node" in command("fsdp-1gpu")


def test_an_error_keeps_what_the_worker_said_without_this_machines_paths():
    output = "\n".join(
        [
            "/opt/venv/lib/python3.12/site-packages/megatron/core/optimizer/__init__.py:24: UserWarning: no TE",
            "  warnings.warn(",
            'File "/tmp/gpu-check-x/model/config.json" is broken',
            "aligner train: error: model.backend=megatron runs under torchrun",
            "E1128 07:32:17.327000 1 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2)",
            "Traceback (most recent call last):",
            "  raise ChildFailedError(",
        ]
    )
    tail = gpu_check.error_tail(output, lines=5)
    assert tail.splitlines() == [
        'File "/tmp/gpu-check-x/model/config.json" is broken',
        "aligner train: error: model.backend=megatron runs under torchrun",
    ]
    short = gpu_check.shorten_paths(
        tail + " /srv/home/me/x/y.py see https://pytorch.org/a/b", {"/tmp/gpu-check-x": "<tmp>"}
    )
    assert '"<tmp>/model/config.json"' in short and "…/x/y.py" in short and "/srv" not in short
    assert "https://pytorch.org/a/b" in short


@pytest.mark.parametrize(
    "argv", [["--cases", "torch-engine,nope"], ["--cases", "hf-engine,hf-engine"], ["--steps", "1"]]
)
def test_refused_arguments(argv):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(argv)


def test_the_device_script_is_valid_bash_and_runs_the_check():
    script = REPO / "scripts" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "bench/gpu_check.py" in script.read_text()
