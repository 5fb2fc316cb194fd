"""The PPO critic server: per-token values (and rewards) served, and the critic trained, with NVIDIA PyTriton.

    aligner serve-critic --model demo_assets/reward_model [--port 5556] [--checkpoint PATH] [--set lr=1e-5 ...]

The critic is the reward model's transformer body with a per-token value head, a copy of the reward model's score
head, so that before any training the value at a sequence's last token is its reward. Values are standardised
like the rewards, ``(head(h_t) - reward_mean) / reward_std``, as NeMo-Aligner's critic does. With
`combine_rm_and_critic_server` (the default) a frozen copy of the reward model serves the rewards as well.

Triton models, as NeMo-Aligner's critic server (HTTP/gRPC KServe v2; the client is aligner/rewards/critic_client.py):
- `critic_infer`: `tokens` INT64 [B, S] (zero-padded) and `sequence_lengths` INT64 [B, 1] -> `values` FP32 [B, S]
  (0 past each length) and, when combined, `rewards` FP32 [B, 1] (standardised). `values[b, t]` is the value of the
  prefix `tokens[b, :t + 1]`: against per-token log-probs [B, S - 1] (token t + 1 given the prefix) use
  `values[:, :-1]`. Any number of rows (declared max 9999999, as NeMo-Aligner's: its client never splits), run
  `batch_size` rows per forward pass; concurrent requests are merged dynamically.
- `critic_train`, unbatched (`max_batch_size` 0, as NeMo-Aligner's `infer_sample` sends it): `tokens` INT64 [B, S],
  `returns`, `prev_values` and `mask` (FP32 [B, S], or [B, S - 1] as NeMo-Aligner's actor sends them, the last
  position dropped), optional `sequence_lengths` INT64 [B, 1] (absent: each row ends at its last masked position)
  -> `loss` FP32 [B, 1] (the batch's loss on every row) and `loss_mean` FP32 [1] (the same, NeMo-Aligner's name):
  ONE AdamW step on the clipped value loss of aligner/algorithms/ppo.py (`loss_clip_val`), in micro-batches of
  `micro_batch_size` rows with gradient accumulation; more than `train_max_batch_size` rows is a bad request.
  Steps run one at a time.
- `critic_save`: `path` BYTES [1, 1], absolute (a folder gets `critic.pt` inside), or NeMo-Aligner's `dummy_var`
  INT64 [1, 1] (ignored; the file goes to `save_dir`) -> `path` of the file written and `status` INT64 [1, 1] (0).
  The file holds the critic's weights, optimiser state and step count; `--checkpoint PATH` starts from such a file,
  so a resumed PPO run continues exactly. With `save_root` set (the worker sets its job's run folder) a path that
  does not lie inside it, once `..` and symlinks are resolved, is a bad request, and so is a checkpoint outside it.

The critic runs without dropout in training too: the values trained are those served as `prev_values`. Triton
rejects a request with a missing input, a wrong shape or type, or mismatched batch sizes with HTTP 400; errors found
by the critic itself (a length past the tokens, returns of another width, a relative path, ...) come back as HTTP
500 with a message starting "bad request: " (the only status PyTriton gives a model's exceptions), which the
client does not retry. The server keeps serving either way. SIGTERM or Ctrl-C stops it cleanly, as the reward
server (aligner/servers/reward_server.py, whose Triton helpers this reuses).
"""

from __future__ import annotations

import copy
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from aligner.algorithms.ppo import clipped_value_loss
from aligner.servers.launch import CRITIC_MODELS
from aligner.servers.reward_server import RewardScorer, RewardServerConfig
from aligner.servers.triton import (
    DECLARED_MAX_BATCH_SIZE,
    BadRequest,
    TritonEndpointConfig,
    decode_text,
    require_pytriton,
    run_triton,
)

CHECKPOINT_FILE = "critic.pt"
CHECKPOINT_FORMAT = "aligner-critic/1"


class CriticServerConfig(TritonEndpointConfig):
    """What `aligner serve-critic` serves and how (YAML with --config, flags, or --set key=value)."""

    model_path: str = Field(
        description="Reward model folder (Hugging Face sequence classifier with 1 label, as `aligner train-rm` "
        "writes): the critic starts from it."
    )
    checkpoint: str | None = Field(None, description="A critic_save file (or its folder) to start from.")
    combine_rm_and_critic_server: bool = Field(
        True, description="Serve the reward model's rewards from critic_infer too (a frozen copy of it)."
    )
    reward_mean: float = Field(0.0, description="Rewards and values are returned as (x - reward_mean) / reward_std.")
    reward_std: float = Field(1.0, gt=0)
    loss_clip_val: float = Field(0.2, ge=0, description="Clip of the value loss around prev_values; 0: no clip.")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate of the critic (constant).")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    micro_batch_size: int = Field(16, ge=1, description="Rows per forward/backward of a critic_train step.")
    batch_size: int = Field(32, ge=1, description="Rows per forward pass of critic_infer.")
    http_port: int = Field(5556, ge=1, le=65535)
    max_batch_size: int = Field(
        64,
        ge=1,
        description="Rows Triton's dynamic batcher prefers to merge concurrent critic_infer requests into; a request "
        "of any size is accepted and run `batch_size` rows per forward pass.",
    )
    train_max_batch_size: int = Field(1024, ge=1, description="Largest critic_train request (rows); larger: refused.")
    dynamic_batching: bool = Field(True, description="Let Triton merge concurrent critic_infer requests.")
    device: str = Field("auto", description="'auto' (CUDA when available), 'cpu', 'cuda', ...")
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads.")
    save_root: str | None = Field(
        None,
        description="The folder critic_save writes in (and the checkpoint comes from), '..' and symlinks resolved; "
        "None: anywhere this process may write.",
    )
    save_dir: str | None = Field(
        None,
        description="Folder critic_save writes critic.pt in when a request names no `path` (NeMo-Aligner's actor "
        "sends only `dummy_var`); default: save_root, else ./critic_checkpoints of the server's working directory.",
    )


SERVER_PATH_FIELDS = (("model_path",), ("checkpoint",), ("save_root",), ("save_dir",))
DEFAULT_SAVE_DIR = "critic_checkpoints"


def confined_path(path: str | Path, root: str | Path | None) -> Path | None:
    """`path` with '..' and symlinks resolved when it lies inside `root` (resolved too), else None; `path` as it is
    when there is no `root`. Whoever can reach a server with a root must not make it write, or read, elsewhere."""
    if root is None:
        return Path(path)
    resolved = Path(path).resolve()
    return resolved if resolved.is_relative_to(Path(root).resolve()) else None


class TokenValueModel(torch.nn.Module):
    """A sequence classifier's body with its score head applied at every token: values [B, S], standardised."""

    def __init__(self, reward_model, reward_mean: float, reward_std: float):
        super().__init__()
        head = getattr(reward_model, "score", None)
        if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
            from aligner.errors import AlignerError

            raise AlignerError(
                f"the critic needs a decoder sequence classifier with a one-output linear `score` head (Llama, "
                f"GPT-2, Qwen, ...); {type(reward_model).__name__} has none"
            )
        self.body = copy.deepcopy(reward_model.base_model)
        self.head = copy.deepcopy(head)
        self.reward_mean, self.reward_std = reward_mean, reward_std

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return (self.head(hidden).squeeze(-1).float() - self.reward_mean) / self.reward_std


class Critic:
    """The critic (and reward) behind the three Triton models; no Triton in here, so it is unit-testable.

    Every use of the network holds one lock: training steps run one at a time and never while values are served.
    """

    def __init__(self, config: CriticServerConfig):
        from aligner.modeling.device import resolve_device

        self.config = config
        scorer = RewardScorer(
            RewardServerConfig(
                model_path=config.model_path,
                reward_mean=config.reward_mean,
                reward_std=config.reward_std,
                batch_size=config.batch_size,
                device=config.device,
                num_threads=config.num_threads,
            )
        )
        self.device = resolve_device(config.device)
        reward_model = scorer.model.model
        self.pad_id = reward_model.config.pad_token_id
        self.network = TokenValueModel(reward_model, config.reward_mean, config.reward_std).to(self.device).eval()
        self.network.requires_grad_(True)
        self.scorer = scorer if config.combine_rm_and_critic_server else None  # else the reward model is freed
        self.optimizer = torch.optim.AdamW(self.network.parameters(), **self._optimizer_settings())
        self.steps = 0
        self.lock = threading.Lock()
        if config.checkpoint:
            self.load(config.checkpoint)

    def _optimizer_settings(self) -> dict[str, Any]:
        c = self.config
        return {"lr": c.lr, "weight_decay": c.weight_decay, "betas": tuple(c.betas), "eps": c.eps}

    # ----------------------------------------------------------------------------------------------- inputs
    def _batch(self, tokens: np.ndarray, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids with the padding rewritten to the pad id, and the attention mask (both [B, S], long)."""
        if tokens.ndim != 2 or tokens.shape[0] == 0:
            raise BadRequest(f"tokens must be [B, S] with B >= 1; got shape {list(tokens.shape)}")
        lengths = lengths.reshape(-1)
        if lengths.shape[0] != tokens.shape[0]:
            raise BadRequest(f"got {tokens.shape[0]} rows of tokens but {lengths.shape[0]} sequence_lengths")
        if tokens.shape[1] == 0 or (lengths < 1).any() or (lengths > tokens.shape[1]).any():
            raise BadRequest(f"sequence_lengths must lie in [1, {tokens.shape[1]}] (the width of tokens)")
        ids = torch.from_numpy(tokens.astype(np.int64))
        valid = torch.arange(ids.shape[1])[None, :] < torch.from_numpy(lengths.astype(np.int64))[:, None]
        vocab = self.network.body.get_input_embeddings().num_embeddings
        if ((ids < 0) | (ids >= vocab))[valid].any():
            raise BadRequest(f"token ids must lie in [0, {vocab}) (the model's vocabulary)")
        return ids.masked_fill(~valid, self.pad_id), valid.long()

    def _targets(self, name: str, values: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
        """returns / prev_values / mask as [B, S] float32; NeMo-Aligner's [B, S - 1] gets a zero last column."""
        b, s = shape
        if values.ndim != 2 or values.shape[0] != b or values.shape[1] not in (s, s - 1):
            raise BadRequest(f"{name} must be [B, S] = [{b}, {s}] (or [{b}, {s - 1}]); got {list(values.shape)}")
        out = torch.zeros(b, s)
        out[:, : values.shape[1]] = torch.from_numpy(values.astype(np.float32))
        return out

    # ----------------------------------------------------------------------------------------------- models
    @torch.no_grad()
    def values(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Values [B, S] (float32, 0 past each length)."""
        ids, attention = self._batch(tokens, lengths)
        out = []
        with self.lock:
            for start in range(0, len(ids), self.config.batch_size):
                rows = slice(start, start + self.config.batch_size)
                values = self.network(ids[rows].to(self.device), attention[rows].to(self.device)).cpu()
                out.append(values.masked_fill(attention[rows] == 0, 0))
        return torch.cat(out).numpy().astype(np.float32)

    def rewards(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Standardised rewards [B] of the frozen reward model."""
        self._batch(tokens, lengths)  # the same checks as for values
        with self.lock:
            return self.scorer.score_tokens(tokens.astype(np.int64), lengths.reshape(-1).astype(np.int64))

    def train_step(
        self,
        tokens: np.ndarray,
        lengths: np.ndarray,
        returns: np.ndarray,
        prev_values: np.ndarray,
        mask: np.ndarray,
    ) -> float:
        """One optimiser step on the clipped value loss of the batch; returns that loss (before the step).

        Positions past a row's length are left out whatever the mask says. A mask without any valid token makes
        no step (loss 0).
        """
        ids, attention = self._batch(tokens, lengths)
        shape = tuple(ids.shape)
        returns_t = self._targets("returns", returns, shape)
        prev_t = self._targets("prev_values", prev_values, shape)
        mask_t = self._targets("mask", mask, shape) * attention
        if not torch.isfinite(mask_t).all() or (mask_t < 0).any():
            raise BadRequest("mask must hold finite weights >= 0 (1 for the tokens to train on)")
        valid = mask_t != 0
        if not (torch.isfinite(returns_t[valid]).all() and torch.isfinite(prev_t[valid]).all()):
            raise BadRequest("returns and prev_values must be finite where the mask is set")
        count = mask_t.sum()
        micro = self.config.micro_batch_size
        total = 0.0
        with self.lock:
            if count == 0:
                return 0.0
            self.optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(ids), micro):
                rows = slice(start, start + micro)
                values = self.network(ids[rows].to(self.device), attention[rows].to(self.device))
                loss = clipped_value_loss(
                    values,
                    prev_t[rows].to(self.device),
                    returns_t[rows].to(self.device),
                    mask_t[rows].to(self.device),
                    clip=self.config.loss_clip_val,
                    normalizer=count,  # micro-batch losses sum to the batch's token mean
                )
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
            self.steps += 1
        return total

    def save(self, path: str) -> Path:
        """Write the critic's weights, optimiser state and step count to `path` (absolute; a folder gets
        critic.pt inside), atomically; returns the file written."""
        target = Path(path)
        if not target.is_absolute():
            raise BadRequest(f"path must be absolute (it is written on the server); got {path!r}")
        if target.is_dir() or path.endswith(("/", os.sep)):
            target = target / CHECKPOINT_FILE
        confined = confined_path(target, self.config.save_root)
        if confined is None:
            raise BadRequest(f"{path} lies outside {self.config.save_root}, the only folder this server writes in")
        target = confined
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with self.lock:
                state = {
                    "format": CHECKPOINT_FORMAT,
                    "critic": self.network.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "steps": self.steps,
                    "reward_mean": self.config.reward_mean,
                    "reward_std": self.config.reward_std,
                }
                torch.save(state, tmp)
            os.replace(tmp, target)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise BadRequest(f"cannot write {target}: {err.strerror or err}") from None
        return target

    def load(self, path: str | Path) -> None:
        """Continue from a critic_save file (or its folder): weights, optimiser state and step count.

        The optimiser's settings stay this server's (so `--set lr=...` applies to a resumed critic).
        """
        from aligner.errors import AlignerError

        source = Path(path)
        if source.is_dir():
            source = source / CHECKPOINT_FILE
        confined = confined_path(source, self.config.save_root)
        if confined is None:
            raise AlignerError(f"critic checkpoint {source} lies outside save_root {self.config.save_root}")
        source = confined
        if not source.is_file():
            raise AlignerError(f"critic checkpoint {source} does not exist")
        try:
            state = torch.load(source, map_location=self.device, weights_only=True)
        except Exception as err:  # a truncated or foreign file: torch raises many kinds
            raise AlignerError(f"critic checkpoint {source} cannot be read: {err}") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise AlignerError(f"{source} is not a critic checkpoint (critic_save writes them)")
        saved = (state["reward_mean"], state["reward_std"])
        if saved != (self.config.reward_mean, self.config.reward_std):
            raise AlignerError(
                f"critic checkpoint {source} was trained with reward_mean={saved[0]}, reward_std={saved[1]}; "
                f"start the server with the same (got {self.config.reward_mean}, {self.config.reward_std})"
            )
        try:
            self.network.load_state_dict(state["critic"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise AlignerError(
                f"critic checkpoint {source} does not fit the critic built from {self.config.model_path}: {err}"
            ) from None
        for group in self.optimizer.param_groups:
            group.update(self._optimizer_settings())
        self.steps = int(state["steps"])

    # ----------------------------------------------------------------------------------- Triton functions
    def infer_fn(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        out = []
        for request in requests:
            tokens, lengths = _inputs(request, "tokens", "sequence_lengths")
            result = {"values": self.values(tokens, lengths)}
            if self.scorer is not None:
                result["rewards"] = self.rewards(tokens, lengths).reshape(-1, 1).astype(np.float32)
            out.append(result)
        return out

    def train_fn(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """critic_train, unbatched: one request is one step. `sequence_lengths` is optional (NeMo-Aligner sends
        none): each row then ends at its last masked position."""
        out = []
        for request in requests:
            tokens, returns, prev_values, mask = _inputs(request, "tokens", "returns", "prev_values", "mask")
            if tokens.ndim != 2 or tokens.shape[0] == 0:
                raise BadRequest(f"tokens must be [B, S] with B >= 1; got shape {list(tokens.shape)}")
            if tokens.shape[0] > self.config.train_max_batch_size:
                raise BadRequest(
                    f"a critic_train step takes at most {self.config.train_max_batch_size} rows "
                    f"(train_max_batch_size; a step is never split); got {tokens.shape[0]}"
                )
            if "sequence_lengths" in request:  # PyTriton's Request: a mapping without .get
                lengths = request["sequence_lengths"]
            else:
                lengths = lengths_from_mask(mask, tokens.shape)
            loss = self.train_step(tokens, lengths, returns, prev_values, mask)
            out.append(
                {
                    "loss": np.full((tokens.shape[0], 1), loss, dtype=np.float32),
                    "loss_mean": np.array([loss], dtype=np.float32),
                }
            )
        return out

    def save_fn(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """critic_save: to `path`, or without one (NeMo-Aligner's `dummy_var`) into `save_dir`."""
        out = []
        for request in requests:
            if "path" in request:
                names = decode_text("path", request["path"])
                if len(names) != 1:
                    raise BadRequest(f"send one path; got {len(names)}")
                target = names[0]
            else:
                c = self.config
                folder = Path(c.save_dir or c.save_root or Path.cwd() / DEFAULT_SAVE_DIR).absolute()
                target = str(folder / CHECKPOINT_FILE)
            written = self.save(target)
            out.append(
                {"path": np.array([[str(written).encode()]], dtype=object), "status": np.zeros((1, 1), np.int64)}
            )
        return out


def lengths_from_mask(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Row lengths [B] that cover every masked position: position t of a [B, S] mask belongs to token t, of a
    [B, S - 1] mask (NeMo-Aligner's) to token t + 1. A row without any gets the whole width (it trains nothing)."""
    b, s = shape
    if mask.ndim != 2 or mask.shape[0] != b or mask.shape[1] not in (s, s - 1):
        raise BadRequest(f"mask must be [B, S] = [{b}, {s}] (or [{b}, {s - 1}]); got {list(mask.shape)}")
    shift = 1 if mask.shape[1] == s else 2
    last = np.where(mask != 0, np.arange(mask.shape[1])[None, :], -1).max(axis=1, initial=-1)
    return np.where(last >= 0, last + shift, s).astype(np.int64)


def _inputs(request, *names: str) -> list[np.ndarray]:
    missing = [n for n in names if n not in request]
    if missing:
        raise BadRequest(f"missing input(s) {missing}; expected {list(names)}")
    return [request[n] for n in names]


def serve(config: CriticServerConfig, ready: threading.Event | None = None, stop: threading.Event | None = None):
    """Run the critic server until SIGTERM/SIGINT (or `stop` is set); `ready` is set once it answers."""
    require_pytriton("critic server")
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    critic = Critic(config)
    tokens = [
        Tensor(name="tokens", dtype=np.int64, shape=(-1,)),
        Tensor(name="sequence_lengths", dtype=np.int64, shape=(1,)),
    ]
    infer_outputs = [Tensor(name="values", dtype=np.float32, shape=(-1,))]
    if critic.scorer is not None:
        infer_outputs.append(Tensor(name="rewards", dtype=np.float32, shape=(1,)))
    batcher = (
        DynamicBatcher(
            max_queue_delay_microseconds=config.max_queue_delay_us, preferred_batch_size=[config.max_batch_size]
        )
        if config.dynamic_batching
        else None
    )

    def bind(triton) -> None:
        triton.bind(
            model_name="critic_infer",
            infer_func=critic.infer_fn,
            inputs=tokens,
            outputs=infer_outputs,
            config=ModelConfig(max_batch_size=DECLARED_MAX_BATCH_SIZE, batcher=batcher),
            strict=False,
        )
        # Unbatched, as NeMo-Aligner's: its actor sends a whole step with `infer_sample`, shapes as they are.
        triton.bind(
            model_name="critic_train",
            infer_func=critic.train_fn,
            inputs=[
                Tensor(name="tokens", dtype=np.int64, shape=(-1, -1)),
                Tensor(name="sequence_lengths", dtype=np.int64, shape=(-1, -1), optional=True),
                *(Tensor(name=n, dtype=np.float32, shape=(-1, -1)) for n in ("returns", "prev_values", "mask")),
            ],
            outputs=[
                Tensor(name="loss", dtype=np.float32, shape=(-1, 1)),
                Tensor(name="loss_mean", dtype=np.float32, shape=(1,)),
            ],
            config=ModelConfig(batching=False, max_batch_size=0, batcher=None),  # a request is a step
            strict=False,
        )
        triton.bind(
            model_name="critic_save",
            infer_func=critic.save_fn,
            inputs=[
                Tensor(name="path", dtype=bytes, shape=(1,), optional=True),
                Tensor(name="dummy_var", dtype=np.int64, shape=(1,), optional=True),  # NeMo-Aligner's; ignored
            ],
            outputs=[Tensor(name="path", dtype=bytes, shape=(1,)), Tensor(name="status", dtype=np.int64, shape=(1,))],
            config=ModelConfig(max_batch_size=1, batcher=None),
            strict=False,
        )

    combined = "with rewards" if critic.scorer is not None else "values only"
    detail = f"models {', '.join(CRITIC_MODELS)}; {combined}; critic step {critic.steps}"
    run_triton(config, bind, "critic server", detail, ready, stop)
