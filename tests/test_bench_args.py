"""The step and generation benchmarks' command lines (bench/rloo_step.py, bench/generate.py): what each process of an
alternation is asked to run, and the arguments refused before any model is loaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import generate  # noqa: E402
import rloo_step  # noqa: E402
from workload import generic_prompts, parse_precisions  # noqa: E402


def test_precisions_are_a_comma_list_of_known_names_each_once():
    assert parse_precisions("fp32") == ["fp32"]
    assert parse_precisions("bf16, fp32") == ["bf16", "fp32"]
    for bad in ("", "fp16", "fp32,fp32", "bf16-mixed"):
        with pytest.raises(ValueError):
            parse_precisions(bad)


def test_generic_prompts_do_not_repeat_within_their_pool():
    prompts = generic_prompts(60)
    assert len(set(prompts)) == 60
    assert generic_prompts(8) == prompts[:8]


def test_each_precision_times_aligner_and_trl_on_the_same_model():
    args = rloo_step.parse_args(
        ["--model", "m", "--tokenizer", "t", "--precision", "fp32,bf16", "--trl-python", "py", "--set", "a.b=1"]
    )
    procs = rloo_step.engines(args)
    assert [(name, precision) for name, precision, _ in procs] == [
        ("aligner", "fp32"),
        ("trl", "fp32"),
        ("aligner", "bf16"),
        ("trl", "bf16"),
    ]
    for name, precision, cmd in procs:
        text = " ".join(cmd)
        assert f"--model m --tokenizer t --precision {precision}" in text
        assert ("--set=a.b=1" in cmd) == (name == "aligner")
    assert procs[1][2][0] == "py"


@pytest.mark.parametrize(
    "argv",
    [
        ["--precision", "fp32,bf16"],  # several precisions are engines of an alternation: they need --trl-python
        ["--tokenizer", "t"],
        ["--precision", "fp16"],
        ["--trl-python", "py", "--variant", "no-overrides"],
    ],
)
def test_rloo_step_refuses(argv):
    with pytest.raises(SystemExit):
        rloo_step.parse_args(argv)


def test_generate_takes_known_engines_only():
    with pytest.raises(SystemExit):
        generate.parse_args(["--engines", "torch,trt"])
    assert generate.parse_args(["--engines", "torch, hf"]).engines == ["torch", "hf"]
