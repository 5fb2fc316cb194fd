"""Reward functions for the worker's test jobs (`reward.function: tests.worker.rewards:...`)."""

from __future__ import annotations

import time

from tests.test_trainer import letter_reward


def paced_letter_reward(prompts, responses):
    """`letter_reward`, taking at least 0.1 s a call: steps of a known minimum length, so that a test can act
    between two steps (tiny steps otherwise take a few milliseconds)."""
    time.sleep(0.1)
    return letter_reward(prompts, responses)
