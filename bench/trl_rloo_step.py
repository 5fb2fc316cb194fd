"""Time one training step of Hugging Face TRL's RLOOTrainer on Aligner's benchmark workload (CPU, offline).

This is the reference point for `bench/rloo_step.py`: the same workload run through TRL instead of Aligner. It does
not import the `aligner` package and runs in its own virtualenv, so TRL's dependencies never touch the project's.

Install (once; torch first and pinned, so pip takes the local CPU wheel and never a CUDA build):

    python3 -m venv trl-env
    trl-env/bin/pip install torch==2.13.0
    trl-env/bin/pip install torch==2.13.0 trl      # pulls transformers 5.x, datasets, accelerate

Run (from the repository root):

    trl-env/bin/python bench/trl_rloo_step.py                  # table
    trl-env/bin/python bench/trl_rloo_step.py --steps 20 --warmup 3 --json   # plus one JSON line
    trl-env/bin/python bench/trl_rloo_step.py --model models/smollm2-135m-instruct --precision bf16 --steps 3

Measured with TRL 1.16.0, transformers 5.23.0, accelerate 1.15.0, datasets 5.2.0, torch 2.13.0+cpu.

`--model PATH` (and `--tokenizer PATH`) runs the same workload shape on any causal-LM folder instead of the tiny
model: loaded in float32, short generic English prompts (bench/workload.py's, the same as Aligner's side), given as
conversations when the tokenizer has a chat template, so TRL applies it. `--precision bf16` is `RLOOConfig(bf16=True)`,
TRL's own mixed precision (float32 weights, bfloat16 autocast); the default fp32 is `bf16=False`.

The default workload, built entirely offline in a temporary directory:
- policy: a Llama-shaped model from a config (hidden 128, 4 layers, 4 heads, intermediate 512, vocab 512), random
  init with a fixed seed, fp32;
- tokenizer: byte-level BPE trained with `tokenizers` on a synthetic corpus to vocab 512, wrapped in
  PreTrainedTokenizerFast with `<|endoftext|>` as eos and `<pad>` as pad;
- 8 distinct prompts x 4 completions = 32 samples per step, 32 new tokens each (`min_new_tokens=32` keeps EOS from
  ending a completion early; the actual lengths are recorded and printed);
- reward: a plain Python function (count of the letter "e"), so reward time is negligible;
- beta = 0.05 > 0, so TRL builds a reference model: it loads a second, frozen copy of the policy from the same
  checkpoint path (`create_model_from_path`) and runs one no-grad forward of it over prompt+completion each step;
- 1 optimiser step per rollout, torch.set_num_threads(2), no logging, reporting or saving.

TRL batch semantics (RLOOConfig in TRL 1.16): `per_device_train_batch_size` counts completions, not prompts.
`generation_batch_size` defaults to per_device_train_batch_size * num_processes * steps_per_generation, and
`steps_per_generation` defaults to `gradient_accumulation_steps`. The RepeatSampler hands out
generation_batch_size / num_generations distinct prompts, each repeated num_generations times. With
per_device_train_batch_size=32, num_generations=4, gradient_accumulation_steps=1 (so steps_per_generation=1 and
generation_batch_size=32) and num_iterations=1, each step takes 8 prompts, generates 4 completions for each in one
`generate` call on 32 rows, scores them (policy no-grad forward for the old log-probs, reference forward, reward),
and does one forward+backward on all 32 and one optimiser step. Nothing is reused across steps.

Settings that differ from TRL's defaults, and why: `bf16=False` (TRL defaults to bf16 autocast; the workload is fp32),
`gradient_checkpointing=False` (TRL defaults to True; a 1M-parameter model needs no memory saving and Aligner does not
recompute activations; `--gradient-checkpointing` turns it back on), `use_cpu=True`, `disable_dropout=True` (Llama's
dropout is 0 anyway). Left at TRL's defaults: AdamW (transformers' default `optim`), max_grad_norm=1.0 (clipping on),
linear LR schedule, temperature 1.0, top_p 1.0, top_k 0, epsilon 0.2, transformers `generate` (no vLLM).

Timing: a TrainerCallback notes the wall clock at `on_step_begin` and `on_step_end`, which bracket one
`training_step` (rollout + loss + backward), gradient clipping and the optimiser step; the first `--warmup` steps are
dropped. The rollout and the generation inside it are timed too (a subclass wraps `_generate_and_score_completions`
and `_generate`). `interval` is the time from one step's end to the next one's end: it adds what the Trainer does
between steps (fetching the batch, its logging hook).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    TrainerCallback,
)
from transformers.trainer_callback import PrinterCallback  # noqa: E402
from trl import RLOOConfig, RLOOTrainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from workload import NEW_TOKENS, PRECISIONS, generic_prompts  # noqa: E402  (plain Python, no aligner import)

SEED = 1234
VOCAB = 512
HIDDEN = 128
LAYERS = 4
HEADS = 4
INTERMEDIATE = 4 * HIDDEN
PROMPTS_PER_STEP = 8
SAMPLES_PER_PROMPT = 4
BETA = 0.05
EOS, PAD = "<|endoftext|>", "<pad>"

WORD_TEXT = (
    "the a cat dog bird fish tree river stone house garden window light dark small large quick slow red "
    "green blue yellow runs jumps sings reads writes sees finds keeps makes takes gives over under near "
    "beside through across because while after before every some many few story poem letter question "
    "answer reason number seven eleven morning evening winter summer happy quiet bright gentle clever "
    "honest"
)
WORDS = WORD_TEXT.split()


def synthetic_corpus(rng: random.Random, n_lines: int = 4000) -> list[str]:
    """Random sentences over a small word list, with some digits and punctuation."""
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
        lines.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ":", ","]))
    return lines


def build_tokenizer(rng: random.Random) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(rng), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, padding_side="left")


def build_policy(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config).to(torch.float32)


def build_prompts(rng: random.Random, n: int) -> list[str]:
    templates = [
        "Write a story about the {} {}:",
        "Tell me why the {} {} is {}:",
        "A short poem on {} and {}:",
        "Question: where does the {} {} go? Answer:",
    ]
    out = []
    for _ in range(n):
        t = rng.choice(templates)
        out.append(t.format(*(rng.choice(WORDS) for _ in range(t.count("{}")))))
    return out


class Recorder:
    """Completion lengths seen by the reward function, and the rollout / generation wall times."""

    def __init__(self) -> None:
        self.lengths: list[list[int]] = []
        self.rollout_s: list[float] = []
        self.generate_s: list[float] = []


REC = Recorder()


def count_e_reward(prompts, completions, completion_ids, **kwargs) -> list[float]:
    """Reward function (not a model): the number of letters "e" in the completion text."""
    REC.lengths.append([len(ids) for ids in completion_ids])
    # Conversational prompts get completions as a list of messages (the assistant's one).
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(t.count("e")) for t in texts]


class TimedRLOOTrainer(RLOOTrainer):
    """RLOOTrainer with the rollout and the generation inside it timed; the computation is TRL's own."""

    def _generate_and_score_completions(self, inputs):
        t0 = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        REC.rollout_s.append(time.perf_counter() - t0)
        return out

    def _generate(self, prompts):
        t0 = time.perf_counter()
        out = super()._generate(prompts)
        REC.generate_s.append(time.perf_counter() - t0)
        return out


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.begin: list[float] = []
        self.end: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        self.end.append(time.perf_counter())


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default; off here (see docstring)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line with the summary")
    ap.add_argument("--model", help="Hugging Face causal-LM folder to time instead of the tiny model")
    ap.add_argument("--tokenizer", help="tokenizer folder, with --model (default: the model's)")
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32", help="bf16: RLOOConfig(bf16=True)")
    args = ap.parse_args(argv)
    if args.tokenizer and not args.model:
        ap.error("--tokenizer needs --model")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*deprecated", category=FutureWarning)
    rng = random.Random(SEED)
    total_steps = args.warmup + args.steps
    batch = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT

    with tempfile.TemporaryDirectory(prefix="trl-rloo-bench-") as tmp:
        tmp_path = Path(tmp)
        if args.model:
            model_dir = Path(args.model)
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model, padding_side="left")
            prompts = generic_prompts(PROMPTS_PER_STEP * total_steps)
            if tokenizer.chat_template:
                chats = [[{"role": "user", "content": p}] for p in prompts]
                texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
                prompt_lens = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
                dataset = Dataset.from_dict({"prompt": chats})  # conversational: TRL applies the chat template
            else:
                prompt_lens = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
                dataset = Dataset.from_dict({"prompt": prompts})
        else:
            tokenizer = build_tokenizer(rng)
            policy = build_policy(tokenizer)
            # TRL builds the reference model from the policy's checkpoint path, so the policy goes through a folder.
            model_dir = tmp_path / "policy"
            policy.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
            del policy
            prompts = build_prompts(rng, PROMPTS_PER_STEP * total_steps)
            prompt_lens = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
            dataset = Dataset.from_dict({"prompt": prompts})

        config = RLOOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=batch,  # counts completions: 8 prompts x 4
            num_generations=SAMPLES_PER_PROMPT,
            gradient_accumulation_steps=1,  # so steps_per_generation=1, generation_batch_size=32
            num_iterations=1,  # one optimiser step per rollout
            max_completion_length=NEW_TOKENS,
            generation_kwargs={"min_new_tokens": NEW_TOKENS},
            temperature=1.0,
            beta=BETA,
            learning_rate=1e-5,
            max_steps=total_steps,
            bf16=args.precision == "bf16",  # TRL's mixed precision: float32 weights, bfloat16 autocast
            fp16=False,
            use_cpu=True,
            gradient_checkpointing=args.gradient_checkpointing,
            disable_dropout=True,
            model_init_kwargs={"dtype": "float32"},
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=SEED,
        )
        assert config.generation_batch_size == batch and config.steps_per_generation == 1, (
            config.generation_batch_size,
            config.steps_per_generation,
        )
        timer = StepTimer()
        trainer = TimedRLOOTrainer(
            model=str(model_dir),
            reward_funcs=count_e_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.remove_callback(PrinterCallback)  # it prints the final metrics dict: not wanted here
        n_params = sum(p.numel() for p in trainer.model.parameters())
        ref_desc = "none"
        if trainer.ref_model is not None:
            ref = trainer.ref_model
            ref_desc = (
                f"separate {type(ref).__name__}, {sum(p.numel() for p in ref.parameters()):,} params, "
                f"training={ref.training} (run under torch.no_grad)"
            )
        torch.set_num_threads(args.threads)  # in case anything above changed it
        t_start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t_start
        threads_seen = torch.get_num_threads()

    steps = [e - b for b, e in zip(timer.begin, timer.end)]
    intervals = [e1 - e0 for e0, e1 in zip(timer.end, timer.end[1:])]
    if len(steps) != total_steps:
        print(f"warning: {len(steps)} steps recorded, {total_steps} expected", file=sys.stderr)
    w = args.warmup
    timed = steps[w:]
    timed_intervals = intervals[max(w - 1, 0) :]
    rollout, gen = REC.rollout_s[w:], REC.generate_s[w:]
    train_part = [s - r for s, r in zip(timed, rollout)]
    lengths = [n for step in REC.lengths[w:] for n in step]
    rows_per_step = sorted({len(step) for step in REC.lengths})
    s_per_step = median(timed)
    tokens_per_step = statistics.mean(lengths) * batch if lengths else float("nan")

    print(
        f"TRL {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"threads {threads_seen}"
    )
    if args.model:
        print(f"policy: {args.model}, vocab {len(tokenizer)}, {n_params:,} params, {args.precision}")
    else:
        print(
            f"policy: Llama hidden {HIDDEN}, {LAYERS} layers, {HEADS} heads, intermediate {INTERMEDIATE}, "
            f"vocab {len(tokenizer)}, {n_params:,} params, {args.precision}"
        )
    print(f"reference model: {ref_desc}")
    print(
        f"per step: {PROMPTS_PER_STEP} prompts x {SAMPLES_PER_PROMPT} = {batch} samples (rows seen by the reward: "
        f"{rows_per_step}); generation_batch_size={config.generation_batch_size}, "
        f"steps_per_generation={config.steps_per_generation}, "
        f"gradient_checkpointing={config.gradient_checkpointing}"
    )
    print(
        f"prompt tokens: {min(prompt_lens)}-{max(prompt_lens)} (mean {statistics.mean(prompt_lens):.1f}); "
        f"completion tokens: {min(lengths, default=0)}-{max(lengths, default=0)} "
        f"(mean {statistics.mean(lengths) if lengths else 0:.2f})"
    )
    print(f"{total_steps} steps ({w} warm-up) in {wall:.1f} s")
    print()
    print(f"{'phase':<28}{'median s':>10}{'min s':>10}{'max s':>10}")
    for name, xs in [
        ("step (begin->end)", timed),
        ("  rollout", rollout),
        ("    generate", gen),
        ("    score (logp, ref, reward)", [r - g for r, g in zip(rollout, gen)]),
        ("  loss+backward+optim", train_part),
        ("interval (end->end)", timed_intervals),
    ]:
        if xs:
            print(f"{name:<28}{median(xs):>10.3f}{min(xs):>10.3f}{max(xs):>10.3f}")
    print()
    print(
        f"s/step {s_per_step:.3f}   samples/s {batch / s_per_step:.1f}   "
        f"generated tokens/s {tokens_per_step / s_per_step:.0f}"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model or "tiny",
                    "precision": args.precision,
                    "s_per_step": round(s_per_step, 4),
                    "samples_per_s": round(batch / s_per_step, 2),
                    "tokens_per_s": round(tokens_per_step / s_per_step, 1),
                    "steps": len(timed),
                    "trl_version": trl.__version__,
                    "transformers_version": transformers.__version__,
                    "torch_version": torch.__version__,
                    "generate_s": round(median(gen), 4),
                    "rollout_s": round(median(rollout), 4),
                    "interval_s": round(median(timed_intervals), 4),
                    "mean_completion_tokens": round(statistics.mean(lengths), 2) if lengths else None,
                    "threads": threads_seen,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
