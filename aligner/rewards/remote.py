"""`RemoteRewardClient`: rewards from a Triton reward server (Aligner's or NeMo-Aligner's), split into batches the
server accepts, retried on transient failures and while the server is away (aligner/rewards/http.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from aligner.errors import RewardError
from aligner.rewards.http import ServerConnection, ServerWait, int_field, outputs_by_name
from aligner.rewards.interface import check_rewards


class RemoteRewardClient:
    def __init__(
        self,
        url: str,
        model_name: str = "reward_model",
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 4,
        sentences_only: bool = False,
        unavailable_timeout_s: float = 600.0,
        on_wait: Callable[[ServerWait], None] | None = None,
        **connection: Any,
    ):
        """`unavailable_timeout_s`: how long a request waits for a server that is away; `on_wait` hears of it
        (`ServerWait`); `connection`: more of `ServerConnection`'s arguments (max_backoff_s, sleep, clock)."""
        self.connection = ServerConnection(
            url,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            unavailable_timeout_s=unavailable_timeout_s,
            on_wait=on_wait,
            **connection,
        )
        self.url, self.model_name, self.sentences_only = self.connection.url, model_name, sentences_only
        # Two pools: a submitted scoring job waits on its chunks, which must never queue behind other jobs.
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="reward-client")
        self.chunk_pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="reward-chunks")
        self.max_batch_size = self._model_max_batch_size()

    # --------------------------------------------------------------------------------------------- HTTP
    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        return self.connection.request(method, path, payload)

    def _model_max_batch_size(self) -> int:
        config = self._request("GET", f"/v2/models/{self.model_name}/config")
        return int_field(config, "max_batch_size", f"reward server {self.url}")  # 0: no batch dimension limit

    # --------------------------------------------------------------------------------------------- scoring
    def _infer(self, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]) -> list[float]:
        n = len(prompts)
        if self.sentences_only:
            inputs = [bytes_input("sentences", [p + r for p, r in zip(prompts, responses)])]
        else:
            inputs = [
                bytes_input("prompts", prompts),
                bytes_input("responses", responses),
                bytes_input("metadata", [json.dumps(m or {}) for m in metadata]),
            ]
        out = self._request("POST", f"/v2/models/{self.model_name}/infer", {"inputs": inputs})
        data = outputs_by_name(out).get("rewards", {}).get("data")
        if not isinstance(data, list):
            raise RewardError(f"reward server {self.url} answered without a 'rewards' output")
        if len(data) != n:
            raise RewardError(f"reward server {self.url} returned {len(data)} rewards for {n} samples")
        return data

    def score(self, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]] | None = None):
        """Rewards [B] (float32), in chunks of the server's max batch size sent concurrently."""
        metadata = metadata or [{}] * len(prompts)
        if len(prompts) != len(responses) or len(metadata) != len(prompts):
            raise ValueError("prompts, responses and metadata must have the same length")
        if not prompts:
            return torch.zeros(0)
        step = self.max_batch_size or len(prompts)
        chunks = [slice(i, i + step) for i in range(0, len(prompts), step)]
        if len(chunks) == 1:
            values = self._infer(prompts, responses, metadata)
        else:
            futures = [self.chunk_pool.submit(self._infer, prompts[c], responses[c], metadata[c]) for c in chunks]
            values = [v for f in futures for v in f.result()]
        return check_rewards(values, len(prompts), f"reward server {self.url}")

    def submit(self, prompts, responses, metadata) -> Future:
        return self.pool.submit(self.score, list(prompts), list(responses), list(metadata))

    def stop_waiting(self) -> None:
        """Requests waiting for the server (away) give up now: the run was asked to stop."""
        self.connection.stop_waiting()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.chunk_pool.shutdown(wait=False, cancel_futures=True)
        self.connection.close()


def bytes_input(name: str, values: list[str]) -> dict:
    return {"name": name, "shape": [len(values), 1], "datatype": "BYTES", "data": values}
