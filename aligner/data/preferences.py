"""Preference pairs for reward-model training: `{"prompt", "chosen", "rejected"}` JSONL lines, checked, tokenized."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aligner.data.prompts import read_jsonl_records
from aligner.errors import PreferenceDataError


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


def check_pair_line(obj) -> PreferencePair | str:
    """A pair, or the reason the line is bad."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    missing = [k for k in ("prompt", "chosen", "rejected") if k not in obj]
    if missing:
        return "missing field(s) " + ", ".join(f'"{k}"' for k in missing) + ' (needs "prompt", "chosen", "rejected")'
    for key in ("prompt", "chosen", "rejected"):
        if not isinstance(obj[key], str):
            return f'field "{key}" must be a string, got {type(obj[key]).__name__}'
    for key in ("chosen", "rejected"):
        if not obj[key].strip():
            return f'field "{key}" must be a non-empty string'
    if obj["chosen"] == obj["rejected"]:
        return '"chosen" and "rejected" are the same text: the pair expresses no preference'
    return PreferencePair(obj["prompt"], obj["chosen"], obj["rejected"])


def read_preference_file(path: str | Path) -> list[PreferencePair]:
    """Read and validate a preference JSONL file; raise PreferenceDataError listing the bad lines."""
    return read_jsonl_records(path, check_pair_line, "preference file", "pairs", PreferenceDataError)


@dataclass
class TokenizedPairs:
    """Token ids of `prompt + chosen` and `prompt + rejected` per pair (at most max_length, keeping the end)."""

    chosen: list[list[int]]
    rejected: list[list[int]]
    num_truncated: int = 0

    def __len__(self) -> int:
        return len(self.chosen)


def tokenize_pairs(pairs: list[PreferencePair], tokenizer, max_length: int) -> TokenizedPairs:
    """Tokenize the scored texts as ModelRewardClient does (the tokenizer's usual special tokens)."""
    chosen = tokenizer([p.prompt + p.chosen for p in pairs])["input_ids"]
    rejected = tokenizer([p.prompt + p.rejected for p in pairs])["input_ids"]
    truncated = 0
    for i in range(len(pairs)):
        if len(chosen[i]) > max_length or len(rejected[i]) > max_length:
            # Keep the end: it holds the response, which is what the pair is about.
            chosen[i], rejected[i] = chosen[i][-max_length:], rejected[i][-max_length:]
            truncated += 1
    return TokenizedPairs(chosen=chosen, rejected=rejected, num_truncated=truncated)


def pad_right(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask [N, longest], padded on the right (as the tokenizer pads by default)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask
