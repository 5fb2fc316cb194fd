"""Choosing the next token from logits: repetition penalty, temperature, top-k, top-p, a ban on EOS, inverse-CDF
sampling or greedy choice.

Pure functions on tensors with no randomness of their own: the caller draws the uniform numbers, so the same
draws give the same tokens whether these run eagerly or inside the compiled decode step
(aligner/generation/llama_decoder.py).
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering; removed tokens get -inf."""
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p; the most likely token always stays.
        drop = (probs.cumsum(-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Hugging Face's repetition penalty (CTRL, Keskar et al. 2019): the logit of each token with `seen` [B, V] set
    is divided by `penalty` when positive and multiplied by it when negative, so a penalty > 1 always makes a seen
    token less likely."""
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def sample_from_logits(logits: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row by inverse CDF on `uniform` [B, 1] in [0, 1) (much cheaper than torch.multinomial on the
    CPU). The uniform draw is scaled to the unnormalised CDF, which spares the softmax's division."""
    weights = (logits.float() - logits.amax(-1, keepdim=True)).exp()
    cdf = weights.cumsum(-1)
    return torch.searchsorted(cdf, uniform * cdf[:, -1:]).squeeze(-1).clamp_(max=weights.shape[-1] - 1)


def sample_next(
    logits: torch.Tensor,
    uniform: torch.Tensor,
    ban_eos: torch.Tensor,
    eos_mask: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    greedy: bool = False,
    repetition_penalty: float = 1.0,
    seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] and the policy's log-probs of them [B].

    The log-probs are of the policy's own distribution (what training and the KL see), whatever the sampling knobs:
    temperature, top-k/top-p, the repetition penalty and greedy choice only change which token is taken.
    `ban_eos` (a 0-dim bool tensor, so a compiled caller need not recompile when it flips) removes every token of
    `eos_mask` [V] from sampling, for responses shorter than min_new_tokens. `seen` [B, V] marks the tokens already
    in each sequence, for a `repetition_penalty` other than 1. `greedy` takes the most likely token (after the
    penalty and the EOS ban) and ignores `uniform`, temperature, top-k and top-p.
    """
    policy_logprobs = logits.float().log_softmax(-1)
    sampling = policy_logprobs
    if repetition_penalty != 1.0:
        # On the logits, not the log-probs: the penalty's effect depends on the logit's sign (as in transformers).
        sampling = apply_repetition_penalty(logits.float(), seen, repetition_penalty)
    sampling = sampling.masked_fill(eos_mask & ban_eos, float("-inf"))
    if greedy:
        tokens = sampling.argmax(-1)
    else:
        tokens = sample_from_logits(filter_logits(sampling, temperature, top_k, top_p), uniform)
    return tokens, policy_logprobs.gather(-1, tokens[:, None]).squeeze(-1)
