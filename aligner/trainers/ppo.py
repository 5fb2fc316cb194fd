"""The PPO trainer: NeMo-Aligner's actor-critic RLHF loop, on the REINFORCE trainer's machinery.

    aligner train --config demo_assets/ppo.yaml            # starts its own critic server (critic.model_path)
    aligner train --config demo_assets/ppo.yaml --resume   # the critic restarts from the checkpoint's critic

`algorithm: ppo` in a config picks this trainer; everything but the rollout and the update is `ReinforceTrainer`'s
(data, generation, reference, validation, checkpoints, signals, metrics). A step: sample responses, send the
[prompt | response] rows to the critic server's critic_infer (values, and rewards with critic.use_critic_rewards)
and compute the reference log-probs while it works, then the per-token rewards with the KL penalty, GAE advantages
and returns (aligner/algorithms/ppo.py), and one update of each side: the actor on the clipped-ratio loss over the
rollout in micro-batches (one optimiser step, NeMo-Aligner's default of one PPO epoch; truncated samples left out,
`ppo.exclude_truncated`, as NeMo's is_end mask does), the critic by one critic_train request that runs on the server
while the actor trains. The first `ppo.critic_warmup_steps` steps train the critic only (NeMo-Aligner's critic
warmup; here they are counted steps, checkpointed like any other). A checkpoint holds the critic too
(`<checkpoint>/critic/critic.pt`, written by the server through critic_save), so a resumed run is exact.

The critic server is either started here from `critic.model_path` (and stopped at the end), or external
(`critic.server_url`, as the service's worker runs it); an external one must be restarted from the critic of the
checkpoint the resume takes before a --resume (`critic_checkpoint(run_dir, step)`, step from
`run_layout.resume_checkpoint`, which sets damaged newer checkpoints aside).

Under torchrun (data parallel, as REINFORCE: `distributed.py`) one critic server serves every rank: rank 0 starts
it (or all use `critic.server_url`). Each rank sends critic_infer for its own share of the samples (the server
batches concurrent requests); for critic_train the ranks gather their rows on rank 0, which sends the global batch
as one request, so the critic takes the step one process would take. The actor's loss in each mini-batch is
divided by the mini-batch's global token count and the gradients are summed over ranks; advantages are whitened
over the global batch. With `ppo.num_mini_batches: 1` (the default) 2 ranks take the 1-process update to float
rounding; with more, mini-batch j is the union of every rank's j-th slice of its share (NeMo-Aligner's data
parallelism), not the j-th slice of the global batch. Only rank 0 saves the critic.
"""

from __future__ import annotations

import atexit
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aligner import distributed
from aligner.algorithms.ppo import (
    entropy_from_logits,
    gae,
    normalize_advantages,
    per_token_rewards,
    ppo_actor_loss,
)
from aligner.algorithms.reinforce import kl_penalty, masked_mean, response_loss_mask
from aligner.data.prompts import PromptDataset
from aligner.errors import ConfigError, CriticServerUnavailableError, ServerUnavailableError
from aligner.generation.generator import GenerationOutput
from aligner.metrics import (
    CLIP_FRACTION,
    CRITIC_LOSS,
    CRITIC_WARMUP,
    ENTROPY,
    GRAD_NORM,
    LOSS,
    LR,
    RETURNS,
    TIMER_CRITIC_INFER,
    TIMER_CRITIC_TRAIN,
    TIMER_REWARD,
    TIMER_TRAIN,
    TRAIN_REWARD_WITH_KL_SUM,
    VALUES,
)
from aligner.modeling.batches import ResponseBatch
from aligner.modeling.device import resolve_device
from aligner.modeling.logprobs import grouped_response_logits, token_logprobs
from aligner.redact import redact_url
from aligner.rewards.critic_client import RemoteCriticClient
from aligner.rewards.http import RetrySettings
from aligner.run_layout import CRITIC_DIR, CRITIC_LOG, checkpoint_steps, critic_checkpoint
from aligner.trainers.reinforce import ReinforceTrainer
from aligner.trainers.rollout import rollout_metrics, sample_prompt_indices, sample_rows


@dataclass
class PPORollout:
    """One step's samples with everything both updates need; [B, T] tensors are over the response tokens."""

    batch: ResponseBatch
    mask: torch.Tensor  # [B, T] float, valid response tokens
    loss_mask: torch.Tensor  # [B, T] float, the tokens of the actor loss (without truncated samples by default)
    old_logprobs: torch.Tensor  # the sampling policy's
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor  # the critic's at rollout time (prev_values of critic_train)
    critic_tokens: torch.Tensor  # [B, S] [prompt | response] rows, right-padded, as the critic reads them
    critic_lengths: torch.Tensor  # [B]
    positions: torch.Tensor  # [B, T] column of critic_tokens whose value belongs to each response token
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)


def critic_rows(gen: GenerationOutput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [B, S], lengths [B], positions [B, T]): the samples as right-padded [prompt | response] rows.

    The value of response token j is the critic's value of the prefix before it, `values[b, P_b + j - 1]` (P_b the
    prompt's length), the state in which the policy chose that token.
    """
    ids = torch.cat([gen.prompt_ids, gen.response_ids], dim=1).cpu()
    valid = torch.cat([gen.prompt_mask, gen.response_mask], dim=1).cpu()
    # A stable sort of the padding flags moves each row's real tokens to its front, in order.
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    lengths = valid.sum(1)
    width = int(lengths.max())
    tokens = (ids.gather(1, order) * valid.gather(1, order))[:, :width]
    prompt_lengths = gen.prompt_mask.sum(1).cpu()
    t = gen.response_ids.shape[1]
    positions = (prompt_lengths[:, None] - 1 + torch.arange(t)[None, :]).clamp(0, width - 1)
    return tokens, lengths, positions


class PPOTrainer(ReinforceTrainer):
    def __init__(self, config):
        super().__init__(config)
        self.critic: RemoteCriticClient | None = None
        self.critic_process = None
        self._warned_critic_elsewhere = False
        self._critic_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="critic")

    # ----------------------------------------------------------------------------------------------- setup
    def setup(self, resume: bool = False) -> None:
        cfg = self.config
        if cfg.algorithm != "ppo":
            raise ConfigError(f"PPOTrainer runs algorithm: ppo configs; this one has algorithm: {cfg.algorithm}")
        self._take_run_dir(resume)  # before a critic server starts for a run that cannot go on here
        # The ranks agree on the checkpoint to resume and on who starts the critic server: the group comes first.
        distributed.init(resolve_device(cfg.model.device))
        # The newest intact checkpoint (verified once: the base setup resumes from it), whose critic the server
        # restores.
        step = self._intact_checkpoint()[0] if resume and checkpoint_steps(self.run_dir) else None
        checkpoint = self._critic_of(step)
        launching = None
        if not cfg.critic.server_url and distributed.is_main():
            # The server loads its models while this process loads its own: the two startups overlap. Launched from
            # the long-lived critic thread: the server is tied to the life of the thread that started it
            # (PR_SET_PDEATHSIG in launch_critic_server), and that thread lives until `close`.
            launching = self._critic_pool.submit(self._launch_critic, checkpoint)
        try:
            super().setup(resume=resume)
            url = launching.result() if launching else cfg.critic.server_url
            resumed = self.step if self.resumed_from else None
            if resumed != step:
                # That checkpoint could not be loaded: the policy resumed from an older one, and so must the critic.
                checkpoint = self._critic_of(resumed)
                if launching is not None:
                    self._stop_critic_server()
                    url = self._critic_pool.submit(self._launch_critic, checkpoint).result()
            url = distributed.all_gather_objects(url)[0]  # rank 0's server serves every rank
            self.critic = RemoteCriticClient(
                url,
                retry=RetrySettings.of(cfg.critic),
                on_wait=self._server_wait,
            )
            if cfg.critic.use_critic_rewards and not self.critic.serves_rewards:
                raise ConfigError(
                    f"critic.use_critic_rewards: the critic server at {url} serves no rewards "
                    "(start it with combine_rm_and_critic_server: true)"
                )
        except BaseException:
            if launching is not None:
                launching.exception()  # a server still starting is stopped once it is up
            self.close()
            raise
        if checkpoint is not None and cfg.critic.server_url and distributed.is_main():
            print(
                f"WARNING: resuming with the external critic server {redact_url(cfg.critic.server_url)}: it must "
                f"have been restarted from {checkpoint} (aligner serve-critic --checkpoint {checkpoint}), or the "
                "critic does not continue where the policy does",
                file=sys.stderr,
            )

    def _critic_of(self, step: int | None) -> Path | None:
        """The critic saved with checkpoint `step` (None: none, a fresh critic)."""
        if step is None:
            return None
        checkpoint = critic_checkpoint(self.run_dir, step)
        if checkpoint is None:
            raise ConfigError(f"checkpoint step {step} in {self.run_dir} has no {CRITIC_DIR}/: not a PPO checkpoint")
        return checkpoint

    def _launch_critic(self, checkpoint: Path | None) -> str:
        from aligner.servers.launch import launch_critic_server

        cfg = self.config.critic
        proc, url = launch_critic_server(
            cfg.model_path,
            self.run_dir / CRITIC_LOG,
            checkpoint=checkpoint,
            overrides=cfg.server_overrides,
            save_root=self.run_dir.resolve(),  # this run's server writes this run's checkpoints only
        )
        self.critic_process = proc
        atexit.register(self.close)  # a run that dies without fit's cleanup must not leave the server behind
        return url

    def close(self) -> None:
        """Stop the critic client, and the critic server if this trainer started it (idempotent)."""
        if self.critic is not None:
            self.critic.close()
            self.critic = None
        self._stop_critic_server()

    def _stop_critic_server(self) -> None:
        from aligner.servers.launch import stop_server

        if self.critic_process is not None:
            stop_server(self.critic_process)
            self.critic_process = None

    def request_stop(self) -> None:
        super().request_stop()
        self._stop_waiting(self.critic)

    def fit(self, until_step: int | None = None) -> None:
        try:
            super().fit(until_step)
        finally:
            self.close()

    # ----------------------------------------------------------------------------------------------- rewards
    def _score(
        self,
        gen: GenerationOutput,
        data: PromptDataset,
        prompt_indices: list[int],
        critic_future: Future | None = None,
    ):
        """With critic.use_critic_rewards the rewards are the critic server's: from `critic_future` (a critic_infer
        of these samples under way), else from a request of their own."""
        if not self.config.critic.use_critic_rewards:
            return super()._score(gen, data, prompt_indices)
        if critic_future is None:
            tokens, lengths, _ = critic_rows(gen)
            critic_future = self.critic.infer(tokens, lengths)
        prompts = [data.texts[i] for i in sample_prompt_indices(gen, prompt_indices)]
        return prompts, _then(critic_future, lambda out: out[1])

    # ----------------------------------------------------------------------------------------------- rollout
    def rollout(self, prompt_indices: list[int], data: PromptDataset) -> PPORollout:
        cfg, ppo = self.config, self.config.ppo
        prompt_indices, gen = self._generate_share(prompt_indices, data)
        tokens, lengths, positions = critic_rows(gen)
        critic_future = self.critic.infer(tokens, lengths)  # runs on the server during the log-prob work below
        if cfg.critic.use_critic_rewards:  # the rewards come with the values
            prompts, reward_future = self._score(gen, data, prompt_indices, critic_future)
        else:
            with self.timers.time(TIMER_REWARD):
                prompts, reward_future = self._score(gen, data, prompt_indices)
        batch = gen.response_batch()
        logprobs, ref_logprobs, _ = self._policy_and_reference_logprobs(gen, batch)
        with self.timers.time(TIMER_CRITIC_INFER):
            all_values, _ = critic_future.result()
        with self.timers.time(TIMER_REWARD):
            rewards = reward_future.result().to(logprobs.device)

        mask = gen.response_mask.float()
        values = all_values.gather(1, positions).to(logprobs.device) * mask
        token_rewards = per_token_rewards(
            rewards, logprobs, ref_logprobs, mask, ppo.initial_policy_kl_penalty, ppo.use_absolute_kl
        )
        advantages, returns = gae(token_rewards, values, mask, ppo.discount_factor, ppo.gae_lambda)
        if ppo.normalize_advantages:
            advantages = global_normalize_advantages(advantages, mask)
        kl = kl_penalty(logprobs, ref_logprobs, mask, absolute=ppo.use_absolute_kl)
        # Means over tokens are weighted by tokens over ranks, means over samples by samples.
        token_means = distributed.mean_over_ranks(
            {
                VALUES: masked_mean(values, mask).item(),
                RETURNS: masked_mean(returns, mask).item(),
            },
            weight=mask.sum().item(),
        )
        metrics = rollout_metrics(
            gen,
            rewards,
            # NeMo-Aligner's rewards_with_kl: each sample's per-token rewards averaged over its tokens.
            masked_mean(token_rewards, mask, dim=-1),
            kl,
            {TRAIN_REWARD_WITH_KL_SUM: token_rewards.sum(-1).mean().item(), **token_means},
        )
        metrics = distributed.mean_over_ranks(metrics, weight=rewards.numel())
        sample_advantages = masked_mean(advantages, mask, dim=-1)
        return PPORollout(
            batch=batch,
            mask=mask,
            loss_mask=response_loss_mask(mask, gen.is_end, ppo.exclude_truncated),
            old_logprobs=logprobs,
            advantages=advantages,
            returns=returns,
            values=values,
            critic_tokens=tokens,
            critic_lengths=lengths,
            positions=positions,
            metrics=metrics,
            samples=sample_rows(self.step + 1, "train", prompts, gen, rewards, kl, sample_advantages),
        )

    # ----------------------------------------------------------------------------------------------- optimise
    @staticmethod
    def _critic_train_rows(rollout: PPORollout) -> list[torch.Tensor]:
        """[tokens, lengths, returns, prev_values, mask] of critic_train for the rollout, targets moved from
        response columns to the critic's row columns; under torchrun every rank's, concatenated on rank 0 in rank
        order (rows right-padded to the widest, as one process would pad the global batch), [] on the others."""

        def to_rows(per_token: torch.Tensor) -> torch.Tensor:
            # Padding columns land on positions no valid token uses (past each row's last state), as zeros.
            out = torch.zeros(rollout.critic_tokens.shape)
            return out.scatter_(1, rollout.positions, (per_token * rollout.mask).float().cpu())

        mine = [
            rollout.critic_tokens,
            rollout.critic_lengths,
            *map(to_rows, (rollout.returns, rollout.values, rollout.mask)),
        ]
        if distributed.world_size() == 1:
            return mine
        parts = distributed.all_gather_objects(mine)
        if not distributed.is_main():
            return []
        width = max(p[0].shape[1] for p in parts)

        def widen(x: torch.Tensor) -> torch.Tensor:
            return x if x.ndim == 1 else torch.nn.functional.pad(x, (0, width - x.shape[1]))

        return [torch.cat([widen(p[i]) for p in parts]) for i in range(len(mine))]

    def optimise(self, rollout: PPORollout) -> dict[str, float]:
        # Gathered here, in the main thread: collectives from two threads at once could pair up wrongly over ranks.
        rows = self._critic_train_rows(rollout)
        # The critic trains on its server while the actor trains here.
        critic_step = self._critic_pool.submit(self.critic.train, *rows) if rows else None
        if self.step < self.config.ppo.critic_warmup_steps:
            return self._critic_only(critic_step)
        metrics = self._optimise_actor(rollout)
        metrics[CRITIC_LOSS] = self._critic_loss(critic_step)
        return metrics

    def _critic_loss(self, critic_step: Future | None) -> float:
        """The critic step's loss, which rank 0 sent for every rank (the others get it from rank 0)."""
        with self.timers.time(TIMER_CRITIC_TRAIN):
            critic_loss = critic_step.result() if critic_step else None
        return distributed.all_gather_objects(critic_loss)[0]

    def _critic_only(self, critic_step: Future | None) -> dict[str, float]:
        """A step of ppo.critic_warmup_steps: the critic trains, the actor's weights, optimiser and learning-rate
        schedule stay as they are (the actor's metrics are left out)."""
        return {
            LR: self.optimizer.param_groups[0]["lr"],
            CRITIC_LOSS: self._critic_loss(critic_step),
            CRITIC_WARMUP: 1.0,
        }

    def _optimise_actor(self, rollout: PPORollout) -> dict[str, float]:
        cfg = self.config
        self.backend.trained.train()
        lr = self.optimizer.param_groups[0]["lr"]
        total = rollout.batch.response_ids.shape[0]
        size = -(-total // min(cfg.ppo.num_mini_batches, total))
        # Every rank takes the same number of optimiser steps (a rank whose share is used up adds nothing).
        steps = int(distributed.max_over_ranks({"steps": -(-total // size)})["steps"])
        losses, grad_norms = [], []
        clip_fraction = entropy_sum = 0.0
        with self.timers.time(TIMER_TRAIN):
            # One optimiser step per mini-batch, in order: after the first, the policy differs from the one that
            # sampled the rollout and the ratio clip takes effect.
            for start in range(0, steps * size, size):
                mini = slice(min(start, total), min(start + size, total))
                batch = rollout.batch.subset(mini)
                mask = rollout.loss_mask[mini]
                # Every token of the global mini-batch's loss weighs the same.
                normalizer = distributed.all_reduce_sum(mask.sum()).clamp(min=1)
                loss_sum = 0.0
                for rows, sub in self.backend.passes(list(self._micro_batches(batch))):
                    with self.training_autocast():
                        logits = grouped_response_logits(self.backend.trained, sub)
                    logprobs = token_logprobs(logits, sub.response_ids)
                    t = logprobs.shape[1]
                    sub_mask = mask[rows, :t]
                    # Entropy needs the whole distribution: computed with a gradient only when it is in the loss.
                    with torch.set_grad_enabled(cfg.ppo.entropy_bonus != 0):
                        entropy = entropy_from_logits(logits)
                    loss, clipped = ppo_actor_loss(
                        logprobs,
                        rollout.old_logprobs[mini][rows, :t],
                        rollout.advantages[mini][rows, :t],
                        sub_mask,
                        cfg.ppo.ratio_eps,
                        entropy,
                        cfg.ppo.entropy_bonus,
                        normalizer,
                    )
                    loss.backward()
                    loss_sum += loss.item()
                    # The clip fraction comes as clipped tokens / normalizer: back to a count, summed over the rollout.
                    clip_fraction += clipped.item() * normalizer.item()
                    entropy_sum += (entropy.detach() * sub_mask).sum().item()
                # The learning rate is the step's: the scheduler moves once, after the last mini-batch.
                grad_norms.append(self.backend.step(self.optimizer, cfg.optim.max_grad_norm))
                losses.append(loss_sum)
            self.scheduler.step()
        self._push_weights()
        # Sums over ranks: the losses (each divided by the global normaliser), clipped tokens, entropy, tokens.
        sums = distributed.all_reduce_sum(
            torch.tensor([*losses, clip_fraction, entropy_sum, rollout.loss_mask.sum().item()], dtype=torch.float64)
        ).tolist()
        losses, (clip_fraction, entropy_sum, tokens) = sums[: len(losses)], sums[len(losses) :]
        tokens = max(tokens, 1.0)
        return {
            LOSS: sum(losses) / len(losses),
            GRAD_NORM: sum(grad_norms) / len(grad_norms),
            LR: lr,
            CRITIC_LOSS: None,  # `optimise` fills it in, keeping the metrics' order
            CLIP_FRACTION: clip_fraction / tokens,
            ENTROPY: entropy_sum / tokens,
        }

    # ----------------------------------------------------------------------------------------------- checkpoints
    def _can_checkpoint_after(self, err: ServerUnavailableError) -> bool:
        # A checkpoint holds the critic, which only its server can write.
        return super()._can_checkpoint_after(err) and not isinstance(err, CriticServerUnavailableError)

    def _save_extra(self, folder: Path) -> None:
        if self.critic.save(str(folder / CRITIC_DIR) + "/") is None and not self._warned_critic_elsewhere:
            # NeMo-Aligner's critic_save takes no path: its server saves where its own config says.
            self._warned_critic_elsewhere = True
            self.log.log_event(
                self.step,
                "the critic server saves its critic where its own config says (NeMo-Aligner's critic_save takes no "
                f"path): checkpoints in {folder.parent} hold no critic, and an exact resume needs that server's save",
                level="warning",
            )


def global_normalize_advantages(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`normalize_advantages` with the mean and variance over the valid tokens of every rank (float64 sums); one
    process: `normalize_advantages` itself."""
    if distributed.world_size() == 1:
        return normalize_advantages(advantages, mask, eps)
    w = (mask > 0).to(torch.float64)
    a = advantages.to(torch.float64)
    stats = distributed.all_reduce_sum(torch.stack([(a * w).sum(), w.sum()]))
    count = stats[1].clamp(min=1)
    mean = stats[0] / count
    var = distributed.all_reduce_sum(((a - mean) ** 2 * w).sum()) / count
    return ((a - mean) * torch.rsqrt(var + eps) * w).to(advantages.dtype)


def _then(future: Future, fn) -> Future:
    """A future of `fn(future.result())`, failing as `future` does."""
    out: Future = Future()

    def done(f: Future) -> None:
        if f.exception() is not None:
            out.set_exception(f.exception())
        else:
            out.set_result(fn(f.result()))

    future.add_done_callback(done)
    return out
