"""The Megatron-Core backend: weight conversion both ways, and equality with the plain HF backend under TP=2, PP=2
and TP=1 x DP=2.

The distributed tests run tests/helpers/megatron_worker.py in 2 processes over gloo on the CPU, under the torch.cuda
shim (tests/helpers/megatron_shim.py). Everything is skipped when megatron-core (the `megatron` extra) is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from aligner.modeling import megatron as mb  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
HELPERS = ROOT / "tests" / "helpers"


def tiny_hf_state(**overrides) -> tuple[object, dict[str, torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    settings = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    config = LlamaConfig(**{**settings, **overrides})
    model = LlamaForCausalLM(config)
    # Distinct values everywhere (norms included), so that any misplaced slice shows.
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return config, state


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_key_value_heads": 4}, {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}],
    ids=["gqa", "mha", "tied-bias"],
)
def test_hf_megatron_hf_round_trip_is_exact(tp, pp, overrides):
    config, state = tiny_hf_state(**overrides)
    shards = [
        mb.merge_pipeline_stages(
            [mb.hf_to_megatron_state_dict(state, config, rank, tp, stage, pp) for stage in range(pp)], config
        )
        for rank in range(tp)
    ]
    back = mb.megatron_to_hf_state_dict(shards, config)
    assert set(back) == set(state)
    for key, value in state.items():
        assert torch.equal(back[key], value), key


def test_qkv_layout_is_megatrons_per_query_group():
    config, state = tiny_hf_state()
    d = config.hidden_size // config.num_attention_heads
    qkv = mb.hf_to_megatron_state_dict(state, config)["decoder.layers.0.self_attention.linear_qkv.weight"]
    q, k, v = (state[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    # Query group 1 (the second kv head) serves query heads 2 and 3: [q2 q3 | k1 | v1].
    group = qkv[4 * d : 8 * d]
    assert torch.equal(group, torch.cat([q[2 * d : 4 * d], k[d : 2 * d], v[d : 2 * d]]))
    # Tensor parallel 2 gives each rank whole query groups, and fc1 its halves of gate and of up.
    rank1 = mb.hf_to_megatron_state_dict(state, config, tp_rank=1, tp_size=2)
    assert torch.equal(rank1["decoder.layers.0.self_attention.linear_qkv.weight"], group)
    gate, up = state["model.layers.0.mlp.gate_proj.weight"], state["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(rank1["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[24:], up[24:]]))


@pytest.mark.parametrize("tied", [False, True])
def test_pipeline_stages_hold_their_layers_with_local_numbers(tied):
    config, state = tiny_hf_state(num_hidden_layers=4, tie_word_embeddings=tied)
    first, last = (mb.hf_to_megatron_state_dict(state, config, pp_rank=s, pp_size=2) for s in (0, 1))
    whole = mb.hf_to_megatron_state_dict(state, config)
    assert list(mb.stage_layers(config, 1, 2)) == [2, 3]
    # Global layer 3 is the last stage's layer 1; each stage numbers its layers from 0.
    assert torch.equal(last["decoder.layers.1.mlp.linear_fc2.weight"], whole["decoder.layers.3.mlp.linear_fc2.weight"])
    assert {k.split(".")[2] for k in first if k.startswith("decoder.layers.")} == {"0", "1"}
    assert "embedding.word_embeddings.weight" in first and "embedding.word_embeddings.weight" not in last
    assert "decoder.final_layernorm.weight" in last and "decoder.final_layernorm.weight" not in first
    assert "output_layer.weight" not in first
    # Tied: Megatron's copy of the embedding on the last stage, dropped again when the stages are merged.
    expected = state["model.embed_tokens.weight"] if tied else state["lm_head.weight"]
    assert torch.equal(last["output_layer.weight"], expected)
    assert ("output_layer.weight" in mb.merge_pipeline_stages([first, last], config)) is not tied


def test_transformer_config_follows_the_hf_config():
    config, _ = tiny_hf_state(rms_norm_eps=1e-5)
    tc = mb.megatron_config_from_hf(config, tensor_model_parallel_size=2)
    assert (tc.num_layers, tc.hidden_size, tc.ffn_hidden_size) == (2, 32, 48)
    assert (tc.num_attention_heads, tc.num_query_groups, tc.kv_channels) == (4, 2, 8)
    assert tc.normalization == "RMSNorm" and tc.layernorm_epsilon == 1e-5 and tc.gated_linear_unit
    assert not tc.add_bias_linear and tc.hidden_dropout == 0 and tc.attention_dropout == 0
    assert tc.tensor_model_parallel_size == 2
    tc = mb.megatron_config_from_hf(config, pipeline_model_parallel_size=2)
    assert tc.pipeline_model_parallel_size == 2 and tc.pipeline_dtype == torch.float32 and tc.variable_seq_lengths


def test_unsupported_shapes_are_refused():
    config, _ = tiny_hf_state(num_key_value_heads=1)
    with pytest.raises(ValueError, match="num_key_value_heads .* must divide by tensor_model_parallel_size"):
        mb.megatron_config_from_hf(config, tensor_model_parallel_size=2)
    with pytest.raises(ValueError, match=r"num_hidden_layers \(2\) must divide by pipeline_model_parallel_size \(3\)"):
        mb.megatron_config_from_hf(config, pipeline_model_parallel_size=3)


# ----------------------------------------------------------------------------------------------- 2 processes
@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("megatron") / "results.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(HELPERS / "megatron_worker.py"), str(out)], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


def _max_response_diff(results: dict, a: str, b: str) -> float:
    mask = results["response_mask"]
    return ((results[a] - results[b]).abs() * mask).max().item()


def _max_state_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k] - b[k]).abs().max().item() for k in b)


@pytest.mark.slow
def test_tp1_tp2_and_pp2_logprobs_equal_the_hf_models(two_rank_results):
    assert _max_response_diff(two_rank_results, "tp2_logprobs", "hf_logprobs") < 1e-5
    assert _max_response_diff(two_rank_results, "tp1_logprobs", "hf_logprobs") < 1e-5
    # Through the pipeline schedule, 3 micro-batches of different lengths, broadcast from the last stage to rank 0:
    assert _max_response_diff(two_rank_results, "pp2_logprobs", "hf_logprobs") < 1e-5
    # Tied embeddings and biases (attention and MLP), through Megatron's layers:
    assert _max_response_diff(two_rank_results, "tp2_tied_logprobs", "hf_tied_logprobs") < 1e-5
    assert _max_response_diff(two_rank_results, "pp2_tied_logprobs", "hf_tied_logprobs") < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("run,reference", [("tp2", "hf"), ("pp2", "hf"), ("pp2_tied", "hf_tied")])
def test_weights_gathered_back_are_the_hf_weights(two_rank_results, run, reference):
    assert _max_state_diff(two_rank_results[f"{run}_roundtrip"], two_rank_results[f"{reference}_state"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("run,reference", [("tp2", "hf"), ("dp2", "hf"), ("pp2", "hf"), ("pp2_tied", "hf_tied")])
def test_reinforce_step_equals_the_hf_step(two_rank_results, run, reference):
    r = two_rank_results
    assert r[f"{run}_loss"] == pytest.approx(r[f"{reference}_loss"], rel=1e-5)
    # The clip threshold is below this norm, so a miscounted norm (shards, replicas, stages) would change the step.
    assert r[f"{run}_grad_norm"] == pytest.approx(r[f"{reference}_grad_norm"], rel=1e-5)
    moved = _max_state_diff(r[f"{reference}_after_step"], r[f"{reference}_state"])
    assert moved > 1e-4
    assert _max_state_diff(r[f"{run}_after_step"], r[f"{reference}_after_step"]) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("run", ["pp2", "pp2_tied"])
def test_pipeline_metrics_reach_every_stage(two_rank_results, run):
    first_stage, last_stage = two_rank_results[f"{run}_rank_metrics"]
    assert first_stage == last_stage


@pytest.mark.slow
def test_tied_embedding_copy_on_the_last_stage_stays_in_step(two_rank_results):
    # Without summing the two copies' gradients, the output layer's copy would move apart from the embedding.
    assert two_rank_results["pp2_tied_copy_diff"] < 1e-6
