"""trainer.async_rollouts: 1 generates step t+1's samples during step t's update, one update behind."""

import pytest
import torch
from safetensors.torch import load_file

from aligner.errors import ConfigError
from aligner.trainers.reinforce import ReinforceTrainer
from aligner.trainers.run_log import read_jsonl
from tests.helpers.training import train

ASYNC = {"async_rollouts": 1}


def train_rows(trainer) -> list[dict]:
    return [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["step"] > 0]


def samples(trainer) -> list[tuple]:
    rows = read_jsonl(trainer.run_dir / "samples.jsonl")
    return [(r["step"], r["prompt"], r["response"]) for r in rows if r["split"] == "train"]


def test_with_weights_that_do_not_move_async_samples_what_sync_samples(run_config):
    """With a zero learning rate the policy one update behind is the current one: the async run draws the same
    prompts with the same noise, so it samples, scores and logs exactly what the synchronous run does, and every
    importance weight is 1 up to the rounding between generation's and training's forward."""
    frozen = {"lr": 1e-30, "weight_decay": 0.0}  # lr must be > 0; its updates vanish in float32
    sync = train(run_config("sync", optim=frozen, trainer={"max_steps": 4, "val_check_interval": 0}))
    ahead = train(run_config("async", optim=frozen, trainer={"max_steps": 4, "val_check_interval": 0, **ASYNC}))
    assert samples(ahead) == samples(sync) and len(samples(sync)) > 4
    for a, s in zip(train_rows(ahead), train_rows(sync)):
        assert a["train_rollouts/rewards"] == s["train_rollouts/rewards"]
        assert a["train_optim/importance_weight"] == pytest.approx(1.0, abs=1e-4)
        assert a["train_optim/importance_weight_capped"] == 0.0
        assert "train_optim/importance_weight" not in s
        assert a["timers/generate"] > 0 and "timers/generate_wait" in a


def generation_weights(config) -> tuple[ReinforceTrainer, list[torch.Tensor], list[torch.Tensor]]:
    """Train `config`; returns the trainer, the weights each training-sample generation ran with (in step order)
    and the policy's weights before the first and after each update (a weight matrix stands for them all)."""
    trainer = ReinforceTrainer(config)
    trainer.setup()
    generator, used, updates = trainer.generator, [], []
    weight = lambda model: model.get_parameter("model.layers.0.mlp.up_proj.weight").detach().clone()  # noqa: E731
    generate, update_weights = generator.generate, generator.update_weights

    def recording_generate(prompt_ids, num_samples, seed):
        used.append(weight(generator.model))
        return generate(prompt_ids, num_samples, seed)

    def recording_update(model):
        update_weights(model)
        updates.append(weight(model))

    generator.generate, generator.update_weights = recording_generate, recording_update
    updates.append(weight(trainer.policy))
    trainer.fit()
    return trainer, used, updates


@pytest.mark.parametrize("ahead", [0, 1])
def test_async_samples_one_update_behind(run_config, ahead):
    """Synchronous: step s samples with the weights after update s - 1. Async: with those after update s - 2 (the
    first two steps with the initial ones), while the weights still train; the engine ends on the final weights."""
    config = run_config(trainer={"max_steps": 4, "val_check_interval": 0, "async_rollouts": ahead})
    trainer, used, updates = generation_weights(config)
    assert len(used) == 4 and len(updates) == 5
    assert not torch.equal(updates[0], updates[-1])
    behind = [0, 0, 1, 2] if ahead else [0, 1, 2, 3]
    for step, update in enumerate(behind):
        assert torch.equal(used[step], updates[update]), (step, update)
    rows = train_rows(trainer)
    if ahead:
        assert rows[0]["train_optim/importance_weight"] == pytest.approx(1.0, abs=1e-4)  # on-policy at step 1
        later = [r["train_optim/importance_weight"] for r in rows[2:]]
        assert any(abs(w - 1.0) > 1e-4 for w in later), later  # the policy moved: the weights correct for it
        engine = dict(trainer.generator.model.named_parameters())
        assert trainer.generator.model is not trainer.policy
        assert all(torch.equal(engine[n], p) for n, p in trainer.policy.named_parameters())
    else:
        assert "train_optim/importance_weight" not in rows[0]
        assert trainer.generator.model is trainer.policy


def test_async_resume_equals_straight_run(run_config):
    """The checkpoint keeps the next step's samples (generated one update behind): 2 steps + resume + 2 steps
    equals 4 steps."""
    trainer = {"max_steps": 4, "val_check_interval": 2, "save_interval": 2, **ASYNC}
    straight = train(run_config("straight", trainer=trainer))
    interrupted = run_config("resumed", trainer=trainer)
    first = train(interrupted, until_step=2)
    assert first.ahead is not None  # the third step's samples were under way at the stop
    resumed = train(interrupted, resume=True)
    a = load_file(straight.final_policy_dir / "model.safetensors")
    b = load_file(resumed.final_policy_dir / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert samples(straight) == samples(resumed)


@pytest.mark.parametrize(
    ("sections", "what"),
    [
        ({"algorithm": "ppo", "critic": {"server_url": "http://127.0.0.1:9"}}, "algorithm: ppo"),
        ({"reinforce": {"dynamic_batching": True}}, "reinforce.dynamic_batching"),
    ],
)
def test_async_refuses_what_it_cannot_overlap(run_config, sections, what):
    with pytest.raises(ConfigError, match=f"trainer.async_rollouts: 1 cannot be combined with {what}"):
        run_config(trainer=ASYNC, **sections)
