"""Grouped log-probs (each prompt computed once) against plain concatenated rows, the chunked vocabulary projection
against logits made whole, and the CPU allocator."""

import pytest
import torch
from torch.nn import functional as F

from aligner.config import GenerationConfig
from aligner.generation.generator import TorchGenerator
from aligner.modeling import logprobs as logprobs_module
from aligner.modeling.device import keep_freed_memory
from aligner.modeling.hf import eos_token_ids, load_policy, load_tokenizer
from aligner.modeling.logprobs import (
    grouped_response_logprobs,
    linear_token_logprobs,
    response_logprobs,
    token_logprobs,
)
from aligner.modeling.reference import ReferencePolicy


@pytest.fixture(scope="module")
def rollout(tiny_policy_dir):
    tokenizer, model = load_tokenizer(tiny_policy_dir), load_policy(tiny_policy_dir)
    gen = TorchGenerator(model, tokenizer, GenerationConfig(max_new_tokens=10), eos_token_ids(model, tokenizer))
    prompts = [tokenizer(p)["input_ids"] for p in ("tell me about the cat.", "dog", "the old river runs")]
    return model, gen.generate(prompts, num_samples=3, seed=0)


def test_grouped_logprobs_and_gradients_equal_those_of_whole_rows(rollout):
    model, out = rollout
    batch = out.response_batch()
    assert batch.prompt_ids.shape[0] == 3 and batch.group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    ids, mask = out.response_batch().sequences()
    model.train()

    grouped = grouped_response_logprobs(model, batch)
    (grouped * out.response_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    whole = response_logprobs(model, ids, mask, out.response_ids.shape[1])
    (whole * out.response_mask).sum().backward()
    model.eval()

    torch.testing.assert_close(grouped * out.response_mask, whole * out.response_mask, atol=1e-5, rtol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
    model.zero_grad()


def test_subsets_split_groups_and_drop_padding_columns(rollout):
    model, out = rollout
    batch = out.response_batch()
    sub = batch.subset(slice(2, 5))  # the last response of prompt 0 and two of prompt 1
    assert sub.group.tolist() == [0, 1, 1] and sub.prompt_ids.shape[0] == 2
    assert sub.prompt_mask.any(0).all()  # no column is padding in every row
    assert sub.response_mask[:, -1].any()
    with torch.no_grad():
        full = grouped_response_logprobs(model, batch)
        part = ReferencePolicy(model).logprobs(sub)
    width = sub.response_ids.shape[1]
    torch.testing.assert_close(part * sub.response_mask, full[2:5, :width] * sub.response_mask, atol=1e-5, rtol=1e-5)


def test_keep_freed_memory_applies_on_linux():
    import sys

    assert keep_freed_memory() == sys.platform.startswith("linux")


def projection(bias: bool, seed: int = 0):
    """Hidden states [N=13, H=24], a vocabulary projection [V=50, 24] (bias optional) and target ids, all leaves."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(13, 24, generator=g).requires_grad_()
    weight = (torch.randn(50, 24, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(50, generator=g) * 0.1).requires_grad_() if bias else None
    return hidden, weight, b, torch.randint(0, 50, (13,), generator=g)


def whole_logprobs(hidden, weight, bias, targets):
    return token_logprobs(F.linear(hidden, weight, bias).float()[None], targets[None])[0]


def values_and_grads(fn, hidden, weight, bias, targets, upstream):
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    for t in leaves:
        t.grad = None
    out = fn(hidden, weight, bias, targets)
    (out * upstream).sum().backward()
    return out.detach(), [t.grad.clone() for t in leaves]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_chunked_projection_logprobs_and_gradients_equal_whole_logits(bias, monkeypatch):
    monkeypatch.setattr(logprobs_module, "_CHUNK_VALUES", 50 * 4)  # 4 rows a chunk: 13 rows make 3 and a remainder
    tensors = projection(bias)
    upstream = torch.randn(13, generator=torch.Generator().manual_seed(1))
    want, want_grads = values_and_grads(whole_logprobs, *tensors, upstream)
    got, got_grads = values_and_grads(linear_token_logprobs, *tensors, upstream)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # nothing kept for a backward; the same values
        torch.testing.assert_close(linear_token_logprobs(*tensors), want, atol=1e-5, rtol=1e-5)


@pytest.mark.cpu_sensitive
def test_under_autocast_the_projection_is_bfloat16_like_f_linear_and_gradients_reach_float32_leaves():
    hidden, weight, bias, targets = projection(bias=True)
    upstream = torch.randn(13, generator=torch.Generator().manual_seed(1))
    exact, exact_grads = values_and_grads(whole_logprobs, hidden, weight, bias, targets, upstream)
    with torch.autocast("cpu", torch.bfloat16):
        same_rounding, _ = values_and_grads(whole_logprobs, hidden, weight, bias, targets, upstream)
        got, got_grads = values_and_grads(linear_token_logprobs, hidden, weight, bias, targets, upstream)
    assert all(g.dtype == torch.float32 for g in got_grads)
    # Both round the logits to bfloat16 (8 bits: 2^-8 of each logit, |logits| < 8 here), so they agree far closer
    # than either agrees with float32.
    torch.testing.assert_close(got, same_rounding, atol=1e-4, rtol=0)
    torch.testing.assert_close(got, exact, atol=8 * 2**-8, rtol=0)
    for g, w in zip(got_grads, exact_grads):
        torch.testing.assert_close(g, w, atol=0.05 * w.abs().max().item(), rtol=0)


@pytest.mark.cpu_sensitive
def test_a_target_almost_certain_keeps_its_small_gradient_exact():
    """1 - p_t comes from the float32 log-prob, not the softmax kept in bfloat16, which would round it to 0."""
    hidden = torch.zeros(1, 2)
    hidden[0, 0] = 12.0
    hidden.requires_grad_()
    weight = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]], requires_grad=True)  # logits [12, 0, 0]
    target = torch.tensor([0])
    with torch.autocast("cpu", torch.bfloat16):
        linear_token_logprobs(hidden, weight, None, target).sum().backward()
    p_other = 1 / (torch.exp(torch.tensor(12.0)) + 2)
    # d log p_0 / d hidden_0 = (1 - p_0) * w_00 = 2 p_other: about 1.2e-5, below bfloat16's resolution near 1.
    torch.testing.assert_close(hidden.grad[0, 0], 2 * p_other, rtol=0.01, atol=0)


def test_the_projection_graph_runs_backward_once():
    hidden, weight, bias, targets = projection(bias=False)
    out = linear_token_logprobs(hidden, weight, bias, targets).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward once"):
        out.backward()
