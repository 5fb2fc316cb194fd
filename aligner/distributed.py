"""Data parallelism over processes started by `torchrun`: the process group, this rank's share, and reductions.

    torchrun --standalone --nproc_per_node 2 -m aligner.cli train --config run.yaml       # 2 processes, 1 node

Every rank holds the whole policy and optimiser. A step's global prompts are split into contiguous shares (all
samples of a prompt on one rank, so the RLOO baseline is exact locally); each rank's loss is divided by the token
count of the *global* batch, so the SUM of the ranks' gradients is the single-process gradient, and every rank then
takes the same optimiser step. Metrics are reduced over ranks; only rank 0 writes files.

Without torchrun (no WORLD_SIZE in the environment, or 1) there is no process group and every helper here is the
identity, so single-process runs do exactly what they did before. The backend is gloo on the CPU and NCCL on CUDA,
where rank r uses cuda:LOCAL_RANK.

With `reinforce.dynamic_batching` (NeMo-Aligner's `batch_iterator.use_flask`) the shares are not fixed: ranks take
chunks of prompts from a queue shared over the process group's store (`dynamic_indices`), so a rank whose
responses are short takes more; each chunk's sampling seed goes by its global position, so the samples do not
depend on which rank drew them.

With model parallelism (the Megatron backend) the trainer declares each rank's data-parallel rank and size
(`set_data_parallel`): shares go by data-parallel rank, and one rank per model-parallel group counts in metrics,
whitening and gathered rows.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from aligner.processes import die_with_parent

# Gradients are all-reduced in flat buckets of this many elements: few calls, bounded extra memory.
GRAD_BUCKET_NUMEL = 1 << 24


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


# Model parallelism (the Megatron backend): ranks of one tensor/pipeline-parallel group hold shards of one model
# replica and see the same rollouts, so prompts and sampling seeds go by the data-parallel rank, and only one rank
# per replica (its "leader", model-parallel rank 0) counts in metrics and logged rows. None: every rank is a replica.
_data_parallel: tuple[int, int, bool] | None = None


def set_data_parallel(dp_rank: int, dp_size: int, leader: bool) -> None:
    """Declare this rank's data-parallel rank and size, and whether it speaks for its model-parallel group."""
    global _data_parallel
    _data_parallel = (dp_rank, dp_size, leader)


def dp_rank() -> int:
    return rank() if _data_parallel is None else _data_parallel[0]


def dp_size() -> int:
    return world_size() if _data_parallel is None else _data_parallel[1]


def is_dp_leader() -> bool:
    return True if _data_parallel is None else _data_parallel[2]


def init(device: torch.device, group_of_one: bool = False) -> torch.device:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) if there is one;
    with `group_of_one`, a process torchrun did not start (or started alone) makes a group of one rank over an
    in-memory store (`dist.HashStore`), for backends whose code runs on a process group whatever its size (FSDP2,
    torch.distributed.checkpoint, Megatron's parallel state).

    Returns the device this rank trains on: cuda:LOCAL_RANK when `device` is CUDA, else `device`.
    """
    if env_world_size() <= 1:
        if group_of_one and not dist.is_initialized():
            if device.type == "cuda":
                device = torch.device("cuda", device.index or 0)
                torch.cuda.set_device(device)
                dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
            else:
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # torchrun starts each rank in a session of its own, so a SIGKILL to the agent's process group (the worker
        # does that on a cancel that overran its grace) would leave the ranks running, blocked in collectives.
        die_with_parent()
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return device


def finish() -> None:
    """Leave the process group at the end of a successful run: the ranks meet, then each tears its group down.

    Without the meeting, a rank that closes its gloo connections while rank 0 still works (writing the final
    policy) could abort at exit ("terminate called without an active exception"). After an error use `destroy`:
    the other ranks may never reach a barrier.
    """
    barrier()
    destroy()


def exit_rank(code: int) -> None:
    """End a process torchrun started (any process: then a plain exit) with `code`, skipping interpreter teardown.

    At teardown gloo's worker threads can still hold work objects whose destruction needs the interpreter: seen as
    "terminate called without an active exception" and SIGABRT in about 1 run in 7 of a 2-rank job that had
    finished its work, after `destroy`. Output is flushed first; nothing else is left to do by then.
    """
    if env_world_size() <= 1:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def destroy() -> None:
    global _data_parallel
    _data_parallel = None
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shard(items: list, num_shards: int | None = None, index: int | None = None) -> list:
    """This rank's contiguous share of `items`; the first `len % n` shares hold one item more.

    Contiguous shares concatenated in rank order give `items` back, so gathered rows keep the global order. The
    shares go by data-parallel rank: the ranks of one model-parallel group get the same share.
    """
    n = dp_size() if num_shards is None else num_shards
    i = dp_rank() if index is None else index
    size, extra = divmod(len(items), n)
    start = i * size + min(i, extra)
    return items[start : start + size + (1 if i < extra else 0)]


# Each `dynamic_indices` call takes a fresh counter in the store; every rank makes the same calls in the same order.
_queue_calls = 0


def dynamic_indices(num_items: int) -> Iterator[int]:
    """Indices `0..num_items-1` dealt to the data-parallel ranks on demand: rank r first takes r, then whichever
    index no rank has taken yet (an atomic counter in the process group's store), until none is left.

    Every index goes to exactly one rank, in increasing order on each; a rank that finishes its work sooner takes
    more. Every rank must call it (the counters are matched by call), and `num_items >= dp_size()`, so no rank goes
    empty. Without a process group (or with one rank) it yields every index.
    """
    global _queue_calls
    n = dp_size()
    if not dist.is_initialized() or n == 1:
        yield from range(num_items)
        return
    key = f"aligner/dynamic_indices/{_queue_calls}"
    _queue_calls += 1
    # The default store is the one torchrun's rendezvous (or init_process_group's init_method) set up: rank 0 (or a
    # file) serves it, so no other port or process is needed.
    store = dist.distributed_c10d._get_default_store()
    index = dp_rank()
    while index < num_items:
        yield index
        index = n + store.add(key, 1) - 1


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of `tensor` (a new tensor; the input is left as it is)."""
    if not dist.is_initialized():
        return tensor
    out = tensor.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is True on any: ranks that must leave a loop together agree first."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def all_gather_objects(obj: Any) -> list[Any]:
    """`[obj of rank 0, obj of rank 1, ...]` on every rank (picklable objects of any size)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_rows(rows: list) -> list:
    """The lists of all ranks concatenated in rank order (the global order when each holds a contiguous share);
    with model parallelism, those of one rank per model-parallel group (the others hold the same rows)."""
    return [row for leader, part in all_gather_objects((is_dp_leader(), rows)) if leader for row in part]


def mean_over_ranks(metrics: dict[str, float], weight: float = 1.0) -> dict[str, float]:
    """Each metric averaged over the ranks, weighted by `weight` (the rank's number of samples, say).

    A weighted mean of per-rank means is the mean over the global batch. Ranks of weight 0 (an empty share) do not
    count; a metric that no rank of positive weight reports is dropped.
    """
    if not dist.is_initialized():
        return dict(metrics)
    parts = all_gather_objects((metrics, float(weight) if is_dp_leader() else 0.0))
    out = {}
    for key in _keys(m for m, _ in parts):
        pairs = [(m[key], w) for m, w in parts if key in m and w > 0]
        total = sum(w for _, w in pairs)
        if total > 0:
            out[key] = sum(v * w for v, w in pairs) / total
    return out


def max_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Each metric's largest value over the ranks (for timers: a step waits for its slowest rank)."""
    if not dist.is_initialized():
        return dict(metrics)
    parts = all_gather_objects(metrics)
    return {key: max(m[key] for m in parts if key in m) for key in _keys(parts)}


def _keys(dicts) -> list[str]:
    seen: dict[str, None] = {}
    for d in dicts:
        seen.update(dict.fromkeys(d))
    return list(seen)


def global_whiten(values: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`(x - mean) / (std + eps)` with the mean and population std of `values` over every rank's elements.

    The distributed form of `advantages_from_baseline(..., normalize=True)`: the same formula, the same result as
    whitening the concatenated global batch in one process (to float rounding); a global batch of one element, or
    of equal values, gives zeros.
    """
    if not dist.is_initialized():
        from aligner.algorithms.reinforce import advantages_from_baseline

        return advantages_from_baseline(values, torch.zeros_like(values), normalize=True, eps=eps)
    count, mean, squares = _global_moments(values)
    if count <= 1:
        return (values.to(torch.float64) - mean).to(values.dtype)
    return ((values.to(torch.float64) - mean) / ((squares / count).sqrt() + eps)).to(values.dtype)


def global_std(values: torch.Tensor) -> torch.Tensor:
    """The unbiased standard deviation of `values` over every rank's elements (a float64 0-dim tensor; 0 for fewer
    than two elements): what one process computes on the concatenated global batch, to float rounding."""
    count, _, squares = _global_moments(values)
    if count < 2:
        return torch.zeros((), dtype=torch.float64, device=values.device)
    return (squares / (count - 1)).sqrt()


def global_masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`(x - mean) * rsqrt(var + eps)` where `mask` holds (0 elsewhere), the mean and the unbiased variance taken over
    every rank's masked elements: veRL's `masked_whiten` of the concatenated global batch (REINFORCE++'s whitening
    of its per-token returns); fewer than two elements in all give zeros."""
    if not dist.is_initialized():
        from aligner.algorithms.grpo import masked_whiten

        return masked_whiten(values, mask, eps)
    valid = mask.bool()
    count, mean, squares = _global_moments(values[valid])
    if count < 2:
        return torch.zeros_like(values)
    out = (values.to(torch.float64) - mean) * torch.rsqrt(squares / (count - 1) + eps)
    return (out * valid).to(values.dtype)


def _global_moments(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, sum of squared deviations from the mean) of `values` over every rank's elements, in float64
    (mean 0 for none; the squares, a second all-reduce, only when the global count exceeds 1, else 0)."""
    # Only one rank per model-parallel group counts (the others hold the same values).
    x = values.to(torch.float64) if is_dp_leader() else values.new_zeros(0, dtype=torch.float64)
    stats = all_reduce_sum(torch.stack([x.sum(), torch.tensor(float(x.numel()), dtype=x.dtype, device=x.device)]))
    count = stats[1]
    mean = stats[0] / count.clamp_min(1)
    if count <= 1:
        return count, mean, torch.zeros_like(mean)
    return count, mean, all_reduce_sum((x - mean).pow(2).sum())


def all_reduce_gradients(parameters) -> None:
    """Replace each trainable parameter's gradient by its SUM over ranks (a missing gradient counts as zeros).

    The trainer divides every rank's loss by the global batch's count, so the sum is the whole batch's gradient;
    DDP would average instead, and would all-reduce at every micro-batch's backward unless told not to.
    """
    if not dist.is_initialized():
        return
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:  # unused on this rank: every rank must still send the same buckets
            p.grad = torch.zeros_like(p)
    for bucket in _buckets([p.grad for p in params]):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def broadcast_parameters(parameters, src: int = 0) -> None:
    """Copy rank `src`'s trainable parameters to every rank (randomly initialised ones such as adapters)."""
    if not dist.is_initialized():
        return
    with torch.no_grad():
        for bucket in _buckets([p.data for p in parameters if p.requires_grad]):
            flat = torch.cat([t.reshape(-1) for t in bucket])
            dist.broadcast(flat, src=src)
            offset = 0
            for t in bucket:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def _buckets(tensors: list[torch.Tensor]):
    """Runs of tensors of one dtype and device, each of at most GRAD_BUCKET_NUMEL elements (or one larger tensor)."""
    bucket: list[torch.Tensor] = []
    numel = 0
    for t in tensors:
        if bucket and (
            t.dtype != bucket[0].dtype or t.device != bucket[0].device or numel + t.numel() > GRAD_BUCKET_NUMEL
        ):
            yield bucket
            bucket, numel = [], 0
        bucket.append(t)
        numel += t.numel()
    if bucket:
        yield bucket


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
