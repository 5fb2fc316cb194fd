"""The REINFORCE / RLOO trainer: NeMo-Aligner's critic-free RLHF loop in plain PyTorch (docs/training.md).

    aligner train --config demo_assets/reinforce.yaml            # a run
    aligner train --config demo_assets/reinforce.yaml --resume   # continue exactly from the newest intact checkpoint
    torchrun --standalone --nproc_per_node 2 -m aligner.cli train --config ...   # data-parallel (docs/scaling.md)

Lifecycle: `setup` -> `fit` (-> `rollout`, `optimise`, `validate`, `save_checkpoint`). The contract:
- `setup(resume=True)` restores everything a step depends on: 2 steps + resume + 2 steps equals 4 steps.
- SIGTERM, a first Ctrl-C or `trainer.max_time` stops at the next step boundary with a checkpoint saved; a reward
  or critic server that stays away past its `unavailable_timeout_s` ends the run with `ServerUnavailableError`.
- However the loop ends, `fit` writes one end record (`run_layout.RunEnd`, docs/training.md "How a run ends").
- Under torchrun every rank takes the update one process would take on the whole batch; rank 0 alone writes files.
PPO (aligner/trainers/ppo.py) is a subclass that replaces `rollout` and `optimise`.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aligner import distributed
from aligner.algorithms.grpo import (
    REWARD_STD_EPS,
    aggregate_loss,
    grpo_advantages,
    kl_loss_term,
    overlong_penalty,
    per_token_policy_loss,
    reinforce_pp_returns,
    zero_spread_groups,
)
from aligner.algorithms.reinforce import (
    LOSS_AGGREGATIONS,
    advantages_from_baseline,
    kl_penalty,
    masked_mean,
    reinforce_loss,
    response_loss_mask,
    rewards_with_kl,
    rloo_baseline,
)
from aligner.algorithms.rollout_correction import mismatch_metrics, rollout_correction_weights
from aligner.config import TrainConfig, save_config
from aligner.data.prompts import PromptDataset, PromptSampler, build_prompt_dataset, read_prompt_file
from aligner.durable import replace_durably
from aligner.errors import ConfigError, RunDirError, ServerUnavailableError, disk_full_message
from aligner.generation.engines import build_generator
from aligner.generation.generator import (
    GenerationOutput,
    _concat,
    concat_samples,
    resolve_compile,
    select_samples,
)
from aligner.metrics import (
    BASELINE,
    CLIP_FRACTION,
    CLIP_FRACTION_HIGH,
    CLIP_FRACTION_LOW,
    DROPPED_GROUPS,
    GRAD_NORM,
    IMPORTANCE_WEIGHT,
    IMPORTANCE_WEIGHT_CAPPED,
    INIT_POLICY_KL,
    LOSS,
    LR,
    MEMORY_PEAK,
    MISMATCH_KL,
    MISMATCH_PPL_RATIO,
    OVERLONG_PENALTY,
    RATIO_MAX,
    RATIO_MEAN,
    RATIO_MIN,
    ROLLOUT_ENTROPY,
    SAMPLING_ROUNDS,
    TIMER_GENERATE,
    TIMER_GENERATE_WAIT,
    TIMER_INIT_LOGPROBS,
    TIMER_LOGPROBS,
    TIMER_REFIT,
    TIMER_REWARD,
    TIMER_STEP,
    TIMER_TRAIN,
    TIMER_VALIDATE,
    TIMER_WALL,
    TRAIN_REWARD,
    VAL_PROPERLY_ENDED,
    VAL_RESPONSE_LENGTH,
    VAL_REWARD,
    gold_reward,
)
from aligner.modeling.batches import ResponseBatch
from aligner.modeling.device import (
    autocast,
    bf16_emulation,
    bf16_note,
    compute_dtype,
    keep_freed_memory,
    peak_memory_bytes,
    resolve_device,
)
from aligner.modeling.fsdp import offload_note
from aligner.modeling.hf import eos_token_ids, load_tokenizer, quiet_transformers
from aligner.modeling.logprobs import grouped_response_logprobs
from aligner.rewards.build import build_reward_client
from aligner.rewards.http import ServerWait
from aligner.run_layout import (
    BEST_FILE,
    BEST_POLICY_DIR,
    CHECKPOINT_DIR,
    COMPLETED,
    FAILED,
    FINAL_POLICY_DIR,
    MAX_TIME,
    SERVER_UNAVAILABLE,
    STATE_FILE,
    STOPPED,
    RunEnd,
    checkpoint_name,
    checkpoint_steps,
    clear_end,
    damaged_message,
    list_checkpoints,
    resume_checkpoint,
    set_aside,
    write_end,
)
from aligner.trainers.checkpoint import (
    UnreadableCheckpoint,
    commit_checkpoint,
    drop_best_after,
    reading,
    rng_state,
    set_rng_state,
    write_json_atomic,
    writing_checkpoint,
)
from aligner.trainers.loop import RunClock, adamw, is_save_step, is_validation_step, run_length
from aligner.trainers.policy_backends import HfBackend, build_backend
from aligner.trainers.rollout import (
    pass_metrics,
    rollout_metrics,
    sample_prompt_indices,
    sample_rows,
    throughput_metrics,
)
from aligner.trainers.run_log import RunLog, Timers
from aligner.trainers.schedule import lr_scheduler
from aligner.trainers.signals import stop_on_signals
from aligner.trainers.tracking import require_packages

VALIDATION_SEED_OFFSET = 7_919  # validation samples with its own fixed noise, the same at every validation
RANK_SEED_STRIDE = 1 << 32  # rank r samples with seed + r * stride: its own noise, never another step's


@dataclass
class PassStats:
    """Sums over a step's training passes (this rank's), turned into the step's metrics over every rank by
    `metrics`: the ratio's statistics (policy_loss clip / cispo), the rollout correction's, and the mismatch
    between the engine's and the trainer's log-probs (over the tokens whose forward ran on the sampling weights)."""

    ratio_tokens: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    ratio_sum: float = 0.0
    ratio_min: float = float("inf")
    ratio_max: float = float("-inf")
    correction_units: float = 0.0
    correction_weight: float = 0.0
    corrected: float = 0.0
    mismatch_tokens: float = 0.0
    mismatch_kl: float = 0.0
    mismatch_log_ratio: float = 0.0  # sum of log pi_engine - log pi_trainer

    def add_ratio(self, stats: dict[str, torch.Tensor], tokens: float) -> None:
        if not tokens:
            return
        self.ratio_tokens += tokens
        self.clip_low += stats["clip_frac_low"].item() * tokens
        self.clip_high += stats["clip_frac_high"].item() * tokens
        self.ratio_sum += stats["ratio_mean"].item() * tokens
        self.ratio_min = min(self.ratio_min, stats["ratio_min"].item())
        self.ratio_max = max(self.ratio_max, stats["ratio_max"].item())

    def add_correction(self, stats: dict[str, torch.Tensor], units: float) -> None:
        self.correction_units += units
        self.correction_weight += stats["weight_mean"].item() * units
        self.corrected += stats["share_corrected"].item() * units

    def add_mismatch(self, trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor) -> None:
        tokens = mask.sum().item()
        if tokens:
            found = mismatch_metrics(trainer_logprobs, engine_logprobs, mask)
            self.mismatch_tokens += tokens
            self.mismatch_kl += found["mismatch_kl"].item() * tokens
            self.mismatch_log_ratio += found["mismatch_ppl_ratio"].log().item() * tokens

    def metrics(self, device: torch.device, ratio: bool, correction: bool) -> dict[str, float]:
        sums = [self.ratio_tokens, self.clip_low, self.clip_high, self.ratio_sum, self.correction_units]
        sums += [
            self.correction_weight,
            self.corrected,
            self.mismatch_tokens,
            self.mismatch_kl,
            self.mismatch_log_ratio,
        ]
        (tokens, low, high, ratio_sum, units, weight, corrected, m_tokens, m_kl, m_log) = distributed.all_reduce_sum(
            torch.tensor(sums, dtype=torch.float64, device=device)
        ).tolist()
        out: dict[str, float] = {}
        if m_tokens:
            out[MISMATCH_KL] = m_kl / m_tokens
            out[MISMATCH_PPL_RATIO] = float(torch.tensor(m_log / m_tokens).exp())
        if ratio and tokens:
            extremes = distributed.max_over_ranks({"max": self.ratio_max, "min": -self.ratio_min})
            out.update(
                {
                    CLIP_FRACTION: (low + high) / tokens,
                    CLIP_FRACTION_LOW: low / tokens,
                    CLIP_FRACTION_HIGH: high / tokens,
                    RATIO_MEAN: ratio_sum / tokens,
                    RATIO_MIN: -extremes["min"],
                    RATIO_MAX: extremes["max"],
                }
            )
        if correction:
            out[IMPORTANCE_WEIGHT] = weight / max(units, 1)
            out[IMPORTANCE_WEIGHT_CAPPED] = corrected / max(units, 1)
        return out


@dataclass
class Rollout:
    """Everything the optimiser needs from one step's samples, plus what gets logged."""

    batch: ResponseBatch  # prompts (each once) and responses
    loss_mask: torch.Tensor  # [B, T] float
    advantages: torch.Tensor  # [B]
    metrics: dict[str, float] = field(default_factory=dict)
    # reinforce.kl_in: loss: the reference's log-probs of the sampled tokens, for the loss's KL term.
    ref_logprobs: torch.Tensor | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    # The generation engine's log-probs of the samples (the behaviour policy's: one update behind with async
    # rollouts), for reinforce.rollout_correction's weights and the mismatch metrics.
    engine_logprobs: torch.Tensor | None = None
    # The trainer's log-probs at rollout time: the ratio's denominator when the rollout serves more than one pass
    # (num_epochs, num_mini_batches); None when the one pass takes its own forward's, detached (ratio exactly 1).
    old_logprobs: torch.Tensor | None = None
    stats: PassStats = field(default_factory=PassStats)  # filled by the rollout-time forward and the passes


@dataclass
class PendingGeneration:
    """trainer.async_rollouts: the next step's samples, generated in a background thread while this step trains."""

    position: dict[str, Any]  # the prompt sampler's state before they were drawn: a dropped step goes back to it
    prompt_indices: list[int]  # this rank's share of the step's prompts
    future: Future  # -> (GenerationOutput, seconds it took)


class ReinforceTrainer:
    def __init__(self, config: TrainConfig):
        self.config = config
        self.run_dir = Path(config.run_dir)
        self.step = 0
        self.backend: HfBackend | None = None  # the trained policy (policy_backends.py), from `setup`
        self.timers = Timers()
        self._stop_requested = False
        self.last_validation: tuple[int, float] | None = None  # (step, val/rewards) of the latest validation
        self.best: dict[str, Any] | None = None  # {"step", VAL_REWARD} of the best checkpoint so far
        self.resumed_from: Path | None = None  # the checkpoint `setup(resume=True)` loaded
        self.skipped_checkpoints: list[tuple[int, str]] = []  # (step, reason) of damaged ones the resume set aside
        self._intact: tuple[int | None, Path | None] | None = None  # `_intact_checkpoint`'s answer, once verified
        self.log: RunLog | None = None  # from the end of `setup`
        self.extra_reward_clients: dict[str, Any] = {}  # validation.extra_rewards' clients, by name
        self.ahead: PendingGeneration | None = None  # trainer.async_rollouts: the next step's samples, under way
        self._background: ThreadPoolExecutor | None = None  # ... and the thread that generates them
        self._time_up: str | None = None  # trainer.max_time stopped this launch: the message saying so
        self._goal: str | None = None  # trainer.stop_at_metric ended the run: the message saying so
        self.end: RunEnd | None = None  # how `fit` ended (run_layout.END_FILE)

    # ----------------------------------------------------------------------------------------------- setup
    def setup(self, resume: bool = False) -> None:
        cfg = self.config
        # Input that can be wrong is checked before any model loads; which settings go together, the config has
        # checked already (aligner/config.py, combination_errors): what is left needs the run.
        require_packages(cfg.logging)
        train_records = read_prompt_file(cfg.data.train_file)
        val_records = read_prompt_file(cfg.data.val_file)
        checkpoints = self._take_run_dir(resume)
        if resume and not checkpoints and not self.skipped_checkpoints:
            print(f"no checkpoint in {self.run_dir}: starting from the beginning", file=sys.stderr)
        self.backend = build_backend(cfg)
        # The process groups (with model parallelism, they decide each rank's share of the data) and the device.
        self.device = self.backend.init_parallel(resolve_device(cfg.model.device))
        if cfg.reinforce.num_prompts_per_step < distributed.dp_size():
            raise ConfigError(
                f"reinforce.num_prompts_per_step ({cfg.reinforce.num_prompts_per_step}) is global over processes and "
                f"must be at least their number ({distributed.dp_size()}): every rank needs a prompt"
            )
        self._check_dynamic_batching()
        if cfg.model.num_threads:
            torch.set_num_threads(cfg.model.num_threads)
        if cfg.model.keep_freed_memory and self.device.type == "cpu":
            keep_freed_memory()
        notes = bf16_note(cfg.model.precision, self.device), offload_note(cfg.model.fsdp.cpu_offload, self.device)
        for note in notes:
            if note and distributed.is_main():
                print(note, file=sys.stderr)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        quiet_transformers()
        # None only for PPO taking its rewards from the critic server (PPOTrainer scores through it).
        tokenizer_path = cfg.model.tokenizer_path or cfg.model.policy_path  # for a reward server taking tokens
        self.reward_client = (
            build_reward_client(cfg.reward, self.device, self._server_wait, tokenizer_path) if cfg.reward else None
        )
        # Servers among them are waited for as the main one is (`_server_wait`, their own unavailable_timeout_s).
        self.extra_reward_clients = {
            name: build_reward_client(reward, self.device, self._server_wait, tokenizer_path)
            for name, reward in cfg.validation.extra_rewards.items()
        }
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.policy_path)
        self.train_data = build_prompt_dataset(
            train_records, self.tokenizer, cfg.data.apply_chat_template, cfg.data.max_prompt_length
        )
        self.val_data = build_prompt_dataset(
            val_records, self.tokenizer, cfg.data.apply_chat_template, cfg.data.max_prompt_length
        )
        self.total_steps = run_length(cfg.trainer, len(self.train_data), cfg.reinforce.num_prompts_per_step)
        if self.total_steps < 1:
            raise ConfigError(
                f"trainer.max_epochs ({cfg.trainer.max_epochs}) passes over {len(self.train_data)} training prompts "
                f"do not fill one step of reinforce.num_prompts_per_step ({cfg.reinforce.num_prompts_per_step})"
            )
        for name, data in (("training", self.train_data), ("validation", self.val_data)):
            if data.num_truncated:
                print(
                    f"{data.num_truncated} {name} prompts kept only their last {cfg.data.max_prompt_length} "
                    "tokens (data.max_prompt_length)",
                    file=sys.stderr,
                )

        self.policy = self.backend.load()
        self.reference = self.backend.reference()
        self.backend.prepare()
        cfg.generation.compile = resolve_compile(cfg.generation.compile, self.device, self.total_steps)
        self.generator = build_generator(cfg, self.policy, self.tokenizer, eos_token_ids(self.policy, self.tokenizer))
        self.optimizer = adamw(self.backend.trainable_parameters(), cfg.optim, self.device)
        self.scheduler = lr_scheduler(
            self.optimizer,
            cfg.optim.warmup_steps,
            self.total_steps,
            min_ratio=cfg.optim.min_lr / cfg.optim.lr,
            constant_steps=cfg.sched.constant_steps,
        )
        self.sampler = PromptSampler(len(self.train_data), cfg.seed, cfg.data.shuffle)
        if resume and (checkpoints or self.skipped_checkpoints):  # PPO's early look may have set them all aside
            self._resume()
        self.backend.same_on_every_rank()
        self.backend.refit(self.generator)  # an engine's own copy of the weights takes the resumed ones

        self.run_dir.mkdir(parents=True, exist_ok=True)
        if distributed.is_main():
            save_config(cfg, self.run_dir / "config.yaml")
        resume_step = self.step if self.resumed_from else None
        self.log = RunLog(
            self.run_dir,
            resume_step=resume_step,
            enabled=distributed.is_main(),
            tracking=cfg.logging,
            params=cfg.model_dump(mode="json"),
        )
        for step, reason in self.skipped_checkpoints:
            self.log.log_event(step, damaged_message(step, reason, resume_step), level="warning")

    def _take_run_dir(self, resume: bool) -> list[Path]:
        """The run dir's checkpoints, once this launch may use it (a used one only to resume); the end record of an
        earlier launch goes: this one writes its own when its loop ends."""
        checkpoints = list_checkpoints(self.run_dir)
        if checkpoints and not resume:
            raise RunDirError(
                f"run_dir {self.run_dir} already holds checkpoints (newest: {checkpoints[-1].name}); "
                "pass --resume to continue it, or choose another run_dir"
            )
        if distributed.is_main():
            clear_end(self.run_dir)
        return checkpoints

    def _check_dynamic_batching(self) -> None:
        cfg = self.config.reinforce
        if not cfg.dynamic_batching:
            return
        chunks = -(-cfg.num_prompts_per_step // cfg.dynamic_batching_prompts)
        if chunks < distributed.dp_size():
            raise ConfigError(
                f"reinforce.dynamic_batching: num_prompts_per_step ({cfg.num_prompts_per_step}) makes {chunks} "
                f"chunks of dynamic_batching_prompts ({cfg.dynamic_batching_prompts}); every one of the "
                f"{distributed.dp_size()} processes needs one"
            )
        algorithm = self.config.algorithm
        mini_batches = self.config.ppo.num_mini_batches if algorithm == "ppo" else cfg.num_mini_batches
        if mini_batches > 1 and distributed.dp_size() > 1:
            # Mini-batches are cut from each rank's share; with dealt chunks those are not one process's halves.
            raise ConfigError(
                f"reinforce.dynamic_batching with {algorithm}.num_mini_batches > 1 under torchrun would not take the "
                "optimiser steps one process takes: use one mini-batch, or static shares"
            )

    @property
    def final_policy_dir(self) -> Path:
        return self.run_dir / FINAL_POLICY_DIR

    def autocast(self):
        """The policy's and reference's forwards in `model.precision`'s compute dtype (nothing for fp32)."""
        precision = self.config.model.precision
        return autocast(precision, self.device) if compute_dtype(precision) else contextlib.nullcontext()

    def training_autocast(self):
        """`autocast` for the training forward, where the backend does not cast by itself."""
        return self.autocast() if self.backend.autocasts else contextlib.nullcontext()

    # ----------------------------------------------------------------------------------------------- the loop
    def fit(self, until_step: int | None = None) -> None:
        """Train to `total_steps` (trainer.max_steps, or fewer by trainer.max_epochs), or stop early with a checkpoint
        (as a cancel would) at `until_step` or once this launch has run `trainer.max_time`. However it ends, the end
        record says how (`self.end`, run_layout.END_FILE)."""
        self._time_up = self._goal = None
        try:
            self._train(until_step)
        except ServerUnavailableError as err:
            self._end(SERVER_UNAVAILABLE, str(err), failing=True)
            raise
        except KeyboardInterrupt:
            message = f"interrupted after step {self.step} (a second Ctrl-C): the step under way was dropped"
            self._end(STOPPED, message, failing=True)
            raise
        except BaseException as err:
            self._end(FAILED, disk_full_message(err) or f"{type(err).__name__}: {err}", failing=True)
            raise
        if self._goal is not None:
            self._end(COMPLETED, f"{self._goal} at step {self.step}: final policy in {FINAL_POLICY_DIR}/")
        elif self.step >= self.total_steps:
            self._end(
                COMPLETED, f"completed step {self.step} of {self.total_steps}: final policy in {FINAL_POLICY_DIR}/"
            )
        elif self._time_up is not None:
            self._end(MAX_TIME, self._time_up)
        else:
            self._end(STOPPED, f"stopped at step {self.step} of {self.total_steps} on request; continue with --resume")

    def _end(self, end: str, message: str, failing: bool = False) -> None:
        """Write the end record (rank 0). `failing`: on the way out of an error, which a disk error here must not
        hide (no record then reads as a crash, which it is)."""
        self.end = RunEnd(end, self.step, self.total_steps, message)
        if not distributed.is_main():
            return
        try:
            write_end(self.run_dir, self.end)
        except OSError as err:
            if not failing:
                raise
            print(f"WARNING: could not write the end record in {self.run_dir}: {err}", file=sys.stderr)

    def _train(self, until_step: int | None) -> None:
        cfg = self.config.trainer
        total = self.total_steps
        clock = RunClock(cfg.max_time)
        from tqdm.auto import tqdm

        bar = tqdm(
            total=total,
            initial=self.step,
            desc=self.config.algorithm,
            disable=not (cfg.progress_bar and distributed.is_main()),
            dynamic_ncols=True,
        )
        with stop_on_signals(self), bf16_emulation(self.config.model.precision, self.device):
            if self.step == 0 and cfg.val_check_interval > 0:
                try:
                    self.log.log_metrics(0, self.validate())
                except ServerUnavailableError as err:
                    self._give_up(err)
            # Signals reach the ranks at different moments: they agree on stopping, or one would wait for the others.
            stop = distributed.any_rank(self._stop_requested)
            logged = time.perf_counter()  # when the previous step's metrics were logged (TIMER_WALL)
            while self.step < total and not stop:
                position, updating, started = self.sampler.state_dict(), False, time.perf_counter()
                try:
                    if cfg.async_rollouts:
                        position, rollout = self._rollout_ahead(total)
                    else:
                        prompt_indices = self.sampler.next_batch(self.config.reinforce.num_prompts_per_step)
                        rollout = self.rollout(prompt_indices, self.train_data)
                    updating = True  # from here the weights move: a step that fails now cannot be checkpointed
                    metrics = {**rollout.metrics, **self.optimise(rollout)}
                except ServerUnavailableError as err:
                    self.sampler.load_state_dict(position)  # the failed step leaves no trace
                    self._give_up(err, can_checkpoint=not updating)
                    break  # a stop was requested while the server was away
                self.step += 1
                last = self.step == total
                # Every rank stops at the same step, or one would wait for the others.
                out_of_time = cfg.max_time is not None and distributed.any_rank(clock.expired()) and not last
                # As NeMo does, a run stopped by the clock validates before its checkpoint (when validation is on).
                validating = is_validation_step(self.step, cfg.val_check_interval, total)
                if validating or (out_of_time and cfg.val_check_interval > 0):
                    try:
                        with self.timers.time(TIMER_VALIDATE):
                            metrics.update(self.validate())
                    except ServerUnavailableError as err:  # the step is done: logged and checkpointed unvalidated
                        self.log.log_metrics(self.step, metrics)
                        self._give_up(err)
                        break
                now = time.perf_counter()
                timers = {**self.timers.pop(), TIMER_STEP: now - started, TIMER_WALL: now - logged}
                logged = now
                memory = {MEMORY_PEAK: peak_memory_bytes(self.device) / 1e9, **self.backend.memory_metrics()}
                metrics.update(distributed.max_over_ranks({**timers, **memory}))  # a step waits for its slowest rank
                metrics.update(throughput_metrics(rollout.batch, metrics[TIMER_STEP]))
                self.log.log_metrics(self.step, metrics)
                n = cfg.train_samples_to_log
                self.log.log_samples(distributed.gather_rows(rollout.samples[:n])[:n])
                if until_step is not None and self.step >= until_step:
                    self.request_stop()
                if out_of_time:
                    self._stop_for_time(cfg.max_time)
                if self._reached_goal(metrics):
                    value = f"{cfg.stop_at_metric} {metrics[cfg.stop_at_metric]:.4g}"
                    self._goal = f"{value} reached trainer.stop_at_value {cfg.stop_at_value:g}"
                    self.log.log_event(self.step, f"{self._goal} at step {self.step}: the run ends")
                    total = self.step  # the run is done: checkpointed below, its final policy exported
                stop = distributed.any_rank(self._stop_requested)
                # A validation that beats the best so far is checkpointed at once, so the best policy is kept.
                if is_save_step(self.step, cfg, total) or stop or self._validated_new_best():
                    self.save_checkpoint()
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics[TRAIN_REWARD]:.3f}",
                    kl=f"{metrics[INIT_POLICY_KL]:.4f}",
                )
        bar.close()
        self._stop_background()
        if self.step >= total:
            # The final policy is always a plain Hugging Face folder (LoRA adapters merged into it, shards gathered).
            self.backend.export(self.final_policy_dir, self.tokenizer)
            distributed.barrier()
        elif distributed.is_main():
            print(f"stopped at step {self.step}; continue with --resume", file=sys.stderr)
        self._close_reward_clients()
        self.log.close(finished=self.step >= total)

    def _stop_for_time(self, max_time: float) -> None:
        """trainer.max_time is up: stop after this step with a checkpoint, saying so (a clean stop, exit status 0)."""
        message = (
            f"time limit trainer.max_time ({max_time:g} s) reached after step {self.step}: stopping with a "
            "checkpoint; continue with --resume"
        )
        if distributed.is_main():
            print(message, file=sys.stderr)
        self.log.log_event(self.step, message, level="warning", stop=MAX_TIME)
        self._time_up = message
        self.request_stop()

    def _reward_clients(self) -> list:
        """The main reward client (if any) and the extra validation ones."""
        main = getattr(self, "reward_client", None)  # none before `setup`
        return ([main] if main is not None else []) + list(self.extra_reward_clients.values())

    def _close_reward_clients(self) -> None:
        for client in self._reward_clients():
            client.close()  # requests still waiting give up

    # ----------------------------------------------------------------------------------------------- servers away
    def _server_wait(self, wait: ServerWait) -> None:
        """The reward and critic clients' `on_wait` (any thread): a server went away, is still away, or is back."""
        if distributed.is_main():
            print(wait.message, file=sys.stderr, flush=True)
        # The clients connect during `setup`, before the run log exists: then the events file only.
        log = self.log or RunLog(self.run_dir, enabled=distributed.is_main(), events_only=True)
        level = "info" if wait.state == "back" else "warning"
        fields = {"server": wait.server.split()[0], "url": wait.url, "wait": wait.state}
        log.log_event(self.step, wait.message, level=level, waited_s=round(wait.waited_s, 1), **fields)

    def _can_checkpoint_after(self, err: ServerUnavailableError) -> bool:
        """Whether a checkpoint can be written with `err`'s server away. Not under torchrun: the other ranks may
        not have failed, and a checkpoint is collective."""
        return distributed.world_size() == 1

    def _give_up(self, err: ServerUnavailableError, can_checkpoint: bool = True) -> None:
        """`err`'s server stayed away past its limit: checkpoint the last completed step unless it is already (or
        cannot be: the weights moved, or no step was done), then end the run with `err`, saying where to resume.
        Returns, for `fit` to stop as a stop request does, when one came while the server was away."""
        done = self.step in checkpoint_steps(self.run_dir)
        if can_checkpoint and self.step > 0 and not done and self._can_checkpoint_after(err):
            self.save_checkpoint()
        server = (err.server or "server").split()[0]
        if self._stop_requested:
            message = f"stopped waiting for {err.server} {err.url}: the run was asked to stop"
            self.log.log_event(self.step, message, level="warning", server=server, url=err.url, wait="stopped")
            return
        steps = checkpoint_steps(self.run_dir)
        if steps:
            where = f"its newest checkpoint is step {max(steps)}: resume the run (--resume) once the server is back"
        else:
            where = "it has no checkpoint: run it again once the server is back"
        message = f"{err} The run stopped at step {self.step}; {where}."
        self.log.log_event(self.step, message, level="error", server=server, url=err.url, wait="failed")
        self._close_reward_clients()
        raise type(err)(message, server=err.server, url=err.url, waited_s=err.waited_s) from None

    def request_stop(self) -> None:
        """Finish the current step, save a checkpoint, and return from `fit`. A step waiting for a server that is
        away stops waiting: it is dropped, and the last completed step is checkpointed."""
        self._stop_requested = True
        for client in self._reward_clients():
            self._stop_waiting(client)

    @staticmethod
    def _stop_waiting(client) -> None:
        stop_waiting = getattr(client, "stop_waiting", None)  # the clients of servers have it
        if stop_waiting is not None:
            stop_waiting()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    # ----------------------------------------------------------------------------------------------- rollout
    def _sampling_seed(self, step: int, slot: int | None = None) -> int:
        """Derived from the step, so a resumed run samples exactly what an uninterrupted one would, and from the
        slot: the rank's (fixed shares) or the chunk's global position (`reinforce.dynamic_batching`), so that
        chunk c draws what rank c of a static split into the same chunks would."""
        slot = distributed.dp_rank() if slot is None else slot
        return self.config.seed * 1_000_003 + step + slot * RANK_SEED_STRIDE

    def _score(self, gen: GenerationOutput, data: PromptDataset, prompt_indices: list[int]):
        """Start the reward request; prompts and metadata repeat for each sample of their prompt."""
        return self._submit(self.reward_client, gen, data, prompt_indices)

    @staticmethod
    def _submit(client, gen: GenerationOutput, data: PromptDataset, prompt_indices: list[int]):
        """(each sample's prompt, `client`'s future rewards of the samples)."""
        per_sample = sample_prompt_indices(gen, prompt_indices)
        prompts = [data.texts[i] for i in per_sample]
        return prompts, client.submit(prompts, gen.responses, [data.metadata[i] for i in per_sample])

    def _generate(self, prompt_indices: list[int], data: PromptDataset) -> GenerationOutput:
        """`reinforce.num_rollouts_per_prompt` samples of each prompt, with this step's sampling noise."""
        with self.timers.time(TIMER_GENERATE):
            return self.generator.generate(
                [data.token_ids[i] for i in prompt_indices],
                self.config.reinforce.num_rollouts_per_prompt,
                self._sampling_seed(self.step),
            )

    def _generate_share(self, prompt_indices: list[int], data: PromptDataset) -> tuple[list[int], GenerationOutput]:
        """(this rank's prompts of the step's global `prompt_indices`, their samples): a contiguous share, or with
        `reinforce.dynamic_batching` the chunks of `dynamic_batching_prompts` prompts this rank took from the queue.

        A chunk is sampled as one batch with its own seed (`_sampling_seed` of its position), whichever rank takes
        it: the step's samples are the same for any number of ranks and any dealing, and equal those of a static
        split into the same chunks.
        """
        cfg = self.config.reinforce
        if not cfg.dynamic_batching:
            share = distributed.shard(prompt_indices)
            return share, self._generate(share, data)
        size = cfg.dynamic_batching_prompts
        chunks = [prompt_indices[i : i + size] for i in range(0, len(prompt_indices), size)]
        taken, parts = [], []
        with self.timers.time(TIMER_GENERATE):
            for c in distributed.dynamic_indices(len(chunks)):
                seed = self._sampling_seed(self.step, c)
                parts.append(
                    self.generator.generate([data.token_ids[i] for i in chunks[c]], cfg.num_rollouts_per_prompt, seed)
                )
                taken += chunks[c]
        gen = parts[0] if len(parts) == 1 else _concat(parts, self.generator.pad_id)
        gen.group_ids = torch.arange(len(taken), device=gen.response_ids.device).repeat_interleave(
            cfg.num_rollouts_per_prompt
        )
        return taken, gen

    def _micro_batches(self, batch: ResponseBatch, micro_batch_size: int | None = None):
        """(rows, sub-batch) pairs of at most `micro_batch_size` (default `optim.micro_batch_size`) responses."""
        size, step = batch.response_ids.shape[0], micro_batch_size or self.config.optim.micro_batch_size
        for start in range(0, size, step):
            rows = slice(start, start + step)
            yield rows, batch.subset(rows)

    @torch.no_grad()
    def _logprobs(self, fn, batch: ResponseBatch) -> torch.Tensor:
        """Log-probs of the response tokens in micro-batches, padded back to the full response width."""
        out = torch.zeros(batch.response_ids.shape, device=batch.response_ids.device)
        for rows, sub in self._micro_batches(batch, self.config.optim.logprob_micro_batch_size):
            out[rows, : sub.response_ids.shape[1]] = fn(sub)
        return out

    @property
    def _reuses_rollouts(self) -> bool:
        """Whether a rollout serves more than one training pass with the ratio to its policy: then the ratio's
        denominator comes from a trainer forward at rollout time (`Rollout.old_logprobs`)."""
        cfg = self.config.reinforce
        return cfg.policy_loss != "reinforce" and (cfg.num_epochs > 1 or cfg.num_mini_batches > 1)

    def _policy_and_reference_logprobs(self, gen: GenerationOutput, batch: ResponseBatch):
        """(the policy's log-probs of the sampled tokens, from generation or a forward pass; the reference's; the
        trainer's forward at rollout time, or None when neither use_generation_logprobs: false nor a reused rollout
        asks for it)."""
        trainer = None
        with self.timers.time(TIMER_LOGPROBS):
            if not self.config.reinforce.use_generation_logprobs or self._reuses_rollouts:
                module = self.backend.rollout_module
                module.eval()
                with self.autocast():
                    trainer = self._logprobs(lambda sub: grouped_response_logprobs(module, sub), batch)
            logprobs = gen.logprobs if self.config.reinforce.use_generation_logprobs else trainer
        with self.timers.time(TIMER_INIT_LOGPROBS), self.autocast():
            ref_logprobs = self._logprobs(self.reference.logprobs, batch)
        return logprobs, ref_logprobs, trainer

    def rollout(self, prompt_indices: list[int], data: PromptDataset) -> Rollout:
        """Samples for this rank's share of the step's global `prompt_indices` (`_generate_share`); metrics over
        all ranks.

        All samples of a prompt stay on one rank, so the RLOO baseline is exact locally.
        """
        prompt_indices, gen = self._generate_share(prompt_indices, data)
        if self.config.reinforce.dynamic_sampling:
            return self._dynamic_rollout(prompt_indices, gen, data)
        return self._score_rollout(prompt_indices, gen, data)

    def _dynamic_rollout(self, prompt_indices: list[int], gen: GenerationOutput, data: PromptDataset) -> Rollout:
        """DAPO's dynamic sampling: drop the groups whose rewards have no spread and sample more prompts (rounds of
        num_prompts_per_step, drawn from the sampler as a step's are) until the step holds num_prompts_per_step
        groups with spread, at most max_sampling_rounds extra rounds; groups beyond that number (in the order of
        rounds, then ranks) are left out. With no group left at all the first round is kept whole (advantages 0).
        The filter looks at the rewards as scored (before the KL and the overlong penalty), as DAPO's
        `filter_groups` looks at the accuracy."""
        cfg = self.config.reinforce
        need, rounds = cfg.num_prompts_per_step, 0
        rank, ranks = distributed.dp_rank(), distributed.dp_size()
        # Per round: (samples, this rank's prompts, their rewards, groups with spread, every rank's count of them).
        parts = []
        while True:
            with self.timers.time(TIMER_REWARD):
                rewards = self._score(gen, data, prompt_indices)[1].result()
            useful = gen.group_ids[~zero_spread_groups(rewards, gen.group_ids)].unique()
            parts.append((gen, prompt_indices, rewards, useful, distributed.all_gather_objects(int(useful.numel()))))
            found = sum(sum(part[4]) for part in parts)
            if found >= need or rounds >= cfg.max_sampling_rounds:
                break
            rounds += 1
            prompt_indices = distributed.shard(self.sampler.next_batch(need))
            # Each round's samples have noise of their own: the slots after every rank's of the rounds before.
            seed = self._sampling_seed(self.step, rank + rounds * ranks)
            with self.timers.time(TIMER_GENERATE):
                gen = self.generator.generate(
                    [data.token_ids[i] for i in prompt_indices], cfg.num_rollouts_per_prompt, seed
                )
        seen = sum(distributed.all_gather_objects(sum(len(part[1]) for part in parts)))
        if found == 0:
            gen, indices, rewards = parts[0][0], parts[0][1], parts[0][2]
        else:
            chosen, indices, kept_rewards, left = [], [], [], need
            for samples, prompts, scored, useful, counts in parts:
                mine = max(0, min(counts[rank], left - sum(counts[:rank])))  # the ranks before take theirs first
                left = max(0, left - sum(counts))
                groups = useful[:mine]
                keep = torch.isin(samples.group_ids, groups)
                chosen.append(select_samples(samples, keep))
                kept_rewards.append(scored[keep])
                indices += [prompts[int(g)] for g in groups]
            gen, rewards = concat_samples(chosen, self.generator.pad_id), torch.cat(kept_rewards)
        extra = {DROPPED_GROUPS: 1.0 - min(found, need) / max(seen, 1), SAMPLING_ROUNDS: float(rounds)}
        # The kept samples' rewards are known already: the rollout does not ask the reward for them again.
        return self._score_rollout(indices, gen, data, extra_metrics=extra, rewards=rewards)

    def _score_rollout(
        self,
        prompt_indices: list[int],
        gen: GenerationOutput,
        data: PromptDataset,
        extra_metrics: dict[str, float] | None = None,
        rewards: torch.Tensor | None = None,
    ) -> Rollout:
        """`rollout` from the samples `gen` of this rank's `prompt_indices`: rewards, KL, baseline, advantages;
        generation's log-probs are kept as the engine's (the behaviour policy's), `extra_metrics` (global values)
        join the step's; `rewards`, when given, are the samples' as scored already."""
        cfg = self.config.reinforce
        if rewards is None:
            with self.timers.time(TIMER_REWARD):
                prompts, future = self._score(gen, data, prompt_indices)
        else:  # scored already (dynamic sampling)
            prompts = [data.texts[i] for i in sample_prompt_indices(gen, prompt_indices)]
            future = Future()
            future.set_result(rewards)
        batch = gen.response_batch()
        logprobs, ref_logprobs, trainer_logprobs = self._policy_and_reference_logprobs(gen, batch)
        with self.timers.time(TIMER_REWARD):
            rewards = future.result().to(logprobs.device)

        extra = {}
        scored = rewards
        if cfg.overlong_buffer:
            max_new = self.config.generation.max_new_tokens
            penalty = overlong_penalty(gen.response_lengths, max_new, cfg.overlong_buffer, cfg.overlong_penalty)
            scored = rewards + penalty.to(rewards)
            extra[OVERLONG_PENALTY] = penalty.mean().item()
        loss_mask = response_loss_mask(
            # NeMo-Aligner's loss zeroes truncated samples whatever exclude_truncated says.
            gen.response_mask,
            gen.is_end,
            cfg.exclude_truncated or cfg.loss_aggregation == "nemo",
        )
        kl = kl_penalty(logprobs, ref_logprobs, gen.response_mask, estimator=cfg.kl_estimator)
        shaped = rewards_with_kl(scored, kl, cfg.initial_policy_kl_penalty if cfg.kl_in == "reward" else 0.0)
        advantages, baseline = self._advantages(scored, shaped, gen, logprobs, ref_logprobs, loss_mask)
        # Each sample's mean -log pi over its tokens: an estimate of the policy's entropy that needs no logits.
        extra[ROLLOUT_ENTROPY] = masked_mean(-logprobs, gen.response_mask, dim=-1).mean().item()
        # The newer metrics after the older ones: metrics.jsonl keeps its order.
        metrics = {**rollout_metrics(gen, rewards, shaped, kl, {BASELINE: baseline.mean().item()}), **extra}
        metrics = {**distributed.mean_over_ranks(metrics, weight=rewards.numel()), **(extra_metrics or {})}
        per_sample = advantages if advantages.dim() == 1 else masked_mean(advantages, loss_mask, dim=-1)
        samples = sample_rows(self.step + 1, "train", prompts, gen, rewards, kl, per_sample)
        rollout = Rollout(
            batch=batch,
            loss_mask=loss_mask,
            advantages=advantages,
            metrics=metrics,
            samples=samples,
            engine_logprobs=gen.logprobs,
            old_logprobs=trainer_logprobs if self._reuses_rollouts else None,
            ref_logprobs=ref_logprobs if cfg.kl_in == "loss" else None,
        )
        if rollout.old_logprobs is not None:  # the mismatch over every sample (else the first pass measures it)
            rollout.stats.add_mismatch(rollout.old_logprobs, gen.logprobs, gen.response_mask)
        return rollout

    def _advantages(self, scored, shaped, gen: GenerationOutput, logprobs, ref_logprobs, loss_mask):
        """(advantages: [B], or [B, T] for reinforce_pp; the baseline [B]) of the rewards as scored (with any
        overlong penalty) and as shaped by the KL (kl_in: reward)."""
        cfg = self.config.reinforce
        if cfg.advantage_estimator == "reinforce_pp":
            # Per-token rewards (the KL folded in per token), returns whitened over every rank's valid tokens.
            coef = cfg.initial_policy_kl_penalty
            returns = reinforce_pp_returns(scored, logprobs, ref_logprobs, loss_mask, coef, cfg.kl_estimator)
            return distributed.global_masked_whiten(returns, loss_mask), torch.zeros_like(shaped)
        if cfg.baseline == "rloo":
            baseline = rloo_baseline(shaped, gen.group_ids, gen.is_end)
        elif cfg.baseline == "group_mean":  # the group's mean, the sample's own reward where it has no group
            baseline = shaped - grpo_advantages(shaped, gen.group_ids, gen.is_end, "group_mean", "none")
        else:
            baseline = torch.zeros_like(shaped)
        advantages = advantages_from_baseline(shaped, baseline)
        if cfg.scale_rewards == "group":
            advantages = grpo_advantages(shaped, gen.group_ids, gen.is_end, cfg.baseline, "group")
        elif cfg.scale_rewards == "batch":  # the std of every rank's rewards, as one process would take it
            std = distributed.global_std(shaped[gen.is_end.bool()])
            if std > 0:
                advantages = advantages / (std + REWARD_STD_EPS)
        if cfg.normalize_advantages:
            advantages = distributed.global_whiten(advantages)  # over the global batch, as one process would
        return advantages, baseline

    # ----------------------------------------------------------------------------------------------- async rollouts
    def _rollout_ahead(self, total: int) -> tuple[dict[str, Any], Rollout]:
        """trainer.async_rollouts: this step's rollout from the samples generated during the previous step's update
        (generated now at a launch's first step), after starting the next step's in the background. Returns the
        sampler's position before this step's prompts were drawn, where a dropped step goes back to."""
        if self.ahead is None:
            self.ahead = self._generate_in_background(self.step)
        ahead, self.ahead = self.ahead, None
        with self.timers.time(TIMER_GENERATE_WAIT):
            gen, seconds = ahead.future.result()
        self.timers.add(TIMER_GENERATE, seconds)
        rollout = self._score_rollout(ahead.prompt_indices, gen, self.train_data)
        if self.step + 1 < total:
            # The engine still holds the weights before this step's update: the next samples are one update behind.
            self.ahead = self._generate_in_background(self.step + 1)
        return ahead.position, rollout

    def _generate_in_background(self, step: int) -> PendingGeneration:
        """Draw step `step`'s prompts and start sampling this rank's share of them, with that step's noise, on the
        background thread (the generator's own copy of the weights: the training module may change meanwhile)."""
        if self._background is None:
            self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aligner-rollouts")
        position = self.sampler.state_dict()
        share = distributed.shard(self.sampler.next_batch(self.config.reinforce.num_prompts_per_step))
        prompts = [self.train_data.token_ids[i] for i in share]
        k, seed = self.config.reinforce.num_rollouts_per_prompt, self._sampling_seed(step)

        # On CUDA the samples are generated on a stream of their own: on the default stream their kernels would queue
        # behind (and in front of) the update's, and nothing would overlap.
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

        def generate() -> tuple[GenerationOutput, float]:
            started = time.perf_counter()
            with (
                torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(),
                bf16_emulation(self.config.model.precision, self.device),
            ):
                gen = self.generator.generate(prompts, k, seed)
            if stream is not None:
                stream.synchronize()  # its tensors are complete before the training thread reads them
            return gen, time.perf_counter() - started

        return PendingGeneration(position, share, self._background.submit(generate))

    def _push_weights(self) -> None:
        """The generator takes the policy's new weights, once the samples it is generating (async) are done."""
        if self.ahead is not None:
            with self.timers.time(TIMER_GENERATE_WAIT):
                wait_for([self.ahead.future])
        with self.timers.time(TIMER_REFIT):
            self.backend.refit(self.generator)

    def _ahead_state(self) -> dict[str, Any] | None:
        """The next step's samples for a checkpoint (done: `_push_weights` waited for them), or None."""
        if self.ahead is None:
            return None
        gen, _ = self.ahead.future.result()
        return {"position": self.ahead.position, "prompt_indices": self.ahead.prompt_indices, "generation": gen}

    def _restore_ahead(self, per_rank: list[dict[str, Any] | None] | None) -> None:
        """The checkpoint's next-step samples become this run's, so a resumed async run trains on what the
        uninterrupted one would. Without async rollouts, or with another number of processes, they are dropped and the
        sampler goes back to draw their prompts again."""
        self.ahead = None
        mine = per_rank[distributed.rank()] if per_rank and len(per_rank) == distributed.world_size() else None
        if mine is not None and self.config.trainer.async_rollouts:
            done: Future = Future()
            done.set_result((mine["generation"], 0.0))
            self.ahead = PendingGeneration(mine["position"], mine["prompt_indices"], done)
        elif per_rank and per_rank[0] is not None:
            self.sampler.load_state_dict(per_rank[0]["position"])  # the position is global: every rank's is the same

    def _stop_background(self) -> None:
        if self.ahead is not None:
            wait_for([self.ahead.future])
        if self._background is not None:
            self._background.shutdown(wait=True)
            self._background = None

    # ----------------------------------------------------------------------------------------------- optimise
    def optimise(self, rollout: Rollout) -> dict[str, float]:
        """`reinforce.num_epochs` passes over the rollout, each `reinforce.num_mini_batches` AdamW steps over
        consecutive mini-batches (advantages computed once), each over micro-batches with gradient accumulation; the
        LR schedule moves once."""
        if self.backend.steps_itself:
            return self._optimise_whole(rollout)
        cfg = self.config.reinforce
        self.backend.trained.train()
        lr = self.optimizer.param_groups[0]["lr"]
        losses, grad_norms = [], []
        with self.timers.time(TIMER_TRAIN):
            for epoch in range(cfg.num_epochs):
                for index, mini in enumerate(self._mini_batches(rollout.advantages.shape[0])):
                    # Until the first optimiser step the weights are the ones that sampled (the proximal policy).
                    fresh = epoch == 0 and index == 0
                    loss = self._accumulate_gradients(rollout, mini, fresh)
                    losses.append(distributed.all_reduce_sum(torch.tensor(loss, device=self.device)).item())
                    grad_norms.append(self.backend.step(self.optimizer, self.config.optim.max_grad_norm))
            self.scheduler.step()
        self._push_weights()
        metrics = {
            LOSS: sum(losses) / len(losses),
            GRAD_NORM: sum(grad_norms) / len(grad_norms),
            LR: lr,
        }
        ratio, correction = cfg.policy_loss != "reinforce", cfg.rollout_correction != "none"
        return {**metrics, **rollout.stats.metrics(self.device, ratio, correction)}

    def _mini_batches(self, local_size: int) -> list[slice]:
        """This rank's rows of each of the `reinforce.num_mini_batches` consecutive mini-batches of the GLOBAL rollout
        (ranks hold consecutive shares of it), so the steps are those of one process; a slice may be empty, every
        rank still takes part in each (collective) step."""
        sizes = distributed.all_gather_objects(local_size)
        offset, total = sum(sizes[: distributed.rank()]), sum(sizes)
        n = self.config.reinforce.num_mini_batches
        bounds = [round(total * k / n) for k in range(n + 1)]
        return [
            slice(min(max(a - offset, 0), local_size), min(max(b - offset, 0), local_size))
            for a, b in zip(bounds, bounds[1:])
        ]

    def _accumulate_gradients(self, rollout: Rollout, mini: slice, fresh: bool = True) -> float:
        """Backward of the loss of the rollout's rows `mini` (this rank's part of a global mini-batch), micro-batch by
        micro-batch; returns this rank's share of the mini-batch's loss.

        Every micro-batch of every rank divides by a count over the whole global mini-batch (tokens for token_mean,
        samples with a token for seq_mean, micro-batches for nemo), so the gradients summed over micro-batches and
        ranks are the mini-batch's, the same as one process computing it alone.

        The proximal log-probs (the ratio's denominator, policy_loss clip / cispo) are the rollout's `old_logprobs`,
        or, on the one pass over unchanged weights, this forward's own, detached. reinforce.rollout_correction
        weighs each token by its importance weight of the proximal against the engine's log-probs; `fresh` (no
        optimiser step yet this rollout) lets the pass measure the engine-trainer mismatch on its way."""
        cfg = self.config.reinforce
        aggregation = cfg.loss_aggregation
        loss_mask, advantages = rollout.loss_mask[mini], rollout.advantages[mini]
        engine = None if rollout.engine_logprobs is None else rollout.engine_logprobs[mini]
        old = None if rollout.old_logprobs is None else rollout.old_logprobs[mini]
        whole = mini.start == 0 and mini.stop == rollout.advantages.shape[0]
        micro = []
        if advantages.numel():
            micro = list(self._micro_batches(rollout.batch if whole else rollout.batch.subset(mini)))
        if aggregation == "token_mean":
            count = loss_mask.sum()
        elif aggregation in ("seq_mean", "seq_mean_token_sum"):
            count = (loss_mask.sum(-1) > 0).sum()
        elif aggregation == "seq_mean_token_sum_norm":  # Dr.GRPO: every row, times a constant length (below)
            count = torch.tensor(loss_mask.shape[0], device=loss_mask.device)
        else:  # nemo: each micro-batch's mean over its rows, averaged over the global number of micro-batches
            count = torch.tensor(len(micro), device=loss_mask.device)
        count = distributed.all_reduce_sum(count.float()).clamp(min=1)
        ref = rollout.ref_logprobs[mini] if rollout.ref_logprobs is not None else None
        total = 0.0
        for rows, sub in self.backend.passes(micro):
            with self.training_autocast():
                logprobs = grouped_response_logprobs(self.backend.trained, sub)
            width = logprobs.shape[1]
            sub_mask = loss_mask[rows, :width]
            normalizer = count * sub_mask.shape[0] if aggregation == "nemo" else count
            proximal = logprobs.detach() if old is None else old[rows, :width]
            sub_engine = None if engine is None else engine[rows, :width]
            if fresh and old is None and sub_engine is not None:
                rollout.stats.add_mismatch(proximal, sub_engine, sub.response_mask)
            weights = None
            if cfg.rollout_correction != "none" and sub_engine is not None:
                weights, stats = rollout_correction_weights(
                    proximal,
                    sub_engine,
                    sub_mask,
                    cfg.rollout_correction,
                    cfg.rollout_correction_level,
                    cfg.rollout_correction_cap,
                    cfg.rollout_correction_min,
                )
                units = sub_mask.sum() if cfg.rollout_correction_level == "token" else (sub_mask.sum(-1) > 0).sum()
                rollout.stats.add_correction(stats, units.item())
            loss = self._loss(logprobs, proximal, advantages[rows], sub_mask, normalizer, weights, ref, rows, rollout)
            loss.backward()
            total += loss.item()
        return total

    def _loss(self, logprobs, proximal, advantages, mask, normalizer, weights, ref_logprobs, rows, rollout):
        """One micro-batch's share of the loss: REINFORCE's (`reinforce_loss`), or, for policy_loss clip / cispo,
        the GRPO family's aggregations or `kl_in: loss`, the per-token terms (-A log pi, or the clipped ratio's,
        `per_token_policy_loss`) plus the coefficient times the per-token KL to the reference (`kl_loss_term`),
        aggregated alike (`aggregate_loss`; Dr.GRPO's constant length is generation.max_new_tokens)."""
        cfg = self.config.reinforce
        width = logprobs.shape[1]
        if advantages.dim() == 2:  # per token (reinforce_pp)
            advantages = advantages[:, :width]
        ratio = cfg.policy_loss != "reinforce"
        if not ratio and ref_logprobs is None and cfg.loss_aggregation in LOSS_AGGREGATIONS:
            return reinforce_loss(logprobs, advantages, mask, cfg.loss_aggregation, normalizer, weights)
        if ratio:
            per_token, stats = per_token_policy_loss(
                logprobs,
                proximal,
                advantages,
                mask,
                cfg.policy_loss,
                cfg.epsilon_low,
                cfg.epsilon_high,
                cfg.dual_clip,
                cfg.importance_level,
            )
            rollout.stats.add_ratio(stats, mask.sum().item())
        else:
            per_token = -logprobs * advantages.detach().to(logprobs.dtype)[:, None]
        if weights is not None:
            per_token = per_token * weights
        if ref_logprobs is not None:
            reference = ref_logprobs[rows, :width]
            coef = cfg.initial_policy_kl_penalty
            per_token = per_token + kl_loss_term(logprobs, reference, mask, coef, cfg.kl_estimator)
        horizon = self.config.generation.max_new_tokens
        return aggregate_loss(per_token, mask, cfg.loss_aggregation, normalizer, horizon)

    def _optimise_whole(self, rollout: Rollout) -> dict[str, float]:
        """The same step taken by a backend that runs it whole (Megatron's pipeline schedule), then the refit."""
        lr = self.optimizer.param_groups[0]["lr"]
        with self.timers.time(TIMER_TRAIN):
            metrics = self.backend.reinforce_step(self.optimizer, rollout, self.config.reinforce.loss_aggregation)
            self.scheduler.step()
        self._push_weights()
        return {**metrics, LR: lr}

    # ----------------------------------------------------------------------------------------------- validate
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Rewards of one sample per fixed validation prompt, with the same sampling noise every time; also each
        of validation.extra_rewards' (val/extra_rewards/<name>, and in the samples' rows)."""
        n = min(self.config.trainer.num_val_prompts or len(self.val_data), len(self.val_data))
        indices = distributed.shard(list(range(n)))  # may be empty on some ranks when n < processes
        rows, metrics = [], {}
        if indices:
            seed = self.config.seed * 1_000_003 + VALIDATION_SEED_OFFSET + distributed.dp_rank() * RANK_SEED_STRIDE
            k = self.config.validation.num_samples_per_prompt
            gen = self.generator.generate([self.val_data.token_ids[i] for i in indices], k, seed)
            prompts, future = self._score(gen, self.val_data, indices)
            extra_futures = {
                name: self._submit(client, gen, self.val_data, indices)[1]
                for name, client in self.extra_reward_clients.items()
            }
            ref = self._logprobs(self.reference.logprobs, gen.response_batch())
            kl = kl_penalty(gen.logprobs, ref, gen.response_mask, estimator=self.config.reinforce.kl_estimator)
            rewards = future.result()
            extra = {name: f.result() for name, f in extra_futures.items()} or None
            rows = sample_rows(self.step, "validation", prompts, gen, rewards, kl, None, extra)
            metrics = {
                VAL_REWARD: rewards.mean().item(),
                VAL_RESPONSE_LENGTH: gen.response_lengths.float().mean().item(),
                VAL_PROPERLY_ENDED: gen.is_end.float().mean().item(),
                **{gold_reward(name): values.mean().item() for name, values in (extra or {}).items()},
            }
            if k > 1:
                metrics.update(pass_metrics(rewards, gen.group_ids, k, self.config.validation.pass_threshold))
        self.log.log_samples(distributed.gather_rows(rows))
        metrics = distributed.mean_over_ranks(metrics, weight=len(indices))
        if self.config.trainer.best_metric in metrics:
            self.last_validation = (self.step, metrics[self.config.trainer.best_metric])
        return metrics

    # ----------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """Policy (the backend's part: HF folder, adapters or shards, and optimiser), scheduler, RNG states, data
        position and counters, written atomically."""
        final = self.run_dir / CHECKPOINT_DIR / checkpoint_name(self.step)
        tmp = final.with_name(final.name + ".tmp")
        rng_per_rank = distributed.all_gather_objects(rng_state())
        ahead_per_rank = distributed.all_gather_objects(self._ahead_state())
        self._update_best()
        if distributed.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        distributed.barrier()
        with writing_checkpoint(tmp, self.step):
            backend_state = self.backend.save(tmp, self.optimizer, self.tokenizer)  # every rank writes its part
        new_best = self.best is not None and self.best["step"] == self.step  # alike on every rank
        best_tmp = self.run_dir / (BEST_POLICY_DIR + ".tmp")
        if new_best:  # every rank: the export gathers shards
            if distributed.is_main():
                shutil.rmtree(best_tmp, ignore_errors=True)
            distributed.barrier()
            self.backend.export(best_tmp, self.tokenizer)
        distributed.barrier()
        if not distributed.is_main():
            distributed.barrier()
            return final
        with writing_checkpoint(tmp, self.step):
            state = {
                "step": self.step,
                **backend_state,  # which backend wrote it, and the optimiser's state (or where each rank's is)
                "scheduler": self.scheduler.state_dict(),
                "sampler": self.sampler.state_dict(),
                "rng": rng_per_rank[0],
                "rng_per_rank": rng_per_rank,
                "best": self.best,
                # async rollouts: each rank's samples for the next step, already generated one update behind.
                "ahead_per_rank": ahead_per_rank,
            }
            self._save_extra(tmp)
            torch.save(state, tmp / STATE_FILE)
            save_config(self.config, tmp / "config.yaml")
            # After the barrier above every rank's file is in `tmp`: the manifest covers them all.
            commit_checkpoint(tmp, final)
        if new_best:
            write_json_atomic(final.parent / BEST_FILE, {**self.best, "path": final.name})
            shutil.rmtree(self.run_dir / BEST_POLICY_DIR, ignore_errors=True)
            replace_durably(best_tmp, self.run_dir / BEST_POLICY_DIR)
        keep = self.config.trainer.keep_checkpoints
        if keep:
            best = self.best and final.with_name(checkpoint_name(self.best["step"]))
            for old in [c for c in list_checkpoints(self.run_dir)[:-keep] if c != best]:
                shutil.rmtree(old, ignore_errors=True)
        distributed.barrier()  # no rank goes on (or exits) before the checkpoint is complete
        return final

    def _validated_new_best(self) -> bool:
        """Whether this step's validation beats the best (by trainer.best_metric; a best of another metric, from a
        checkpoint of a run that steered by it, is beaten by any value)."""
        if self.last_validation is None or self.last_validation[0] != self.step:
            return False
        best = None if self.best is None else self.best.get(self.config.trainer.best_metric)
        return best is None or self.last_validation[1] > best

    def _update_best(self) -> None:
        """The checkpoint being saved becomes the best when it was validated at this step and beats the best."""
        if self._validated_new_best():
            self.best = {"step": self.step, self.config.trainer.best_metric: self.last_validation[1]}

    def _reached_goal(self, metrics: dict[str, float]) -> bool:
        """trainer.stop_at_metric reached stop_at_value at this step's validation (the same on every rank)."""
        cfg = self.config.trainer
        value = metrics.get(cfg.stop_at_metric) if cfg.stop_at_metric else None
        return value is not None and value >= cfg.stop_at_value

    def _save_extra(self, folder: Path) -> None:
        """Hook for subclasses: write more into the checkpoint folder before it is complete (PPO: the critic)."""

    def _intact_checkpoint(self) -> tuple[int | None, Path | None]:
        """(step, folder) of the newest intact checkpoint, verified once (PPO asks before `setup` does). Rank 0
        verifies it (reading every file) and sets damaged ones aside; the other ranks take its answer."""
        if self._intact is None:
            found = resume_checkpoint(self.run_dir) if distributed.is_main() else None
            step, path, skipped = distributed.all_gather_objects(found)[0]
            self.skipped_checkpoints += skipped
            self._intact = (step, path)
        return self._intact

    def _resume(self) -> None:
        """Load the newest checkpoint that is intact and can be loaded; each damaged one is set aside for the one
        before, or for the beginning when none is left."""
        while True:
            step, path = self._intact_checkpoint()
            if path is None:
                break
            try:
                loaded, error = self._read_checkpoint(path), None
            except UnreadableCheckpoint as err:
                loaded, error = None, str(err)
            # Agreed before anything is restored: one rank restoring a checkpoint another cannot read would leave
            # the ranks on different states.
            errors = [e for e in distributed.all_gather_objects(error) if e]
            if not errors:
                self._apply_checkpoint(path, loaded)
                self.resumed_from = path
                break
            if distributed.is_main():
                set_aside(path)
            self.skipped_checkpoints.append((step, errors[0]))
            self._intact = None
        if distributed.is_main():
            resume_step = self.step if self.resumed_from else None
            for step, reason in self.skipped_checkpoints:
                print(f"WARNING: {damaged_message(step, reason, resume_step)}", file=sys.stderr)
            drop_best_after(self.run_dir, resume_step, self.best)

    def _read_checkpoint(self, path: Path) -> dict[str, Any]:
        """Every file of checkpoint `path` this rank needs, read before anything is restored: a file that cannot be
        loaded (`UnreadableCheckpoint`) leaves the trainer as it was, for the checkpoint before."""
        with reading(STATE_FILE):
            state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
        return {"state": state, "backend": self.backend.read(path, state)}

    def _apply_checkpoint(self, path: Path, loaded: dict[str, Any]) -> None:
        state = loaded["state"]
        self.backend.apply(path, loaded["backend"], self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self._restore_ahead(state.get("ahead_per_rank"))
        per_rank = state.get("rng_per_rank", [])
        # Each rank continues its own random streams; with another number of processes, rank 0's are used.
        set_rng_state(per_rank[distributed.rank()] if len(per_rank) == distributed.world_size() else state["rng"])
        self.step = state["step"]
        self.best = state.get("best")
        if distributed.is_main():
            print(f"resumed from {path} at step {self.step}", file=sys.stderr)
