from pathlib import Path

import pytest

from aligner.config import apply_overrides, config_from_dict, load_config, save_config
from aligner.errors import ConfigError

MINIMAL = """
run_dir: runs/x
model: {policy_path: policy}
data: {train_file: train.jsonl, val_file: val.jsonl}
reward: {function: "aligner.demo:reward"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg" / "c.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_relative_paths_resolve_against_the_config_folder(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.model.policy_path == str(tmp_path / "cfg" / "policy")
    assert cfg.data.train_file == str(tmp_path / "cfg" / "train.jsonl")
    assert cfg.run_dir == str(tmp_path / "cfg" / "runs" / "x")
    # Defaults follow NeMo-Aligner.
    assert cfg.reinforce.kl_estimator == "abs" and cfg.optim.max_grad_norm == 1.0


def test_overrides_are_typed_and_nested(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        write(tmp_path, MINIMAL),
        ["reinforce.num_rollouts_per_prompt=8", "optim.lr=1e-5", "generation.end_strings=[a, b]", "run_dir=out"],
    )
    assert cfg.reinforce.num_rollouts_per_prompt == 8
    assert cfg.optim.lr == pytest.approx(1e-5)
    assert cfg.generation.end_strings == ["a", "b"]
    assert cfg.run_dir == str(tmp_path / "out")  # --set paths are relative to the current directory


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reinforce.num_rollouts_per_prompt=1", "reinforce: num_rollouts_per_prompt must be at least 2"),
        ("optim.lr=-1", "optim.lr: Input should be greater than 0 (got -1)"),
        ("generation.temperature=hot", "generation.temperature: Input should be a valid number"),
        ("generation.compile=maybe", "generation.compile: must be true, false or auto (got 'maybe')"),
        ("model.dtyp=float32", "model.dtyp: unknown field"),
        ("generation.min_new_tokens=100", "min_new_tokens (100) must not exceed max_new_tokens (64)"),
        ("reward.model_path=rm", "give exactly one of reward.function, reward.model_path or reward.server_url"),
        ("reward.unavailable_timeout_s=-1", "reward.unavailable_timeout_s: must be a number of seconds >= 0 (0: do"),
        ("critic.unavailable_timeout_s=.inf", "critic.unavailable_timeout_s: must be a number of seconds >= 0"),
        ("reinforce.num_mini_batches=33", "num_mini_batches (33) must not exceed the rollout's samples"),
        ("reinforce.loss_aggregation=sum", "reinforce.loss_aggregation: Input should be 'token_mean', 'seq_mean'"),
        ("sched.constant_steps=-1", "sched.constant_steps: Input should be greater than or equal to 0"),
        ("optim.logprob_micro_batch_size=0", "optim.logprob_micro_batch_size: Input should be greater than or"),
        ("trainer.max_time=soon", "trainer.max_time: must be seconds or 'DD:HH:MM:SS' (got 'soon')"),
        ("trainer.max_time=0", "trainer.max_time: must be a number of seconds > 0"),
        ("trainer.max_time=00:-1:00:00", "trainer.max_time: must be seconds or 'DD:HH:MM:SS' with numbers >= 0"),
        ("trainer.max_time=0:0:0:0:1", "trainer.max_time: must be seconds or 'DD:HH:MM:SS' with numbers >= 0"),
        ("trainer.max_epochs=0", "trainer.max_epochs: Input should be greater than or equal to 1"),
        ("trainer.val_check_interval=-1", "trainer.val_check_interval: Input should be greater than or equal to 0"),
        ("generation.repetition_penalty=0", "generation.repetition_penalty: Input should be greater than 0"),
        ("ppo.critic_warmup_steps=-1", "ppo.critic_warmup_steps: Input should be greater than or equal to 0"),
    ],
)
def test_bad_values_name_the_field(tmp_path, override, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, MINIMAL), [override])
    assert message in str(err.value)


def test_nemo_loop_knobs(tmp_path):
    """max_time as seconds or NeMo's DD:HH:MM:SS; validation off with val_check_interval 0, which
    save_on_validation (checkpoints at validation steps) cannot go with."""

    def load(*overrides):
        return load_config(write(tmp_path, MINIMAL), list(overrides)).trainer

    assert load().max_time is None and load().max_epochs is None and not load().save_on_validation
    assert load("trainer.max_time=00:01:30:05").max_time == 86400 * 0 + 3600 + 30 * 60 + 5
    assert load("trainer.max_time='02:00:00:00'").max_time == 2 * 86400
    assert load("trainer.max_time=00:10").max_time == 10  # MM:SS
    assert load("trainer.max_time=90.5").max_time == 90.5
    assert load("trainer.val_check_interval=0").val_check_interval == 0
    with pytest.raises(ConfigError, match="trainer: save_on_validation needs validation: val_check_interval must be"):
        load("trainer.val_check_interval=0", "trainer.save_on_validation=true")


def test_function_args_go_only_with_a_function(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL), ["reward.function_args={scale: 2}"])
    assert cfg.reward.function_args == {"scale": 2}
    assert load_config(write(tmp_path, MINIMAL)).reward.function_args == {}
    overrides = ["reward.function=null", "reward.server_url=http://127.0.0.1:8000", "reward.function_args={scale: 2}"]
    with pytest.raises(ConfigError, match="reward: function_args are the reward function's: give them only with"):
        load_config(write(tmp_path, MINIMAL), overrides)
    assert load_config(write(tmp_path, MINIMAL), overrides[:2] + ["reward.function_args={}"]).reward.server_url


def test_missing_sections_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="data: required field is missing"):
        config_from_dict({"model": {"policy_path": "p"}, "reward": {"function": "m:f"}})
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "model: [unclosed"))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="not of the form key=value"):
        apply_overrides({}, ["optim.lr"])


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL), ["seed=7"])
    save_config(cfg, tmp_path / "resolved.yaml")
    again = load_config(tmp_path / "resolved.yaml")
    assert again == cfg


def test_extra_validation_rewards_are_rewards_by_name_with_paths_resolved(tmp_path):
    text = MINIMAL + (
        "validation:\n  extra_rewards:\n    rule: {function: 'aligner.demo:reward'}\n"
        "    rm: {model_path: reward_model}\n    srv: {server_url: 'http://127.0.0.1:8000'}\n"
    )
    cfg = load_config(write(tmp_path, text))
    extra = cfg.validation.extra_rewards
    assert list(extra) == ["rule", "rm", "srv"]
    assert extra["rule"].function == "aligner.demo:reward"
    assert extra["rm"].model_path == str(tmp_path / "cfg" / "reward_model")  # like reward.model_path
    assert extra["srv"].server_url == "http://127.0.0.1:8000" and extra["srv"].model_path is None
    assert load_config(write(tmp_path, MINIMAL)).validation.extra_rewards == {}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("{'val/x': {function: 'm:f'}}", "validation.extra_rewards: reward name 'val/x' is not a short identifier"),
        ("{9lives: {function: 'm:f'}}", "reward name '9lives' is not a short identifier"),
        ("{" + "a" * 33 + ": {function: 'm:f'}}", "at most 32 characters"),
        ("{rm: {}}", "validation.extra_rewards.rm: give exactly one of reward.function"),
        ("{rm: {model_path: x, unknown: 1}}", "validation.extra_rewards.rm.unknown: unknown field"),
        ("[a]", "validation.extra_rewards: Input should be a valid dictionary"),
    ],
)
def test_bad_extra_rewards_name_the_field(tmp_path, extra, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, MINIMAL + f"validation:\n  extra_rewards: {extra}\n"))
    assert message in str(err.value)


# ------------------------------------------------------------------------------------------------- combinations
PPO = ["algorithm=ppo", "critic.server_url=http://127.0.0.1:9"]
MEGATRON = ["model.backend=megatron"]


@pytest.mark.parametrize(
    ("overrides", "line", "neighbour"),
    [
        (MEGATRON + ["model.lora.r=8"], "model.backend: megatron cannot be combined with model.lora (r: 8)", MEGATRON),
        (["model.lora.r=8"] + MEGATRON, "megatron cannot be combined with model.lora", ["model.lora.r=8"]),
        (
            MEGATRON + ["reinforce.loss_aggregation=nemo"],
            "model.backend: megatron cannot be combined with reinforce.loss_aggregation: nemo",
            MEGATRON + ["reinforce.loss_aggregation=seq_mean"],
        ),
        (
            MEGATRON + ["reinforce.algorithm=grpo"],  # its KL in the loss and its seq_mean: Megatron takes the second
            "model.backend: megatron cannot be combined with reinforce.kl_in: loss",
            MEGATRON + ["reinforce.algorithm=grpo", "reinforce.kl_in=reward", "reinforce.policy_loss=reinforce"],
        ),
        (
            MEGATRON + ["reinforce.algorithm=dapo"],
            "model.backend: megatron cannot be combined with reinforce.policy_loss: clip",
            MEGATRON
            + ["reinforce.algorithm=dapo", "reinforce.policy_loss=reinforce", "reinforce.dynamic_sampling=false"],
        ),
        (
            ["reinforce.num_epochs=2"],
            "reinforce.num_epochs: 2 passes reuse each rollout",
            ["reinforce.num_epochs=2", "reinforce.policy_loss=clip"],
        ),
        (
            ["reinforce.algorithm=reinforce_pp", "reinforce.policy_loss=reinforce"],
            "reinforce.advantage_estimator: reinforce_pp's per-token advantages go with",
            ["reinforce.algorithm=reinforce_pp"],
        ),
        (
            ["reinforce.policy_loss=cispo", "reinforce.dual_clip=3"],
            "reinforce.dual_clip: needs reinforce.policy_loss: clip",
            ["reinforce.policy_loss=clip", "reinforce.dual_clip=3"],
        ),
        (
            ["reinforce.algorithm=dapo", "reinforce.dynamic_batching=true"],
            "reinforce.dynamic_sampling: true cannot be combined with reinforce.dynamic_batching",
            ["reinforce.algorithm=dapo"],
        ),
        (
            ["reinforce.overlong_buffer=100000"],
            "reinforce.overlong_buffer: 100000 exceeds generation.max_new_tokens",
            ["reinforce.overlong_buffer=1"],
        ),
        (
            MEGATRON + ["reinforce.num_mini_batches=2"],
            "model.backend: megatron cannot be combined with reinforce.num_mini_batches: 2",
            ["reinforce.num_mini_batches=2"],
        ),
        (
            MEGATRON + ["reinforce.dynamic_batching=true"],
            "model.backend: megatron cannot be combined with reinforce.dynamic_batching",
            ["reinforce.dynamic_batching=true"],
        ),
        (
            MEGATRON + ["model.precision=bf16-mixed"],
            "model.backend: megatron cannot be combined with model.precision: bf16-mixed",
            ["model.precision=bf16-mixed"],
        ),
        (PPO + MEGATRON, "algorithm: ppo cannot be combined with model.backend: megatron", PPO),
        (
            MEGATRON + ["model.gradient_checkpointing=true"],  # the older name of the field
            "model.backend: megatron cannot be combined with model.activation_checkpointing",
            ["model.activation_checkpointing=true"],
        ),
        (
            ["model.fsdp.cpu_offload=true"],
            "model.fsdp.cpu_offload: true needs model.backend: fsdp (not hf)",
            ["model.fsdp.cpu_offload=true", "model.backend=fsdp"],
        ),
        (
            ["model.fsdp.sync_each_micro_batch=false", "model.backend=megatron"],
            "model.fsdp.sync_each_micro_batch: false needs model.backend: fsdp (not megatron)",
            ["model.fsdp.sync_each_micro_batch=false", "model.fsdp.reshard_after_forward=false", "model.backend=fsdp"],
        ),
        (
            # LoRA on fsdp shards is allowed (FsdpLoraBackend); the engine's refusal of adapters still holds.
            ["model.backend=fsdp", "model.lora.r=4", "generation.engine=vllm"],
            "generation.engine: vllm cannot be combined with model.lora (r: 4)",
            [
                "model.backend=fsdp",
                "model.lora.r=4",
                "model.activation_checkpointing=true",
                "model.precision=bf16-mixed",
            ]
            + PPO,
        ),
        (
            ["trainer.async_rollouts=1", "model.backend=fsdp"],
            "trainer.async_rollouts: 1 cannot be combined with model.backend: fsdp",
            ["model.backend=fsdp", "reinforce.dynamic_batching=true"],
        ),
        (
            ["model.precision=bf16-mixed", "model.dtype=bfloat16"],
            "model.precision: bf16-mixed keeps float32 master weights: set model.dtype: float32 (not bfloat16)",
            ["model.dtype=bfloat16"],
        ),
        (
            ["model.tensor_model_parallel_size=2"],
            "model.tensor_model_parallel_size: 2 needs model.backend: megatron",
            MEGATRON + ["model.tensor_model_parallel_size=2"],
        ),
        (
            ["model.pipeline_model_parallel_size=2"],
            "model.pipeline_model_parallel_size: 2 needs model.backend: megatron",
            MEGATRON + ["model.pipeline_model_parallel_size=2"],
        ),
        (
            ["generation.engine=vllm", "model.lora.r=4"],
            "generation.engine: vllm cannot be combined with model.lora (r: 4)",
            ["generation.engine=vllm"],
        ),
        (
            ["trainer.async_rollouts=1"] + PPO,
            "trainer.async_rollouts: 1 cannot be combined with algorithm: ppo",
            PPO,
        ),
        (
            ["trainer.async_rollouts=1"] + MEGATRON,
            "trainer.async_rollouts: 1 cannot be combined with model.backend: megatron",
            ["trainer.async_rollouts=1"],
        ),
        (
            ["trainer.async_rollouts=1", "reinforce.dynamic_batching=true"],
            "trainer.async_rollouts: 1 cannot be combined with reinforce.dynamic_batching",
            ["reinforce.dynamic_batching=true"],
        ),
        (["algorithm=ppo"], "critic: algorithm: ppo needs a critic: give critic.server_url", PPO),
        (
            ["reward=null"],
            "reward: required field is missing (give reward.function",
            PPO + ["reward=null", "critic.use_critic_rewards=true"],
        ),
    ],
)
def test_each_combination_rule_names_its_fields_and_a_neighbour_passes(
    tmp_path, monkeypatch, overrides, line, neighbour
):
    """Whether megatron-core is installed or not, the rules are the config's alone."""
    monkeypatch.setattr("aligner.config._megatron_installed", lambda: True)
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, MINIMAL), overrides)
    assert line in str(err.value)
    load_config(write(tmp_path, MINIMAL), neighbour)


def test_every_broken_combination_is_said_at_once_with_or_without_megatron(tmp_path, monkeypatch):
    monkeypatch.setattr("aligner.config._megatron_installed", lambda: False)
    overrides = MEGATRON + ["model.lora.r=8", "reinforce.dynamic_batching=true", "trainer.async_rollouts=1"]
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, MINIMAL), overrides)
    lines = str(err.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == ["model.backend"] * 3 + ["trainer.async_rollouts"] * 2
    assert "megatron needs the optional extra: pip install 'aligner[megatron]'" in lines[2]
    assert all("(got " not in line for line in lines)  # the reason names the values; no repr of a section


# Nine levels of nine aliases: 9^9 (387 million) strings once expanded, from 400 bytes.
ALIAS_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """aligner.config.load_yaml refuses aliases, so `aligner train --config` (and `--set`) cannot be made to expand
    a billion strings (a `--set` value with one is taken as text); an anchor alone is harmless and still reads."""
    from aligner.config import load_yaml

    with pytest.raises(ConfigError, match=r"not valid YAML.*aliases \(\*a\) are not accepted"):
        load_config(write(tmp_path, MINIMAL + ALIAS_BOMB))
    assert load_yaml("a: &x 1\nb: 2\n") == {"a": 1, "b": 2}


def test_an_algorithm_preset_sets_its_knobs_and_an_explicit_knob_wins(tmp_path):
    from aligner.config import ALGORITHM_PRESETS, ReinforceConfig

    default = ReinforceConfig()
    assert default.algorithm == "rloo" and ALGORITHM_PRESETS["rloo"] == {}
    grpo = ReinforceConfig(algorithm="grpo")
    assert (grpo.baseline, grpo.scale_rewards, grpo.loss_aggregation) == ("group_mean", "group", "seq_mean")
    assert (grpo.kl_in, grpo.kl_estimator, grpo.initial_policy_kl_penalty) == ("loss", "k3", 0.04)
    assert grpo.exclude_truncated == default.exclude_truncated  # knobs the preset leaves alone keep their defaults
    mine = ReinforceConfig(algorithm="grpo", scale_rewards="none", initial_policy_kl_penalty=0.0)
    assert (mine.baseline, mine.scale_rewards, mine.initial_policy_kl_penalty) == ("group_mean", "none", 0.0)
    # The resolved config, saved with every run, shows the values used and loads back to the same.
    assert ReinforceConfig(**grpo.model_dump()) == grpo
    assert ReinforceConfig(algorithm="dr_grpo").loss_aggregation == "seq_mean_token_sum_norm"


def test_the_metrics_a_run_steers_by_must_be_its_own_validation_metrics():
    from aligner.config import TrainConfig

    base = {"model": {"policy_path": "p"}, "data": {"train_file": "t", "val_file": "v"}, "reward": {"function": "m:f"}}

    def config(trainer: dict, validation: dict | None = None) -> TrainConfig:
        return TrainConfig(**base, trainer=trainer, validation=validation or {})

    with pytest.raises(ValueError, match="val/pass@1 needs validation.num_samples_per_prompt of 2 or more"):
        config({"best_metric": "val/pass@1"})
    assert config({"best_metric": "val/pass@1"}, {"num_samples_per_prompt": 4}).trainer.best_metric == "val/pass@1"
    goal = {"stop_at_metric": "val/extra_rewards/rule", "stop_at_value": 0.9}
    with pytest.raises(ValueError, match="'val/extra_rewards/rule' is not a validation metric of this run"):
        config(goal)
    assert config(goal, {"extra_rewards": {"rule": {"function": "m:f"}}}).trainer.stop_at_value == 0.9
    with pytest.raises(ValueError, match="stop_at_metric and stop_at_value go together"):
        config({"stop_at_metric": "val/rewards"})
