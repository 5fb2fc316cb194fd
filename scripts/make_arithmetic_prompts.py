"""Prompt files of a verifiable task for SmolLM2-135M-Instruct: small sums and differences, checked exactly.

    .venv/bin/python scripts/make_arithmetic_prompts.py      # writes configs/prompts/arithmetic_{train,val}.jsonl

Each line is `{"prompt": "...", "answer": N}`; the reward `aligner.rewards.verifiable:numeric_match` scores 1 when
the last number of a response is N (configs/smollm2_arithmetic.yaml). The problems are drawn with a fixed seed, so
the files are the same on every run; no problem (its operands and operator) is in both files, so validation
measures held-out accuracy.
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

# Share of each kind of problem, with the range of each operand. SmolLM2-135M-Instruct, sampled at temperature 0.5,
# gets about half of the one-digit sums right and a tenth of the rest (often by talking past its 16 new tokens):
# a start well below the ceiling that RL can raise.
KINDS = (
    # (weight, operator, range of a, range of b)
    (2, "+", (1, 9), (1, 9)),
    (3, "+", (10, 99), (1, 9)),
    (2, "-", (10, 99), (1, 9)),
    (1, "+", (10, 99), (10, 99)),
)


def problem(rng: random.Random) -> tuple[int, str, int]:
    """(a, operator, b), subtractions never below zero."""
    _, op, a_range, b_range = rng.choices(KINDS, weights=[k[0] for k in KINDS])[0]
    a, b = rng.randint(*a_range), rng.randint(*b_range)
    if op == "-" and b > a:
        a, b = b, a
    return a, op, b


def answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def make_splits(num_train: int, num_val: int, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """Distinct problems (a + b and b + a count as one), the first num_val for validation: no problem is in both
    splits."""
    rng = random.Random(seed)
    seen: set[tuple[int, str, int]] = set()
    problems = []
    while len(problems) < num_train + num_val:
        p = problem(rng)
        a, op, b = p
        key = (min(a, b), op, max(a, b)) if op == "+" else p  # 12 + 34 and 34 + 12 are one problem
        if key not in seen:
            seen.add(key)
            problems.append(p)
    records = [{"prompt": TEMPLATE.format(a=a, op=op, b=b), "answer": answer(a, op, b)} for a, op, b in problems]
    return records[num_val:], records[:num_val]


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
