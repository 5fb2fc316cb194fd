"""The GRPO family in the REINFORCE trainer (reinforce.policy_loss, num_epochs, rollout_correction, dynamic sampling,
the overlong penalty, reinforce_pp), each against what it must equal (docs/training.md, "Algorithm presets")."""

from __future__ import annotations

import math

import pytest
import torch

from aligner import metrics
from aligner.trainers import reinforce as reinforce_module
from aligner.trainers.run_log import read_jsonl
from tests.helpers.training import train


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.backend.trained.state_dict().items()}


def _rows(trainer) -> list[dict]:
    return [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["step"] > 0]


def test_the_clipped_ratio_on_one_pass_takes_reinforces_step(run_config):
    """With one pass over unchanged weights the ratio is exactly 1 (its denominator is the pass's own log-probs,
    detached): policy_loss clip and cispo take REINFORCE's gradient, and the ratio's metrics say so."""
    quiet = {"val_check_interval": 0, "max_steps": 2, "save_interval": 2}
    runs = {}
    for loss in ("reinforce", "clip", "cispo"):
        reward = {"function": "tests.helpers.rewards:varied_reward"}
        config = run_config(run_dir=loss, trainer=quiet, reinforce={"policy_loss": loss}, reward=reward)
        runs[loss] = train(config)
    plain = _weights(runs["reinforce"])
    assert all(row[metrics.GRAD_NORM] > 0 for row in _rows(runs["reinforce"]))
    for loss in ("clip", "cispo"):
        for name, value in _weights(runs[loss]).items():
            torch.testing.assert_close(value, plain[name], rtol=1e-5, atol=1e-6, msg=f"{loss}: {name}")
        for row in _rows(runs[loss]):
            assert row[metrics.RATIO_MEAN] == row[metrics.RATIO_MIN] == row[metrics.RATIO_MAX] == 1.0
            assert row[metrics.CLIP_FRACTION] == 0.0
    assert metrics.RATIO_MEAN not in _rows(runs["reinforce"])[0]


def test_epochs_and_mini_batches_reuse_the_rollout_against_its_trainer_log_probs(run_config, monkeypatch):
    """num_epochs 2 x num_mini_batches 2: four optimiser steps a rollout; the ratio's denominator is the trainer's
    rollout-time forward (not generation's), so the first pass starts at ratio 1 and later passes move off it and
    get clipped (a large learning rate, a tight clip)."""
    steps = []
    original = reinforce_module.HfBackend.step

    def counting(self, optimizer, max_grad_norm):
        steps.append(1)
        return original(self, optimizer, max_grad_norm)

    monkeypatch.setattr(reinforce_module.HfBackend, "step", counting)
    config = run_config(
        trainer={"val_check_interval": 0, "max_steps": 2, "save_interval": 2},
        reinforce={
            "policy_loss": "clip",
            "num_epochs": 2,
            "num_mini_batches": 2,
            "epsilon_low": 0.01,
        },
        reward={"function": "tests.helpers.rewards:varied_reward"},
        optim={"lr": 0.05, "warmup_steps": 0},
    )
    trainer = train(config)
    assert len(steps) == 2 * 2 * 2
    rows = _rows(trainer)
    assert all(r[metrics.RATIO_MIN] < 1.0 < r[metrics.RATIO_MAX] for r in rows), rows
    assert all(r[metrics.CLIP_FRACTION] > 0 for r in rows), [
        {k: v for k, v in r.items() if "optim" in k} for r in rows
    ]
    assert all(r[metrics.CLIP_FRACTION] == r[metrics.CLIP_FRACTION_LOW] + r[metrics.CLIP_FRACTION_HIGH] for r in rows)


def test_a_zero_spread_group_gives_no_gradient(run_config):
    """Every group flat (a constant reward), group-mean baseline: the advantages are 0, the weights do not move."""
    config = run_config(
        trainer={"val_check_interval": 0, "max_steps": 1, "save_interval": 1},
        reinforce={"algorithm": "dapo", "dynamic_sampling": False},
        reward={"function": "tests.helpers.rewards:constant_reward"},
        optim={"weight_decay": 0.0},
    )
    from aligner.trainers.reinforce import ReinforceTrainer

    trainer = ReinforceTrainer(config)
    trainer.setup()
    before = _weights(trainer)
    trainer.fit()
    for name, value in _weights(trainer).items():
        assert torch.equal(value, before[name]), name


def test_dynamic_sampling_fills_the_step_with_groups_that_have_spread(run_config):
    """Half the prompts get a flat reward (tests.helpers.rewards:half_flat_reward): the step samples more rounds
    until it holds num_prompts_per_step groups with spread, trains on exactly those, and logs the share dropped
    and the rounds; with max_sampling_rounds 0 it trains on what the first round had."""
    config = run_config(
        trainer={"val_check_interval": 0, "max_steps": 3, "save_interval": 3, "train_samples_to_log": 100},
        reinforce={"algorithm": "dapo", "max_sampling_rounds": 4},
        reward={"function": "tests.helpers.rewards:half_flat_reward"},
    )
    trainer = train(config)
    rows = _rows(trainer)
    samples = [s for s in read_jsonl(trainer.run_dir / "samples.jsonl") if s["split"] == "train"]
    for row in rows:
        trained = [s for s in samples if s["step"] == row["step"]]
        assert len(trained) == 4 * 2  # num_prompts_per_step groups of num_rollouts_per_prompt
        assert all(len(s["prompt"]) % 2 == 0 for s in trained)  # only prompts with reward spread
        assert 1 <= row[metrics.SAMPLING_ROUNDS] <= 4
        assert 0 < row[metrics.DROPPED_GROUPS] < 1
        assert row[metrics.ZERO_SPREAD_GROUPS] == 0.0

    bounded = run_config(
        run_dir="bounded",
        trainer={"val_check_interval": 0, "max_steps": 2, "save_interval": 2, "train_samples_to_log": 100},
        reinforce={"algorithm": "dapo", "max_sampling_rounds": 0},
        reward={"function": "tests.helpers.rewards:half_flat_reward"},
    )
    trainer = train(bounded)
    samples = [s for s in read_jsonl(trainer.run_dir / "samples.jsonl") if s["split"] == "train"]
    for row in _rows(trainer):
        trained = [s for s in samples if s["step"] == row["step"]]
        assert row[metrics.SAMPLING_ROUNDS] == 0
        assert len(trained) == 2 * round(4 * (1 - row[metrics.DROPPED_GROUPS]))
        assert all(len(s["prompt"]) % 2 == 0 for s in trained)


def test_the_overlong_penalty_lowers_the_reward_of_long_responses(run_config):
    """overlong_buffer = max_new_tokens: every response is in the buffer and loses length / max_new_tokens."""
    config = run_config(
        trainer={"val_check_interval": 0, "max_steps": 1, "save_interval": 1, "train_samples_to_log": 100},
        reinforce={"overlong_buffer": 8, "overlong_penalty": 0.5, "baseline": "rloo"},
    )
    trainer = train(config)
    (row,) = _rows(trainer)
    samples = [s for s in read_jsonl(trainer.run_dir / "samples.jsonl") if s["split"] == "train"]
    lengths = [s["response_length"] for s in samples]
    expected = -0.5 * sum(length / 8 for length in lengths) / len(lengths)
    assert row[metrics.OVERLONG_PENALTY] == pytest.approx(expected, rel=1e-6)
    assert row[metrics.OVERLONG_PENALTY] < 0


@pytest.mark.parametrize("method", ["tis", "mis"])
def test_rollout_correction_weighs_bf16_engine_samples_by_their_definition(run_config, monkeypatch, method):
    """The hf engine samples from a bfloat16 copy while the trainer is in float32: the mismatch metrics are not
    zero, and each token's weight is clip(exp(p - q)) (tis) or exp(p - q) inside [min, cap] else 0 (mis), p the
    trainer's log-prob of the token, q the engine's. The bounds are set at the measured mismatch's typical size
    (the same samples, the same first step), so that some tokens fall outside on any CPU."""
    seen = []
    original = reinforce_module.rollout_correction_weights

    def recording(*args, **kwargs):
        weights, stats = original(*args, **kwargs)
        seen.append((args, weights))
        return weights, stats

    def run(name, cap, low):
        config = run_config(
            run_dir=name,
            trainer={"val_check_interval": 0, "max_steps": 1, "save_interval": 1},
            generation={"engine": "hf", "weights_dtype": "bfloat16"},
            reinforce={
                "rollout_correction": method,
                "rollout_correction_cap": cap,
                "rollout_correction_min": low,
                "baseline": "rloo",
            },
        )
        return _rows(train(config))[0]

    measured = run("measure", 100.0, 0.0)
    assert measured[metrics.MISMATCH_KL] > 0 and measured[metrics.MISMATCH_PPL_RATIO] != 1.0
    assert measured[metrics.IMPORTANCE_WEIGHT_CAPPED] == 0.0
    # k3 ~ d^2 / 2 for small d: the log ratio's root mean square.
    rms = (2 * measured[metrics.MISMATCH_KL]) ** 0.5
    cap, low = math.exp(rms), math.exp(-rms)
    monkeypatch.setattr(reinforce_module, "rollout_correction_weights", recording)
    row = run("corrected", cap, low)
    assert row[metrics.MISMATCH_KL] == measured[metrics.MISMATCH_KL]
    assert 0 < row[metrics.IMPORTANCE_WEIGHT_CAPPED] < 1
    assert seen
    for (proximal, engine, mask, *_), weights in seen:
        assert not torch.equal(proximal[mask.bool()], engine[mask.bool()])
        rho = torch.exp(proximal - engine)
        if method == "tis":
            expected = rho.clamp(low, cap)
        else:
            expected = torch.where((rho >= low) & (rho <= cap), rho, torch.zeros_like(rho))
        torch.testing.assert_close(weights, expected * mask, rtol=1e-6, atol=1e-7)


def test_reinforce_pp_advantages_are_whitened_per_token(run_config):
    """REINFORCE++: per-token advantages whitened over the step's tokens; each sample's logged advantage is the
    mean over its tokens, and over all tokens they have mean 0."""
    config = run_config(
        trainer={"val_check_interval": 0, "max_steps": 1, "save_interval": 1, "train_samples_to_log": 100},
        reinforce={"algorithm": "reinforce_pp"},
        reward={"function": "tests.helpers.rewards:varied_reward"},
    )
    trainer = train(config)
    samples = [s for s in read_jsonl(trainer.run_dir / "samples.jsonl") if s["split"] == "train"]
    total = sum(s["advantage"] * s["response_length"] for s in samples)
    assert abs(total) / sum(s["response_length"] for s in samples) < 1e-5
    assert len({round(s["advantage"], 6) for s in samples}) > 1
