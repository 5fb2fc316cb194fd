"""Text that every file, database column and tokenizer can hold: valid Unicode without NUL characters.

JSON escapes can spell strings that Python parses but nothing downstream takes: `\\ud800` (a lone surrogate has no
UTF-8 encoding, so writing it to a file, a column or a tokenizer fails) and `\\u0000` (PostgreSQL text and file
paths refuse NUL). The API refuses them in request bodies (webapp/errors.py) and the prompt readers in data files
(aligner/data/prompts.py), so that a job never fails later on text that was accepted.
"""

from __future__ import annotations

from typing import Any


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored, or None."""
    if "\x00" in text:
        return "must not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"must be valid Unicode: lone surrogate \\u{ord(text[err.start]):04x} at position {err.start}"
    return None


def unstorable_strings(value: Any, path: str = "") -> dict[str, list[str]]:
    """The strings (keys included) in parsed JSON that `text_problem` refuses, by dotted path (`a.b.0`).

    The caller bounds the depth (the JSON parser does: RecursionError past Python's limit)."""
    out: dict[str, list[str]] = {}
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            out[path or "body"] = [problem]
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = text_problem(key)
            shown = key.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00") if problem else key
            child = f"{path}.{shown}" if path else shown
            if problem:
                out.setdefault(child, []).append(f"key {problem}")
            for k, v in unstorable_strings(item, child).items():
                out.setdefault(k, []).extend(v)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.update(unstorable_strings(item, f"{path}.{index}" if path else str(index)))
    return out
