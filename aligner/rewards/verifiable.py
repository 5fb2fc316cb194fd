"""Verifiable rewards: rule-based scores a user configures with data (parameters), never with code.

Each is `fn(prompts, responses, metadata=None, **params) -> list[float]`, one float per sample, as
`FunctionRewardClient` calls it with `reward.function_args` as `params` (checked first by aligner/rewards/builtins.py,
which also names them for the service's catalogue):

- `exact_match`: 1.0 when the response (or the part of it `extract` picks) equals the record's answer, else 0.0;
- `numeric_match`: 1.0 when the last number in the response is within a tolerance of the record's answer, else 0.0;
- `regex_match`: 1.0 when a pattern matches the response, else 0.0;
- `length_penalty`: minus `coef` per character (or word) beyond a target length.

The answer of a sample is its prompt record's `field` key (metadata: the prompt line's extra JSON keys). A record
without it (or with null) scores 0.0: nothing to check against (under RLOO the samples of that prompt then tie,
which gives them no advantage). A batch in which NO record has the
field raises RewardError naming the field: that is a misspelt `field` or the wrong prompt file, not a few
unanswered prompts, and it shows on the first step.

The pattern of `regex_match` comes from an untrusted user, so it is run with the `regex` module (Python `re`
syntax) under a time limit per response, on at most the first MAX_SEARCHED_CHARS characters, after checks that keep
its compilation small; see `compile_pattern`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from re import _parser as re_parser  # the stdlib's own parse tree of a pattern: how its repeats nest
from typing import Any, Literal

import regex

from aligner.errors import RewardError

ANSWER_FIELD = "answer"
DEFAULT_TOLERANCE = 1e-6
DEFAULT_MARKER = "Answer:"
DEFAULT_LENGTH_COEF = 0.01
Extract = Literal["response", "marker", "boxed"]
LengthUnit = Literal["chars", "words"]

MAX_PATTERN_LENGTH = 200
# `regex` allocates memory per count of a counted repeat when it compiles, so `(a{65535}){65535}`, 17 characters,
# exhausts memory: a pattern's size with every repeat written out (see `_expanded_size`) is capped.
MAX_PATTERN_SIZE = 10_000
# Backtracking can take time exponential in the text's length (`re` takes 0.25 s for `(a+)+$` on 22 a's and a b,
# doubling with each further a), so no length cap alone would do: each search has a time limit, and runs on a
# prefix so that polynomial patterns (`.*a.*b`) on a huge response stay fast.
MAX_SEARCHED_CHARS = 10_000
REGEX_TIMEOUT_S = 0.25

_BOXED = "\\boxed{"
# A number as people write it: 42, -3.5, .5, 1e-3, 6.02E23, 1,234,567.89. A sign glued to a word or a number is a
# hyphen ("3-5", "2024-01-15"), not a minus.
_NUMBER = re.compile(
    r"(?:(?<![\w.])[-+\u2212])?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<!\d)\.\d+)"
    r"(?:[eE][-+]?\d+)?"
)
_REPEATS = (re_parser.MAX_REPEAT, re_parser.MIN_REPEAT, re_parser.POSSESSIVE_REPEAT)


# ---------------------------------------------------------------------------------------------------------------
# Rewards


def exact_match(
    prompts: Sequence[str],
    responses: Sequence[str],
    metadata: Sequence[Mapping[str, Any]] | None = None,
    *,
    field: str = ANSWER_FIELD,
    ignore_case: bool = False,
    extract: Extract = "response",
    marker: str = DEFAULT_MARKER,
) -> list[float]:
    """1.0 when the response equals the record's `field`, else 0.0; both stripped, casefolded with `ignore_case`.

    `extract` picks what of the response is compared: the whole `response`; the text after the last `marker`
    (`extract: marker`); or the content of the last `\\boxed{...}` (`extract: boxed`, nested braces allowed). A
    response without the marker or a complete box scores 0.0. A non-string answer is compared as `str(answer)`
    (JSON 42 as "42"); compare numbers with `numeric_match`.
    """
    rewards = []
    for response, answer in zip(responses, _answers("exact_match", metadata, len(responses), field)):
        got = None if answer is None else extract_answer(response, extract, marker)
        if got is None:
            rewards.append(0.0)
            continue
        got, want = got.strip(), str(answer).strip()
        if ignore_case:
            got, want = got.casefold(), want.casefold()
        rewards.append(float(got == want))
    return rewards


def numeric_match(
    prompts: Sequence[str],
    responses: Sequence[str],
    metadata: Sequence[Mapping[str, Any]] | None = None,
    *,
    field: str = ANSWER_FIELD,
    tolerance: float = DEFAULT_TOLERANCE,
    relative_tolerance: float = 0.0,
    missing: float = 0.0,
) -> list[float]:
    """1.0 when the last number in the response is within tolerance of the record's answer, else 0.0.

    Within tolerance: |x - answer| <= max(tolerance, relative_tolerance * |answer|). A response without a number
    scores `missing`. Numbers are read by `last_number` (thousands separators, decimals, signs, exponents). A
    string answer is read the same way, so GSM8K's "... #### 72" is 72; an answer that holds no number (or is a
    boolean) raises RewardError: a broken prompt file should not silently train on zeros.
    """
    rewards = []
    for i, (response, answer) in enumerate(zip(responses, _answers("numeric_match", metadata, len(responses), field))):
        if answer is None:
            rewards.append(0.0)
            continue
        want = _answer_number(answer, field, i)
        got = last_number(response)
        if got is None:
            rewards.append(missing)
        else:
            rewards.append(float(abs(got - want) <= max(tolerance, relative_tolerance * abs(want))))
    return rewards


def regex_match(
    prompts: Sequence[str],
    responses: Sequence[str],
    metadata: Sequence[Mapping[str, Any]] | None = None,
    *,
    pattern: str,
    ignore_case: bool = False,
) -> list[float]:
    """1.0 when `pattern` matches somewhere in the response (like `re.search`), else 0.0.

    Only the first MAX_SEARCHED_CHARS characters are searched. A search that takes longer than REGEX_TIMEOUT_S
    (catastrophic backtracking, as `(a+)+$` on "aaa...b") raises RewardError naming the pattern rather than
    scoring 0.0, which would quietly reward whatever the pattern is fast on.
    """
    try:
        compiled = compile_pattern(pattern, ignore_case)
    except ValueError as err:
        raise RewardError(f"regex_match: pattern {err}") from None
    rewards = []
    for response in responses:
        try:
            found = compiled.search(response[:MAX_SEARCHED_CHARS], timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            raise RewardError(
                f"regex_match: pattern {pattern!r} took more than {REGEX_TIMEOUT_S} s on a response "
                "(catastrophic backtracking, as in (a+)+$); simplify it, e.g. without nested repeats"
            ) from None
        rewards.append(float(found is not None))
    return rewards


def length_penalty(
    prompts: Sequence[str],
    responses: Sequence[str],
    metadata: Sequence[Mapping[str, Any]] | None = None,
    *,
    target_length: int,
    coef: float = DEFAULT_LENGTH_COEF,
    unit: LengthUnit = "chars",
    max_penalty: float | None = None,
) -> list[float]:
    """-coef * max(0, length - target_length): 0.0 up to the target, then `coef` less per unit beyond it.

    `unit` is `chars` (characters) or `words` (whitespace-separated); a reward function sees text, not tokens.
    With `max_penalty` the reward never goes below -max_penalty: `coef: 0.01, max_penalty: 1.0` keeps it in
    [-1, 0], reached 100 units beyond the target.
    """
    rewards = []
    for response in responses:
        length = len(response) if unit == "chars" else len(response.split())
        penalty = coef * max(0, length - target_length)
        if max_penalty is not None:
            penalty = min(penalty, max_penalty)
        rewards.append(-penalty if penalty else 0.0)
    return rewards


# ---------------------------------------------------------------------------------------------------------------
# Parts


def extract_answer(response: str, extract: Extract, marker: str = DEFAULT_MARKER) -> str | None:
    """What `exact_match` compares (see there); None when the response has no marker or no complete box."""
    if extract == "response":
        return response
    if extract == "marker":
        at = response.rfind(marker)
        return None if at < 0 else response[at + len(marker) :]
    return last_boxed(response)


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (balanced braces inside), or None."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth = 1
    for i in range(start + len(_BOXED), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_BOXED) : i]
    return None


def last_number(text: str) -> float | None:
    """The last number written in `text`, or None.

    Reads 42, -3.5, .5, 1e-3, 6.02E23, the Unicode minus, and thousands separators (1,234,567.89 is 1234567.89;
    a comma not followed by exactly three digits separates numbers: "1,23" ends with 23). A hyphen between digits
    or after a word is not a minus: "pages 3-5" ends with 5, "2024-01-15" with 15.
    """
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    return float(numbers[-1].replace(",", "").replace("\u2212", "-"))


@functools.lru_cache(maxsize=64)
def compile_pattern(pattern: str, ignore_case: bool = False) -> regex.Pattern:
    """`pattern` compiled once (cached), after checks against untrusted input.

    Raises ValueError with the reason, worded to follow the field's name ("pattern is ..."): empty, longer than
    MAX_PATTERN_LENGTH, not valid Python `re` syntax, or larger than MAX_PATTERN_SIZE written out.
    """
    if not pattern:
        raise ValueError("must not be empty")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(f"is {len(pattern)} characters long; at most {MAX_PATTERN_LENGTH} are allowed")
    try:
        parsed = re_parser.parse(pattern)
    except re.error as err:
        raise ValueError(f"is not a valid regular expression: {err}") from None
    size = _expanded_size(parsed)
    if size > MAX_PATTERN_SIZE:
        raise ValueError(
            f"repeats too much: written out it would have {size} items, at most {MAX_PATTERN_SIZE} are allowed "
            "(lower the counts of {m,n} repeats)"
        )
    try:
        # VERSION0 is the module's `re`-compatible behaviour.
        return regex.compile(pattern, regex.VERSION0 | (regex.IGNORECASE if ignore_case else 0))
    except regex.error as err:
        raise ValueError(f"is not a valid regular expression: {err}") from None


def _expanded_size(items) -> int:
    """Items of a parsed pattern with each repeat written out its largest count (unbounded: its least)."""
    size = 0
    for op, arg in items:
        if op in _REPEATS:
            low, high, body = arg
            size += max(1, low if high == re_parser.MAXREPEAT else high) * _expanded_size(body)
        else:
            size += 1 + sum(_expanded_size(sub) for sub in _subpatterns(arg))
    return size


def _subpatterns(arg):
    """The sub-patterns inside an opcode's argument (groups, branches, look-arounds...), whatever its shape."""
    if isinstance(arg, re_parser.SubPattern):
        yield arg
    elif isinstance(arg, tuple | list):
        for part in arg:
            yield from _subpatterns(part)


def _answers(name: str, metadata, n: int, field: str) -> list[Any]:
    """Each sample's answer (None where its record lacks `field`); RewardError when none has it."""
    records = [{}] * n if metadata is None else list(metadata)
    if len(records) != n:
        raise RewardError(f"{name}: got {len(records)} metadata records for {n} responses")
    answers = [record.get(field) if isinstance(record, Mapping) else None for record in records]
    if n and all(answer is None for answer in answers):
        raise RewardError(
            f"{name}: no prompt record of the batch has the field {field!r} (the prompt file's key holding the "
            "reference answer; set it with reward.function_args.field)"
        )
    return answers


def _answer_number(answer: Any, field: str, index: int) -> float:
    if isinstance(answer, bool) or not isinstance(answer, int | float | str):
        raise RewardError(f"numeric_match: sample {index}: {field!r} is {answer!r}, not a number")
    if isinstance(answer, str):
        number = last_number(answer)
        if number is None:
            raise RewardError(f"numeric_match: sample {index}: {field!r} is {answer!r}, which holds no number")
        return number
    return float(answer)
