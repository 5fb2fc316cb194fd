"""One rank of the data-parallel equivalence test (tests/aligner/test_distributed.py); rank 0 saves the results.

    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 -m tests.helpers.distributed_worker \
        CFG OUT
    .venv/bin/python -m tests.helpers.distributed_worker CFG OUT     # the 1-process reference
    ... CFG OUT 2            # stop after step 2 (with a checkpoint)
    ... CFG OUT "" resume    # resume from the run's newest checkpoint

Runs `ReinforceTrainer.fit` on the config in CFG (JSON) with a generator whose samples do not depend on how the
prompts are split over ranks, and records the gradient of every optimiser step (after the all-reduce), the final
weights, and the run's metrics and samples.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import torch

from aligner import distributed
from aligner.config import config_from_dict
from aligner.generation.generator import _concat
from aligner.trainers.ppo import PPOTrainer
from aligner.trainers.reinforce import RANK_SEED_STRIDE, ReinforceTrainer
from aligner.trainers.run_log import read_jsonl


class PerPromptGenerator:
    """Samples each prompt alone, seeded by its tokens and the step: the same responses on any rank, in any batch.

    The real generator's noise depends on the batch it samples (and the rank's seed), so 1 and 2 processes would
    draw different responses; this keeps the rollout identical and the comparison about the update alone.
    """

    def __init__(self, inner):
        self.inner = inner

    @property
    def pad_id(self) -> int:
        return self.inner.pad_id

    def update_weights(self, model) -> None:
        self.inner.update_weights(model)

    def generate(self, prompt_ids: list[list[int]], num_samples: int, seed: int):
        base = seed % RANK_SEED_STRIDE  # the step's seed, whichever rank (or dynamic_batching chunk) samples
        parts = [
            self.inner.generate([ids], num_samples, base + zlib.crc32(json.dumps(ids).encode())) for ids in prompt_ids
        ]
        out = _concat(parts, self.inner.pad_id)
        out.group_ids = torch.arange(len(prompt_ids)).repeat_interleave(num_samples)
        return out


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A backend fsdp shard's whole tensor (a collective: every rank calls it), or `tensor` itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def main(config_path: str, out_path: str, until: str = "", resume: str = "") -> None:
    config = config_from_dict(json.loads(Path(config_path).read_text()))
    trainer = (PPOTrainer if config.algorithm == "ppo" else ReinforceTrainer)(config)
    trainer.setup(resume=resume == "resume")
    trainer.generator = PerPromptGenerator(trainer.generator)
    grads = []
    trainer.optimizer.register_step_pre_hook(
        lambda *_: grads.append(
            {n: whole(p.grad).clone() for n, p in trainer.backend.trained.named_parameters() if p.grad is not None}
        )
    )
    trainer.fit(until_step=int(until) if until else None)
    # The trained weights themselves (backend fsdp's whole copy is in the compute dtype); every rank gathers.
    weights = {k: whole(v).clone() for k, v in trainer.backend.trained.state_dict().items()}
    if distributed.is_main():
        torch.save(
            {
                "world_size": distributed.world_size(),
                "grads": grads,
                "weights": weights,
                "metrics": read_jsonl(trainer.run_dir / "metrics.jsonl"),
                "samples": read_jsonl(trainer.run_dir / "samples.jsonl"),
            },
            out_path,
        )
    distributed.finish()


if __name__ == "__main__":
    main(*sys.argv[1:])
    distributed.exit_rank(0)
