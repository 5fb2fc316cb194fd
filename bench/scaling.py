"""Data-parallel scaling: samples/s of the bench/rloo_step.py workload on 1 and 2 processes (torchrun, gloo).

    .venv/bin/python bench/scaling.py                        # table
    .venv/bin/python bench/scaling.py --json                 # one JSON line
    .venv/bin/python bench/scaling.py --runs 1x2,2x1         # processes x threads per process
    .venv/bin/python bench/scaling.py --rounds 3             # alternate the runs 3 times, report medians
    .venv/bin/python bench/scaling.py --prompts 32           # a larger global batch (default 8, as rloo_step.py)

The workload is bench/rloo_step.py's (a ~2M-parameter Llama, 8 prompts x 4 samples x 32 new tokens a step, one
optimiser step per rollout); the batch is global, so 2 processes take 4 prompts each and all-reduce gradients. Each
run is its own launch (`torchrun --standalone --nproc_per_node N bench/scaling.py --child ...` for N > 1) on the
same workload files; steps after the warm-up are timed on rank 0 (the ranks meet at a barrier before each step, and
the gradient all-reduce ends it) and the median is reported.

On a machine of C cores, compare runs that use the same cores: 1x2 against 2x1 on 2 cores. Data parallelism on one
CPU host trades intra-op threads for processes; it pays on several GPUs or nodes, where each rank has its own.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def child(config: str, threads: int, prompts: int, steps: int, warmup: int) -> None:
    """One rank: time `steps` steps after `warmup`; rank 0 prints one JSON line."""
    from rloo_step import SAMPLES
    from workload import timed_steps

    from aligner import distributed
    from aligner.config import load_config
    from aligner.trainers.reinforce import ReinforceTrainer

    overrides = [f"model.num_threads={threads}", f"reinforce.num_prompts_per_step={prompts}"]
    trainer = ReinforceTrainer(load_config(config, overrides))
    trainer.setup()
    times, phases, lengths = timed_steps(trainer, prompts, steps, warmup, before_step=distributed.barrier)
    if distributed.is_main():
        s = statistics.median(times)
        result = {
            "processes": distributed.world_size(),
            "threads": threads,
            "prompts": prompts,
            "s_per_step": s,
            "samples_per_s": prompts * SAMPLES / s,
            "tokens_per_s": statistics.mean(lengths) * prompts * SAMPLES / s,
            "generate_s": statistics.median(p["timers/generate"] for p in phases),
            "train_s": statistics.median(p["timers/train"] for p in phases),
        }
        print(json.dumps(result), flush=True)
    distributed.finish()


def launch(config: Path, processes: int, threads: int, prompts: int, steps: int, warmup: int) -> dict:
    args = [str(HERE / "scaling.py"), "--child", str(config), "--threads", str(threads), "--prompts", str(prompts)]
    args += ["--steps", str(steps), "--warmup", str(warmup)]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    else:
        command = [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(command + args, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(command + args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", default="1x1,1x2,2x1", help="comma-separated PROCESSESxTHREADS runs")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the runs this many times (median of each)")
    parser.add_argument("--prompts", type=int, default=8, help="global prompts per step (4 samples each)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--child", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads, args.prompts, args.steps, args.warmup)
        return

    from rloo_step import build_workload

    runs = [tuple(int(x) for x in run.split("x")) for run in args.runs.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        config = build_workload(Path(tmp))
        if not args.json:
            header = ("processes x threads", "s/step", "samples/s", "tokens/s", "generate", "train")
            print(" ".join(f"{h:>{w}}" for h, w in zip(header, (20, 8, 10, 9, 9, 7))))
        # Alternated, so that every run sees the same share of whatever else loads the machine.
        measured = [
            [launch(config, p, t, args.prompts, args.steps, args.warmup) for p, t in runs] for _ in range(args.rounds)
        ]
        for i, (processes, threads) in enumerate(runs):
            r = {k: statistics.median(m[i][k] for m in measured) for k in measured[0][i]}
            results.append(r)
            if not args.json:
                print(
                    f"{f'{processes} x {threads}':>20} {r['s_per_step']:8.3f} {r['samples_per_s']:10.1f} "
                    f"{r['tokens_per_s']:9.0f} {r['generate_s']:9.3f} {r['train_s']:7.3f}",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"runs": results, "cpu_count": os.cpu_count()}))


if __name__ == "__main__":
    main()
