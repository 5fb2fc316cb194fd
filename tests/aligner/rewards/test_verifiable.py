import pytest

from aligner.errors import RewardError
from aligner.rewards.verifiable import (
    MAX_PATTERN_LENGTH,
    MAX_SEARCHED_CHARS,
    compile_pattern,
    exact_match,
    last_boxed,
    last_number,
    length_penalty,
    numeric_match,
    regex_match,
)


def score(fn, responses, answers=None, **params):
    metadata = None if answers is None else [{} if a is None else {"answer": a} for a in answers]
    return fn(["q"] * len(responses), responses, metadata, **params)


# ---------------------------------------------------------------------------------------------------------------
# exact_match


def test_exact_match_strips_and_optionally_ignores_case():
    responses = ["  Paris\n", "paris", "Paris, France"]
    assert score(exact_match, responses, ["Paris"] * 3) == [1.0, 0.0, 0.0]
    assert score(exact_match, responses, ["Paris"] * 3, ignore_case=True) == [1.0, 1.0, 0.0]


def test_exact_match_after_the_last_marker():
    responses = ["Answer: 3. Let me check. Answer: 4", "The answer is 4", "Answer:4  "]
    assert score(exact_match, responses, ["4"] * 3, extract="marker") == [1.0, 0.0, 1.0]
    assert score(exact_match, ["Final => 4"], ["4"], extract="marker", marker="=>") == [1.0]


def test_exact_match_in_the_last_box():
    responses = [r"first \boxed{1}, then \boxed{\frac{1}{2}}", r"\boxed{1/2", "1/2", r"\boxed{ 1/2 }"]
    assert score(exact_match, responses, [r"\frac{1}{2}", "1/2", "1/2", "1/2"], extract="boxed") == [
        1.0,
        0.0,  # the box never closes
        0.0,  # no box
        1.0,
    ]
    assert last_boxed(r"\boxed{a{b}c}") == "a{b}c"


def test_exact_match_compares_a_json_number_as_written():
    assert score(exact_match, ["42", "42.0"], [42, 42]) == [1.0, 0.0]


def test_a_record_without_the_answer_scores_zero_but_a_batch_without_any_is_an_error():
    assert score(exact_match, ["4", "4"], ["4", None]) == [1.0, 0.0]
    with pytest.raises(RewardError, match="'answer'"):
        score(exact_match, ["4", "4"], [None, None])
    with pytest.raises(RewardError, match="'solution'"):
        exact_match(["q"], ["4"], [{"answer": "4"}], field="solution")
    with pytest.raises(RewardError, match="'answer'"):
        exact_match(["q"], ["4"])  # no metadata at all (a reward server's `sentences` input)


# ---------------------------------------------------------------------------------------------------------------
# numeric_match


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is 42.", 42.0),
        ("3 apples and 7 pears", 7.0),
        ("It costs $1,234,567.89 in total", 1234567.89),
        ("x = -3.5", -3.5),
        ("x = \u22127", -7.0),  # the Unicode minus
        ("about .5 of it", 0.5),
        ("rate 1e-3", 0.001),
        ("Avogadro: 6.02E23", 6.02e23),
        ("-2.5e+2", -250.0),
        ("pages 3-5", 5.0),  # a hyphen between numbers is no minus
        ("on 2024-01-15", 15.0),
        ("list: 1,23", 23.0),  # not a thousands separator
        ("50%", 50.0),
        ("3 eggs", 3.0),
        ("nothing here", None),
        ("", None),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


def test_numeric_match_tolerance_is_inclusive():
    responses = ["1.5", "0.5", "1.5001", "x"]
    assert score(numeric_match, responses, [1] * 4, tolerance=0.5) == [1.0, 1.0, 0.0, 0.0]
    # The default absolute tolerance forgives float rounding, not a different number.
    assert score(numeric_match, ["0.30000000000000004", "0.3001"], ["0.3"] * 2) == [1.0, 0.0]


def test_numeric_match_relative_tolerance():
    rewards = score(numeric_match, ["1010", "1011", "-990"], [1000, 1000, -1000], relative_tolerance=0.01)
    assert rewards == [1.0, 0.0, 1.0]


def test_numeric_match_without_a_number_scores_missing():
    assert score(numeric_match, ["no idea", "7"], [7, 7], missing=-1.0) == [-1.0, 1.0]


def test_numeric_match_reads_the_answer_like_a_response():
    assert score(numeric_match, ["so 72", "1234"], ["She has ... #### 72", "1,234"]) == [1.0, 1.0]
    with pytest.raises(RewardError, match=r"sample 1: 'answer' is 'n/a', which holds no number"):
        score(numeric_match, ["1", "2"], ["1", "n/a"])
    with pytest.raises(RewardError, match="not a number"):
        score(numeric_match, ["1"], [True])


# ---------------------------------------------------------------------------------------------------------------
# regex_match


def test_regex_match_searches_anywhere_and_optionally_ignores_case():
    responses = ["Final answer: 12", "final ANSWER: x", "none"]
    assert score(regex_match, responses, pattern=r"answer: \d+") == [1.0, 0.0, 0.0]
    assert score(regex_match, responses, pattern=r"^final answer", ignore_case=True) == [1.0, 1.0, 0.0]


def test_regex_match_searches_only_the_start_of_a_long_response():
    response = "x" * MAX_SEARCHED_CHARS + "needle"
    assert score(regex_match, [response, "needle"], pattern="needle") == [0.0, 1.0]


def test_a_catastrophic_pattern_is_stopped_by_the_time_limit():
    # (a+)+$ backtracks exponentially on a's followed by a b: without the limit this would not return in our lifetime.
    with pytest.raises(RewardError, match=r"catastrophic backtracking"):
        score(regex_match, ["a" * (MAX_SEARCHED_CHARS - 1) + "b"], pattern="(a+)+$")
    assert score(regex_match, ["a" * 50], pattern="(a+)+$") == [1.0]  # where it is fast, it works


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("", "must not be empty"),
        ("a" * (MAX_PATTERN_LENGTH + 1), f"is {MAX_PATTERN_LENGTH + 1} characters long; at most {MAX_PATTERN_LENGTH}"),
        ("(unclosed", "is not a valid regular expression"),
        (r"\p{L}", "is not a valid regular expression"),  # `regex` syntax beyond Python's re
        # 17 characters whose compilation would exhaust memory.
        ("(a{65535}){65535}", "repeats too much"),
        ("((ab){100}){100}", "repeats too much"),
    ],
)
def test_bad_patterns_are_refused_before_they_run(pattern, reason):
    with pytest.raises(ValueError, match=reason):
        compile_pattern(pattern)
    with pytest.raises(RewardError, match="regex_match: pattern " + reason[:10]):
        score(regex_match, ["a"], pattern=pattern)


def test_patterns_with_modest_repeats_compile():
    assert compile_pattern(r"\d{3}-\d{4}").search("call 555-1234")
    assert compile_pattern(r"(?:ab){1,100}c") is compile_pattern(r"(?:ab){1,100}c")  # compiled once


# ---------------------------------------------------------------------------------------------------------------
# length_penalty


def test_length_penalty_in_chars_and_words():
    responses = ["a" * 10, "a" * 13, "one two three four"]
    assert score(length_penalty, responses, target_length=10, coef=0.5) == [0.0, -1.5, -4.0]
    assert score(length_penalty, responses, target_length=3, coef=0.5, unit="words") == [0.0, 0.0, -0.5]


def test_length_penalty_floor():
    rewards = score(length_penalty, ["a" * 50, "a" * 500], target_length=0, coef=0.01, max_penalty=1.0)
    assert rewards == pytest.approx([-0.5, -1.0])
