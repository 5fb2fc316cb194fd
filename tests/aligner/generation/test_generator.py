import pytest
import torch

from aligner.config import GenerationConfig
from aligner.generation.generator import TorchGenerator, contiguous_head_input
from aligner.modeling.hf import eos_token_ids, load_policy, load_tokenizer
from aligner.modeling.logprobs import response_logprobs


@pytest.fixture(scope="module")
def policy(tiny_policy_dir):
    tokenizer = load_tokenizer(tiny_policy_dir)
    model = load_policy(tiny_policy_dir)
    return model, tokenizer


def make(policy, eos_boost=0.0, **gen):
    model, tokenizer = policy
    eos = eos_token_ids(model, tokenizer)
    return TorchGenerator(model, tokenizer, GenerationConfig(**gen), eos), eos


@pytest.fixture
def eos_boost(policy):
    """Make EOS likely (about one token in three), so responses end within a few tokens."""
    model, tokenizer = policy
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 6.0
    handle = model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    yield
    handle.remove()


def prompts(tokenizer):
    return [tokenizer("tell me about the cat.")["input_ids"], tokenizer("dog")["input_ids"]]


def test_layout_groups_and_logprobs_match_a_full_forward(policy, eos_boost):
    model, tokenizer = policy
    gen, eos = make(policy, max_new_tokens=12)
    out = gen.generate(prompts(tokenizer), num_samples=3, seed=0)
    assert out.response_ids.shape[0] == 6 and out.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    # Samples of one prompt share its (left-padded) prompt.
    assert torch.equal(out.prompt_ids[0], out.prompt_ids[2]) and out.prompt_mask[3].sum() == len(
        tokenizer("dog")["input_ids"]
    )
    ids, mask = out.response_batch().sequences()
    full = response_logprobs(model, ids, mask.long(), out.response_ids.shape[1])
    torch.testing.assert_close(full * out.response_mask, out.logprobs, atol=1e-5, rtol=1e-5)
    for row in range(6):
        length = int(out.response_lengths[row])
        tokens = out.response_ids[row]
        assert bool(out.is_end[row]) == (tokens[length - 1].item() in eos)  # ends exactly at EOS
        assert (tokens[length:] == tokenizer.pad_token_id).all()
        assert not torch.isin(tokens[: length - 1], torch.tensor(eos)).any()
        assert out.is_end[row] or length == 12  # not ended means truncated at the cap
    assert out.is_end.any() and len(out.responses) == 6


def test_same_seed_same_samples_and_other_seed_differs(policy):
    gen, _ = make(policy, max_new_tokens=10)
    p = prompts(policy[1])
    a, b, c = gen.generate(p, 4, seed=1), gen.generate(p, 4, seed=1), gen.generate(p, 4, seed=2)
    assert torch.equal(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_top_k_1_is_greedy_decoding(policy):
    model, tokenizer = policy
    gen, _ = make(policy, max_new_tokens=8, top_k=1)
    ids = prompts(tokenizer)[0]
    out = gen.generate([ids], 2, seed=0)
    reference = model.generate(
        torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )[0, len(ids) :]
    n = min(len(reference), int(out.response_lengths[0]))
    assert out.response_ids[0, :n].tolist() == reference[:n].tolist()
    assert torch.equal(out.response_ids[0], out.response_ids[1])
    # generation.greedy is the same decoding, whatever the temperature (the limit temperature -> 0).
    greedy, _ = make(policy, max_new_tokens=8, greedy=True, temperature=3.0)
    assert torch.equal(greedy.generate([ids], 2, seed=7).response_ids, out.response_ids)


def test_greedy_with_repetition_penalty_matches_transformers(policy):
    """Hugging Face's repetition penalty (the prompt's tokens count as seen) on both decode paths; the log-probs
    stay the policy's own."""
    model, tokenizer = policy
    ids = prompts(tokenizer)[0]
    reference = model.generate(
        torch.tensor([ids]),
        max_new_tokens=12,
        do_sample=False,
        repetition_penalty=1.8,
        pad_token_id=tokenizer.pad_token_id,
    )[0, len(ids) :]
    plain, _ = make(policy, max_new_tokens=12, greedy=True)
    unpenalised = plain.generate([ids], 1, seed=0).response_ids
    for fast_decode in (True, False):
        gen, _ = make(policy, max_new_tokens=12, greedy=True, repetition_penalty=1.8, fast_decode=fast_decode)
        out = gen.generate([ids], 1, seed=0)
        n = min(len(reference), int(out.response_lengths[0]))
        assert n >= 4 and out.response_ids[0, :n].tolist() == reference[:n].tolist()
        assert not torch.equal(unpenalised, out.response_ids)  # the penalty acts
        batch_ids, mask = out.response_batch().sequences()
        full = response_logprobs(model, batch_ids, mask, out.response_ids.shape[1])
        torch.testing.assert_close(full * out.response_mask, out.logprobs, atol=1e-5, rtol=1e-5)


def test_min_new_tokens_blocks_early_eos(policy, eos_boost):
    gen, _ = make(policy, max_new_tokens=12, min_new_tokens=5)
    out = gen.generate(prompts(policy[1]), 8, seed=3)
    assert (out.response_lengths >= 5).all()
    assert out.is_end.any()


def test_logprobs_are_the_policys_whatever_the_sampling_knobs(policy, eos_boost):
    """Temperature, top-k, top-p and min_new_tokens shape the sampling, not the log-probs training sees."""
    model, tokenizer = policy
    gen, _ = make(policy, max_new_tokens=10, min_new_tokens=4, temperature=0.7, top_k=20, top_p=0.9)
    out = gen.generate(prompts(tokenizer), 4, seed=1)
    ids, mask = out.response_batch().sequences()
    full = response_logprobs(model, ids, mask, out.response_ids.shape[1])
    torch.testing.assert_close(full * out.response_mask, out.logprobs, atol=1e-5, rtol=1e-5)


def test_end_strings_stop_a_response(policy):
    model, tokenizer = policy
    gen, _ = make(policy, max_new_tokens=30, top_k=1)
    greedy = gen.generate(prompts(tokenizer)[:1], 1, seed=0).responses[0]
    stop = greedy[3:5]  # a string the greedy response is certain to produce
    gen_stop, _ = make(policy, max_new_tokens=30, top_k=1, end_strings=[stop])
    out = gen_stop.generate(prompts(tokenizer)[:1], 1, seed=0)
    assert out.is_end[0] and out.responses[0].endswith(stop)
    assert len(out.responses[0]) < len(greedy)


def test_prompts_are_processed_in_chunks(policy):
    gen, _ = make(policy, max_new_tokens=6, batch_size=1)
    out = gen.generate(prompts(policy[1]), 2, seed=0)
    assert out.response_ids.shape[0] == 4 and out.group_ids.tolist() == [0, 0, 1, 1]
    assert out.prompt_ids.shape == out.prompt_mask.shape


@pytest.fixture(scope="module")
def eos_biased(policy):
    """A copy of the policy whose output layer has a bias making EOS likely, so that some responses end: a plain
    Linear the fast step reads (unlike the eos_boost hook, which sends decoding through transformers)."""
    import copy

    from aligner.modeling.llama_kernels import supports_fast_decode

    model, tokenizer = policy
    model = copy.deepcopy(model)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 4.0
    model.lm_head = head
    assert supports_fast_decode(model) and model.config.num_key_value_heads < model.config.num_attention_heads
    return model, tokenizer


def test_fast_llama_decode_matches_transformers_decode(eos_biased):
    """Aligner's own decode step gives the samples and log-probs of transformers' forward (this policy has GQA)."""
    fast, _ = make(eos_biased, max_new_tokens=16, fast_decode=True)
    slow, _ = make(eos_biased, max_new_tokens=16, fast_decode=False)
    a = fast.generate(prompts(eos_biased[1]), num_samples=3, seed=5)
    b = slow.generate(prompts(eos_biased[1]), num_samples=3, seed=5)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.is_end, b.is_end)
    assert a.is_end.any() and not a.is_end.all()
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)


@pytest.mark.slow
def test_compiled_decode_samples_what_the_eager_decode_samples(eos_biased, capfd):
    """generation.compile: the compiled step (decode and sampling in one function) draws the eager step's tokens with
    the same log-probs; with min_new_tokens banning EOS at first, top-k and top-p on, and later calls (new weights,
    prompts of another length within the cache block) reusing the compiled code."""
    model, tokenizer = eos_biased
    knobs = dict(max_new_tokens=12, min_new_tokens=3, top_k=50, top_p=0.95)
    eager, _ = make(eos_biased, **knobs)
    compiled, _ = make(eos_biased, compile=True, **knobs)
    batches = [prompts(tokenizer), [tokenizer("the bird sings to the old river")["input_ids"], [5, 6]]]
    for i, batch in enumerate(batches):
        a = eager.generate(batch, num_samples=3, seed=i)
        b = compiled.generate(batch, num_samples=3, seed=i)
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.is_end, b.is_end)
        assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
        assert a.is_end.any() and (a.response_lengths >= 3).all()
        with torch.no_grad():  # an optimiser step changes the weights, not the compiled code
            model.lm_head.weight.mul_(1.01)
    assert capfd.readouterr().err.count("compiling the decode step") == 1


def test_hooked_or_wrapped_projections_take_the_transformers_path(policy, eos_boost):
    from aligner.modeling.llama_kernels import supports_fast_decode

    assert not supports_fast_decode(policy[0])  # eos_boost hooks lm_head


def test_other_architectures_decode_through_transformers(tiny_policy_dir):
    from transformers import GPT2Config, GPT2LMHeadModel

    from aligner.modeling.llama_kernels import supports_fast_decode

    tokenizer = load_tokenizer(tiny_policy_dir)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model = GPT2LMHeadModel(config).eval()
    assert not supports_fast_decode(model)
    gen = TorchGenerator(model, tokenizer, GenerationConfig(max_new_tokens=6), eos_token_ids(model, tokenizer))
    out = gen.generate(prompts(tokenizer), num_samples=2, seed=0)
    ids, mask = out.response_batch().sequences()
    full = response_logprobs(model, ids, mask, out.response_ids.shape[1])
    assert torch.allclose(full[out.response_mask], out.logprobs[out.response_mask], atol=1e-4)


def test_compile_auto_is_for_long_runs_on_the_cpu_with_a_compiler(monkeypatch):
    import shutil

    from aligner.config import GenerationConfig
    from aligner.generation.generator import AUTO_COMPILE_MIN_STEPS, resolve_compile

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert GenerationConfig().compile == "auto"
    assert resolve_compile(True, cpu, 1) is True and resolve_compile(False, cpu, 10**6) is False
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert resolve_compile("auto", cpu, AUTO_COMPILE_MIN_STEPS) is True
    assert resolve_compile("auto", cpu, AUTO_COMPILE_MIN_STEPS - 1) is False  # would not earn the compilation back
    assert resolve_compile("auto", cuda, 10**6) is False  # CUDA compiles only when asked
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert resolve_compile("auto", cpu, 10**6) is False  # no C++ compiler


@pytest.mark.cpu_sensitive
@pytest.mark.parametrize("engine", ["torch", "hf"])
def test_bfloat16_weights_copy_samples_with_the_policys_current_weights(policy, engine):
    """model.precision bf16-mixed: generation runs on its own bfloat16 copy; its log-probs are the float32 policy's
    up to bfloat16 rounding (8-bit mantissa: ~0.4% per op; a few thousandths of a nat through this 2-layer policy),
    and after `update_weights` they follow the policy's new weights."""
    from aligner.generation.hf_engine import HFGenerator

    model, tokenizer = policy
    cls = TorchGenerator if engine == "torch" else HFGenerator
    gen = cls(model, tokenizer, GenerationConfig(max_new_tokens=8), eos_token_ids(model, tokenizer), torch.bfloat16)
    assert gen.model is not model and {p.dtype for p in gen.model.parameters()} == {torch.bfloat16}

    def gap() -> float:
        out = gen.generate(prompts(tokenizer), num_samples=2, seed=0)
        ids, mask = out.response_batch().sequences()
        full = response_logprobs(model, ids, mask.long(), out.response_ids.shape[1]) * out.response_mask
        return (full - out.logprobs).abs().max().item()

    assert gap() < 0.03
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        with torch.no_grad():
            model.lm_head.weight.neg_()  # likely tokens become unlikely
        assert gap() > 0.2  # the copy still holds the old weights: a hundred times the rounding
        gen.update_weights(model)
        assert gap() < 0.03
    finally:
        model.load_state_dict(original)


def test_the_prefill_projects_the_last_positions_as_one_contiguous_matrix(policy):
    """transformers hands the head a strided slice for logits_to_keep=1, which torch's matmul multiplies against a
    copy of the weight per prompt; within `contiguous_head_input` it gets the rows themselves, and the same logits."""
    model, _ = policy
    ids = torch.randint(3, model.config.vocab_size, (3, 7), generator=torch.Generator().manual_seed(0))
    seen = []
    probe = model.lm_head.register_forward_hook(lambda _, args, out: seen.append(args[0].is_contiguous()))
    try:
        with torch.no_grad():
            plain = model(input_ids=ids, logits_to_keep=1).logits
            with contiguous_head_input(model):
                fixed = model(input_ids=ids, logits_to_keep=1).logits
            after = model(input_ids=ids, logits_to_keep=1).logits
    finally:
        probe.remove()
    assert seen == [False, True, False]  # the hook is gone once the block ends
    torch.testing.assert_close(fixed, plain, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(after, plain, rtol=0, atol=0)
