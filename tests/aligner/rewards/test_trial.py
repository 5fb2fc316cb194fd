import json

import pytest
import torch

from aligner import cli
from aligner.config import save_config
from aligner.errors import RewardError
from aligner.rewards.trial import format_table, try_reward, warnings_for

HELPERS = "tests.helpers.rewards"


def test_a_try_scores_each_prompts_samples_and_sums_them_up(run_config):
    config = run_config(reward={"function": f"{HELPERS}:letter_reward"}, generation={"max_new_tokens": 6})
    result = try_reward(config, num_prompts=3, num_samples=2)
    samples, groups = result["samples"], result["groups"]
    assert [s["group"] for s in samples] == [0, 0, 1, 1, 2, 2]
    assert [g["prompt"] for g in groups] == [samples[2 * i]["prompt"] for i in range(3)]
    for s in samples:  # each reward is the function's on that response, each length within the cap
        assert s["reward"] == pytest.approx(s["response"].count("e") / max(1, len(s["response"])), abs=1e-6)
        assert 1 <= s["length"] <= 6
    rewards = torch.tensor([s["reward"] for s in samples]).view(3, 2).double()
    assert [g["mean"] for g in groups] == pytest.approx(rewards.mean(1).tolist())
    assert [g["std"] for g in groups] == pytest.approx(rewards.std(1, unbiased=False).tolist(), abs=1e-7)
    zero = [bool(r[0] == r[1]) for r in rewards]
    assert [g["zero_spread"] for g in groups] == zero
    assert result["frac_zero_std_groups"] == pytest.approx(sum(zero) / 3)
    assert -1 <= result["reward_length_corr"] <= 1 and result["seconds"] > 0
    # Sampling is seeded: the same config samples the same responses.
    assert [s["response"] for s in try_reward(config, 3, 2)["samples"]] == [s["response"] for s in samples]
    assert "prompt 2:" in format_table(result)


def test_a_try_samples_with_the_configs_generation_engine(run_config, monkeypatch):
    from aligner.generation import engines

    built = []
    real = engines.build_generator
    monkeypatch.setattr(engines, "build_generator", lambda *args: built.append(real(*args)) or built[-1])
    config = run_config(generation={"max_new_tokens": 4, "engine": "hf"})
    result = try_reward(config, num_prompts=2, num_samples=2)
    assert type(built[0]).__name__ == "HFGenerator" and len(result["samples"]) == 4


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("boom_reward", "the reward function raised ValueError: boom"),
        ("nan_reward", "non-finite or non-numeric reward for sample 1: nan"),
        ("short_reward", "returned 3 rewards for 4 samples"),
    ],
)
def test_a_broken_reward_is_a_reward_error_saying_what_broke(run_config, reward, message):
    config = run_config(reward={"function": f"{HELPERS}:{reward}"}, generation={"max_new_tokens": 2})
    with pytest.raises(RewardError, match=message):
        try_reward(config, num_prompts=2, num_samples=2)


def test_warnings_name_zero_spread_and_length_gaming():
    assert warnings_for(1.0, 4, 0.1, 0, 16) == ["every group has zero spread: RLOO gets no learning signal"]
    assert warnings_for(0.5, 4, -0.93, 2, 16) == [
        "2 of 4 groups have zero spread: they give RLOO no learning signal",
        "reward correlates with length (-0.93)",
        "2 of 16 responses were cut at generation.max_new_tokens",
    ]
    assert warnings_for(0.0, 4, 0.5, 0, 16) == []


def test_the_command_prints_json_or_the_error_as_json(run_config, tmp_path, capsys):
    config = run_config(reward={"function": f"{HELPERS}:constant_reward"}, generation={"max_new_tokens": 2})
    save_config(config, tmp_path / "c.yaml")
    argv = ["try-reward", "--config", str(tmp_path / "c.yaml"), "--num-prompts", "2", "--num-samples", "2", "--json"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["frac_zero_std_groups"] == 1.0 and len(result["samples"]) == 4
    assert result["warnings"][0] == "every group has zero spread: RLOO gets no learning signal"
    assert cli.main([*argv, "--set", f"reward.function={HELPERS}:boom_reward"]) == 2
    out = capsys.readouterr()
    message = "the reward function raised ValueError: boom"
    assert json.loads(out.out) == {"error": {"type": "RewardError", "message": message}}
    assert f"aligner try-reward: error: {message}" in out.err
