"""`RemoteRewardClient`: the trainer's client of a reward server speaking Triton's HTTP/KServe-v2 protocol.

    reward: {server_url: http://127.0.0.1:8000}        # in an `aligner train` config

It sends `prompts` and `responses` (BYTES, plus `metadata` as JSON) to `aligner serve-reward`; with
`sentences_only=True` it sends NeMo-Aligner's single `sentences` input (prompt + response) instead, which any
NeMo-Aligner-compatible reward server understands. Scoring is asynchronous (`submit` returns a future, so the
trainer computes log-probs meanwhile), requests larger than the server's `max_batch_size` are split (Triton
rejects them otherwise) and sent concurrently, each with a timeout and bounded retries with exponential backoff.
An unreachable server is a `RewardError` naming the URL.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import requests
import torch

from aligner.rewards import RewardError, check_rewards

RETRY_STATUS = {429, 500, 502, 503, 504}


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
    ):
        self.url = url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            self.url = "http://" + self.url
        self.model_name, self.timeout_s = model_name, timeout_s
        self.max_retries, self.backoff_s, self.sentences_only = max_retries, backoff_s, sentences_only
        self.session = requests.Session()
        # Two pools: a submitted scoring job waits on its chunks, which must never queue behind other jobs.
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="reward-client")
        self.chunk_pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="reward-chunks")
        self.max_batch_size = self._model_max_batch_size()

    # --------------------------------------------------------------------------------------------- HTTP
    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One call with retries on connection errors, timeouts and 5xx; a 4xx is the caller's fault: no retry."""
        url = f"{self.url}{path}"
        last = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self.session.request(method, url, json=payload, timeout=self.timeout_s)
            except requests.RequestException as err:
                last = f"{type(err).__name__}: {err}"
                continue
            if response.status_code in RETRY_STATUS:
                last = f"HTTP {response.status_code}: {_error_text(response)}"
                continue
            if response.status_code >= 400:
                raise RewardError(f"reward server {self.url} refused the request: {_error_text(response)}")
            return response.json()
        raise RewardError(
            f"reward server {self.url} cannot be reached ({method} {path} failed {self.max_retries + 1} times; "
            f"last error: {last}). Is `aligner serve-reward` running there?"
        )

    def _model_max_batch_size(self) -> int:
        config = self._request("GET", f"/v2/models/{self.model_name}/config")
        return int(config.get("max_batch_size") or 0)  # 0: the model takes no batch dimension limit

    # --------------------------------------------------------------------------------------------- scoring
    def _infer(self, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]) -> list[float]:
        n = len(prompts)
        if self.sentences_only:
            inputs = [_bytes_input("sentences", [p + r for p, r in zip(prompts, responses)])]
        else:
            inputs = [
                _bytes_input("prompts", prompts),
                _bytes_input("responses", responses),
                _bytes_input("metadata", [json.dumps(m or {}) for m in metadata]),
            ]
        out = self._request("POST", f"/v2/models/{self.model_name}/infer", {"inputs": inputs})
        rewards = next((o for o in out.get("outputs", []) if o.get("name") == "rewards"), None)
        if rewards is None:
            raise RewardError(f"reward server {self.url} answered without a 'rewards' output: {out}")
        if len(rewards["data"]) != n:
            raise RewardError(f"reward server {self.url} returned {len(rewards['data'])} rewards for {n} samples")
        return rewards["data"]

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

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.chunk_pool.shutdown(wait=False, cancel_futures=True)
        self.session.close()


def _bytes_input(name: str, values: list[str]) -> dict:
    return {"name": name, "shape": [len(values), 1], "datatype": "BYTES", "data": values}


def _error_text(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", response.text))
    except ValueError:
        return response.text.strip()[:500]
