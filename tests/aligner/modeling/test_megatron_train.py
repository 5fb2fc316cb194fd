"""`aligner train` with model.backend=megatron: 2 processes over gloo on the CPU under the torch.cuda shim
(tests/helpers/megatron_train.py), against the plain HF backend in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

pytest.importorskip("megatron.core")

from aligner.cli import main  # noqa: E402
from aligner.metrics import MACHINE_PREFIXES  # noqa: E402
from aligner.run_layout import MANIFEST_FILE, checkpoint_problem  # noqa: E402
from aligner.trainers.run_log import read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
HELPERS = ROOT / "tests" / "helpers"
PROMPTS = ["tell me about the cat.", "describe the dog.", "a bird", "the old river", "the sea", "a song"]


def _config(tmp_path: Path, policy: Path, run: str, **model) -> Path:
    for name in ("train", "val"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    config = {
        "run_dir": str(tmp_path / run),
        "model": {"policy_path": str(policy), "num_threads": 1, **model},
        "data": {"train_file": str(tmp_path / "train.jsonl"), "val_file": str(tmp_path / "val.jsonl")},
        "reward": {"function": "tests.helpers.rewards:varied_reward"},
        "generation": {"max_new_tokens": 8, "end_strings": ["e", "a"]},
        "reinforce": {
            "num_prompts_per_step": 3,
            "num_rollouts_per_prompt": 2,
            "baseline": "none",
            "normalize_advantages": True,
        },
        # A low clip threshold: a miscounted gradient norm over the shards would change the step. AdamW moves a weight
        # by lr * g / (|g| + eps): with the default eps (1e-8) a gradient entry near 1e-8, whose rounding differs
        # between the sharded and the whole matmuls, turns into a visible share of lr (seen on another CPU: 1.2e-6).
        # With eps 1e-4 the update is a smooth function of the gradient (see _assert_same_weights).
        "optim": {"lr": 1e-3, "warmup_steps": 1, "micro_batch_size": 4, "max_grad_norm": 0.05, "eps": 1e-4},
        "trainer": {"max_steps": 2, "val_check_interval": 1, "save_interval": 1, "progress_bar": False},
    }
    path = tmp_path / f"{run}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _torchrun(*args: str, processes: int = 2) -> subprocess.CompletedProcess:
    """tests/helpers/megatron_train.py under torchrun, or in a plain process (`processes` 1)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    if processes == 1:
        cmd = [sys.executable]
    done = subprocess.run(
        [*cmd, str(HELPERS / "megatron_train.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    return done


def _without_timers(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(MACHINE_PREFIXES)} for r in rows]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "final_policy" / "model.safetensors")


def _assert_same_weights(run_dir: Path, reference: Path) -> None:
    """Equal to float rounding. Clipping bounds every gradient entry by max_grad_norm (0.05); fp32 sums of up to ~1e3
    terms in another order (tensor-parallel shards) change an entry by at most 1e3 * 6e-8 * 0.05 = 3e-9; an AdamW step
    with eps 1e-4 turns that into at most lr / eps * 3e-9 = 3e-8 of weight. Two steps stay under 1e-7: atol 1e-6
    leaves 10x. A wrong shard, a miscounted norm or a missed gradient moves weights by a share of lr (1e-3)."""
    a, b = _weights(reference), _weights(run_dir)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory, tiny_policy_dir) -> Path:
    """The reference: 2 steps of the plain HF backend in this process."""
    tmp_path = tmp_path_factory.mktemp("hf")
    assert main(["train", "--config", str(_config(tmp_path, tiny_policy_dir, "hf"))]) == 0
    start = load_file(tiny_policy_dir / "model.safetensors")
    final = _weights(tmp_path / "hf")
    assert max((final[k] - start[k]).abs().max().item() for k in final) > 1e-4  # the policy moved
    return tmp_path / "hf"


@pytest.mark.slow
def test_tensor_parallel_2_trains_like_the_hf_backend(tmp_path, tiny_policy_dir, hf_run):
    config = _config(tmp_path, tiny_policy_dir, "tp2", backend="megatron", tensor_model_parallel_size=2)
    done = _torchrun("train", "--config", str(config))
    assert done.stdout.count("final policy:") == 1
    tp2 = tmp_path / "tp2"
    _assert_same_weights(tp2, hf_run)

    # Same samples (the seeds go by data-parallel rank), same metrics, each logged once.
    ma, mb_ = _without_timers(read_jsonl(hf_run / "metrics.jsonl")), _without_timers(read_jsonl(tp2 / "metrics.jsonl"))
    assert [r["step"] for r in mb_] == [0, 1, 2]
    assert ma[1]["train_optim/grad_norm"] > 0.05  # clipped: the norm over the shards counts
    # The engine-trainer mismatch is measured on the first training pass, which Megatron's schedule keeps to itself.
    mismatch = {"train_rollouts/mismatch_kl", "train_rollouts/mismatch_ppl_ratio"}
    ma = [{k: v for k, v in r.items() if k not in mismatch} for r in ma]
    for ra, rb in zip(ma, mb_):
        assert ra.keys() == rb.keys()
        for key in ra:
            assert rb[key] == pytest.approx(ra[key], rel=1e-4, abs=1e-6), key
    sa, sb = read_jsonl(hf_run / "samples.jsonl"), read_jsonl(tp2 / "samples.jsonl")
    assert [(s["prompt"], s["response"]) for s in sa] == [(s["prompt"], s["response"]) for s in sb]

    # Per-rank optimiser state next to the gathered HF policy, both in the manifest rank 0 wrote.
    checkpoint = tp2 / "checkpoints" / "step_000002"
    ranks = ["megatron_optimizer_rank00000.pt", "megatron_optimizer_rank00001.pt"]
    assert sorted(p.name for p in checkpoint.glob("megatron_optimizer_rank*.pt")) == ranks
    assert set(ranks) <= json.loads((checkpoint / MANIFEST_FILE).read_text())["files"].keys()
    assert checkpoint_problem(checkpoint) is None


@pytest.mark.slow
def test_one_process_without_torchrun_trains_like_the_hf_backend(tmp_path, tiny_policy_dir, hf_run):
    """Megatron's parallel state on a process group of one rank, made by the backend itself (no torchrun)."""
    config = _config(tmp_path, tiny_policy_dir, "one", backend="megatron")
    done = _torchrun("train", "--config", str(config), processes=1)
    assert done.stdout.count("final policy:") == 1
    _assert_same_weights(tmp_path / "one", hf_run)


@pytest.mark.slow
def test_pipeline_parallel_2_resumes_exactly_and_its_final_policy_loads_with_transformers(
    tmp_path, tiny_policy_dir, hf_run
):
    from transformers import AutoModelForCausalLM

    # 1 step, then --resume to 2 (each rank's optimiser state restored): the 2 steps of the HF backend.
    config = _config(tmp_path, tiny_policy_dir, "pp2", backend="megatron", pipeline_model_parallel_size=2)
    _torchrun("train", "--config", str(config), "--set", "trainer.max_steps=1")
    _torchrun("train", "--config", str(config), "--resume")
    _assert_same_weights(tmp_path / "pp2", hf_run)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "pp2" / "final_policy"))
    assert model.config.num_hidden_layers == 2
    assert [r["step"] for r in read_jsonl(tmp_path / "pp2" / "metrics.jsonl")] == [0, 1, 2]
