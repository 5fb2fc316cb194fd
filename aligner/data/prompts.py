"""Prompt data: JSONL files, chat templates, and a resumable, seeded prompt sampler.

A prompt file holds one JSON object per line, either `{"prompt": "..."}` or
`{"messages": [{"role": "user", "content": "..."}, ...]}`. Any other keys of a line travel with the prompt as
metadata (a reward function can read, say, a reference `answer`). Files are checked completely, before any model
loads; the first bad lines are reported with file, line number and reason. Strings must be valid Unicode without
NUL characters (aligner/data/text.py), as everything downstream (tokenizers, the service's database) needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aligner.data.text import unstorable_strings
from aligner.errors import PromptDataError

MAX_REPORTED_ERRORS = 10
ROLES = ("system", "user", "assistant", "tool")


@dataclass
class PromptRecord:
    """One prompt as read from a file: plain text or chat messages, plus any extra keys as metadata."""

    text: str | None = None
    messages: list[dict[str, str]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def _check_line(obj: Any) -> PromptRecord | str:
    """A record, or the reason the line is bad."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        return 'needs exactly one of the fields "prompt" or "messages"'
    extra = {k: v for k, v in obj.items() if k not in ("prompt", "messages")}
    if has_prompt:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            return 'field "prompt" must be a non-empty string'
        return PromptRecord(text=obj["prompt"], metadata=extra)
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        return 'field "messages" must be a non-empty list'
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f'messages[{j}] must be an object with string fields "role" and "content"'
        if m["role"] not in ROLES:
            return f"messages[{j}].role {m['role']!r} is not one of {', '.join(ROLES)}"
    return PromptRecord(messages=[{"role": m["role"], "content": m["content"]} for m in messages], metadata=extra)


def read_jsonl_records(path: str | Path, check_line, what: str, items: str, error=PromptDataError) -> list:
    """Read a JSONL file whose every non-empty line `check_line` turns into a record or a reason it is bad.

    Raises `error` naming the file, and for bad lines `file:line: reason` (the first MAX_REPORTED_ERRORS of them);
    `what` ("prompt file") and `items` ("prompts") word the messages. An empty file is an error too.
    """
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {what} not found")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise error(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
    records, errors = [], []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            errors.append(f"{path}:{lineno}: invalid JSON: {err.msg} (column {err.colno})")
            continue
        except RecursionError:
            errors.append(f"{path}:{lineno}: invalid JSON: nested too deeply")
            continue
        except ValueError as err:  # an integer of more digits than sys.get_int_max_str_digits() (4300)
            errors.append(f"{path}:{lineno}: invalid JSON: {err}")
            continue
        # Parsed, but text no file, column or tokenizer takes (`\ud800`, `\u0000`): every job using it would fail.
        unstorable = unstorable_strings(obj)
        if unstorable:
            where, reasons = next(iter(unstorable.items()))
            errors.append(f"{path}:{lineno}: {where}: {reasons[0]}")
            continue
        result = check_line(obj)
        if isinstance(result, str):
            errors.append(f"{path}:{lineno}: {result}")
        else:
            records.append(result)
    if errors:
        more = f"\n  ... and {len(errors) - MAX_REPORTED_ERRORS} more" if len(errors) > MAX_REPORTED_ERRORS else ""
        raise error(f"{len(errors)} bad line(s) in {what}:\n  " + "\n  ".join(errors[:MAX_REPORTED_ERRORS]) + more)
    if not records:
        raise error(f"{path}: {what} has no {items}")
    return records


def read_prompt_file(path: str | Path) -> list[PromptRecord]:
    """Read and validate a prompt JSONL file; raise PromptDataError listing the bad lines."""
    return read_jsonl_records(path, _check_line, "prompt file", "prompts")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def format_prompt(record: PromptRecord, tokenizer, apply_chat_template: bool | None) -> str:
    """The text the policy sees: the chat template with a generation prompt, or the raw text.

    `apply_chat_template=None` uses the template when the tokenizer has one. Messages without a template are
    joined as "role: content" lines, so a base model still gets readable input.
    """
    use_template = has_chat_template(tokenizer) if apply_chat_template is None else apply_chat_template
    if use_template and not has_chat_template(tokenizer):
        raise PromptDataError("data.apply_chat_template is true but the tokenizer has no chat template")
    messages = record.messages or [{"role": "user", "content": record.text}]
    if use_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if record.text is not None:
        return record.text
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant: "


@dataclass
class PromptDataset:
    """Formatted prompts, their token ids (left-truncated to max length), and their metadata."""

    texts: list[str]
    token_ids: list[list[int]]
    metadata: list[dict[str, Any]]
    num_truncated: int = 0

    def __len__(self) -> int:
        return len(self.texts)


def build_prompt_dataset(
    records: list[PromptRecord], tokenizer, apply_chat_template: bool | None, max_prompt_length: int
) -> PromptDataset:
    texts = [format_prompt(r, tokenizer, apply_chat_template) for r in records]
    # Chat templates write their own BOS; plain text gets the tokenizer's usual special tokens.
    add_special = not (has_chat_template(tokenizer) if apply_chat_template is None else apply_chat_template)
    ids = tokenizer(texts, add_special_tokens=add_special)["input_ids"]
    truncated = 0
    for i, seq in enumerate(ids):
        if len(seq) > max_prompt_length:
            # Keep the end: it holds the question and the generation prompt.
            ids[i] = seq[-max_prompt_length:]
            truncated += 1
    return PromptDataset(texts=texts, token_ids=ids, metadata=[r.metadata for r in records], num_truncated=truncated)


class PromptSampler:
    """Draws prompt indices in seeded, per-epoch shuffled order; its position is part of a checkpoint.

    A batch that runs past the end of an epoch continues into the next one, so every step has a full batch.
    """

    def __init__(self, num_prompts: int, seed: int, shuffle: bool = True):
        self.num_prompts, self.seed, self.shuffle = num_prompts, seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_prompts))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_prompts, generator=g).tolist()

    def next_batch(self, size: int) -> list[int]:
        batch = []
        while len(batch) < size:
            if self.index == self.num_prompts:
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            take = min(size - len(batch), self.num_prompts - self.index)
            batch.extend(self._order[self.index : self.index + take])
            self.index += take
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "num_prompts": self.num_prompts}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_prompts"] != self.num_prompts:
            raise PromptDataError(
                f"the checkpoint was made with {state['num_prompts']} training prompts, the file now has "
                f"{self.num_prompts}: resuming would not continue the same data order"
            )
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._epoch_order(self.epoch)
