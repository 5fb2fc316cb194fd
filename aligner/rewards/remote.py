"""`RemoteRewardClient`: rewards from a Triton reward server (Aligner's or NeMo-Aligner's), split into batches the
server accepts, retried on transient failures and while the server is away (aligner/rewards/http.py).

What it sends is what the model declares (`GET /v2/models/NAME` -> `inputs`, read once; `choose_inputs`):
`prompts` + `responses` (+ `metadata`, JSON, when declared) to `aligner serve-reward`; else `sentences` (prompt +
response text, as NeMo-Aligner's reward server tokenizes it); else `tokens` [B, S] (int64, zero-padded) +
`sequence_lengths` [B, 1], the prompt and response tokenized with the policy's tokenizer. `server_inputs` forces one.
The tensors are built and read by aligner/rewards/kserve.py; the critic's client beside this one is
aligner/rewards/critic_client.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from aligner.errors import RewardError
from aligner.rewards.http import PooledClient, RetrySettings, ServerConnection, ServerWait, int_field
from aligner.rewards.interface import check_rewards
from aligner.rewards.kserve import bytes_column, declared_inputs, output_data, tensor

# What each way of calling a reward model needs the model to declare; `auto` takes the first the model declares.
REQUIRED_INPUTS = {
    "aligner": ("prompts", "responses"),
    "sentences": ("sentences",),
    "tokens": ("tokens", "sequence_lengths"),
}


def choose_inputs(declared: Iterable[str] | None, server_inputs: str = "auto", who: str = "reward server") -> str:
    """How to call (aligner | sentences | tokens) a model declaring `declared` (None: it does not say), as
    `server_inputs` (`reward.server_inputs`) asks. Errors name only our own input names, never the server's."""
    if server_inputs != "auto" and server_inputs not in REQUIRED_INPUTS:
        raise ValueError(f"server_inputs must be auto, aligner, sentences or tokens; got {server_inputs!r}")
    if declared is None:
        return "aligner" if server_inputs == "auto" else server_inputs
    declared = set(declared)
    if server_inputs != "auto":
        missing = [n for n in REQUIRED_INPUTS[server_inputs] if n not in declared]
        if missing:
            raise RewardError(
                f"{who}: reward.server_inputs is {server_inputs}, but the model declares no {' or '.join(missing)} "
                "input; use auto"
            )
        return server_inputs
    for mode, names in REQUIRED_INPUTS.items():
        if all(n in declared for n in names):
            return mode
    raise RewardError(
        f"{who}: the model declares none of the inputs a reward client sends: prompts + responses (aligner "
        "serve-reward), sentences, or tokens + sequence_lengths (NeMo-Aligner's reward_model)"
    )


class RemoteRewardClient(PooledClient):
    def __init__(
        self,
        url: str,
        model_name: str = "reward_model",
        *,
        retry: RetrySettings | None = None,
        max_concurrency: int = 4,
        server_inputs: str = "auto",
        load_tokenizer: Callable[[], Any] | None = None,
        on_wait: Callable[[ServerWait], None] | None = None,
        **connection: Any,
    ):
        """`retry`: timeouts, retries and how long a request waits for a server that is away (`RetrySettings`, its
        defaults when None); `server_inputs`: auto (what the model declares) | aligner | sentences | tokens
        (`choose_inputs`); `load_tokenizer`: returns the policy's tokenizer, called once if tokens are sent; `on_wait`
        hears of a wait (`ServerWait`); `connection`: more of `ServerConnection`'s arguments (sleep, clock)."""
        self.connection = ServerConnection(url, retry, on_wait=on_wait, **connection)
        self.url, self.model_name = self.connection.url, model_name
        # Two pools: a submitted scoring job waits on its chunks, which must never queue behind other jobs.
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="reward-client")
        self.chunk_pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="reward-chunks")
        self.max_batch_size = self._model_max_batch_size()
        self.declared = declared_inputs(self._request("GET", f"/v2/models/{self.model_name}"))
        self.inputs = choose_inputs(self.declared, server_inputs, f"{self.connection.who}")
        self.sends_metadata = self.inputs == "aligner" and (self.declared is None or "metadata" in self.declared)
        self.tokenizer = None
        if self.inputs == "tokens":
            if load_tokenizer is None:
                raise RewardError(
                    f"{self.connection.who} takes tokens: the client needs the policy's tokenizer to send them"
                )
            self.tokenizer = load_tokenizer()

    # --------------------------------------------------------------------------------------------- HTTP
    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        return self.connection.request(method, path, payload)

    def _model_max_batch_size(self) -> int:
        config = self._request("GET", f"/v2/models/{self.model_name}/config")
        return int_field(config, "max_batch_size", f"{self.connection.who}")  # 0: no batch dimension limit

    # --------------------------------------------------------------------------------------------- scoring
    def _infer(self, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]) -> list[float]:
        n = len(prompts)
        if self.inputs == "sentences":
            inputs = [bytes_column("sentences", [p + r for p, r in zip(prompts, responses)])]
        elif self.inputs == "tokens":
            tokens, lengths = token_rows(self.tokenizer, prompts, responses)
            inputs = [tensor("tokens", "INT64", tokens), tensor("sequence_lengths", "INT64", lengths)]
        else:
            inputs = [bytes_column("prompts", prompts), bytes_column("responses", responses)]
            if self.sends_metadata:
                inputs.append(bytes_column("metadata", [json.dumps(m or {}) for m in metadata]))
        out = self._request("POST", f"/v2/models/{self.model_name}/infer", {"inputs": inputs})
        data = output_data(out, "rewards")
        if not isinstance(data, list):
            raise RewardError(f"{self.connection.who} answered without a 'rewards' output")
        if len(data) != n:
            raise RewardError(f"{self.connection.who} returned {len(data)} rewards for {n} samples")
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
        return check_rewards(values, len(prompts), f"{self.connection.who}")

    def submit(self, prompts, responses, metadata) -> Future:
        return self.pool.submit(self.score, list(prompts), list(responses), list(metadata))


def token_rows(tokenizer, prompts: list[str], responses: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """([B, S] prompt + response token ids, zero-padded as NeMo-Aligner's actor pads them; [B, 1] lengths). A prompt
    gets the tokenizer's special tokens unless it starts with its BOS already (a chat template writes it); a response
    none (generation's EOS is not in its text)."""
    bos = getattr(tokenizer, "bos_token", None)
    rows = []
    for prompt, response in zip(prompts, responses):
        special = not (bos and prompt.startswith(bos))
        ids = list(tokenizer(prompt, add_special_tokens=special)["input_ids"])
        ids += tokenizer(response, add_special_tokens=False)["input_ids"] if response else []
        rows.append(ids or [0])  # Triton takes no empty row; a one-token row of padding scores as the server says
    width = max(len(r) for r in rows)
    return [r + [0] * (width - len(r)) for r in rows], [[len(r)] for r in rows]
