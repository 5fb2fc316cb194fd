"""model.precision: bf16-mixed in the trainer: float32 master weights, bfloat16 compute, exact resume, and learning
that matches fp32's within the noise between seeds."""

import statistics
import threading

import pytest
import torch
from safetensors.torch import load_file

from aligner.modeling.cpu import BF16_ENV
from aligner.modeling.device import BFloat16MatmulsInFloat32
from aligner.trainers.run_log import read_jsonl
from tests.helpers.training import train

MIXED = {"precision": "bf16-mixed"}
pytestmark = pytest.mark.cpu_sensitive


def test_bf16_mixed_trains_float32_masters_with_bfloat16_copies(run_config):
    trainer = train(run_config(model=MIXED, trainer={"max_steps": 2, "val_check_interval": 0}))
    params = list(trainer.policy.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    assert all(s["exp_avg"].dtype == torch.float32 for s in trainer.optimizer.state.values())
    assert {p.dtype for p in trainer.reference.model.parameters()} == {torch.bfloat16}
    # Generation samples with a bfloat16 copy of the weights after the last step, not the initial ones.
    engine = list(trainer.generator.model.parameters())
    assert {p.dtype for p in engine} == {torch.bfloat16}
    assert all(torch.equal(e, p.to(torch.bfloat16)) for e, p in zip(engine, params))
    initial = trainer.reference.model.parameters()
    assert not all(torch.equal(e, r) for e, r in zip(engine, initial))
    rows = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(r["train_optim/loss"])) for r in rows)
    saved = load_file(trainer.final_policy_dir / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.float32}


def test_bf16_mixed_resume_equals_straight_run(run_config):
    """The bfloat16 copies are rebuilt from the checkpoint's float32 weights: 2 steps + resume + 2 = 4 steps."""
    straight = train(run_config("straight", model=MIXED))
    interrupted = run_config("resumed", model=MIXED)
    train(interrupted, until_step=2)
    resumed = train(interrupted, resume=True)
    a = load_file(straight.final_policy_dir / "model.safetensors")
    b = load_file(resumed.final_policy_dir / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rewards = [
        [r["train_rollouts/rewards"] for r in read_jsonl(t.run_dir / "metrics.jsonl") if r["step"] > 0]
        for t in (straight, resumed)
    ]
    assert rewards[0] == rewards[1]


@pytest.mark.parametrize(("answer", "emulated"), [("slow", True), ("fast", False)])
def test_bf16_mixed_multiplies_in_float32_on_every_thread_where_bfloat16_does_not_pay(
    run_config, monkeypatch, capsys, answer, emulated
):
    """Where bfloat16 products do not pay (`ALIGNER_CPU_BF16`, the seam every CPU question goes through) the run's
    products (training, reference, validation, and the background generator's with async rollouts) go through
    `BFloat16MatmulsInFloat32` and the run says why; where they pay, none do and it says nothing."""
    threads = set()
    dispatch = BFloat16MatmulsInFloat32.__torch_dispatch__

    def spy(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            threads.add(threading.current_thread().name)
        return dispatch(self, func, types, args, kwargs)

    monkeypatch.setenv(BF16_ENV, answer)
    monkeypatch.setattr(BFloat16MatmulsInFloat32, "__torch_dispatch__", spy)
    trainer = train(run_config(model=MIXED, trainer={"max_steps": 3, "async_rollouts": 1}))
    assert threads == ({threading.current_thread().name, "aligner-rollouts_0"} if emulated else set())
    assert ("run in float32 on bfloat16 inputs" in capsys.readouterr().err) is emulated
    rows = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor(r["train_optim/loss"])) for r in rows)


@pytest.mark.slow(80)
def test_bf16_mixed_learns_the_demo_task_as_fp32_does(demo_assets_dir, tmp_path):
    """The demo task, 3 seeds in each precision: the mean gain in reward (last 10 steps over the first 10) of
    bf16-mixed is within the noise of fp32's seeds, and every run gains.

    Why 30 steps: over 12 seeds (AMD EPYC, native and as on an AVX2 CPU) the gain was 3.9 (fp32) and 5.2-6.8
    (bf16-mixed) standard deviations above 0, smallest 0.106; in 20-step runs (first 7 over last 7) 1.6-2.0, smallest
    0.013: with six runs a test, "every run gains" would fail about one test in five.
    """
    from aligner.config import load_config

    def gain(precision: str, seed: int) -> float:
        config = load_config(
            demo_assets_dir / "reinforce.yaml",
            [
                f"run_dir={tmp_path / f'{precision}-{seed}'}",
                f"seed={seed}",
                f"model.precision={precision}",
                "trainer.max_steps=30",
                "trainer.val_check_interval=0",
                "trainer.progress_bar=false",
                "model.num_threads=1",
            ],
        )
        rows = [r for r in read_jsonl(train(config).run_dir / "metrics.jsonl") if r["step"] > 0]
        rewards = [r["train_rollouts/rewards"] for r in rows]
        return statistics.mean(rewards[-10:]) - statistics.mean(rewards[:10])

    seeds = [1, 2, 3]
    gains = {p: [gain(p, s) for s in seeds] for p in ("fp32", "bf16-mixed")}
    assert all(g > 0 for g in gains["fp32"] + gains["bf16-mixed"]), gains
    # The difference of the two means of 3 runs, against the spread between the seeds of one precision (pooled
    # within each): under 3 standard errors of that difference.
    within = ((statistics.variance(gains["fp32"]) + statistics.variance(gains["bf16-mixed"])) / 2) ** 0.5
    diff = statistics.mean(gains["bf16-mixed"]) - statistics.mean(gains["fp32"])
    assert abs(diff) < 3 * within * (2 / len(seeds)) ** 0.5, gains
