"""Reward clients: how the trainer gets a scalar reward per (prompt, response).

`RewardClient.submit` returns a future, so a remote scorer (the PyTriton server) can work while the trainer
computes log-probs. The in-process clients here score synchronously and return a finished future:
- `FunctionRewardClient`: a Python callable `module:callable` taking (prompts, responses[, metadata], and
  `reward.function_args` as keyword arguments) and returning one float per sample: rule-based and verifiable rewards
  (the built-in ones: aligner/rewards/builtins.py);
- `ModelRewardClient`: a Hugging Face sequence-classification model with one label, scoring prompt + response.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from aligner.errors import RewardError
from aligner.rewards.builtins import builtin_for_target, validate_builtin_params
from aligner.rewards.interface import check_rewards, done


def import_callable(spec: str) -> Callable:
    """Import `package.module:function`; a clear RewardError when it is not there."""
    module_name, sep, attr = spec.partition(":")
    # Console scripts do not put the current directory on sys.path; a reward module beside the user's files should
    # import as it would with `python -m`.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    if not sep or not module_name or not attr:
        raise RewardError(f"reward.function {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RewardError(f"reward.function {spec!r}: cannot import module {module_name!r} ({err})") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise RewardError(f"reward.function {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise RewardError(f"reward.function {spec!r} is not callable")
    return fn


class FunctionRewardClient:
    """Calls `fn(prompts, responses[, metadata=...], **function_args)`.

    The function_args of a built-in's function are checked against its parameters and get its defaults (ConfigError
    naming the parameter); those of any function must fit its signature: a RewardError here, not at the first step.
    """

    def __init__(self, spec: str, function_args: Mapping[str, Any] | None = None):
        self.spec = spec
        self.fn = import_callable(spec)
        builtin = builtin_for_target(spec)
        args = dict(function_args or {})
        self.function_args = validate_builtin_params(builtin.name, args) if builtin else args
        signature = inspect.signature(self.fn)
        params = signature.parameters
        self._wants_metadata = "metadata" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        try:
            signature.bind([], [], **self._metadata_kwargs([]), **self.function_args)
        except TypeError as err:
            how = f"with reward.function_args {self.function_args}" if self.function_args else "that way"
            raise RewardError(
                f"reward.function {spec!r} cannot be called as fn(prompts, responses[, metadata]) {how}: {err}"
            ) from None

    def _metadata_kwargs(self, metadata) -> dict[str, Any]:
        return {"metadata": metadata} if self._wants_metadata else {}

    def submit(self, prompts, responses, metadata) -> Future:
        future: Future = Future()
        try:
            rewards = self.fn(prompts, responses, **self._metadata_kwargs(metadata), **self.function_args)
            future.set_result(check_rewards(rewards, len(prompts), self.spec))
        except Exception as err:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(err)
        return future

    def close(self) -> None:
        pass


class ModelRewardClient:
    """A frozen sequence-classification reward model (one label), scoring `prompt + response` text."""

    def __init__(self, path: str | Path, batch_size: int = 32, device: str | torch.device = "cpu"):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from aligner.modeling.hf import check_model_dir

        check_model_dir(path, what="reward model")
        self.model = AutoModelForSequenceClassification.from_pretrained(str(path)).to(device).eval()
        if self.model.config.num_labels != 1:
            raise RewardError(f"reward model {path} has {self.model.config.num_labels} labels; a reward model has 1")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.device = batch_size, device

    @torch.no_grad()
    def score(self, texts: list[str]) -> torch.Tensor:
        rewards = []
        for i in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(texts[i : i + self.batch_size], return_tensors="pt", padding=True)
            rewards.append(self.model(**batch.to(self.device)).logits[:, 0].float().cpu())
        return torch.cat(rewards)

    @torch.no_grad()
    def score_tokens(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Rewards of already tokenised rows: `tokens` [B, S] padded on the right, `lengths` [B] real tokens.

        Padding is rewritten to the model's pad id, which is how a sequence classifier finds each row's last token.
        """
        mask = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
        ids = tokens.masked_fill(~mask, self.model.config.pad_token_id)
        rewards = []
        for i in range(0, len(ids), self.batch_size):
            rows = slice(i, i + self.batch_size)
            out = self.model(input_ids=ids[rows].to(self.device), attention_mask=mask[rows].long().to(self.device))
            rewards.append(out.logits[:, 0].float().cpu())
        return torch.cat(rewards)

    def submit(self, prompts, responses, metadata) -> Future:
        return done(self.score([p + r for p, r in zip(prompts, responses)]))

    def close(self) -> None:
        pass
