"""Prompt files of a verifiable task for SmolLM2-135M-Instruct: small sums and differences, checked exactly.

    .venv/bin/python scripts/make_arithmetic_prompts.py      # writes configs/prompts/arithmetic_{train,val}.jsonl

Each line is `{"prompt": "...", "answer": N}`; the reward `aligner.rewards.verifiable:numeric_match` scores 1 when
the last number of a response is N (configs/smollm2_arithmetic.yaml). The problems are drawn with a fixed seed, so
the files are the same on every run; no problem of validation (its operands and operator; a + b and b + a count
as one) is in training, so validation measures held-out accuracy.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "configs" / "prompts"
SEED = 19
NUM_TRAIN = 1000
NUM_VAL = 128
TEMPLATE = "What is {a} {op} {b}? Give only the number."

# Kinds of problem, each with its share and the ranges of its operands. SmolLM2-135M-Instruct, sampled at
# temperature 0.5, gets about half of the one-digit sums right and a tenth of the two-digit ones (often by talking
# past its 16 new tokens): a start well below the ceiling that RL can raise.
KINDS = (
    # (share, operator, range of a, range of b)
    (1, "+", (1, 9), (1, 9)),
    (2, "-", (2, 18), (1, 9)),
    (2, "+", (10, 99), (1, 9)),
    (1, "+", (10, 99), (10, 99)),
)


def pool(op: str, a_range: tuple[int, int], b_range: tuple[int, int]) -> list[tuple[int, str, int]]:
    """Every distinct problem of a kind, sorted: a + b and b + a are one problem, a - b is never below zero."""
    problems = set()
    for a in range(a_range[0], a_range[1] + 1):
        for b in range(b_range[0], b_range[1] + 1):
            if op == "+":
                problems.add((min(a, b), op, max(a, b)))
            elif a >= b:
                problems.add((a, op, b))
    return sorted(problems)


def answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def record(problem: tuple[int, str, int], rng: random.Random) -> dict:
    a, op, b = problem
    if op == "+" and rng.random() < 0.5:
        a, b = b, a
    return {"prompt": TEMPLATE.format(a=a, op=op, b=b), "answer": answer(*problem)}


def make_splits(num_train: int, num_val: int, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """Both splits with the kinds' shares; validation's problems are distinct and none is in training.

    The small kinds (45 one-digit sums, 21 of them for validation) have too few problems to fill the training share
    once each: training lines are drawn with replacement from what validation left.
    """
    rng = random.Random(seed)
    total = sum(k[0] for k in KINDS)
    train, val = [], []
    for share, op, a_range, b_range in KINDS:
        problems = pool(op, a_range, b_range)
        rng.shuffle(problems)
        n_val = round(num_val * share / total)
        val += [record(p, rng) for p in problems[:n_val]]
        train += [record(rng.choice(problems[n_val:]), rng) for _ in range(round(num_train * share / total))]
    rng.shuffle(train)
    rng.shuffle(val)
    return train, val


def write_jsonl(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="folder of the two files")
    parser.add_argument("--num-train", type=int, default=NUM_TRAIN)
    parser.add_argument("--num-val", type=int, default=NUM_VAL)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    train, val = make_splits(args.num_train, args.num_val, args.seed)
    write_jsonl(train, args.out_dir / "arithmetic_train.jsonl")
    write_jsonl(val, args.out_dir / "arithmetic_val.jsonl")
    print(f"wrote {len(train)} training and {len(val)} validation prompts to {args.out_dir}")


if __name__ == "__main__":
    main()
