"""The PPO trainer (aligner/trainers/ppo.py) against live critic servers it starts itself.

Run: .venv/bin/python -m pytest tests/aligner/trainers/test_ppo.py -q            (add -m "not slow" for the fast ones)
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from aligner import metrics
from aligner.cli import main
from aligner.config import config_from_dict, load_config
from aligner.errors import ConfigError, RunDirError
from aligner.generation.generator import GenerationOutput
from aligner.run_layout import (
    BEST_FILE,
    CHECKPOINT_DIR,
    CRITIC_DIR,
    CRITIC_LOG,
    RunEnd,
    critic_checkpoint,
    list_checkpoints,
    read_end,
    write_end,
)
from aligner.trainers.checkpoint import best_checkpoint
from aligner.trainers.policy_backends import HfBackend
from aligner.trainers.ppo import PPOTrainer, critic_rows
from aligner.trainers.reinforce import ReinforceTrainer
from aligner.trainers.run_log import read_jsonl
from tests.helpers.checkpoints import write_checkpoint
from tests.helpers.learning import assert_reward_rises
from tests.helpers.rewards import letter_reward

PPO_METRICS = [
    metrics.TRAIN_REWARD,
    metrics.TRAIN_REWARD_WITH_KL,
    metrics.INIT_POLICY_KL,
    metrics.VALUES,
    metrics.TRAIN_RESPONSE_LENGTH,
    metrics.TRAIN_PROPERLY_ENDED,
    metrics.REWARD_LENGTH_CORR,
    metrics.ZERO_SPREAD_GROUPS,
    metrics.LOSS,
    metrics.GRAD_NORM,
    metrics.LR,
    metrics.CRITIC_LOSS,
    metrics.CLIP_FRACTION,
    metrics.ENTROPY,
    metrics.TIMER_GENERATE,
    metrics.TIMER_INIT_LOGPROBS,
    metrics.TIMER_CRITIC_INFER,
    metrics.TIMER_CRITIC_TRAIN,
    metrics.TIMER_TRAIN,
]


def _base(tmp_path, **top):
    return {
        "model": {"policy_path": str(tmp_path)},
        "data": {"train_file": "t.jsonl", "val_file": "v.jsonl"},
        "reward": {"function": "m:f"},
        **top,
    }


# ------------------------------------------------------------------------------------------------ config
def test_ppo_needs_a_critic_and_reward_may_come_from_it(tmp_path):
    assert config_from_dict(_base(tmp_path)).algorithm == "reinforce"
    with pytest.raises(ConfigError, match="critic.server_url .*critic.model_path"):
        config_from_dict(_base(tmp_path, algorithm="ppo"))
    config = config_from_dict(_base(tmp_path, algorithm="ppo", critic={"server_url": "http://127.0.0.1:1"}))
    assert config.ppo.ratio_eps == 0.2 and config.ppo.gae_lambda == 0.95 and config.ppo.use_absolute_kl
    no_reward = _base(tmp_path, algorithm="ppo", critic={"model_path": "rm", "use_critic_rewards": True})
    del no_reward["reward"]
    assert config_from_dict(no_reward).reward is None
    del no_reward["critic"]["use_critic_rewards"]
    with pytest.raises(ConfigError, match="reward: required"):
        config_from_dict(no_reward)
    with pytest.raises(ConfigError, match="algorithm"):
        config_from_dict(_base(tmp_path, algorithm="dpo"))
    with pytest.raises(ConfigError, match="ppo.gae_lambda"):
        config_from_dict(_base(tmp_path, ppo={"gae_lambda": 1.5}))


def test_critic_model_path_resolves_against_the_yaml(tmp_path):
    (tmp_path / "c.yaml").write_text(json.dumps(_base(tmp_path, algorithm="ppo", critic={"model_path": "rm"})))
    assert load_config(tmp_path / "c.yaml").critic.model_path == str(tmp_path / "rm")


def test_critic_rows_right_align_prompt_and_response_and_point_at_the_state_before_each_token():
    gen = GenerationOutput(
        prompt_ids=torch.tensor([[0, 5, 6], [7, 8, 9]]),
        prompt_mask=torch.tensor([[False, True, True], [True, True, True]]),
        response_ids=torch.tensor([[10, 11, 0], [12, 0, 0]]),
        response_mask=torch.tensor([[True, True, False], [True, False, False]]),
        logprobs=torch.zeros(2, 3),
        is_end=torch.tensor([True, True]),
        group_ids=torch.tensor([0, 1]),
        responses=["a", "b"],
    )
    tokens, lengths, positions = critic_rows(gen)
    assert tokens.tolist() == [[5, 6, 10, 11], [7, 8, 9, 12]]
    assert lengths.tolist() == [4, 4]
    # Response token j of row b follows the prefix ending at column P_b + j - 1.
    assert positions[0, :2].tolist() == [1, 2] and positions[1, :1].tolist() == [2]


def test_a_used_run_dir_is_refused_before_a_critic_server_starts(run_config, tmp_path):
    """Without --resume a run folder holding checkpoints is refused at once: no critic server is started for a run
    that cannot go on, and the folder's end record (an earlier launch's) is left as it was."""
    config = run_config(algorithm="ppo", critic={"model_path": str(tmp_path / "rm")})
    write_checkpoint(tmp_path / "run", 2)
    earlier = RunEnd("max_time", 2, 4, "time is up")
    write_end(tmp_path / "run", earlier)
    trainer = PPOTrainer(config)
    with pytest.raises(RunDirError, match="pass --resume"):
        trainer.setup()
    assert trainer.critic_process is None and not (tmp_path / "run" / CRITIC_LOG).exists()
    assert read_end(tmp_path / "run") == earlier


# ------------------------------------------------------------------------------------------------ best checkpoint
def test_best_checkpoint_survives_pruning(run_config):
    config = run_config(
        "best",
        trainer={"max_steps": 4, "val_check_interval": 1, "save_interval": 1, "keep_checkpoints": 1},
    )
    trainer = ReinforceTrainer(config)
    trainer.setup()
    trainer.fit()
    rows = read_jsonl(trainer.run_dir / "metrics.jsonl")
    val = {r["step"]: r["val/rewards"] for r in rows if "val/rewards" in r and r["step"] > 0}
    best_step = max(val, key=lambda s: (val[s], -s))
    pointer = json.loads((trainer.run_dir / CHECKPOINT_DIR / BEST_FILE).read_text())
    assert pointer["step"] == best_step and pointer["val/rewards"] == val[best_step]
    assert best_checkpoint(trainer.run_dir).name == f"step_{best_step:06d}"
    kept = {c.name for c in list_checkpoints(trainer.run_dir)}
    assert kept == {"step_000004", f"step_{best_step:06d}"}


def test_a_new_best_validation_is_checkpointed_between_save_intervals(run_config):
    config = run_config("best_between", trainer={"max_steps": 4, "val_check_interval": 1, "save_interval": 100})
    trainer = ReinforceTrainer(config)
    trainer.setup()
    trainer.fit()
    rows = read_jsonl(trainer.run_dir / "metrics.jsonl")
    val = [(r["step"], r["val/rewards"]) for r in rows if "val/rewards" in r and r["step"] > 0]
    records = [step for i, (step, reward) in enumerate(val) if all(reward > v for _, v in val[:i])]
    saved = {c.name for c in list_checkpoints(trainer.run_dir)}
    assert saved == {f"step_{s:06d}" for s in records} | {"step_000004"}  # every new best, and the last step
    assert best_checkpoint(trainer.run_dir).name == f"step_{records[-1]:06d}"


# ------------------------------------------------------------------------------------------------ critic warmup
def test_critic_warmup_steps_train_the_critic_only(run_config, tiny_policy_dir):
    """ppo.critic_warmup_steps: during the warmup the critic gets its critic_train and the actor's weights, optimiser
    and learning rate stay; from the step after, the actor moves."""
    from aligner.config import GenerationConfig
    from aligner.generation.generator import TorchGenerator
    from aligner.modeling.hf import eos_token_ids, load_policy, load_tokenizer
    from aligner.trainers.loop import adamw
    from aligner.trainers.ppo import PPORollout
    from aligner.trainers.schedule import lr_scheduler

    class FakeCritic:
        def __init__(self):
            self.calls = 0

        def train(self, tokens, lengths, returns, values, mask):
            self.calls += 1
            return 0.25

        def close(self):
            pass

    config = run_config(algorithm="ppo", critic={"server_url": "http://127.0.0.1:9"}, ppo={"critic_warmup_steps": 2})
    trainer = PPOTrainer(config)
    policy, tokenizer = load_policy(tiny_policy_dir), load_tokenizer(tiny_policy_dir)
    trainer.policy, trainer.critic = policy, FakeCritic()
    trainer.backend = HfBackend.around(config, policy)
    trainer.generator = TorchGenerator(
        policy, tokenizer, GenerationConfig(max_new_tokens=4), eos_token_ids(policy, tokenizer)
    )
    trainer.optimizer = adamw(policy.parameters(), config.optim, torch.device("cpu"))
    trainer.scheduler = lr_scheduler(trainer.optimizer, 1, 4)
    gen = trainer.generator.generate([tokenizer("the cat")["input_ids"]], 2, seed=0)
    tokens, lengths, positions = critic_rows(gen)
    mask = gen.response_mask.float()
    rollout = PPORollout(
        gen.response_batch(),
        mask,
        mask,
        gen.logprobs,
        torch.randn(mask.shape) * mask,
        mask,
        mask * 0,
        tokens,
        lengths,
        positions,
    )
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    for step in (0, 1):
        trainer.step = step
        logged = trainer.optimise(rollout)
        assert logged[metrics.CRITIC_LOSS] == 0.25 and logged[metrics.CRITIC_WARMUP] == 1
        assert metrics.LOSS not in logged
    assert trainer.critic.calls == 2 and not trainer.optimizer.state and trainer.scheduler.last_epoch == 0
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in before.items())
    trainer.step = 2  # warmup over: both sides train
    logged = trainer.optimise(rollout)
    assert trainer.critic.calls == 3 and metrics.LOSS in logged and metrics.CRITIC_WARMUP not in logged
    assert not all(torch.equal(v, policy.state_dict()[k]) for k, v in before.items())
    trainer.close()


# ------------------------------------------------------------------------------------------------ live critic
def ppo_train(config, resume=False, until_step=None) -> PPOTrainer:
    trainer = PPOTrainer(config)
    trainer.setup(resume=resume)
    trainer.fit(until_step=until_step)
    return trainer


@pytest.mark.slow(40)
def test_ppo_two_steps_resume_two_steps_equals_four_steps(run_config, reward_model_dir):
    pytest.importorskip("pytriton")
    sections = {
        "algorithm": "ppo",
        "critic": {"model_path": str(reward_model_dir), "server_overrides": ["lr=1e-3", "num_threads=1"]},
        "trainer": {"max_steps": 4, "val_check_interval": 2, "save_interval": 2, "progress_bar": False},
        "ppo": {"num_mini_batches": 2},  # two optimiser steps per rollout: the second sees a moved policy
    }
    straight = ppo_train(run_config("straight", **sections))
    interrupted = run_config("resumed", **sections)
    first = ppo_train(interrupted, until_step=2)
    assert first.step == 2 and critic_checkpoint(first.run_dir).name == CRITIC_DIR
    assert read_end(first.run_dir).end == "stopped"
    resumed = ppo_train(interrupted, resume=True)
    assert resumed.step == 4 and resumed.critic_process is None  # the server it started is stopped
    assert read_end(resumed.run_dir) == RunEnd(
        "completed", 4, 4, "completed step 4 of 4: final policy in final_policy/"
    )

    a = load_file(straight.final_policy_dir / "model.safetensors")
    b = load_file(resumed.final_policy_dir / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    critics = [torch.load(critic_checkpoint(t.run_dir) / "critic.pt", weights_only=True) for t in (straight, resumed)]
    assert critics[0]["steps"] == critics[1]["steps"] == 4
    assert all(torch.equal(v, critics[1]["critic"][k]) for k, v in critics[0]["critic"].items())
    # Values (and every other metric) of the resumed steps are those of the straight run, bit for bit.
    rows = [read_jsonl(t.run_dir / "metrics.jsonl") for t in (straight, resumed)]
    strip = [[{k: v for k, v in r.items() if not k.startswith(metrics.MACHINE_PREFIXES)} for r in rs] for rs in rows]
    assert strip[0] == strip[1]
    assert all(name in rows[0][1] for name in PPO_METRICS)
    logged = {key for row in rows[0] for key in row} - {"step"}
    assert {key for key in logged if key not in metrics.names(metrics.PPO)} == set()  # all in the registry
    assert all(r["train_optim/critic_loss"] >= 0 for r in rows[0][1:])
    assert all(0 <= r["train_optim/clip_fraction"] <= 1 for r in rows[0][1:])
    assert all(-1 <= r["train_rollouts/reward_length_corr"] <= 1 for r in rows[0][1:])
    assert all(0 <= r["train_rollouts/frac_zero_std_groups"] <= 1 for r in rows[0][1:])


@pytest.mark.slow(35)
def test_demo_ppo_run_raises_the_reward(demo_assets_dir, tmp_path, capsys):
    """ppo.yaml shortened to 40 steps: the reward rises by more than the run's noise explains, and the validation
    reward ends above where it started."""
    pytest.importorskip("pytriton")
    steps = 40
    code = main(
        [
            "train",
            "--config",
            str(demo_assets_dir / "ppo.yaml"),
            "--set",
            f"run_dir={tmp_path / 'ppo'}",
            "--set",
            f"trainer.max_steps={steps}",
            "--set",
            "trainer.val_check_interval=20",
            "--set",
            "trainer.progress_bar=false",
        ]
    )
    assert code == 0
    rows = read_jsonl(tmp_path / "ppo" / "metrics.jsonl")
    rewards = [r["train_rollouts/rewards"] for r in rows if "train_rollouts/rewards" in r]
    assert len(rewards) == steps
    assert_reward_rises(rewards)
    val = [r["val/rewards"] for r in rows if "val/rewards" in r]
    assert val[-1] > val[0], val
    assert all(r["train_rollouts/init_policy_kl"] >= 0 and r["train_optim/critic_loss"] >= 0 for r in rows[1:])
    assert "train reward" in capsys.readouterr().out


@pytest.mark.slow
def test_rewards_from_the_critic_server_without_a_reward_section(run_config, reward_model_dir):
    pytest.importorskip("pytriton")
    config = run_config(
        "critic_rewards",
        algorithm="ppo",
        reward=None,
        critic={"model_path": str(reward_model_dir), "use_critic_rewards": True, "server_overrides": ["lr=1e-3"]},
        trainer={"max_steps": 2, "val_check_interval": 2, "save_interval": 2, "progress_bar": False},
        validation={"extra_rewards": {"letters": {"function": "tests.helpers.rewards:letter_reward"}}},
    )
    trainer = ppo_train(config)
    assert trainer.step == 2 and best_checkpoint(trainer.run_dir).name == "step_000002"
    rows = read_jsonl(trainer.run_dir / "metrics.jsonl")
    # The tiny reward model scores every row differently: the rewards are the critic server's, not constants.
    samples = read_jsonl(trainer.run_dir / "samples.jsonl")
    assert len({s["reward"] for s in samples}) > 1 and "val/rewards" in rows[-1]
    # PPO validates as REINFORCE does: the gold reward scores the samples the critic's rewards did.
    val = [s for s in samples if s["split"] == "validation" and s["step"] == 2]
    gold = letter_reward([], [s["response"] for s in val])
    assert rows[-1]["val/extra_rewards/letters"] == pytest.approx(sum(gold) / len(gold), rel=1e-5, abs=1e-6)
