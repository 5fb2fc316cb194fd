"""The 2-rank side of tests/aligner/modeling/test_fsdp.py: run under `torchrun --nproc_per_node 2` (gloo, CPU), or
called in one process on a process group of one rank (`init_process_group`).

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m tests.aligner.modeling.fsdp_worker \
        POLICY_DIR OUT_DIR [CHECKPOINT_FROM_ONE_PROCESS]

Each rank writes OUT_DIR/rank<r>.pt (full tensors gathered with `full_weights`, so the ranks' files agree), the
checkpoints and the exported folder under OUT_DIR.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from aligner import distributed
from aligner.modeling import fsdp
from aligner.modeling.batches import ResponseBatch
from aligner.modeling.logprobs import grouped_response_logprobs

LR, EPS = 1e-3, 1e-4  # eps 1e-4: an AdamW update smooth in the gradient, see tests/aligner/test_distributed.py
MAX_GRAD_NORM = 0.05  # low, so clipping acts: a norm miscounted over the shards would change the steps


def fixed_batch(vocab: int = 290) -> tuple[ResponseBatch, torch.Tensor]:
    """3 prompts (left-padded), 6 responses of different lengths (right-padded), and their advantages."""
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(6, vocab, (3, 5), generator=g)
    prompt_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    response_ids = torch.randint(6, vocab, (6, 4), generator=g)
    lengths = torch.tensor([4, 2, 3, 4, 1, 3])
    response_mask = torch.arange(4)[None, :] < lengths[:, None]
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, -0.4])
    return ResponseBatch(prompt_ids, prompt_mask, group, response_ids, response_mask), advantages


def loss_of(model, rows: slice) -> torch.Tensor:
    """REINFORCE token-mean loss of the batch's responses `rows`, divided by the GLOBAL batch's token count (as
    aligner's trainers do), so the sum over ranks of the gradients is the whole batch's."""
    batch, advantages = fixed_batch()
    count = batch.response_mask.sum()
    sub = batch.subset(rows)
    logprobs = grouped_response_logprobs(model, sub)
    mask = sub.response_mask[:, : logprobs.shape[1]]
    return -(logprobs * advantages[rows, None] * mask).sum() / count


def my_rows() -> slice:
    start, stop = fsdp.shard_rows(6, dist.get_world_size(), dist.get_rank())
    return slice(start, stop)


def train(model, optimizer, steps: int) -> list[float]:
    """`steps` optimiser steps on this rank's rows, in micro-batches of 2 rows (gradients accumulate over them)."""
    norms = []
    rows = my_rows()
    for _ in range(steps):
        for start in range(rows.start, rows.stop, 2):
            loss_of(model, slice(start, min(start + 2, rows.stop))).backward()
        norms.append(fsdp.clip_and_step(optimizer, model.parameters(), MAX_GRAD_NORM).item())
    return norms


def adamw(model) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, fused=True)


def weights(model) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in fsdp.full_weights(model)}  # one rank: views of the parameters


def optimizer_state(model, optimizer) -> dict[str, torch.Tensor]:
    """Each parameter's AdamW moments and step, full tensors, keyed by parameter name."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, param in model.named_parameters():
        for key, value in optimizer.state[param].items():
            out[f"{name}/{key}"] = (value.full_tensor() if isinstance(value, DTensor) else value).clone()
    return out


def logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()


def main(policy: str, out: str, checkpoint_from_one: str | None = None) -> dict:
    out_dir = Path(out)
    fsdp.init_process_group(torch.device("cpu"))
    rank = dist.get_rank()
    result: dict = {"world_size": dist.get_world_size()}
    try:
        input_ids = fixed_batch()[0].sequences()[0]
        load = fsdp.LoadTally()
        model = fsdp.load_sharded_policy(policy, torch.device("cpu"), tally=load)
        result["load"] = load
        result["local_rows"] = {name: p.to_local().shape[0] for name, p in model.named_parameters()}
        result["logits"] = logits(model, input_ids)

        model.train()
        optimizer = adamw(fsdp.reshard(model))  # the forward under no_grad left the root's parameters gathered
        result["norms"] = train(model, optimizer, 2)
        save_dir = out_dir / f"checkpoint{dist.get_world_size()}"
        fsdp.save_checkpoint(model, optimizer, save_dir)
        result["weights2"] = weights(model)
        result["optimizer2"] = optimizer_state(model, optimizer)
        result["norms"] += train(model, optimizer, 2)
        result["weights4"] = weights(model)
        result["gather"] = fsdp.export_hf(model, out_dir / "export", AutoTokenizer.from_pretrained(policy))
        result["gather_bf16"] = fsdp.GatherTally()
        for _, tensor in fsdp.full_weights(model, torch.bfloat16, "cpu", result["gather_bf16"]):
            assert tensor.dtype == torch.bfloat16

        # Resume: the checkpoint of step 2 (this run's, or one process's) into a fresh model, then 2 more steps.
        result["resumed"] = resume(policy, str(save_dir))
        if checkpoint_from_one:
            result["resumed_from_one"] = resume(policy, checkpoint_from_one)

        # Activation checkpointing: the same gradients, so the same 2 steps.
        ac = fsdp.load_sharded_policy(policy, torch.device("cpu"), activation_checkpointing=True).train()
        train(ac, adamw(ac), 2)
        result["checkpointed2"] = weights(ac)

        # bf16-mixed: bfloat16 compute, float32 shards and reductions.
        bf16 = fsdp.load_sharded_policy(policy, torch.device("cpu"), precision="bf16-mixed").train()
        train(bf16, adamw(bf16), 2)
        result["bf16_2"] = weights(bf16)
        torch.save(result, out_dir / f"rank{rank}.pt")
    finally:
        distributed.destroy()
    return result


def resume(policy: str, checkpoint: str) -> dict:
    """Load `checkpoint` into a fresh sharded model and optimiser of this world size; its state, then 2 steps on."""
    fresh = fsdp.load_sharded_policy(policy, torch.device("cpu")).train()
    optimizer = adamw(fresh)
    fsdp.load_checkpoint(fresh, optimizer, checkpoint)
    result = {"weights2": weights(fresh), "optimizer2": optimizer_state(fresh, optimizer)}
    train(fresh, optimizer, 2)
    result["weights4"] = weights(fresh)
    return result


def without_fast_forward() -> None:
    """The fast Llama forward reads weights without calling the modules whose hooks gather them (see fsdp.py): send
    models through transformers' forward (the unsharded reference too, so both sides compute the same arithmetic)."""
    from aligner.modeling import llama_forward

    llama_forward.supports_fast_forward = lambda model: False


if __name__ == "__main__":
    without_fast_forward()
    main(*sys.argv[1:])
    distributed.exit_rank(0)
