import pytest

from aligner.config import RewardConfig, load_config
from aligner.errors import ConfigError, RewardError
from aligner.rewards.build import build_reward_client
from aligner.rewards.local import FunctionRewardClient

NUMERIC_MATCH = "aligner.rewards.verifiable:numeric_match"


def test_function_args_reach_a_builtin_checked_and_completed():
    client = FunctionRewardClient(NUMERIC_MATCH, {"tolerance": 0.5})
    assert client.function_args["tolerance"] == 0.5 and client.function_args["field"] == "answer"
    rewards = client.submit(["q", "q"], ["about 1.4", "2"], [{"answer": 1}, {"answer": 1}]).result()
    assert rewards.tolist() == [1.0, 0.0]


def test_a_builtin_target_from_a_config_is_checked_like_the_catalogue():
    config = RewardConfig(function=NUMERIC_MATCH, function_args={"tolerance": -0.5})
    with pytest.raises(ConfigError, match="reward.function_args.tolerance: Input should be greater than or equal"):
        build_reward_client(config)
    with pytest.raises(ConfigError, match="reward.function_args.pattern: required field is missing"):
        FunctionRewardClient("aligner.rewards.verifiable:regex_match")


def test_a_config_file_names_a_builtin_and_its_args(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {policy_path: policy}\n"
        "data: {train_file: train.jsonl, val_file: val.jsonl}\n"
        f"reward: {{function: '{NUMERIC_MATCH}', function_args: {{tolerance: 0.5}}}}\n"
    )
    client = build_reward_client(load_config(path, ["reward.function_args.missing=-1"]).reward)
    assert client.submit(["q", "q"], ["1.5", "?"], [{"answer": 1}] * 2).result().tolist() == [1.0, -1.0]


def test_function_args_reach_any_function_that_takes_them():
    client = FunctionRewardClient("tests.helpers.rewards:scaled_letter_reward", {"scale": 10})
    assert client.submit(["q"], ["ee"], [{}]).result().tolist() == [10.0]


def test_function_args_a_function_cannot_take_are_refused_when_the_client_is_built():
    with pytest.raises(RewardError, match=r"letter_reward' cannot be called .* unexpected keyword argument 'scale'"):
        FunctionRewardClient("tests.helpers.rewards:letter_reward", {"scale": 10})
    with pytest.raises(RewardError, match="missing a required argument: 'scale'"):
        FunctionRewardClient("tests.helpers.rewards:scaled_letter_reward")


def test_functions_without_args_are_called_as_before():
    client = FunctionRewardClient("tests.helpers.rewards:length_reward")
    assert client.submit(["q"], ["abc"], [{"answer": "abc"}]).result().tolist() == [103.0]
    demo = FunctionRewardClient("aligner.demo:reward")
    assert demo.submit(["Describe the cat."], ["the cat is kind."], [{}]).result().tolist() == [1.0]
