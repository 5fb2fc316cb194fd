"""scripts/make_arithmetic_prompts.py: the same files every run, held-out problems, right answers."""

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_arithmetic_prompts.py"
SPEC = importlib.util.spec_from_file_location("make_arithmetic_prompts", SCRIPT)
script = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(script)

PROBLEM = re.compile(r"What is (\d+) ([+-]) (\d+)\? Give only the number\.")


def problems(records):
    """Each record's (a, op, b) read back from its prompt text, its answer checked against the arithmetic."""
    out = []
    for record in records:
        a, op, b = PROBLEM.fullmatch(record["prompt"]).groups()
        a, b = int(a), int(b)
        assert record["answer"] == (a + b if op == "+" else a - b), record
        assert record["answer"] >= 0
        out.append((min(a, b), op, max(a, b)) if op == "+" else (a, op, b))
    return out


def test_files_are_deterministic_disjoint_and_correct(tmp_path):
    script.main(["--out-dir", str(tmp_path / "a"), "--num-train", "300", "--num-val", "40"])
    script.main(["--out-dir", str(tmp_path / "b"), "--num-train", "300", "--num-val", "40"])
    for name in ("arithmetic_train.jsonl", "arithmetic_val.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    read = lambda name: [json.loads(line) for line in (tmp_path / "a" / name).read_text().splitlines()]  # noqa: E731
    train, val = problems(read("arithmetic_train.jsonl")), problems(read("arithmetic_val.jsonl"))
    assert (len(train), len(val)) == (300, 40)
    # Validation's problems are distinct and none is in training (12 + 34 and 34 + 12 are one problem).
    assert len(set(val)) == 40
    assert not set(val) & set(train)
    # Both splits hold every kind: one-digit sums, differences, two-digit sums.
    for split in (train, val):
        assert {op for _, op, _ in split} == {"+", "-"}
        assert any(b < 10 for _, op, b in split if op == "+") and any(a >= 10 for a, op, _ in split if op == "+")


def test_another_seed_draws_other_problems():
    assert script.make_splits(50, 10, seed=1) != script.make_splits(50, 10, seed=2)


def test_committed_files_are_the_scripts_output():
    train, val = script.make_splits(script.NUM_TRAIN, script.NUM_VAL)
    for name, records in (("arithmetic_train.jsonl", train), ("arithmetic_val.jsonl", val)):
        lines = (ROOT / "configs" / "prompts" / name).read_text().splitlines()
        assert [json.loads(line) for line in lines] == records


def test_shipped_config_scores_the_answers_of_its_files():
    """configs/smollm2_arithmetic.yaml reads these files, and its reward gives 1 to the answer, 0 to a wrong one
    and to one whose last number is wrong."""
    from aligner.config import load_config
    from aligner.data.prompts import read_prompt_file
    from aligner.rewards.local import FunctionRewardClient

    config = load_config(ROOT / "configs" / "smollm2_arithmetic.yaml")
    records = read_prompt_file(config.data.val_file)[:4]
    client = FunctionRewardClient(config.reward.function, config.reward.function_args)
    metadata = [r.metadata for r in records]
    answers = [str(m["answer"]) for m in metadata]
    prompts = [r.text for r in records]
    right = client.submit(prompts, answers, metadata).result()
    wrong = client.submit(prompts, [str(int(a) + 1) for a in answers], metadata).result()
    talk = client.submit(prompts, [f"{a}, or rather {int(a) + 1}" for a in answers], metadata).result()
    assert list(right) == [1.0] * 4 and list(wrong) == [0.0] * 4 and list(talk) == [0.0] * 4
