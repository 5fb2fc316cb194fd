"""`build_reward_client`: the reward source a `reward:` config section names (function, model folder or server URL)."""

from __future__ import annotations

import torch

from aligner.config import RewardConfig
from aligner.rewards.interface import RewardClient
from aligner.rewards.local import FunctionRewardClient, ModelRewardClient


def build_reward_client(
    config: RewardConfig, device: str | torch.device = "cpu", on_wait=None, tokenizer_path: str | None = None
) -> RewardClient:
    """`on_wait`: called with an `aligner.rewards.http.ServerWait` while a reward server is away (servers only);
    `tokenizer_path`: the policy's tokenizer, loaded only for a reward server that takes tokens."""
    if config.server_url:
        from aligner.rewards.http import RetrySettings
        from aligner.rewards.remote import RemoteRewardClient

        def policy_tokenizer():
            from aligner.modeling.hf import load_tokenizer

            return load_tokenizer(tokenizer_path)

        return RemoteRewardClient(
            config.server_url,
            config.model_name,
            retry=RetrySettings.of(config),
            server_inputs=config.server_inputs,
            load_tokenizer=policy_tokenizer if tokenizer_path else None,
            on_wait=on_wait,
        )
    if config.function:
        return FunctionRewardClient(config.function, config.function_args)
    return ModelRewardClient(config.model_path, batch_size=config.batch_size, device=device)
