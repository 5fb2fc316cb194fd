"""The demo task end to end: `aligner demo-assets DIR` builds a tokenizer, an SFT policy, prompts, rewards, configs.

`aligner.demo:reward` (in configs as `reward.function`) is the task's reward function (aligner/demo/task.py).
"""

from aligner.demo.task import reward

__all__ = ["reward"]
