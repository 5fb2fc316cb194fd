"""Aligner: alignment of language models with REINFORCE / RLOO and PPO, in plain PyTorch."""

__version__ = "0.1.0"
