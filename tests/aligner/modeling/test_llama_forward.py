"""aligner.modeling.llama_forward: the same logits and gradients as transformers' forward, and when it applies."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from aligner.modeling.batches import ResponseBatch
from aligner.modeling.llama_forward import llama_grouped_logits, supports_fast_forward
from aligner.modeling.logprobs import _response_logits, grouped_response_logits

VOCAB = 97


def tiny_llama(**extra) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        **extra,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # norms start at 1: make their weights matter to the comparison
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def ragged_batch(seed: int = 0) -> ResponseBatch:
    """3 prompts of 2-6 tokens (left-padded), 2-3 responses each of 1-5 tokens (right-padded), pad id 0 sampled too."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths, response_lengths = [6, 2, 4], [5, 1, 3, 5, 2, 4, 4, 5]
    group = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    prompt_ids = torch.zeros(3, 6, dtype=torch.long)
    prompt_mask = torch.zeros(3, 6, dtype=torch.bool)
    for i, n in enumerate(prompt_lengths):
        prompt_ids[i, 6 - n :] = torch.randint(1, VOCAB, (n,), generator=g)
        prompt_mask[i, 6 - n :] = True
    response_ids = torch.randint(0, VOCAB, (8, 5), generator=g)  # 0 = the pad id, as a policy may sample it
    response_mask = torch.arange(5)[None, :] < torch.tensor(response_lengths)[:, None]
    return ResponseBatch(prompt_ids, prompt_mask, group, response_ids.masked_fill(~response_mask, 0), response_mask)


def transformers_logits(model, batch: ResponseBatch) -> torch.Tensor:
    ids, mask = batch.sequences()
    return _response_logits(model, ids, mask, batch.response_ids.shape[1])


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True},
        {"num_key_value_heads": 1, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}},
    ],
    ids=["mha", "gqa-biases", "mqa-scaled-rope"],
)
def test_logits_and_gradients_equal_those_of_transformers(extra):
    model = tiny_llama(**extra).train()
    batch = ragged_batch()
    weights = torch.randn(batch.response_ids.shape + (VOCAB,), generator=torch.Generator().manual_seed(1))
    # Padding positions' logits are never used (and transformers' whole rows number them differently).
    weights *= batch.response_mask[..., None]

    results = []
    for logits_of in (transformers_logits, llama_grouped_logits):
        model.zero_grad(set_to_none=True)
        logits = logits_of(model, batch)
        (logits * weights).sum().backward()
        results.append(
            (logits.detach() * batch.response_mask[..., None], {n: p.grad for n, p in model.named_parameters()})
        )
    (expected, expected_grads), (logits, grads) = results

    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert set(grads) == set(expected_grads)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # The pad id's embedding row gets no gradient (transformers' padding_idx), though a response holds that token.
    assert (batch.response_ids[batch.response_mask] == 0).any()
    assert not grads["model.embed_tokens.weight"][0].any()


@pytest.mark.cpu_sensitive
def test_bfloat16_logits_agree_to_bfloat16_precision():
    model, batch = tiny_llama(num_key_value_heads=2).to(torch.bfloat16).eval(), ragged_batch(seed=4)
    mask = batch.response_mask[..., None]
    with torch.no_grad():
        expected, got = transformers_logits(model, batch) * mask, llama_grouped_logits(model, batch) * mask
    assert got.dtype == torch.float32
    # Both round to bfloat16 after every op (norms and softmax in float32): a few bfloat16 ulps (2^-8 relative).
    assert (got - expected).abs().max() <= 4 * 2**-8 * expected.abs().max()


def test_one_token_responses_feed_nothing_and_are_predicted_from_their_prompts():
    model, batch = tiny_llama().train(), ragged_batch(seed=3)
    only_first = ResponseBatch(
        batch.prompt_ids, batch.prompt_mask, batch.group, batch.response_ids[:, :1], batch.response_mask[:, :1]
    )
    logits = llama_grouped_logits(model, only_first)
    assert logits.shape == (8, 1, VOCAB)
    torch.testing.assert_close(logits, transformers_logits(model, only_first), atol=1e-5, rtol=1e-5)
    logits.sum().backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad.any()


def test_grouped_logits_take_the_fast_path_for_llama_and_transformers_otherwise(monkeypatch):
    import aligner.modeling.llama_forward

    calls = []
    monkeypatch.setattr(
        aligner.modeling.llama_forward,
        "llama_grouped_logits",
        lambda m, b: calls.append(m) or llama_grouped_logits(m, b),
    )
    model, batch = tiny_llama().eval(), ragged_batch(seed=2)
    with torch.no_grad():
        fast = grouped_response_logits(model, batch)
    assert calls == [model]

    model.model.layers[0].mlp.up_proj.register_forward_hook(lambda *args: None)  # a patched module: transformers
    with torch.no_grad():
        slow = grouped_response_logits(model, batch)
    assert calls == [model]
    mask = batch.response_mask[..., None]
    torch.testing.assert_close(fast * mask, slow * mask, atol=1e-5, rtol=1e-5)


def test_fast_forward_is_refused_where_it_would_compute_something_else():
    assert supports_fast_forward(tiny_llama().train())
    dropout = tiny_llama(attention_dropout=0.1)
    assert not supports_fast_forward(dropout.train())
    assert supports_fast_forward(dropout.eval())  # dropout is off in eval mode
    assert not supports_fast_forward(tiny_llama(hidden_act="gelu"))
