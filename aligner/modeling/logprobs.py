"""Log-probabilities of responses under a model, for training and the reference policy.

`grouped_response_logits` runs each distinct prompt once and its responses against it; Llama models with plain
projections take `aligner.modeling.llama_forward`, others transformers' forward.
"""

from __future__ import annotations

import torch
from torch import nn

from aligner.modeling.batches import ResponseBatch, position_ids_from_mask


def response_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int
) -> torch.Tensor:
    """Log-probs [B, T] of the last T tokens of each row (the response), under `model`.

    Rows are [left-padded prompt | right-padded response]; only the response positions' logits are computed,
    which saves most of the vocabulary projection for long prompts.
    """
    return token_logprobs(_response_logits(model, input_ids, attention_mask, num_response_tokens), input_ids)


def _response_logits(model: nn.Module, input_ids, attention_mask, num_response_tokens: int) -> torch.Tensor:
    """Float32 logits [B, T, V] predicting the last T tokens of each [prompt | response] row."""
    return model(
        input_ids=input_ids[:, :-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids_from_mask(attention_mask)[:, :-1],
        use_cache=False,
        logits_to_keep=num_response_tokens,
    ).logits.float()


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-probs [B, T] of the last T tokens of `ids` under logits [B, T, V]."""
    targets = ids[:, -logits.shape[1] :]
    # Not cross_entropy, though it is twice as fast here: its rounding of a row depends on the row's place in the
    # batch, and at the first step the KL (generation's log-probs against these) is pure rounding, which whitened
    # advantages magnify; 1 and 2 data-parallel ranks then disagree (tests/aligner/test_distributed.py).
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def _activation_checkpointing(model: nn.Module) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (deprecated) to is_activation_checkpointing. Asked of the
    # instance, not its class, so a peft wrapper forwards it to its base model.
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def grouped_response_logprobs(model: nn.Module, batch: ResponseBatch) -> torch.Tensor:
    """Log-probs [B, T] of the response tokens under `model`, each distinct prompt computed once.

    The prompts run first and fill a KV cache; its rows are gathered per response (`index_select`, which gradients
    flow back through), then every response runs against its prompt's keys and values. With k responses per prompt
    this spares (k - 1) prompt forwards and backwards: on the bench workload (8 prompts x 4) ~15% of a training step.
    The result equals `response_logprobs` on the concatenated rows up to float rounding. Gradient checkpointing
    disables transformers' cache, so with it the rows are concatenated instead. Llama models take the same
    arrangement without transformers' forward (`aligner.modeling.llama_forward`), which is faster.
    """
    return token_logprobs(grouped_response_logits(model, batch), batch.response_ids)


def grouped_response_logits(model: nn.Module, batch: ResponseBatch) -> torch.Tensor:
    """Float32 logits [B, T, V] predicting each response token, each distinct prompt run once (as
    `grouped_response_logprobs`, which PPO's entropy needs the whole distribution of)."""
    from transformers import DynamicCache

    from aligner.modeling import llama_forward  # it builds on this module's position_ids_from_mask

    t = batch.response_ids.shape[1]
    if model.training and _activation_checkpointing(model):
        input_ids, attention_mask = batch.sequences()
        return _response_logits(model, input_ids, attention_mask, t)
    if llama_forward.supports_fast_forward(model):
        return llama_forward.llama_grouped_logits(model, batch)
    cache = DynamicCache(config=model.config)
    prompt_out = model(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask.long(),
        position_ids=position_ids_from_mask(batch.prompt_mask),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = prompt_out.logits[:, -1:].index_select(0, batch.group)  # predicts each response's first token
    if t > 1:
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(0, batch.group)
            layer.values = layer.values.index_select(0, batch.group)
        prompt_lengths = batch.prompt_mask.sum(-1).index_select(0, batch.group)
        positions = prompt_lengths[:, None] + torch.arange(t - 1, device=prompt_lengths.device)[None, :]
        rest = model(
            input_ids=batch.response_ids[:, :-1],
            attention_mask=torch.cat([batch.prompt_mask[batch.group], batch.response_mask[:, :-1]], dim=1).long(),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).logits
        logits = torch.cat([logits, rest], dim=1)
    return logits.float()
