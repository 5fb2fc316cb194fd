"""Learning: every reinforce.algorithm preset raises the demo's reward (docs/training.md, "Algorithm presets").

A file of its own: `make test` hands whole files to its two workers, and these eight runs, started first, then
overlap with the rest of the suite instead of lengthening test_reinforce.py's worker."""

from __future__ import annotations

import pytest

from aligner.trainers.run_log import read_jsonl
from tests.helpers.learning import assert_reward_rises
from tests.helpers.training import train


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "dr_grpo", "dapo", "gspo", "cispo", "reinforce_pp", "nemo"])
def test_demo_run_raises_the_reward(demo_assets_dir, tmp_path, algorithm):
    """The demo config, shortened to 40 steps, with each reinforce.algorithm preset: the reward rises by more than
    the run's noise explains, and the validation reward (fixed prompts and sampling noise, 4 samples of each of the
    16 prompts: a standard error near 0.06) ends more than 0.1 above where it started (measured: dapo 0.45, rloo
    0.37 above)."""
    from aligner.config import load_config

    overrides = [f"run_dir={tmp_path / 'run'}", "trainer.max_steps=40", "trainer.progress_bar=false"]
    overrides += ["model.num_threads=1", f"reinforce.algorithm={algorithm}", "validation.num_samples_per_prompt=4"]
    config = load_config(demo_assets_dir / "reinforce.yaml", overrides)
    trainer = train(config)
    rows = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["step"] > 0]
    rewards = [r["train_rollouts/rewards"] for r in rows]
    assert len(rewards) == 40
    assert_reward_rises(rewards)
    val = [r["val/rewards"] for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if "val/rewards" in r]
    assert val[-1] > val[0] + 0.1, f"validation reward {val}"
    if config.reinforce.kl_estimator != "k1":  # k1 (log pi - log pi_ref) of one sample can be negative
        assert all(r["train_rollouts/init_policy_kl"] >= 0 for r in rows)
