import pytest
import torch

from aligner.config import GenerationConfig
from aligner.generation.generator import TorchGenerator
from aligner.generation.hf_engine import HFGenerator
from aligner.modeling.hf import eos_token_ids, load_policy, load_tokenizer
from aligner.modeling.logprobs import grouped_response_logprobs
from tests.helpers.architectures import ARCHITECTURES, SLIDING_WINDOW, tiny_causal_lm

# Log-probs of the same fp32 logits computed by two code paths (generate's cached decode, the training forward):
# they differ by float rounding only, ~1e-6 at these sizes.
FP32_TOLERANCE = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tokenizer(tiny_policy_dir):
    return load_tokenizer(tiny_policy_dir)


@pytest.fixture(scope="module")
def models(tiny_policy_dir, tokenizer):
    """The tiny Llama policy and a tiny model of every other architecture, in eval mode."""
    built = {"llama": load_policy(tiny_policy_dir)}
    built |= {name: tiny_causal_lm(name, tokenizer) for name in ARCHITECTURES}
    return {name: model.eval() for name, model in built.items()}


def prompts(tokenizer):
    # Of different lengths (left padding), the longer one longer than Gemma's sliding window.
    long, short = tokenizer("tell me about the cat and the dog.")["input_ids"], tokenizer("dog")["input_ids"]
    assert len(long) > SLIDING_WINDOW
    return [long, short]


def boost_eos(model, tokenizer, boost=1.0):
    """A hook making EOS likely, so that some responses end early; returns the handle to remove."""
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = boost
    return model.lm_head.register_forward_hook(lambda module, args, out: out + bias)


@pytest.mark.parametrize("architecture", ("llama",) + ARCHITECTURES)
def test_logprobs_are_the_training_forwards_and_the_layout_torchs(models, tokenizer, architecture):
    """The sampled tokens' log-probs are the policy's unmodified ones, whatever the sampling knobs: what the training
    forward (grouped_response_logprobs) computes for the same responses."""
    model = models[architecture]
    eos = eos_token_ids(model, tokenizer)
    config = GenerationConfig(
        max_new_tokens=10, min_new_tokens=2, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3
    )
    handle = boost_eos(model, tokenizer)
    try:
        out = HFGenerator(model, tokenizer, config, eos).generate(prompts(tokenizer), num_samples=3, seed=0)
        expected = grouped_response_logprobs(model, out.response_batch())
    finally:
        handle.remove()
    torch.testing.assert_close(expected * out.response_mask, out.logprobs, **FP32_TOLERANCE)
    assert out.logprobs.dtype == torch.float32
    assert out.group_ids.tolist() == [0, 0, 0, 1, 1, 1] and len(out.responses) == 6
    assert torch.equal(out.prompt_ids[0], out.prompt_ids[2])
    assert int(out.prompt_mask[3].sum()) == len(prompts(tokenizer)[1])
    assert not out.prompt_mask[3, 0] and out.prompt_mask[3, -1]  # left-padded
    for row in range(6):
        length, tokens = int(out.response_lengths[row]), out.response_ids[row]
        assert length >= 2  # min_new_tokens
        assert bool(out.is_end[row]) == (tokens[length - 1].item() in eos)  # the mask covers the EOS
        assert not torch.isin(tokens[: length - 1], torch.tensor(eos)).any()
        assert (tokens[length:] == tokenizer.pad_token_id).all()
        assert out.is_end[row] or length == 10
    assert out.is_end.any()


def test_gemmas_sliding_window_acts_in_both_paths(models, tokenizer):
    """Responses attend past Gemma's window: a model with a wide window gives other log-probs, so the agreement
    above covers the sliding-window layers."""
    model = models["gemma2"]
    out = HFGenerator(model, tokenizer, GenerationConfig(max_new_tokens=8), eos_token_ids(model, tokenizer)).generate(
        prompts(tokenizer), num_samples=2, seed=0
    )
    wide = tiny_causal_lm("gemma2", tokenizer, sliding_window=256).eval()
    assert torch.equal(wide.lm_head.weight, model.lm_head.weight)  # the same weights
    unwindowed = grouped_response_logprobs(wide, out.response_batch()) * out.response_mask
    assert (unwindowed - out.logprobs).abs().max() > 1e-3


def test_same_seed_same_samples_and_the_global_rng_is_left_alone(models, tokenizer):
    model = models["qwen2"]
    gen = HFGenerator(model, tokenizer, GenerationConfig(max_new_tokens=10), eos_token_ids(model, tokenizer))
    state = torch.get_rng_state()
    a, b = gen.generate(prompts(tokenizer), 4, seed=1), gen.generate(prompts(tokenizer), 4, seed=1)
    c = gen.generate(prompts(tokenizer), 4, seed=2)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)
    # Chunks of prompts draw different noise: the two prompts' samples are not the same sequence of draws.
    chunked = HFGenerator(
        model, tokenizer, GenerationConfig(max_new_tokens=10, batch_size=1), eos_token_ids(model, tokenizer)
    )
    out = chunked.generate(prompts(tokenizer), 4, seed=1)
    assert out.group_ids.tolist() == [0] * 4 + [1] * 4 and out.prompt_ids.shape == out.prompt_mask.shape


def test_the_models_own_generation_settings_are_ignored(models, tokenizer):
    """A checkpoint's generation_config.json (here a min_p that leaves only the likeliest token) does not change
    sampling: generation.* alone decides, and the model's settings are back afterwards."""
    model = models["qwen2"]
    model.generation_config.min_p = 0.999
    try:
        gen = HFGenerator(model, tokenizer, GenerationConfig(max_new_tokens=6), eos_token_ids(model, tokenizer))
        out = gen.generate(prompts(tokenizer)[:1], 4, seed=0)
        assert model.generation_config.min_p == 0.999
    finally:
        model.generation_config.min_p = None
    assert len({tuple(row.tolist()) for row in out.response_ids}) > 1  # sampled, not greedy


@pytest.mark.parametrize("fast_decode", (True, False))
def test_end_rules_are_torch_generators(models, tokenizer, fast_decode):
    """Greedy decoding with both engines: EOS (an extra EOS id the greedy response produces at its 4th token),
    min_new_tokens past it, an end string and the repetition penalty give the same responses, masks, is_end and
    log-probs."""
    model = models["llama"]
    ids = prompts(tokenizer)
    base = GenerationConfig(max_new_tokens=12, greedy=True, fast_decode=fast_decode)
    eos = eos_token_ids(model, tokenizer)
    greedy = TorchGenerator(model, tokenizer, base, eos).generate(ids, 1, seed=0)
    ender = int(greedy.response_ids[0, 3])
    end_string = greedy.responses[1][2:4]
    cases = [
        (eos + [ender], {}),
        (eos + [ender], {"min_new_tokens": 6}),
        (eos, {"end_strings": [end_string]}),
        (eos, {"end_strings": [end_string], "min_new_tokens": 11}),
        (eos, {"repetition_penalty": 1.8}),
    ]
    for eos_ids, settings in cases:
        config = base.model_copy(update=settings)
        want = TorchGenerator(model, tokenizer, config, eos_ids).generate(ids, 2, seed=0)
        got = HFGenerator(model, tokenizer, config, eos_ids).generate(ids, 2, seed=0)
        for field in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "is_end", "group_ids"):
            assert torch.equal(getattr(got, field), getattr(want, field)), (settings, field)
        assert got.responses == want.responses
        torch.testing.assert_close(got.logprobs, want.logprobs, **FP32_TOLERANCE)
    assert ender not in eos and end_string  # the cases exercised what they name
