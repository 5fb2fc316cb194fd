"""bench/algorithms.py, the presets' learning benchmark, at the suite's size: the tiny local policy on the arithmetic
prompts for 3 steps a preset. Each run differs from the others only by its preset's knobs, and the table, the JSON
and the curves come from each run's own validations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from aligner.config import ALGORITHM_PRESETS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import algorithms as bench  # noqa: E402

TINY = ["--steps", "3", "--val-every", "2", "--val-prompts", "4", "--set", "generation.max_new_tokens=4",
        "--set", "reinforce.num_prompts_per_step=2", "--set", "reinforce.num_rollouts_per_prompt=2",
        "--set", "optim.micro_batch_size=4", "--set", "model.num_threads=1"]  # fmt: skip


def test_presets_train_on_equal_settings_and_report_their_validations(tmp_path, tiny_policy_dir, capsys):
    out, png = tmp_path / "algorithms.json", tmp_path / "curves.png"
    argv = ["--presets", "rloo,grpo", "--model", str(tiny_policy_dir), "--workdir", str(tmp_path / "runs"),
            "--json", str(out), "--plot", str(png), "--seed", "7", *TINY]  # fmt: skip
    report = bench.main(argv)
    printed = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert [row["preset"] for row in report["rows"]] == ["rloo", "grpo"]
    configs = {}
    for row in report["rows"]:
        run_dir = Path(row["run_dir"])
        configs[row["preset"]] = yaml.safe_load((run_dir / "config.yaml").read_text())
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        validations = [(m["step"], m["val/rewards"]) for m in metrics if "val/rewards" in m]
        assert [tuple(point) for point in row["curve"]] == validations
        assert [step for step, _ in validations] == [0, 2, 3]
        values = [acc for _, acc in validations]
        assert (row["start"], row["end"], row["best"]) == (values[0], values[-1], max(values))
        # Step 1 alone ran without a validation: its wall time is the median of one.
        assert row["step_s"] == pytest.approx(next(m["timers/step"] for m in metrics if m["step"] == 1))
        assert f"| {row['preset']} | {row['start']:.1%} | {row['end']:.1%} | {row['best']:.1%} (" in printed
    rloo, grpo = configs["rloo"], configs["grpo"]
    # The base config's baseline, KL coefficient and estimator (the rloo preset's) do not override grpo's preset.
    for knob, value in ALGORITHM_PRESETS["grpo"].items():
        assert grpo["reinforce"][knob] == value, knob
    assert rloo["reinforce"]["baseline"] == "rloo" and rloo["reinforce"]["kl_estimator"] == "abs"
    assert grpo["reinforce"]["baseline"] != rloo["reinforce"]["baseline"]
    # Everything outside reinforce is the same (the run folder aside), and so is every knob no preset sets.
    for section in rloo.keys() - {"reinforce", "run_dir"}:
        assert rloo[section] == grpo[section], section
    assert rloo["seed"] == 7 and rloo["trainer"]["max_steps"] == 3 and rloo["optim"]["lr"] == 1e-5
    for knob in rloo["reinforce"].keys() - bench.PRESET_KNOBS - {"algorithm", "overlong_buffer"}:
        assert rloo["reinforce"][knob] == grpo["reinforce"][knob], knob
    assert Image.open(png).format == "PNG"


def test_table_has_a_row_a_preset_with_its_percentages():
    row = {"preset": "dapo", "start": 0.172, "end": 0.5, "best": 0.625, "best_step": 20, "step_s": 10.04,
           "wall_s": 420.0}  # fmt: skip
    table = bench.format_rows([row, {**row, "preset": "rloo", "step_s": None}])
    assert "| dapo | 17.2% | 50.0% | 62.5% (20) | 10.0 | 7.0 |" in table
    assert "| rloo | 17.2% | 50.0% | 62.5% (20) | - | 7.0 |" in table


@pytest.mark.parametrize(
    "argv",
    [
        ["--presets", "rloo,ppo"],
        ["--presets", "grpo,grpo"],
        ["--presets", ""],
        ["--steps", "0"],
        ["--set", "reinforce.algorithm=grpo"],  # the preset is what the runs compare
        ["--config", "no/such.yaml"],
    ],
)
def test_algorithms_bench_refuses(argv):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
