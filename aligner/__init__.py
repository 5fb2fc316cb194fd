"""Aligner: REINFORCE / RLOO alignment of language models, in plain PyTorch."""

__version__ = "0.1.0"
