"""The GPU check: one REINFORCE / RLOO step of a random-init ~1B Llama per training setup, timed, in one JSON.

    bash scripts/gpu_check.sh                                   # on the device machine (docs/performance.md)
    .venv/bin/python bench/gpu_check.py --tiny --cases torch-engine,hf-engine --out /tmp/gpu_check.json   # CPU

Cases, each its own `aligner train` process so that one failing (or hanging past its timeout) cannot stop the others:

    torch-engine   model.backend hf,       generation.engine torch (Aligner's own decode)
    hf-engine      model.backend hf,       generation.engine hf (transformers' generate)
    fsdp-1gpu      model.backend fsdp,     under torchrun --nproc_per_node 1
    megatron-tp1   model.backend megatron, tensor parallel 1, under torchrun --nproc_per_node 1 (NCCL on CUDA);
                   Megatron refuses bf16-mixed and trains in model.dtype, so this case runs bfloat16 weights

The model is built from a config, never downloaded: TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32 heads, 4 KV
heads, intermediate 5632) with the demo's byte-level BPE tokenizer (aligner/demo/tokenizer.py; vocab about 512, so the
embeddings are small: 0.97B parameters in all, the count goes into the JSON), saved as a Hugging Face folder in a
temp dir. The workload is fixed so that the work is the same on any machine: 16 prompts a step (the prompt file holds
exactly those, so every step trains on all of them), 4 samples each, every response exactly 256 tokens
(generation.min_new_tokens = max_new_tokens: EOS is ignored), no validation; `--steps` steps, of which the first
(the warm-up: CUDA context, allocator, kernels picked) is left out of the figures.

Per case the JSON holds (means over the measured steps):
  step_s                 timers/step, the trainer's wall-clock seconds of a step
  phases_s               every timers/* metric (generate, logprobs, init_logprobs, reward, train, refit, ...)
  tokens_per_step        prompt + response tokens of the step's samples: the prompts' token counts (computed here
                         from the file, as aligner.data tokenises it) x samples per prompt, plus the samples' mean
                         response length (train_rollouts/response_lengths) x samples
  tokens_per_s_per_gpu   NeMo-RL's definition: tokens_per_step / (step_s x gpus); `trainer_tokens_per_s_per_gpu`
                         beside it is the trainer's own throughput/tokens_per_s, the same figure counted by the trainer
  peak_memory_bytes      torch.cuda.max_memory_allocated() of the trainer process at its exit (null off CUDA): the
                         trainer logs no memory metric, so each case runs `aligner train` through this file's
                         `--trainer-wrapper`, which calls aligner.cli.main and reads it afterwards
  error                  for a failed case: its last lines of output, paths shortened; the other cases still run
Checkpoints and the final policy save are skipped in the wrapper (the check times steps; a 1B model's checkpoint with
its AdamW state is about 12 GB of disk per case): `--keep-saves` keeps them.

The JSON goes to `--out`, else $OUT/gpu_check.json when $OUT is set (the device tool brings $OUT back), else
bench/results/gpu_check.json; it is rewritten after every case, so a run cut short keeps the cases done. Each case's
full output goes beside it as gpu_check-<case>.log. `--tiny` runs a ~50k-parameter model for a step or two (any
device, the CPU included) to test the check itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRAPPER_FLAG = "--trainer-wrapper"

# TinyLlama-1.1B's shape; the vocabulary is the demo tokenizer's.
FULL_SHAPE = dict(
    hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, intermediate_size=5632
)
TINY_SHAPE = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64
)
MAX_POSITIONS = 2048


@dataclass(frozen=True)
class Workload:
    prompts: int  # per step, and in the prompt file
    samples: int  # per prompt
    new_tokens: int  # every response's exact length
    prompt_sentences: int  # demo prompts joined into one prompt
    micro_batch: int
    steps: int  # including the warm-up step


FULL = Workload(prompts=16, samples=4, new_tokens=256, prompt_sentences=8, micro_batch=16, steps=3)
TINY = Workload(prompts=2, samples=2, new_tokens=4, prompt_sentences=1, micro_batch=4, steps=2)


@dataclass(frozen=True)
class Case:
    overrides: tuple[str, ...]
    torchrun: bool = False  # one process under torchrun (a process group), else a plain process
    precision: str | None = None  # None: the run's --precision
    dtype: str = "float32"
    notes: str = ""


CASES = {
    "torch-engine": Case(("model.backend=hf", "generation.engine=torch")),
    "hf-engine": Case(("model.backend=hf", "generation.engine=hf")),
    "fsdp-1gpu": Case(("model.backend=fsdp", "generation.engine=torch"), torchrun=True),
    "megatron-tp1": Case(
        ("model.backend=megatron", "model.tensor_model_parallel_size=1", "generation.engine=torch"),
        torchrun=True,
        precision="fp32",
        dtype="bfloat16",
        notes="Megatron refuses bf16-mixed: bfloat16 weights and compute (model.dtype bfloat16)",
    ),
}

DEFINITION = "tokens_per_s_per_gpu = tokens_per_step / (step_s x gpus), NeMo-RL's: prompt + response tokens of a step"


@dataclass
class CaseResult:
    status: str = "not run"  # ok | failed | timeout | skipped
    backend: str = ""
    engine: str = ""
    precision: str = ""
    dtype: str = ""
    gpus: int = 1  # processes, one device each
    wall_s: float | None = None
    steps_measured: int = 0
    step_s: float | None = None
    step_s_each: list[float] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)
    response_tokens_mean: float | None = None
    tokens_per_step: float | None = None
    tokens_per_s_per_gpu: float | None = None
    trainer_tokens_per_s_per_gpu: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_gib: float | None = None
    peak_rss_bytes: int | None = None
    notes: str = ""
    error: str | None = None


# ----------------------------------------------------------------------------------------------- the trainer side
def trainer_wrapper(argv: list[str]) -> None:
    """`gpu_check.py --trainer-wrapper MEMORY_JSON [--keep-saves] train ...`: `aligner train` in this process, then
    its peak memory into MEMORY_JSON (rank 0). The trainer logs no memory metric; this reads it from outside."""
    memory_file, rest = Path(argv[0]), argv[1:]
    keep_saves = rest[:1] == ["--keep-saves"]
    rest = rest[1:] if keep_saves else rest
    sys.path.insert(0, str(REPO))
    import torch

    from aligner import distributed
    from aligner.cli import main

    if not keep_saves:
        from aligner.trainers import reinforce

        reinforce.ReinforceTrainer.save_checkpoint = lambda self: None
        reinforce.save_policy = reinforce.save_merged_policy = lambda *args, **kwargs: None
    code = main(rest)
    if int(os.environ.get("RANK", "0")) == 0:  # the process group is gone by now: torchrun's RANK says
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        memory = {
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "peak_rss_bytes": usage * 1024,
        }
        memory_file.write_text(json.dumps(memory))
    distributed.exit_rank(code)


# ----------------------------------------------------------------------------------------------- the workload
def build_model(folder: Path, shape: dict, device: str) -> int:
    """A random-init Llama of `shape` with the demo tokenizer, saved (bfloat16 safetensors) in `folder`; its
    parameter count."""
    import random

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from aligner.demo.task import make_examples, split_prompts
    from aligner.demo.tokenizer import TOKENIZER_CORPUS_SIZE, train_tokenizer

    train, _ = split_prompts(0)
    pool = [(text, text) for text in train]
    corpus = make_examples(random.Random("gpu-check"), pool, TOKENIZER_CORPUS_SIZE)
    tokenizer = train_tokenizer(text for example in corpus for text in example)
    tokenizer.model_max_length = MAX_POSITIONS  # the demo's 256 is its own model's context
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    ids["pad_token_id"] = tokenizer.pad_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False, **shape, **ids
    )
    torch.manual_seed(0)
    # Initialised on the GPU when there is one: a billion normal draws take a while on the CPU.
    with torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    hf_logging.disable_progress_bar()
    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    count = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the cases' trainer processes get the device's memory
    return count


def write_prompts(path: Path, workload: Workload, tokenizer_dir: Path) -> int:
    """Exactly `workload.prompts` prompts (so every step takes all of them); their token count as the trainer
    tokenises plain prompts (the tokenizer's special tokens, no chat template)."""
    from transformers import AutoTokenizer

    from aligner.demo.task import all_prompts

    texts = [text for text, _ in all_prompts()]
    n = workload.prompt_sentences
    prompts = [" ".join(texts[i * n : (i + 1) * n]) for i in range(workload.prompts)]
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return sum(len(ids) for ids in tokenizer(prompts)["input_ids"])


def write_config(folder: Path, model_dir: Path, prompts: Path, workload: Workload, device: str) -> Path:
    config = {
        "seed": 1234,
        "model": {"policy_path": str(model_dir), "device": device, "attn_implementation": "sdpa"},
        "data": {
            "train_file": str(prompts),
            "val_file": str(prompts),
            "apply_chat_template": False,
            "max_prompt_length": 1024,
        },
        "reward": {"function": "aligner.demo:reward"},
        "generation": {
            "max_new_tokens": workload.new_tokens,
            "min_new_tokens": workload.new_tokens,
            "batch_size": workload.prompts,
        },
        "reinforce": {"num_prompts_per_step": workload.prompts, "num_rollouts_per_prompt": workload.samples},
        "optim": {"micro_batch_size": workload.micro_batch, "lr": 1e-6},
        "trainer": {
            "max_steps": workload.steps,
            "val_check_interval": 0,
            "save_interval": 1_000_000,
            "progress_bar": False,
            "train_samples_to_log": 0,
        },
    }
    path = folder / "gpu_check.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


# ----------------------------------------------------------------------------------------------- one case
def case_command(name: str, config: Path, run_dir: Path, memory_file: Path, precision: str, keep_saves: bool):
    case = CASES[name]
    if case.torchrun:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    else:
        launcher = [sys.executable]
    command = launcher + [str(Path(__file__).resolve()), WRAPPER_FLAG, str(memory_file)]
    command += ["--keep-saves"] if keep_saves else []
    command += ["train", "--config", str(config), "--set", f"run_dir={run_dir}"]
    sets = [*case.overrides, f"model.precision={case.precision or precision}", f"model.dtype={case.dtype}"]
    for item in sets:
        command += ["--set", item]
    return command


def shorten_paths(text: str, roots: dict[str, str]) -> str:
    """`text` without this machine's paths: each root as its label, other absolute paths to their last two parts."""
    for root, label in sorted(roots.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(root, label)
    return re.sub(r"(?<![\w<>.:/])/(?:[^\s/'\"():,]+/)+([^\s/'\"():,]+/[^\s/'\"():,]+)", r"…/\1", text)


# The line where torchrun's agent starts reporting a worker that failed: what the worker said comes before it.
TORCHRUN_REPORT = re.compile(r"elastic/multiprocessing/api\.py:\d+\] failed \(exitcode")
WARNING_LINE = re.compile(r"^\S+:\d+: \w*Warning: ")


def error_tail(output: str, lines: int) -> str:
    """The last `lines` lines a failed run printed before torchrun's own report (a traceback of the launcher), less
    Python's warnings (Megatron warns four times on every start that TransformerEngine is absent)."""
    kept = []
    for line in output.strip().splitlines():
        if TORCHRUN_REPORT.search(line):
            break
        if WARNING_LINE.search(line) or line.strip() == "warnings.warn(":
            continue
        kept.append(line)
    return "\n".join(kept[-lines:])


def summarise(rows: list[dict], warmup: int, prompt_tokens: int, workload: Workload, result: CaseResult) -> None:
    """Fill `result`'s figures from the run's metrics rows (metrics.jsonl), leaving out the first `warmup` steps."""
    from aligner.metrics import TIMER_STEP, TIMERS_PREFIX, TOKENS_PER_S, TRAIN_RESPONSE_LENGTH

    steps = sorted((r for r in rows if TIMER_STEP in r), key=lambda r: r["step"])
    measured = steps[warmup:] or steps[-1:]  # a one-step run reports its only (warm-up) step
    if not measured:
        raise RuntimeError("the run logged no step")
    result.steps_measured = len(measured)
    result.step_s_each = [r[TIMER_STEP] for r in measured]
    result.step_s = statistics.mean(result.step_s_each)
    timers = sorted({k for r in measured for k in r if k.startswith(TIMERS_PREFIX) and k != TIMER_STEP})
    result.phases_s = {
        k.removeprefix(TIMERS_PREFIX): statistics.mean(r[k] for r in measured if k in r) for k in timers
    }
    result.response_tokens_mean = statistics.mean(r[TRAIN_RESPONSE_LENGTH] for r in measured)
    samples = workload.prompts * workload.samples
    result.tokens_per_step = prompt_tokens * workload.samples + result.response_tokens_mean * samples
    result.tokens_per_s_per_gpu = result.tokens_per_step / (result.step_s * result.gpus)
    result.trainer_tokens_per_s_per_gpu = statistics.mean(r[TOKENS_PER_S] for r in measured)


def run_case(name: str, args, paths: dict, precision: str, timeout: float, roots: dict) -> CaseResult:
    from aligner.run_layout import METRICS_FILE
    from aligner.trainers.run_log import read_jsonl

    case = CASES[name]
    overrides = dict(item.split("=", 1) for item in case.overrides)
    result = CaseResult(
        backend=overrides.get("model.backend", "hf"),
        engine=overrides.get("generation.engine", "torch"),
        precision=case.precision or precision,
        dtype=case.dtype,
        notes=case.notes,
    )
    run_dir, memory_file = paths["work"] / f"run-{name}", paths["work"] / f"memory-{name}.json"
    command = case_command(name, paths["config"], run_dir, memory_file, precision, args.keep_saves)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    log_path = paths["out"].with_name(f"{paths['out'].stem}-{name}.log")
    started = time.perf_counter()
    with open(log_path, "w") as log:
        # A session of its own: on a timeout the whole group (torchrun and its worker) goes.
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    result.wall_s = time.perf_counter() - started
    output = log_path.read_text(errors="replace")
    try:
        if code is None:
            result.status = "timeout"
            raise RuntimeError(f"timed out after {timeout:.0f} s")
        if code != 0:
            raise RuntimeError(f"exit status {code}")
        summarise(read_jsonl(run_dir / METRICS_FILE), args.warmup, paths["prompt_tokens"], paths["workload"], result)
        if memory_file.exists():
            memory = json.loads(memory_file.read_text())
            result.peak_memory_bytes, result.peak_rss_bytes = memory["peak_memory_bytes"], memory["peak_rss_bytes"]
            if result.peak_memory_bytes is not None:
                result.peak_memory_gib = result.peak_memory_bytes / 2**30
        result.status = "ok"
    except Exception as err:  # noqa: BLE001 - a case's failure is data: recorded, and the next case runs
        result.status = "timeout" if code is None else "failed"
        result.error = shorten_paths(f"{err}\n{error_tail(output, args.error_lines)}", roots)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


# ----------------------------------------------------------------------------------------------- the whole check
def environment() -> dict:
    import platform

    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "device_count": torch.cuda.device_count(),
    }
    try:
        from importlib.metadata import version

        info["megatron_core"] = version("megatron-core")
    except Exception:  # noqa: BLE001 - not installed
        info["megatron_core"] = None
    return info


def output_path(args) -> Path:
    if args.out:
        return Path(args.out)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_check.json"
    return REPO / "bench" / "results" / "gpu_check.json"


def print_table(cases: dict[str, CaseResult]) -> None:
    header = ("case", "status", "s/step", "generate", "train", "tok/s/GPU", "peak GiB")
    widths = (14, 8, 8, 9, 7, 10, 9)
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, widths)))

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    for name, r in cases.items():
        cells = (
            name,
            r.status,
            num(r.step_s, ".3f"),
            num(r.phases_s.get("generate"), ".3f"),
            num(r.phases_s.get("train"), ".3f"),
            num(r.tokens_per_s_per_gpu, ".0f"),
            num(r.peak_memory_gib, ".2f"),
        )
        print(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths)), flush=True)
    for name, r in cases.items():
        if r.error:
            print(f"\n{name}: {r.error}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)} (default: all)")
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny model and workload, to test the check (any device)"
    )
    parser.add_argument("--device", default="auto", help="model.device (default auto: CUDA when there is one)")
    parser.add_argument(
        "--precision", choices=["bf16-mixed", "fp32"], help="model.precision (default bf16-mixed; --tiny: fp32)"
    )
    parser.add_argument("--steps", type=int, help="steps per case, the first a warm-up (default 3; --tiny: 2)")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the figures (default 1)")
    parser.add_argument("--case-timeout", type=float, default=150.0, help="seconds one case may take (150)")
    parser.add_argument(
        "--budget", type=float, default=420.0, help="seconds for the whole check, model build included (420)"
    )
    parser.add_argument("--out", help="JSON file (default $OUT/gpu_check.json, else bench/results/gpu_check.json)")
    parser.add_argument("--keep-saves", action="store_true", help="let the runs write checkpoints and final policy")
    parser.add_argument("--error-lines", type=int, default=15, help="output lines kept for a failed case (15)")
    args = parser.parse_args(argv)
    args.case_list = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in args.case_list if c not in CASES]
    if unknown or not args.case_list or len(set(args.case_list)) != len(args.case_list):
        parser.error(f"--cases takes some of {', '.join(CASES)}, each once (got {args.cases!r})")
    if args.steps is not None and args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must be more than --warmup ({args.warmup})")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget
    sys.path.insert(0, str(REPO))
    base = TINY if args.tiny else FULL
    workload = Workload(**{**base.__dict__, "steps": args.steps or base.steps})
    precision = args.precision or ("fp32" if args.tiny else "bf16-mixed")
    out = output_path(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "check": "gpu_check",
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tiny": args.tiny,
        "environment": environment(),
        "definition": DEFINITION,
        "cases": {},
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        roots = {tmp: "<tmp>", str(REPO): "<repo>", sys.prefix: "<python>", str(Path.home()): "~"}
        started = time.perf_counter()
        shape = TINY_SHAPE if args.tiny else FULL_SHAPE
        parameters = build_model(work / "model", shape, args.device)
        prompts = work / "prompts.jsonl"
        prompt_tokens = write_prompts(prompts, workload, work / "model")
        config = write_config(work, work / "model", prompts, workload, args.device)
        report["model"] = {"shape": shape, "parameters": parameters, "build_s": time.perf_counter() - started}
        report["workload"] = {
            **workload.__dict__,
            "samples_per_step": workload.prompts * workload.samples,
            "prompt_tokens_per_step": prompt_tokens * workload.samples,
            "warmup_steps": args.warmup,
            "precision": precision,
            "device": args.device,
        }
        paths = {"work": work, "config": config, "out": out, "prompt_tokens": prompt_tokens, "workload": workload}
        print(f"model: {parameters / 1e9:.3f}B parameters {shape}; cases: {', '.join(args.case_list)}", flush=True)
        for name in args.case_list:
            left = deadline - time.monotonic()
            if left < 10:
                result = CaseResult(status="skipped", error=f"the check's --budget ({args.budget:g} s) was spent")
            else:
                result = run_case(name, args, paths, precision, min(args.case_timeout, left), roots)
            report["cases"][name] = result.__dict__
            out.write_text(json.dumps(report, indent=1))  # after every case: a run cut short keeps what it did
            print(f"{name}: {result.status} in {result.wall_s or 0:.0f} s", flush=True)
    print_table({name: CaseResult(**r) for name, r in report["cases"].items()})
    print(f"\nwritten: {out}")
    return report


if __name__ == "__main__":
    if sys.argv[1:2] == [WRAPPER_FLAG]:
        trainer_wrapper(sys.argv[2:])
    else:
        main()
