"""`build_reward_client`: the reward source a `reward:` config section names (function, model folder or server URL)."""

from __future__ import annotations

import torch

from aligner.config import RewardConfig
from aligner.rewards.interface import RewardClient
from aligner.rewards.local import FunctionRewardClient, ModelRewardClient


def build_reward_client(config: RewardConfig, device: str | torch.device = "cpu") -> RewardClient:
    if config.server_url:
        from aligner.rewards.remote import RemoteRewardClient

        return RemoteRewardClient(
            config.server_url, config.model_name, timeout_s=config.timeout_s, max_retries=config.max_retries
        )
    if config.function:
        return FunctionRewardClient(config.function, config.function_args)
    return ModelRewardClient(config.model_path, batch_size=config.batch_size, device=device)
