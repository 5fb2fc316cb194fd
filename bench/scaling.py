"""Data-parallel scaling: samples/s of the bench/rloo_step.py workload on 1 and 2 processes (torchrun, gloo).

    .venv/bin/python bench/scaling.py                        # table
    .venv/bin/python bench/scaling.py --json                 # one JSON line
    .venv/bin/python bench/scaling.py --runs 1x2,2x1         # processes x threads per process
    .venv/bin/python bench/scaling.py --rounds 3             # alternate the runs 3 times, report medians
    .venv/bin/python bench/scaling.py --prompts 32           # a larger global batch (default 8, as rloo_step.py)
    .venv/bin/python bench/scaling.py --skewed               # static vs dynamic dealing (2x1 vs 2x1d), skewed lengths

The workload is bench/rloo_step.py's (a ~2M-parameter Llama, 8 prompts x 4 samples x 32 new tokens a step, one
optimiser step per rollout); the batch is global, so 2 processes take 4 prompts each and all-reduce gradients. Each
run is its own launch (`torchrun --standalone --nproc_per_node N bench/scaling.py --child ...` for N > 1) on the
same workload files; steps after the warm-up are timed on rank 0 (the ranks meet at a barrier before each step, and
the gradient all-reduce ends it) and the median is reported.

`--skewed` makes the response lengths uneven: of each step's global batch (prompts in file order), the first half
sample SKEW_LONG tokens and the second half SKEW_SHORT (forced: min = max new tokens, per run of prompts). The
static split gives rank 0 every long prompt; a run ending in `d` deals chunks of `--chunk` prompts from the shared
queue (reinforce.dynamic_batching), so the rank done with a short chunk takes the next long one. Training goes in
micro-batches of SKEW_MICRO_BATCH responses, so short rows are not padded to the long ones' width.

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

SKEW_LONG, SKEW_SHORT = 64, 4  # new tokens of the long and the short half of a step's prompts (--skewed)
SKEW_MICRO_BATCH = 8  # --skewed: responses per micro-batch (2 prompts' samples), in both dealings


class SkewedGenerator:
    """Wraps the trainer's generator: prompts in `long` sample SKEW_LONG tokens, the others SKEW_SHORT."""

    def __init__(self, inner, long: set[tuple[int, ...]]):
        self.inner, self.long, self.pad_id = inner, long, inner.pad_id

    def update_weights(self, model) -> None:
        self.inner.update_weights(model)

    def generate(self, prompt_ids: list[list[int]], num_samples: int, seed: int):
        import itertools

        import torch

        from aligner.generation.generator import _concat

        config, parts = self.inner.config, []
        try:
            for is_long, run in itertools.groupby(prompt_ids, key=lambda ids: tuple(ids) in self.long):
                tokens = SKEW_LONG if is_long else SKEW_SHORT
                self.inner.config = config.model_copy(update={"max_new_tokens": tokens, "min_new_tokens": tokens})
                parts.append(self.inner.generate(list(run), num_samples, seed + len(parts)))
        finally:
            self.inner.config = config
        out = parts[0] if len(parts) == 1 else _concat(parts, self.pad_id)
        out.group_ids = torch.arange(len(prompt_ids)).repeat_interleave(num_samples)
        return out


def child(
    config: str, threads: int, prompts: int, steps: int, warmup: int, dynamic: bool, chunk: int, skewed: bool
) -> None:
    """One rank: time `steps` steps after `warmup`; rank 0 prints one JSON line."""
    from rloo_step import SAMPLES
    from workload import timed_steps

    from aligner import distributed
    from aligner.config import load_config
    from aligner.metrics import TIMER_GENERATE, TIMER_TRAIN
    from aligner.trainers.reinforce import ReinforceTrainer

    overrides = [f"model.num_threads={threads}", f"reinforce.num_prompts_per_step={prompts}"]
    overrides += [f"reinforce.dynamic_batching={str(dynamic).lower()}", f"reinforce.dynamic_batching_prompts={chunk}"]
    if skewed:
        overrides.append("data.shuffle=false")  # batches in file order: the long half first
        # Micro-batches of a few rows: a rank's short rows are not padded to its long rows' width in training.
        overrides.append(f"optim.micro_batch_size={SKEW_MICRO_BATCH}")
    trainer = ReinforceTrainer(load_config(config, overrides))
    trainer.setup()
    if skewed:
        ids = trainer.train_data.token_ids
        trainer.generator = SkewedGenerator(
            trainer.generator, {tuple(ids[i]) for i in range(len(ids)) if i % prompts < prompts // 2}
        )
    times, phases, lengths = timed_steps(trainer, prompts, steps, warmup, before_step=distributed.barrier)
    if distributed.is_main():
        s = statistics.median(times)
        result = {
            "processes": distributed.world_size(),
            "threads": threads,
            "dealing": "dynamic" if dynamic else "static",
            "prompts": prompts,
            "s_per_step": s,
            "samples_per_s": prompts * SAMPLES / s,
            "tokens_per_s": statistics.mean(lengths) * prompts * SAMPLES / s,
            "generate_s": statistics.median(p[TIMER_GENERATE] for p in phases),
            "train_s": statistics.median(p[TIMER_TRAIN] for p in phases),
        }
        print(json.dumps(result), flush=True)
    distributed.finish()


def launch(config: Path, run: str, args: argparse.Namespace) -> dict:
    processes, threads = (int(x) for x in run.rstrip("d").split("x"))
    command_args = [str(HERE / "scaling.py"), "--child", str(config), "--threads", str(threads)]
    command_args += ["--prompts", str(args.prompts), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    command_args += ["--chunk", str(args.chunk)] + (["--dynamic"] if run.endswith("d") else [])
    command_args += ["--skewed"] if args.skewed else []
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    else:
        command = [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(command + command_args, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(command + command_args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--runs",
        help="comma-separated PROCESSESxTHREADS runs, d at the end: dynamic dealing (default 1x1,1x2,2x1; "
        "with --skewed 2x1,2x1d)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternate the runs this many times (median of each)")
    parser.add_argument("--prompts", type=int, default=8, help="global prompts per step (4 samples each)")
    parser.add_argument("--skewed", action="store_true", help="half the prompts long, half short (see above)")
    parser.add_argument("--chunk", type=int, default=1, help="prompts per chunk of dynamic dealing")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--child", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--dynamic", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads, args.prompts, args.steps, args.warmup, args.dynamic, args.chunk, args.skewed)
        return

    from rloo_step import build_workload

    runs = (args.runs or ("2x1,2x1d" if args.skewed else "1x1,1x2,2x1")).split(",")
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        config = build_workload(Path(tmp))
        if not args.json:
            header = ("processes x threads", "dealing", "s/step", "samples/s", "tokens/s", "generate", "train")
            print(" ".join(f"{h:>{w}}" for h, w in zip(header, (20, 8, 8, 10, 9, 9, 7))))
        # Alternated, so that every run sees the same share of whatever else loads the machine.
        measured = [[launch(config, run, args) for run in runs] for _ in range(args.rounds)]
        for i, _ in enumerate(runs):
            r = {
                k: v if isinstance(v, str) else statistics.median(m[i][k] for m in measured)
                for k, v in measured[0][i].items()
            }
            results.append(r)
            if not args.json:
                processes, threads = r["processes"], r["threads"]
                print(
                    f"{f'{processes} x {threads}':>20} {r['dealing']:>8} {r['s_per_step']:8.3f} "
                    f"{r['samples_per_s']:10.1f} "
                    f"{r['tokens_per_s']:9.0f} {r['generate_s']:9.3f} {r['train_s']:7.3f}",
                    flush=True,
                )
    if args.json:
        load = {"load_avg_1m_before": load_before[0], "load_avg_1m_after": os.getloadavg()[0]}
        print(json.dumps({"runs": results, "cpu_count": os.cpu_count(), "skewed": args.skewed, **load}))


if __name__ == "__main__":
    main()
