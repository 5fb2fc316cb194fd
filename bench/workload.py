"""The benchmarks' shared tiny model: the issue's Llama shape (hidden 128, 4 layers, 4 heads, vocab 512) and a
byte-level BPE tokenizer trained on a synthetic corpus, built offline. Imported by bench/rloo_step.py and
bench/reward_server.py and bench/scaling.py (bench/trl_rloo_step.py runs in TRL's own environment and keeps its own
copy), as is `timed_steps`, the timing loop of Aligner's trainer. `generic_prompts`, the prompts of a real model's
workload (`--model`), is plain Python and shared with bench/trl_rloo_step.py and bench/generate.py.
"""

from __future__ import annotations

import time

VOCAB = 512
SHAPE = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4)
# The one workload shape every step benchmark times, Aligner's and TRL's alike.
PROMPTS, SAMPLES, NEW_TOKENS = 8, 4, 32
PRECISIONS = ("fp32", "bf16")
_TASKS = [
    "Write a short poem about {}.",
    "Explain {} to a child.",
    "Give three facts about {}.",
    "Describe {} in one sentence.",
    "Tell a short story about {}.",
    "What is the best thing about {}?",
]
_TOPICS = ["the sea", "autumn", "coffee", "the moon", "trains", "bees", "rain", "mountains", "libraries", "bicycles"]


def generic_prompts(n: int) -> list[str]:
    """`n` short generic English prompts for a real model (`--model`), the same list on every call."""
    pool = [task.format(topic) for topic in _TOPICS for task in _TASKS]
    return [pool[(i * 7) % len(pool)] for i in range(n)]  # 7 is coprime with the pool's 60: no repeat before 60


def parse_precisions(text: str) -> list[str]:
    """`--precision fp32`, `bf16` or a comma list of them (each is timed on both sides of a comparison)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in PRECISIONS]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"--precision {text!r}: expected one or more of {', '.join(PRECISIONS)}, comma-separated")
    return names


def bpe_tokenizer(corpus: list[str], vocab_size: int = VOCAB):
    """A byte-level BPE tokenizer with <pad>, <s> and </s>, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def llama_config(tokenizer, **extra):
    """The benchmark Llama's config for `tokenizer` (extra fields, e.g. num_labels=1, pass through)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SHAPE,
        **extra,
    )


def closed_loop(clients: int, warmup_s: float, seconds: float, request, first=None, on_start=None):
    """`clients` threads, each with its own requests.Session, calling `request(session, i)` back to back.

    Each client first calls `first(session, i)` (default: `request`) once, which opens its connection, warms up for
    `warmup_s`, meets the others at a barrier (`on_start()` runs there once), then is measured for `seconds`.
    Returns (latencies in seconds, elapsed seconds of the measured window, sum of what `request` returned).
    A failing client stops all and its error is raised; Ctrl-C is seen between requests.
    """
    import threading
    import time

    import requests

    stop = threading.Event()
    errors: list[BaseException] = []
    latencies: list[list[float]] = [[] for _ in range(clients)]
    totals = [0] * clients
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * clients
    barrier = threading.Barrier(clients, action=on_start)

    def client(c: int) -> None:
        try:
            with requests.Session() as session:
                i = c * 7  # clients start at different requests
                (first or request)(session, i)
                end = time.perf_counter() + warmup_s
                while time.perf_counter() < end and not stop.is_set():
                    i += 1
                    request(session, i)
                barrier.wait()
                start = time.perf_counter()
                end = start + seconds
                mine, total = latencies[c], 0
                while not stop.is_set():
                    t0 = time.perf_counter()
                    if t0 >= end:
                        break
                    i += 1
                    total += request(session, i) or 0
                    mine.append(time.perf_counter() - t0)
                spans[c], totals[c] = (start, time.perf_counter()), total
        except threading.BrokenBarrierError:
            pass
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)
            stop.set()
            barrier.abort()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # in slices, so that Ctrl-C is seen
    finally:
        stop.set()
    if errors:
        raise RuntimeError(f"a client failed: {errors[0]}") from errors[0]
    elapsed = max(e for _, e in spans) - min(s for s, _ in spans)
    return [x for xs in latencies for x in xs], elapsed, sum(totals)


def timed_steps(trainer, prompts: int, steps: int, warmup: int, before_step=lambda: None):
    """Run `warmup + steps` steps of a set-up trainer; of the last `steps`: seconds, phase splits, mean lengths."""
    # Imported here, not at the top: bench/trl_rloo_step.py imports this module where aligner is not installed.
    from aligner.metrics import TRAIN_RESPONSE_LENGTH

    times, phases, lengths = [], [], []
    for i in range(warmup + steps):
        indices = trainer.sampler.next_batch(prompts)
        before_step()
        start = time.perf_counter()
        rollout = trainer.rollout(indices, trainer.train_data)
        trainer.optimise(rollout)
        elapsed = time.perf_counter() - start
        trainer.step += 1
        split = trainer.timers.pop()
        if i >= warmup:
            times.append(elapsed)
            phases.append(split)
            lengths.append(rollout.metrics[TRAIN_RESPONSE_LENGTH])  # the global mean under torchrun
    return times, phases, lengths
