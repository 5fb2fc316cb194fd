"""The demo's policy: a tiny Llama built from its config and taught the task by supervised fine-tuning."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence

from aligner.demo.task import make_examples

MODEL_SHAPE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512)
MAX_POSITIONS = 256
DEFAULT_SFT_STEPS = 400
SFT_BATCH_SIZE = 24
SFT_LR = 6e-3
SFT_MIN_LR_RATIO = 0.1  # the cosine decay ends at a tenth of SFT_LR


def new_policy(tokenizer):
    """A freshly initialised tiny Llama for `tokenizer` (initialisation draws from torch's global RNG)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    ids["pad_token_id"] = tokenizer.pad_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITIONS,
        num_key_value_heads=MODEL_SHAPE["num_attention_heads"],
        tie_word_embeddings=True,
        **MODEL_SHAPE,
        **ids,
    )
    config._attn_implementation = "eager"  # faster than sdpa at this size on the CPU; not saved with the config
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model


def chat_prompt(tokenizer, text: str) -> str:
    """The formatted prompt the trainer gives the policy for the user message `text`."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def sft(model, tokenizer, rng: random.Random, pool, steps: int, progress: bool) -> float:
    """Supervised training on freshly drawn examples; the loss covers the response tokens and the final EOS.

    Returns the mean loss of the last (up to) 20 steps.
    """
    import torch
    from tqdm import tqdm

    from aligner.trainers.loop import optimizer_step
    from aligner.trainers.schedule import lr_scheduler

    prompt_ids = {}
    for text, _ in pool:
        prompt_ids[text] = tokenizer(chat_prompt(tokenizer, text), add_special_tokens=False)["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LR, betas=(0.9, 0.98), weight_decay=0.01)
    scheduler = lr_scheduler(optimizer, max(1, steps // 10), steps, min_ratio=SFT_MIN_LR_RATIO)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    model.train()
    losses = []
    bar = tqdm(range(steps), desc="SFT", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    for _ in bar:
        examples = make_examples(rng, pool, SFT_BATCH_SIZE)
        responses = tokenizer([r for _, r in examples], add_special_tokens=False)["input_ids"]
        seqs = [(prompt_ids[p], r + [eos]) for (p, _), r in zip(examples, responses)]
        width = max(len(p) + len(r) for p, r in seqs)
        input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (p, r) in enumerate(seqs):
            n = len(p) + len(r)
            input_ids[i, :n] = torch.tensor(p + r)
            labels[i, len(p) : n] = torch.tensor(r)
            mask[i, :n] = 1
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer_step(optimizer, model.parameters(), 1.0, scheduler)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    tail = losses[-20:]
    return sum(tail) / len(tail) if tail else float("nan")


def sample_policy(
    model, tokenizer, prompts: Sequence[str], num_samples: int = 4, max_new_tokens: int = 48, seed: int = 0
) -> list[tuple[str, str, bool]]:
    """Sample `num_samples` responses per user prompt at temperature 1 (no top-k/top-p).

    Returns (formatted prompt, decoded response, ended with EOS) per sample.
    """
    import torch

    formatted = [chat_prompt(tokenizer, p) for p in prompts for _ in range(num_samples)]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        batch = tokenizer(formatted, add_special_tokens=False, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    results = []
    for prompt, row in zip(formatted, out[:, batch["input_ids"].shape[1] :].tolist()):
        ended = tokenizer.eos_token_id in row
        if ended:
            row = row[: row.index(tokenizer.eos_token_id)]
        results.append((prompt, tokenizer.decode(row, skip_special_tokens=True), ended))
    return results
