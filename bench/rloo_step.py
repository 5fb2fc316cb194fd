"""Time one REINFORCE / RLOO step of Aligner on a fixed workload: the tiny default, or any Hugging Face folder.

    .venv/bin/python bench/rloo_step.py                 # table
    .venv/bin/python bench/rloo_step.py --json          # one JSON line: s_per_step, samples_per_s, tokens_per_s, ...
    .venv/bin/python bench/rloo_step.py --trl-python trl-env/bin/python   # alternate with TRL's RLOOTrainer
    .venv/bin/python bench/rloo_step.py --set generation.compile=false       # any config override (A/B)
    .venv/bin/python bench/rloo_step.py --trl-python trl-env/bin/python --rounds 7 \
        --variant eager:generation.compile=false        # default (compiled), eager and TRL, alternated each round
    .venv/bin/python bench/rloo_step.py --model models/smollm2-135m-instruct --precision fp32,bf16 \
        --trl-python trl-env/bin/python --rounds 2 --steps 3 --warmup 1   # a real model, both precisions, both sides

Workload (the same as bench/trl_rloo_step.py): 8 prompts x 4 samples per step, exactly 32 new tokens per sample, a
rule reward (the share of letters "e": negligible cost), KL to the reference policy on, one optimiser step per
rollout, 2 threads. The policy is a Llama-shaped tiny model (hidden 128, 4 layers, 4 heads, vocab 512, about 2M
parameters, random init) with short random word prompts, or with `--model PATH` (and `--tokenizer PATH`) any causal
LM folder, with short generic English prompts in the tokenizer's chat template when it has one. `--precision fp32`
(default) trains in float32; `bf16` is `model.precision: bf16-mixed` (float32 master weights, bfloat16 compute) here
and `RLOOConfig(bf16=True)`, TRL's own mixed precision, on TRL's side; `fp32,bf16` times both.
Steps after the warm-up are timed; the median is reported. With --trl-python the two are run alternately, one
process each, `--rounds` times, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from workload import NEW_TOKENS, PROMPTS, SAMPLES, generic_prompts, parse_precisions  # noqa: E402

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "bird",
    "river",
    "sea",
    "song",
    "old",
    "happy",
    "sad",
    "kind",
    "slow",
    "bright",
    "runs",
    "sings",
    "to",
    "of",
    "and",
    "is",
]


def letter_reward(prompts: list[str], responses: list[str]) -> list[float]:
    return [r.count("e") / max(1, len(r)) for r in responses]


def build_workload(folder: Path, model: str | None = None, tokenizer: str | None = None, precision: str = "fp32"):
    """The step's config (returns its path): the tiny workload, built here, or `model`'s folder, generic prompts."""
    import random

    import yaml

    rng = random.Random(0)
    if model is None:
        import torch
        from transformers import LlamaForCausalLM
        from workload import bpe_tokenizer, llama_config

        corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(2000)]
        tok = bpe_tokenizer(corpus)
        torch.manual_seed(0)
        config = llama_config(tok)
        policy = folder / "policy"
        LlamaForCausalLM(config).save_pretrained(str(policy))
        tok.save_pretrained(str(policy))
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(256)]
        model_cfg = {"policy_path": str(policy), "num_threads": 2}
    else:
        prompts = generic_prompts(256)
        model_cfg = {"policy_path": str(Path(model).resolve()), "num_threads": 2}
        if tokenizer:
            model_cfg["tokenizer_path"] = str(Path(tokenizer).resolve())
    if precision == "bf16":
        model_cfg["precision"] = "bf16-mixed"  # float32 master weights, bfloat16 compute; fp32 is the default
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    cfg = {
        "run_dir": str(folder / "run"),
        "model": model_cfg,
        "data": {"train_file": str(folder / "prompts.jsonl"), "val_file": str(folder / "prompts.jsonl")},
        "reward": {"function": "rloo_step:letter_reward"},
        "generation": {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS},
        "reinforce": {"num_prompts_per_step": PROMPTS, "num_rollouts_per_prompt": SAMPLES},
        "optim": {"lr": 1e-4, "warmup_steps": 0, "micro_batch_size": PROMPTS * SAMPLES},
        "trainer": {"max_steps": 10_000, "val_check_interval": 10_000, "save_interval": 10_000, "progress_bar": False},
    }
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_aligner(steps: int, warmup: int, overrides: list[str], model=None, tokenizer=None, precision="fp32") -> dict:
    """Time `steps` steps after `warmup` in this process."""
    from workload import timed_steps

    from aligner.config import load_config
    from aligner.trainers.reinforce import ReinforceTrainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = ReinforceTrainer(load_config(build_workload(Path(tmp), model, tokenizer, precision), overrides))
        trainer.setup()
        times, phases, lengths = timed_steps(trainer, PROMPTS, steps, warmup)
    s = statistics.median(times)
    tokens = statistics.mean(lengths) * PROMPTS * SAMPLES
    return {
        "engine": "aligner",
        "model": model or "tiny",
        "precision": precision,
        "s_per_step": s,
        "samples_per_s": PROMPTS * SAMPLES / s,
        "tokens_per_s": tokens / s,
        "steps": steps,
        "phases": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
    }


def run_child(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--model", help="Hugging Face causal-LM folder to time instead of the tiny model")
    parser.add_argument("--tokenizer", help="tokenizer folder, with --model (default: the model's)")
    parser.add_argument(
        "--precision",
        default="fp32",
        help="fp32, bf16 (Aligner model.precision bf16-mixed, TRL bf16=True) or a comma list: each is timed",
    )
    parser.add_argument("--trl-python", help="python of an environment with TRL: alternate runs with TRL")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds with --trl-python")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override Aligner's config")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="with --trl-python: also time Aligner with these overrides, in the same alternation",
    )
    args = parser.parse_args(argv)
    try:
        args.precision = parse_precisions(args.precision)
    except ValueError as err:
        parser.error(str(err))
    if args.tokenizer and not args.model:
        parser.error("--tokenizer needs --model")
    if len(args.precision) > 1 and not args.trl_python:
        parser.error("several --precision values need --trl-python (each is one engine of the alternation)")
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1, --warmup >= 0")
    args.variants = []
    for spec in args.variant:
        name, _, overrides = spec.partition(":")
        if not name or not overrides:
            parser.error(f"--variant {spec!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
        args.variants.append((name, [f"--set={kv}" for kv in overrides.split(",")]))
    return args


def engines(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """(name, precision, command) of every process of one round: Aligner, its variants and TRL, per precision."""
    here = Path(__file__).resolve()
    common = ["--json", "--steps", str(args.steps), "--warmup", str(args.warmup)]
    model = ["--model", args.model] if args.model else []
    model += ["--tokenizer", args.tokenizer] if args.tokenizer else []
    out = []
    for precision in args.precision:
        ours = [sys.executable, str(here), *common, *model, "--precision", precision]
        ours += [f"--set={override}" for override in args.set]
        out.append(("aligner", precision, ours))
        out += [(name, precision, ours + overrides) for name, overrides in args.variants]
        trl = [args.trl_python, str(here.with_name("trl_rloo_step.py")), *common, *model, "--precision", precision]
        out.append(("trl", precision, trl))
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if not args.trl_python:
        result = run_aligner(args.steps, args.warmup, args.set, args.model, args.tokenizer, args.precision[0])
        if args.json:
            keys = ("model", "precision", "s_per_step", "samples_per_s", "tokens_per_s", "steps", "phases")
            print(json.dumps({k: result[k] for k in keys}))
        else:
            from aligner.metrics import TIMERS_PREFIX

            print(f"{result['model']}, {result['precision']}")
            print(f"{'s/step':>8} {'samples/s':>10} {'tokens/s':>10}   phase medians (s)")
            phases = "  ".join(f"{k.removeprefix(TIMERS_PREFIX)}={v:.3f}" for k, v in result["phases"].items())
            speed = f"{result['s_per_step']:8.3f} {result['samples_per_s']:10.1f} {result['tokens_per_s']:10.0f}"
            print(f"{speed}   {phases}")
        return

    procs = engines(args)
    rows = []
    for r in range(args.rounds):
        for name, precision, cmd in procs:
            result = run_child(cmd)
            rows.append({"round": r, "engine": name, "precision": precision, **result})
            if not args.json:
                print(
                    f"round {r} {name:8s} {precision:5s} {result['s_per_step']:.3f} s/step "
                    f"{result['samples_per_s']:.1f} samples/s",
                    flush=True,
                )
    speed = {(x["round"], x["engine"], x["precision"]): x["samples_per_s"] for x in rows}
    rounds = range(args.rounds)
    summary = {"model": args.model or "tiny", "rounds": args.rounds, "steps": args.steps}
    single = len(args.precision) == 1
    lines, best = [], 0.0
    trl_best = max(statistics.median(speed[r, "trl", p] for r in rounds) for p in args.precision)
    for p in args.precision:
        suffix = "" if single else f"_{p}"  # one precision keeps the keys earlier runs wrote
        trl_med = statistics.median(speed[r, "trl", p] for r in rounds)
        summary[f"trl{suffix}_samples_per_s"] = trl_med
        summary[f"trl{suffix}_s_per_step"] = PROMPTS * SAMPLES / trl_med
        for name, precision, _ in procs:
            if precision != p or name == "trl":
                continue
            med = statistics.median(speed[r, name, p] for r in rounds)
            # The ratio within each round (both ran back to back) is steadier than the ratio of the medians when the
            # host's speed drifts between rounds.
            per_round = statistics.median(speed[r, name, p] / speed[r, "trl", p] for r in rounds)
            key = ("aligner" if name == "aligner" else f"aligner_{name}") + suffix
            summary |= {
                f"{key}_samples_per_s": med,
                f"{key}_s_per_step": PROMPTS * SAMPLES / med,
                f"{key}_speedup": med / trl_med,
                f"{key}_round_speedup": per_round,
                f"{key}_speedup_over_best_trl": med / trl_best,
            }
            best = max(best, med / trl_best) if name == "aligner" else best
            lines.append(
                f"{name} {p}: median {PROMPTS * SAMPLES / med:.3f} s/step ({med:.1f} samples/s), trl {p} "
                f"{PROMPTS * SAMPLES / trl_med:.3f} s/step: speedup {med / trl_med:.2f}x (median of per-round ratios "
                f"{per_round:.2f}x), {med / trl_best:.2f}x TRL's faster precision"
            )
    summary["speedup"] = best  # Aligner's (default config) faster precision over TRL's faster precision
    lines.append(f"best Aligner over TRL's faster precision: {summary['speedup']:.2f}x")
    print(json.dumps(summary) if args.json else "\n".join(lines))


if __name__ == "__main__":
    main()
