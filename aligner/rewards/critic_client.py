"""`RemoteCriticClient`: the PPO trainer's client of `aligner serve-critic` (Triton's HTTP/KServe-v2 protocol).

    critic = RemoteCriticClient("http://127.0.0.1:5556")
    future = critic.infer(tokens, lengths)        # returns at once: compute the actor's log-probs meanwhile
    values, rewards = future.result()             # [B, S] and [B] (None when the server serves no rewards)
    loss = critic.train(tokens, lengths, returns, prev_values, mask)     # one optimiser step of the critic
    critic.save("/abs/run/checkpoints/step_10/critic.pt")                # restart with --checkpoint to resume

It talks to NeMo-Aligner's critic server too, telling the two apart by the inputs each model declares (Triton's
model metadata, `GET /v2/models/NAME`): a critic_train without `sequence_lengths` is NeMo's (one request of `tokens`
[B, S] and `returns`, `prev_values`, `mask` [B, S - 1]; it answers `loss_mean`), a critic_save declaring `dummy_var`
rather than `path` is NeMo's (it saves where its own config says, and answers `status`).

Inference is split into requests of the server's `max_batch_size` rows sent concurrently; a training step is never
split (it is one optimiser step) and is refused if larger than the `max_batch_size` of a batched critic_train (an
unbatched one, as Aligner's and NeMo's servers declare it, refuses an oversized step itself). Tensors are built and
read as the reward client's are (aligner/rewards/kserve.py), and every request goes through a `ServerConnection`
(aligner/rewards/http.py) with the same `RetrySettings`: a timeout, bounded retries of transient failures, and
waiting with backoff for a server that is away, up to `unavailable_timeout_s` (`critic.unavailable_timeout_s`; then a
`CriticServerUnavailableError`). A request the server refuses (HTTP 4xx, or an error it marks "bad request: ") is
not retried, nor is a training step that may have reached the server (a retry could apply it twice). Errors are
`CriticError`s naming the URL. Shapes are checked here first, so a wrong call fails at once with a ValueError.
Tested by

    .venv/bin/python -m pytest tests/aligner/servers/test_critic_server.py tests/aligner/rewards/test_http.py -q
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aligner.errors import CriticError, CriticServerUnavailableError
from aligner.rewards.http import PooledClient, RetrySettings, ServerConnection, ServerWait, int_field
from aligner.rewards.kserve import declared_inputs, output_data, outputs_by_name, tensor


def _array(value, dtype) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value).astype(dtype, copy=False)


def _check_tokens(tokens, lengths) -> tuple[np.ndarray, np.ndarray]:
    tokens, lengths = _array(tokens, np.int64), _array(lengths, np.int64).reshape(-1)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, S]; got shape {list(tokens.shape)}")
    if lengths.shape[0] != tokens.shape[0]:
        raise ValueError(f"got {tokens.shape[0]} rows of tokens but {lengths.shape[0]} lengths")
    if tokens.shape[0] and ((lengths < 1).any() or (lengths > tokens.shape[1]).any()):
        raise ValueError(f"lengths must lie in [1, {tokens.shape[1]}] (the width of tokens)")
    return tokens, lengths


class RemoteCriticClient(PooledClient):
    def __init__(
        self,
        url: str,
        *,
        retry: RetrySettings | None = None,
        train_timeout_s: float = 600.0,
        max_concurrency: int = 4,
        on_wait: Callable[[ServerWait], None] | None = None,
        **connection: Any,
    ):
        """`retry`: timeouts, retries and how long a request waits for a server that is away (`RetrySettings`, its
        defaults when None), `train_timeout_s` the timeout of a training step or a save instead; `on_wait` hears of a
        wait (`ServerWait`); `connection`: more of `ServerConnection`'s arguments (sleep, clock)."""
        self.connection = ServerConnection(
            url,
            retry,
            on_wait=on_wait,
            server="critic server",
            command="aligner serve-critic",
            timeout_key="critic.unavailable_timeout_s",
            error=CriticError,
            unavailable_error=CriticServerUnavailableError,
            **connection,
        )
        self.url, self.train_timeout_s = self.connection.url, train_timeout_s
        # Two pools: a submitted inference waits on its chunks, which must never queue behind other inferences.
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="critic-client")
        self.chunk_pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="critic-chunks")
        who = f"{self.connection.who}"
        infer_config = self._request("GET", "/v2/models/critic_infer/config")
        self.max_batch_size = int_field(infer_config, "max_batch_size", who, CriticError)
        outputs = infer_config.get("output")
        self.serves_rewards = isinstance(outputs, list) and any(
            isinstance(o, dict) and o.get("name") == "rewards" for o in outputs
        )
        train_config = self._request("GET", "/v2/models/critic_train/config")
        self.train_max_batch_size = int_field(train_config, "max_batch_size", who, CriticError)
        train_inputs = declared_inputs(self._request("GET", "/v2/models/critic_train"))
        # NeMo-Aligner's critic_train takes no lengths (its mask says where the responses are) and [B, S - 1] targets.
        self.train_sends_lengths = train_inputs is None or "sequence_lengths" in train_inputs
        self._save_call: tuple[str, int] | None = None  # (input name, max_batch_size) of critic_save, once asked

    def _request(
        self, method: str, path: str, payload: dict | None = None, timeout_s: float | None = None, idempotent=True
    ) -> dict:
        return self.connection.request(method, path, payload, timeout_s, idempotent)

    def _outputs(self, answer: dict, names: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        found = outputs_by_name(answer)
        out = {}
        for name, shape in names.items():
            if name not in found:
                raise CriticError(f"{self.connection.who} answered without a {name!r} output")
            try:
                values = np.asarray(found[name].get("data", []), dtype=np.float32)
            except (TypeError, ValueError):  # their messages quote the data
                raise CriticError(f"{self.connection.who} returned non-numeric {name}") from None
            if values.size != int(np.prod(shape)):
                raise CriticError(f"{self.connection.who} returned {values.size} {name} for shape {list(shape)}")
            if not np.isfinite(values).all():
                raise CriticError(f"{self.connection.who} returned non-finite {name}")
            out[name] = values.reshape(shape)
        return out

    # --------------------------------------------------------------------------------------------- inference
    def _infer_chunk(self, tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        inputs = [tensor("tokens", "INT64", tokens), tensor("sequence_lengths", "INT64", lengths[:, None])]
        answer = self._request("POST", "/v2/models/critic_infer/infer", {"inputs": inputs})
        names = {"values": tokens.shape}
        if self.serves_rewards:
            names["rewards"] = (tokens.shape[0],)
        out = self._outputs(answer, names)
        return out["values"], out.get("rewards")

    def _infer(self, tokens: np.ndarray, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        step = self.max_batch_size or len(tokens)
        chunks = [slice(i, i + step) for i in range(0, len(tokens), step)]
        if len(chunks) == 1:
            parts = [self._infer_chunk(tokens, lengths)]
        else:
            futures = [self.chunk_pool.submit(self._infer_chunk, tokens[c], lengths[c]) for c in chunks]
            parts = [f.result() for f in futures]
        values = torch.from_numpy(np.concatenate([v for v, _ in parts]))
        rewards = torch.from_numpy(np.concatenate([r for _, r in parts])) if self.serves_rewards else None
        return values, rewards

    def infer(self, tokens, lengths) -> Future:
        """Start inference; the future gives ``(values [B, S], rewards [B] or None)``, float32 CPU tensors.

        ``tokens`` [B, S] (int, right-padded; any padding value) and ``lengths`` [B] or [B, 1] (each in [1, S]).
        ``values[b, t]`` is the value of the prefix ``tokens[b, :t + 1]``, 0 past the length. ``rewards`` come
        when the server combines the reward model (its default). Shapes are checked before this returns.
        """
        tokens, lengths = _check_tokens(tokens, lengths)
        if not len(tokens):
            done: Future = Future()
            done.set_result((torch.zeros(tokens.shape), torch.zeros(0) if self.serves_rewards else None))
            return done
        return self.pool.submit(self._infer, tokens, lengths)

    # --------------------------------------------------------------------------------------------- training
    def train(self, tokens, lengths, returns, prev_values, mask) -> float:
        """One optimiser step of the critic on this batch (never split); returns the batch's value loss.

        ``returns``, ``prev_values`` and ``mask`` are [B, S] like ``tokens`` (or [B, S - 1], NeMo-Aligner's layout,
        the last position dropped): position t belongs to the prefix ``tokens[:, :t + 1]``. Entries where the mask
        is 0 are sent as 0, whatever they hold. NeMo-Aligner's server gets [B, S - 1] (the last position, the whole
        row, has no next token to value: its mask must be 0) and no lengths.
        """
        tokens, lengths = _check_tokens(tokens, lengths)
        b, s = tokens.shape
        if not 0 < b <= (self.train_max_batch_size or b):
            raise ValueError(
                f"a critic training step takes 1 to {self.train_max_batch_size} rows (the server's "
                f"train_max_batch_size; a step is never split); got {b}"
            )
        mask = _array(mask, np.float32)
        targets = {"returns": _array(returns, np.float32), "prev_values": _array(prev_values, np.float32)}
        for name, values in {**targets, "mask": mask}.items():
            if values.ndim != 2 or values.shape[0] != b or values.shape[1] not in (s, s - 1):
                raise ValueError(f"{name} must be [B, S] = [{b}, {s}] (or [{b}, {s - 1}]); got {list(values.shape)}")
            if values.shape != mask.shape:
                raise ValueError(f"{name} {list(values.shape)} and mask {list(mask.shape)} differ in shape")
        if not np.isfinite(mask).all() or (mask < 0).any():
            raise ValueError("mask must hold finite weights >= 0")
        inputs = [tensor("tokens", "INT64", tokens)]
        if self.train_sends_lengths:
            inputs.append(tensor("sequence_lengths", "INT64", lengths[:, None]))
        elif mask.shape[1] == s:
            if mask[:, -1].any():
                raise ValueError("NeMo-Aligner's critic_train takes [B, S - 1]: the mask's last position must be 0")
            mask, targets = mask[:, :-1], {name: values[:, :-1] for name, values in targets.items()}
        for name, values in targets.items():
            values = np.where(mask != 0, values, 0).astype(np.float32)
            if not np.isfinite(values).all():
                raise ValueError(f"{name} must be finite where the mask is set")
            inputs.append(tensor(name, "FP32", values))
        inputs.append(tensor("mask", "FP32", mask))
        answer = self._request(
            "POST", "/v2/models/critic_train/infer", {"inputs": inputs}, self.train_timeout_s, idempotent=False
        )
        if "loss" in outputs_by_name(answer):
            return float(self._outputs(answer, {"loss": (b, 1)})["loss"][0, 0])
        return float(self._outputs(answer, {"loss_mean": (1,)})["loss_mean"][0])  # NeMo-Aligner's

    def _save_interface(self) -> tuple[str, int]:
        """("path" | "dummy_var", critic_save's max_batch_size): asked once, at the first save."""
        if self._save_call is None:
            inputs = declared_inputs(self._request("GET", "/v2/models/critic_save"))
            config = self._request("GET", "/v2/models/critic_save/config")
            batch = int_field(config, "max_batch_size", f"{self.connection.who}", CriticError)
            nemo = inputs is not None and "path" not in inputs and "dummy_var" in inputs
            self._save_call = ("dummy_var" if nemo else "path", batch)
        return self._save_call

    def save(self, path: str | Path) -> Path | None:
        """Have the server write its critic (weights, optimiser state, step count) to ``path``; a relative path is
        made absolute against this process's working directory (the server writes on its own file system). A
        folder gets ``critic.pt`` inside. Returns the file written; None from NeMo-Aligner's server, which saves
        where its own config says (``path`` is not sent)."""
        name, batch = self._save_interface()
        shape = [1, 1] if batch else [1]  # a model without batching (NeMo's) takes the bare [1]
        if name == "dummy_var":
            payload = {"inputs": [tensor(name, "INT64", np.zeros(shape))]}
            answer = self._request("POST", "/v2/models/critic_save/infer", payload, self.train_timeout_s)
            status = output_data(answer, "status")
            if status != [0]:
                raise CriticError(f"{self.connection.who} answered critic_save without status 0 (saved)")
            return None
        target = os.path.abspath(path) + (os.sep if str(path).endswith(("/", os.sep)) else "")
        payload = {"inputs": [tensor("path", "BYTES", np.full(shape, target, dtype=object))]}
        answer = self._request("POST", "/v2/models/critic_save/infer", payload, self.train_timeout_s)
        written = output_data(answer, "path")
        if not isinstance(written, list) or len(written) != 1 or not isinstance(written[0], str):
            raise CriticError(f"{self.connection.who} answered critic_save without the path written")
        return Path(written[0])

    def __enter__(self) -> RemoteCriticClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
