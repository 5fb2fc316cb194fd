"""Reward functions of the test runs, by reference (`reward.function: tests.helpers.rewards:letter_reward`)."""

from __future__ import annotations

import os
import time


def letter_reward(prompts, responses):
    """Share of the letter 'e' in the response: any policy gets a graded, non-constant signal."""
    return [r.count("e") / max(1, len(r)) for r in responses]


def length_reward(prompts, responses, metadata):
    """len(response), plus 100 when the response equals the line's `answer`: every input shows in the value."""
    return [len(r) + (100.0 if m.get("answer") == r else 0.0) for r, m in zip(responses, metadata)]


def chars_reward(prompts, responses):
    """The response's length in characters: a reward a policy games by writing longer (the length-hacking alarm)."""
    return [float(len(r)) for r in responses]


def varied_reward(prompts, responses):
    """Differs between almost any two responses: every step has non-zero advantages to train on."""
    return [(len(r) % 7) / 7 + r.count("e") for r in responses]


def paced_letter_reward(prompts, responses):
    """`letter_reward`, taking at least 0.1 s a call: steps of a known minimum length, so that a test can act
    between two steps (tiny steps otherwise take a few milliseconds)."""
    time.sleep(0.1)
    return letter_reward(prompts, responses)


def scaled_letter_reward(prompts, responses, *, scale):
    """`letter_reward` times `scale`, a keyword given in `reward.function_args`."""
    return [scale * r for r in letter_reward(prompts, responses)]


def confined_letter_reward(prompts, responses):
    """`letter_reward`, failing the run when the trainer can see the worker's credentials (it must not)."""
    leaked = [name for name in ("ALIGNER_DATABASE_URL", "ALIGNER_BROKER_URL") if name in os.environ]
    if leaked:
        raise RuntimeError(f"the trainer sees the worker's {', '.join(leaked)}")
    return letter_reward(prompts, responses)


def boom_reward(prompts, responses):
    """Raises, as a broken reward function would."""
    raise ValueError("boom")


def nan_reward(prompts, responses):
    """NaN for the second sample."""
    return [float("nan") if i == 1 else 0.0 for i in range(len(responses))]


def short_reward(prompts, responses):
    """One reward too few."""
    return [0.0] * (len(responses) - 1)


def constant_reward(prompts, responses):
    """The same reward for every response: every group has zero spread."""
    return [1.0] * len(responses)


def sleepy_reward(prompts, responses):
    """Takes 30 s: a reward slower than any try's time limit in the tests."""
    time.sleep(30)
    return [0.0] * len(responses)


def half_flat_reward(prompts, responses):
    """Flat (0) for prompts of odd length, `varied_reward` for the others: half the test prompts' groups have no
    reward spread (dynamic sampling drops them)."""
    varied = varied_reward(prompts, responses)
    return [0.0 if len(p) % 2 else v for p, v in zip(prompts, varied)]
