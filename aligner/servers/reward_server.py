"""The reward server: a frozen reward served with NVIDIA PyTriton over Triton's HTTP/gRPC (KServe v2) protocol.

    aligner serve-reward --model demo_assets/reward_model --port 8000        # a sequence-classification model
    aligner serve-reward --function aligner.demo:reward --port 8000          # a Python reward function
    curl -s -X POST 127.0.0.1:8000/v2/models/reward_model/infer \\
      -d '{"inputs":[{"name":"sentences","shape":[1,1],"datatype":"BYTES","data":["Describe the cat. it is kind."]}]}'

Model `reward_model` (configurable), inputs compatible with NeMo-Aligner's reward server, one of:
- `sentences` BYTES [B, 1]: prompt + response text;
- `tokens` INT64 [B, S] (zero-padded) with `sequence_lengths` INT64 [B, 1];
- `prompts` and `responses` BYTES [B, 1] (and optionally `metadata`, BYTES [B, 1] of JSON objects): Aligner's own
  client sends these, so that a reward function gets the prompt, the response and e.g. a reference answer apart.
Output `rewards` FP32 [B, 1], optionally standardised: `(reward - reward_mean) / reward_std`. A reward model scores
the whole text (or the tokens as they are). A reward function given `tokens` or `sentences` gets them split into
prompt and response at the last assistant marker (`PromptSplitter`), decoded without special tokens.

Any number of rows is accepted (the model declares NeMo-Aligner's max batch size, 9999999: its client never splits)
and a model scores them `batch_size` rows per forward pass; Triton merges concurrent requests dynamically
(`max_batch_size` is its preferred batch, `max_queue_delay_us`). A bad request gets an error that
says what was wrong, and the server goes on serving. SIGTERM or Ctrl-C stops Triton and its children and removes
the workspace; the workspace of a server that was SIGKILLed is removed at the next start.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from aligner.servers.triton import (
    DECLARED_MAX_BATCH_SIZE,
    BadRequest,
    TritonEndpointConfig,
    decode_text,
    require_pytriton,
    run_triton,
)

INPUT_FORMS = (
    "send `sentences`, or `prompts` and `responses` (with optional `metadata`), or `tokens` and `sequence_lengths`"
)


class RewardServerConfig(TritonEndpointConfig):
    """What `aligner serve-reward` serves and how (YAML with --config, flags, or --set key=value)."""

    model_path: str | None = Field(None, description="Hugging Face sequence-classification reward model (1 label).")
    function: str | None = Field(None, description="'module:callable' reward (prompts, responses[, metadata]).")
    tokenizer_path: str | None = Field(
        None,
        description="Tokenizer for `tokens` inputs; default: the model's (a function needs one for `tokens`, and "
        "for `sentences` to be split into prompt and response).",
    )
    assistant_marker: str | None = Field(
        None,
        description="Text that ends the prompt in `tokens`/`sentences` inputs given to a function (the last one "
        "counts); default: the generation prompt of the tokenizer's chat template, e.g. '<|assistant|>\\n'.",
    )
    model_name: str = Field("reward_model", description="Triton model name.")
    max_batch_size: int = Field(
        64,
        ge=1,
        description="Rows Triton's dynamic batcher prefers to merge concurrent requests into; a request of any size "
        "is accepted (the model declares NeMo-Aligner's 9999999) and scored `batch_size` rows per forward pass.",
    )
    dynamic_batching: bool = Field(
        True, description="Let Triton merge concurrent requests into one batch; false: one request per forward pass."
    )
    device: str = Field("auto", description="'auto' (CUDA when available), 'cpu', 'cuda', ...")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_size: int = Field(32, ge=1, description="Rows per forward pass of the reward model.")
    reward_mean: float = Field(0.0, description="Rewards are returned as (reward - reward_mean) / reward_std.")
    reward_std: float = Field(1.0, gt=0)
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads of the scorer.")

    @model_validator(mode="after")
    def _one_source(self) -> RewardServerConfig:
        if bool(self.model_path) == bool(self.function):
            raise ValueError("give exactly one of model_path (--model) or function (--function)")
        return self


SERVER_PATH_FIELDS = (("model_path",), ("tokenizer_path",))


class RewardScorer:
    """Scores the three input forms with a reward model or a reward function; no Triton in here (unit-testable)."""

    def __init__(self, config: RewardServerConfig):
        import torch

        from aligner.modeling.device import resolve_device
        from aligner.rewards.local import FunctionRewardClient, ModelRewardClient

        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model = self.function = self.tokenizer = None
        if config.model_path:
            self.model = ModelRewardClient(config.model_path, config.batch_size, resolve_device(config.device))
            self.tokenizer = self.model.tokenizer
        else:
            self.function = FunctionRewardClient(config.function)
        if config.tokenizer_path:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path)
        self.splitter = PromptSplitter(self.tokenizer, config.assistant_marker) if self.tokenizer else None

    def score_text(self, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]) -> np.ndarray:
        if self.model is not None:
            rewards = self.model.score([p + r for p, r in zip(prompts, responses)])
        else:
            rewards = self.function.submit(prompts, responses, metadata).result()
        return self._standardise(rewards.numpy())

    def score_tokens(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        import torch

        if tokens.ndim != 2 or lengths.reshape(-1).shape[0] != tokens.shape[0]:
            raise BadRequest(f"tokens must be [B, S] and sequence_lengths [B, 1]; got {tokens.shape}, {lengths.shape}")
        lengths = lengths.reshape(-1)
        if (lengths < 0).any() or (lengths > tokens.shape[1]).any():
            raise BadRequest(f"sequence_lengths must lie in [0, {tokens.shape[1]}] (the tokens' width)")
        if self.model is not None and self.config.tokenizer_path is None:
            rewards = self.model.score_tokens(torch.from_numpy(tokens), torch.from_numpy(lengths))
            return self._standardise(rewards.numpy())
        if self.tokenizer is None:
            raise BadRequest("this server has no tokenizer for `tokens` inputs (start it with --tokenizer); send text")
        rows = [row[:n].tolist() for row, n in zip(tokens, lengths)]
        if self.model is not None:  # a model reads the whole text, as the policy wrote it
            texts = self.tokenizer.batch_decode(rows)
            return self.score_text(texts, [""] * len(texts), [{}] * len(texts))
        prompts, responses = zip(*(self.splitter.split(row) for row in rows)) if rows else ((), ())
        return self.score_text(list(prompts), list(responses), [{}] * len(rows))

    def score_sentences(self, sentences: list[str]) -> tuple[list[str], list[str], list[dict[str, Any]]]:
        """`sentences` as the (prompts, responses, metadata) to score: a model reads each whole; a function gets it
        split at the assistant marker when the server has a tokenizer, else the whole text as the response."""
        if self.model is not None or self.splitter is None:
            return [""] * len(sentences), sentences, [{}] * len(sentences)
        pairs = [self.splitter.split(self.tokenizer.encode(t, add_special_tokens=False)) for t in sentences]
        return [p for p, _ in pairs], [r for _, r in pairs], [{}] * len(sentences)

    def _standardise(self, rewards: np.ndarray) -> np.ndarray:
        rewards = rewards.astype(np.float32).reshape(-1)
        return (rewards - self.config.reward_mean) / self.config.reward_std

    def infer(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Triton's batch of requests -> one `{"rewards": [B, 1]}` per request; text requests share one pass."""
        parsed = [_parse_request(r, self) for r in requests]
        texts = [p for p in parsed if p[0] == "text"]
        text_rewards: list[np.ndarray] = []
        if texts:
            prompts = [x for _, (ps, _, _) in texts for x in ps]
            responses = [x for _, (_, rs, _) in texts for x in rs]
            metadata = [x for _, (_, _, ms) in texts for x in ms]
            flat = self.score_text(prompts, responses, metadata)
            sizes = np.cumsum([len(ps) for _, (ps, _, _) in texts])[:-1]
            text_rewards = np.split(flat, sizes)
        out, next_text = [], iter(text_rewards)
        for kind, payload in parsed:
            rewards = next(next_text) if kind == "text" else self.score_tokens(*payload)
            out.append({"rewards": rewards.reshape(-1, 1).astype(np.float32)})
        return out


class PromptSplitter:
    """Splits a conversation's token ids into the prompt's and the response's text, special tokens left out.

    The prompt ends after the last `marker` in the text decoded with its special tokens; the marker defaults to the
    generation prompt of the tokenizer's chat template (what `add_generation_prompt` appends to a conversation,
    e.g. '<|assistant|>\\n' or '<|im_start|>assistant\\n'), which is where the policy began to write. Without a
    marker (no chat template) or when the text has none, the prompt is "" and the whole text is the response.
    """

    PROBE = [{"role": "user", "content": "\x00"}]

    def __init__(self, tokenizer, marker: str | None = None):
        self.tokenizer = tokenizer
        self.marker = marker if marker is not None else self._generation_prompt(tokenizer)

    @classmethod
    def _generation_prompt(cls, tokenizer) -> str | None:
        if not getattr(tokenizer, "chat_template", None):
            return None
        try:
            with_prompt = tokenizer.apply_chat_template(cls.PROBE, add_generation_prompt=True, tokenize=False)
            without = tokenizer.apply_chat_template(cls.PROBE, add_generation_prompt=False, tokenize=False)
        except Exception:  # noqa: BLE001 - a template that cannot render a lone user turn: no marker
            return None
        if not with_prompt.startswith(without) or with_prompt == without:
            return None
        return with_prompt[len(without) :]

    def split(self, ids: list[int]) -> tuple[str, str]:
        decode = self.tokenizer.decode
        end = -1
        if self.marker:
            start = decode(ids).rfind(self.marker)
            end = start + len(self.marker) if start >= 0 else -1
        if end < 0:
            return "", decode(ids, skip_special_tokens=True)
        # the fewest tokens whose text covers the marker: prefix texts grow with the prefix
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(decode(ids[:mid])) >= end:
                hi = mid
            else:
                lo = mid + 1
        return decode(ids[:lo], skip_special_tokens=True), decode(ids[lo:], skip_special_tokens=True)


def _parse_request(request: dict[str, np.ndarray], scorer: RewardScorer):
    names = set(request)
    if names == {"sentences"}:
        return "text", scorer.score_sentences(decode_text("sentences", request["sentences"]))
    if names in ({"prompts", "responses"}, {"prompts", "responses", "metadata"}):
        prompts, responses = decode_text("prompts", request["prompts"]), decode_text("responses", request["responses"])
        if len(prompts) != len(responses):
            raise BadRequest(f"got {len(prompts)} prompts but {len(responses)} responses")
        metadata = [{}] * len(prompts)
        if "metadata" in request:
            try:
                metadata = [json.loads(m) if m else {} for m in decode_text("metadata", request["metadata"])]
            except json.JSONDecodeError as err:
                raise BadRequest(f"metadata must hold JSON objects: {err}") from None
        return "text", (prompts, responses, metadata)
    if names == {"tokens", "sequence_lengths"}:
        return "tokens", (request["tokens"].astype(np.int64), request["sequence_lengths"].astype(np.int64))
    raise BadRequest(f"unexpected set of inputs {sorted(names)}: {INPUT_FORMS}")


def serve(config: RewardServerConfig, ready: threading.Event | None = None, stop: threading.Event | None = None):
    """Run the server until SIGTERM/SIGINT (or `stop` is set); `ready` is set once it answers."""
    require_pytriton("reward server")
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    scorer = RewardScorer(config)

    def bind(triton) -> None:
        triton.bind(
            model_name=config.model_name,
            infer_func=scorer.infer,
            inputs=[
                Tensor(name="sentences", dtype=bytes, shape=(1,), optional=True),
                Tensor(name="prompts", dtype=bytes, shape=(1,), optional=True),
                Tensor(name="responses", dtype=bytes, shape=(1,), optional=True),
                Tensor(name="metadata", dtype=bytes, shape=(1,), optional=True),
                Tensor(name="tokens", dtype=np.int64, shape=(-1,), optional=True),
                Tensor(name="sequence_lengths", dtype=np.int64, shape=(1,), optional=True),
            ],
            outputs=[Tensor(name="rewards", dtype=np.float32, shape=(1,))],
            config=ModelConfig(
                max_batch_size=DECLARED_MAX_BATCH_SIZE,  # NeMo-Aligner's clients never split: any size is served
                batcher=DynamicBatcher(
                    max_queue_delay_microseconds=config.max_queue_delay_us,
                    preferred_batch_size=[config.max_batch_size],
                )
                if config.dynamic_batching
                else None,  # no `dynamic_batching` section in Triton's model config
            ),
            strict=False,
        )

    run_triton(config, bind, "reward server", f"model {config.model_name}", ready, stop)
