"""Grouped log-probs (each prompt computed once) against plain concatenated rows, and the CPU allocator."""

import pytest
import torch

from aligner.config import GenerationConfig
from aligner.generation.generator import TorchGenerator
from aligner.modeling.device import keep_freed_memory
from aligner.modeling.hf import eos_token_ids, load_policy, load_tokenizer
from aligner.modeling.logprobs import grouped_response_logprobs, response_logprobs
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
