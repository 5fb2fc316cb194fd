"""Time one REINFORCE / RLOO step of Aligner on a fixed tiny workload.

    .venv/bin/python bench/rloo_step.py                 # table
    .venv/bin/python bench/rloo_step.py --json          # one JSON line: s_per_step, samples_per_s, tokens_per_s
    .venv/bin/python bench/rloo_step.py --trl-python trl-env/bin/python   # alternate with TRL's RLOOTrainer
    .venv/bin/python bench/rloo_step.py --set generation.compile=false       # any config override (A/B)
    .venv/bin/python bench/rloo_step.py --trl-python trl-env/bin/python --rounds 7 \
        --variant eager:generation.compile=false        # default (compiled), eager and TRL, alternated each round

Workload (the same as bench/trl_rloo_step.py): a Llama-shaped policy (hidden 128, 4 layers, 4 heads, vocab 512,
about 2M parameters, fp32, random init), 8 prompts x 4 samples per step, exactly 32 new tokens per sample, a
reward function (negligible cost), KL to the reference policy on, one optimiser step per rollout, 2 threads.
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

PROMPTS = 8
SAMPLES = 4
NEW_TOKENS = 32
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


def build_workload(folder: Path) -> Path:
    """Tokenizer (byte-level BPE, vocab 512), random tiny Llama, prompt files, config; returns the config path."""
    import random

    import torch
    import yaml
    from transformers import LlamaForCausalLM
    from workload import bpe_tokenizer, llama_config

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(2000)]
    tokenizer = bpe_tokenizer(corpus)
    torch.manual_seed(0)
    config = llama_config(tokenizer)
    policy = folder / "policy"
    LlamaForCausalLM(config).save_pretrained(str(policy))
    tokenizer.save_pretrained(str(policy))
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(256)]
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    cfg = {
        "run_dir": str(folder / "run"),
        "model": {"policy_path": str(policy), "num_threads": 2},
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


def run_aligner(steps: int, warmup: int, overrides: list[str]) -> dict:
    """Time `steps` steps after `warmup` in this process."""
    sys.path.insert(0, str(Path(__file__).parent))
    from workload import timed_steps

    from aligner.config import load_config
    from aligner.trainers.reinforce import ReinforceTrainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = ReinforceTrainer(load_config(build_workload(Path(tmp)), overrides))
        trainer.setup()
        times, phases, lengths = timed_steps(trainer, PROMPTS, steps, warmup)
    s = statistics.median(times)
    tokens = statistics.mean(lengths) * PROMPTS * SAMPLES
    return {
        "engine": "aligner",
        "s_per_step": s,
        "samples_per_s": PROMPTS * SAMPLES / s,
        "tokens_per_s": tokens / s,
        "steps": steps,
        "phases": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
    }


def run_child(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
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
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if not args.trl_python:
        result = run_aligner(args.steps, args.warmup, args.set)
        if args.json:
            print(json.dumps({k: result[k] for k in ("s_per_step", "samples_per_s", "tokens_per_s", "steps")}))
        else:
            print(f"{'s/step':>8} {'samples/s':>10} {'tokens/s':>10}   phase medians (s)")
            phases = "  ".join(f"{k.removeprefix('timers/')}={v:.3f}" for k, v in result["phases"].items())
            speed = f"{result['s_per_step']:8.3f} {result['samples_per_s']:10.1f} {result['tokens_per_s']:10.0f}"
            print(f"{speed}   {phases}")
        return

    here = Path(__file__).resolve()
    ours = [sys.executable, str(here), "--json", "--steps", str(args.steps), "--warmup", str(args.warmup)]
    ours += [f"--set={override}" for override in args.set]
    trl = [
        args.trl_python,
        str(here.with_name("trl_rloo_step.py")),
        "--json",
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    engines = [("aligner", ours)]
    for spec in args.variant:
        name, _, overrides = spec.partition(":")
        if not name or not overrides:
            parser.error(f"--variant {spec!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
        engines.append((name, ours + [f"--set={kv}" for kv in overrides.split(",")]))
    engines.append(("trl", trl))
    rows = []
    for r in range(args.rounds):
        for name, cmd in engines:
            result = run_child(cmd)
            rows.append({"round": r, "engine": name, **{k: result[k] for k in ("s_per_step", "samples_per_s")}})
            if not args.json:
                print(
                    f"round {r} {name:8s} {result['s_per_step']:.3f} s/step {result['samples_per_s']:.1f} samples/s",
                    flush=True,
                )
    speed = {(x["round"], x["engine"]): x["samples_per_s"] for x in rows}
    trl_med = statistics.median(speed[r, "trl"] for r in range(args.rounds))
    summary = {"trl_samples_per_s": trl_med, "rounds": args.rounds}
    lines = []
    for name, _ in engines[:-1]:
        med = statistics.median(speed[r, name] for r in range(args.rounds))
        # The ratio within each round (both ran back to back) is steadier than the ratio of the medians when the
        # host's speed drifts between rounds.
        per_round = statistics.median(speed[r, name] / speed[r, "trl"] for r in range(args.rounds))
        key = "aligner" if name == "aligner" else f"aligner_{name}"
        summary |= {f"{key}_samples_per_s": med, f"{key}_speedup": med / trl_med, f"{key}_round_speedup": per_round}
        lines.append(
            f"{name}: median {med:.1f} samples/s, trl {trl_med:.1f}: speedup {med / trl_med:.2f}x "
            f"(median of per-round ratios {per_round:.2f}x)"
        )
    summary["speedup"] = summary["aligner_speedup"]
    print(json.dumps(summary) if args.json else "\n".join(lines))


if __name__ == "__main__":
    main()
