"""Demo assets: everything a REINFORCE / RLOO run needs, built offline in under two minutes on two CPU cores.

    aligner demo-assets demo_assets
    aligner train --config demo_assets/reinforce.yaml

The task is a toy one whose reward a tiny model can learn to raise within a few dozen steps. Prompts ask to
describe a thing ("Describe the cat.", "Tell me about the old river."); the supervised (SFT) answers are one to
three short sentences whose adjectives are drawn half from a POSITIVE and half from a NEGATIVE list ("the cat is
happy and sad. it likes the sun."). The reward (`reward`, referred to as `aligner.demo:reward`) is the share of
positive over negative adjectives (minus 0.5 for a response that never names the prompt's subject), so the SFT
policy scores about 0 on average with a large spread between the samples of one prompt, which is what the
leave-one-out (RLOO) baseline needs; RL pushes it towards 1 (a throwaway RLOO loop with the settings of
reinforce.yaml, constant lr, went from about 0 to +0.7 in 60 steps and +0.8 in 100, in under a minute).

The folder holds:

    policy/               a tiny Llama (hidden 128, 4 layers, ~1M parameters) briefly SFT-trained on the task,
                          with its byte-level BPE tokenizer (vocab ~512, chat template), in safetensors
    prompts_train.jsonl   training prompts, as {"prompt": ...} lines and some {"messages": [...]} lines
    prompts_val.jsonl     validation prompts, disjoint from the training ones
    reinforce.yaml        a ready `aligner train` config (relative paths resolve against this folder)
    ppo.yaml              the same run with `algorithm: ppo`: a critic server started from reward_model/
    preferences_train.jsonl, preferences_val.jsonl
                          preference pairs {"prompt", "chosen", "rejected"}: two SFT-style responses (`make_response`)
                          to one chat-formatted prompt (train / validation prompts), chosen = the higher `reward`
    reward_model.yaml     the `aligner train-rm` config that made reward_model/
    reward_model/         a Bradley-Terry reward model (Llama sequence classifier, started from the SFT policy) that
                          orders about 96% of the validation pairs right: an alternative to `aligner.demo:reward`
                          (reward.model_path, or `aligner serve-reward --model reward_model`)

The build is deterministic: the same seed gives byte-identical tokenizer, prompt, preference and config files and
identical weights. The SFT and the reward-model training run on one torch thread: CPU matmuls may sum in another
order on another thread count, and on a busy shared 2-core machine two threads were several times slower than one
(on a quiet one, 1.6x faster).

An existing output folder is rebuilt in place when it holds nothing but what this command writes (and a `runs/`
folder of earlier training runs, which is left alone); any other non-empty folder is refused, so a mistyped path
cannot clobber unrelated files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

POSITIVE = (
    "happy", "kind", "good", "nice", "bright", "warm", "calm", "friendly", "gentle",
    "lovely", "clean", "beautiful", "brave", "cheerful", "sweet", "great", "wonderful", "pretty",
)  # fmt: skip
NEGATIVE = (
    "sad", "mean", "bad", "ugly", "dark", "cold", "angry", "dirty", "rude",
    "lazy", "noisy", "scary", "awful", "sick", "weak", "grumpy", "nasty", "boring",
)  # fmt: skip
# Things to describe (the subject of a prompt), neutral modifiers, and neutral things to mention in passing.
SUBJECTS = (
    "cat", "dog", "bird", "horse", "fish", "cow", "frog", "bear", "river", "lake", "tree", "flower", "house",
    "city", "garden", "forest", "car", "boat", "train", "bridge", "book", "song", "road", "hill", "village", "tower",
)  # fmt: skip
MODIFIERS = ("old", "young", "small", "big", "little", "tall", "red", "blue", "green", "brown", "white")
OBJECTS = ("sun", "rain", "wind", "sea", "moon", "snow", "grass", "night", "morning", "park", "music", "water")
PROMPT_TEMPLATES = (
    "Describe the {s}.",
    "Tell me about the {s}.",
    "What is the {s} like?",
    "Write a few words about the {s}.",
    "Say something about the {s}.",
    "Can you describe the {s}?",
)
# Sentences of a response: {S} the subject phrase, {N} the bare noun, {A} an adjective, {O} a neutral object.
FIRST_SENTENCES = (
    "{S} is {A}.",
    "{S} is {A} and {A}.",
    "{S} looks {A}.",
    "{S} is very {A}.",
    "{S} is {A}, {A} and {A}.",
)
LATER_SENTENCES = (
    "it is {A}.",
    "it is very {A}.",
    "it feels {A} today.",
    "people say it is {A}.",
    "the {N} is {A} and {A}.",
    "it likes the {O}.",
    "it is near the {O}.",
)

POSITIVE_SET, NEGATIVE_SET, SUBJECT_SET = frozenset(POSITIVE), frozenset(NEGATIVE), frozenset(SUBJECTS)
OFF_TOPIC_PENALTY = 0.5
_WORD = re.compile(r"[a-z]+")

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Each message is "<|role|>\n{content}\n"; an assistant turn ends with EOS instead of the newline, which is what
# the policy learns to emit. With add_generation_prompt the prompt ends in "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + message['content'] + eos_token }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

VOCAB_SIZE = 512
TOKENIZER_CORPUS_SIZE = 8192
MODEL_SHAPE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512)
MAX_POSITIONS = 256
DEFAULT_SFT_STEPS = 400
SFT_BATCH_SIZE = 24
SFT_LR = 6e-3
BUILD_THREADS = 1
NUM_TRAIN_PROMPTS = 384
NUM_VAL_PROMPTS = 16
CHAT_FORM_EVERY = 4  # every 4th prompt line uses the {"messages": [...]} form
# Reward model: preference pairs per training prompt and per validation prompt, and its training (reward_model.yaml).
TRAIN_PAIRS_PER_PROMPT = 8
VAL_PAIRS_PER_PROMPT = 16
DEFAULT_RM_STEPS = 150
RM_BATCH_SIZE = 16
RM_LR = "2.0e-3"  # as written in reward_model.yaml
OWN_ENTRIES = frozenset(
    {
        "policy",
        ".policy.partial",
        "prompts_train.jsonl",
        "prompts_val.jsonl",
        "reinforce.yaml",
        "ppo.yaml",
        "preferences_train.jsonl",
        "preferences_val.jsonl",
        "reward_model.yaml",
        "reward_model",
        "runs",
    }
)


# ---------------------------------------------------------------------------------------------------------------
# Reward


def sentiment(text: str) -> float:
    """(#positive - #negative adjectives) / max(1, #positive + #negative): in [-1, 1], 0 without adjectives.

    Whole lowercase words count, each occurrence once: "unhappy" is not "happy"; "happy happy" counts twice.
    """
    words = _WORD.findall(text.lower())
    pos = sum(w in POSITIVE_SET for w in words)
    neg = sum(w in NEGATIVE_SET for w in words)
    return (pos - neg) / max(1, pos + neg)


def prompt_subject(prompt: str) -> str | None:
    """The thing a prompt asks about: the last known subject noun in it ("Describe the old river." -> "river")."""
    nouns = [w for w in _WORD.findall(prompt.lower()) if w in SUBJECT_SET]
    return nouns[-1] if nouns else None


def reward(prompts: list[str], responses: list[str]) -> list[float]:
    """Reward of the demo task: `sentiment(response)`, minus 0.5 when the response never names the prompt's subject.

    The penalty keeps the policy on topic ("the cat is happy." scores 1.0 for "Describe the cat.", "the dog is
    happy." only 0.5). Prompts without a known subject get no penalty. Range [-1.5, 1].
    """
    if len(prompts) != len(responses):
        raise ValueError(f"reward: got {len(prompts)} prompts but {len(responses)} responses")
    scores = []
    for prompt, response in zip(prompts, responses):
        score = sentiment(response)
        subject = prompt_subject(prompt)
        if subject is not None and subject not in _WORD.findall(response.lower()):
            score -= OFF_TOPIC_PENALTY
        scores.append(score)
    return scores


# ---------------------------------------------------------------------------------------------------------------
# Corpus


def all_prompts() -> list[tuple[str, str]]:
    """Every distinct prompt of the task as (text, subject phrase), in a fixed order."""
    phrases = list(SUBJECTS) + [f"{m} {noun}" for noun in SUBJECTS for m in MODIFIERS]
    return [(t.format(s=phrase), phrase) for phrase in phrases for t in PROMPT_TEMPLATES]


def make_response(rng: random.Random, phrase: str) -> str:
    """One to three sentences about `phrase` ("old river") with adjectives drawn 50/50 positive/negative."""
    noun = phrase.split()[-1]

    def fill(template: str) -> str:
        out = template.replace("{S}", "the " + (phrase if rng.random() < 0.7 else noun)).replace("{N}", noun)
        out = out.replace("{O}", rng.choice(OBJECTS))
        while "{A}" in out:
            out = out.replace("{A}", rng.choice(POSITIVE if rng.random() < 0.5 else NEGATIVE), 1)
        return out

    num_sentences = rng.choices((1, 2, 3), weights=(25, 45, 30))[0]
    sentences = [fill(rng.choice(FIRST_SENTENCES))]
    sentences += [fill(rng.choice(LATER_SENTENCES)) for _ in range(num_sentences - 1)]
    return " ".join(sentences)


def make_examples(rng: random.Random, pool: Sequence[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    """`n` SFT examples (prompt text, response) drawn from the prompt pool."""
    out = []
    for _ in range(n):
        text, phrase = rng.choice(pool)
        out.append((text, make_response(rng, phrase)))
    return out


def _prompt_line(text: str, chat_form: bool) -> str:
    obj = {"messages": [{"role": "user", "content": text}]} if chat_form else {"prompt": text}
    return json.dumps(obj, ensure_ascii=False) + "\n"


def split_prompts(seed: int) -> tuple[list[str], list[str]]:
    """Disjoint (train, validation) prompt texts, shuffled by `seed`."""
    texts = [text for text, _ in all_prompts()]
    random.Random(f"demo-prompts-{seed}").shuffle(texts)
    return texts[NUM_VAL_PROMPTS : NUM_VAL_PROMPTS + NUM_TRAIN_PROMPTS], texts[:NUM_VAL_PROMPTS]


def make_preference_pairs(
    rng: random.Random, prompts: Sequence[str], pairs_per_prompt: int, format_prompt
) -> list[dict[str, str]]:
    """`pairs_per_prompt` preference pairs per prompt text: two SFT-style responses, chosen = higher `reward`.

    Pairs whose two responses score the same are drawn again. `format_prompt` turns the prompt text into what the
    policy sees (the chat template), which is the prompt the reward model is trained and later scored with.
    """
    phrases = dict(all_prompts())
    pairs = []
    for text in prompts:
        made = 0
        while made < pairs_per_prompt:
            a, b = make_response(rng, phrases[text]), make_response(rng, phrases[text])
            ra, rb = reward([text, text], [a, b])
            if ra == rb:
                continue
            chosen, rejected = (a, b) if ra > rb else (b, a)
            pairs.append({"prompt": format_prompt(text), "chosen": chosen, "rejected": rejected})
            made += 1
    return pairs


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer and policy


def train_tokenizer(texts: Iterable[str]):
    """A byte-level BPE tokenizer (vocab <= 512) with BOS/EOS/PAD and role tokens and the chat template.

    Plain `tokenizer(text)` prepends BOS; the chat template writes its own BOS, so tokenize its output with
    `add_special_tokens=False` (as aligner.data does).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [PAD, BOS, EOS, *ROLE_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


def new_policy(tokenizer):
    """A freshly initialised tiny Llama for `tokenizer` (initialisation draws from torch's global RNG)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    ids["pad_token_id"] = tokenizer.pad_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITIONS,
        num_key_value_heads=MODEL_SHAPE["num_attention_heads"],
        tie_word_embeddings=True,
        **MODEL_SHAPE,
        **ids,
    )
    config._attn_implementation = "eager"  # faster than sdpa at this size on the CPU; not saved with the config
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model


def chat_prompt(tokenizer, text: str) -> str:
    """The formatted prompt the trainer gives the policy for the user message `text`."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def _lr_factor(step: int, steps: int) -> float:
    warmup = max(1, steps // 10)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def sft(model, tokenizer, rng: random.Random, pool, steps: int, progress: bool) -> float:
    """Supervised training on freshly drawn examples; the loss covers the response tokens and the final EOS.

    Returns the mean loss of the last (up to) 20 steps.
    """
    import torch
    from tqdm import tqdm

    prompt_ids = {}
    for text, _ in pool:
        prompt_ids[text] = tokenizer(chat_prompt(tokenizer, text), add_special_tokens=False)["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LR, betas=(0.9, 0.98), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps))
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    model.train()
    losses = []
    bar = tqdm(range(steps), desc="SFT", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    for _ in bar:
        examples = make_examples(rng, pool, SFT_BATCH_SIZE)
        responses = tokenizer([r for _, r in examples], add_special_tokens=False)["input_ids"]
        seqs = [(prompt_ids[p], r + [eos]) for (p, _), r in zip(examples, responses)]
        width = max(len(p) + len(r) for p, r in seqs)
        input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (p, r) in enumerate(seqs):
            n = len(p) + len(r)
            input_ids[i, :n] = torch.tensor(p + r)
            labels[i, len(p) : n] = torch.tensor(r)
            mask[i, :n] = 1
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    tail = losses[-20:]
    return sum(tail) / len(tail) if tail else float("nan")


def sample_policy(
    model, tokenizer, prompts: Sequence[str], num_samples: int = 4, max_new_tokens: int = 48, seed: int = 0
) -> list[tuple[str, str, bool]]:
    """Sample `num_samples` responses per user prompt at temperature 1 (no top-k/top-p).

    Returns (formatted prompt, decoded response, ended with EOS) per sample.
    """
    import torch

    formatted = [chat_prompt(tokenizer, p) for p in prompts for _ in range(num_samples)]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        batch = tokenizer(formatted, add_special_tokens=False, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    results = []
    for prompt, row in zip(formatted, out[:, batch["input_ids"].shape[1] :].tolist()):
        ended = tokenizer.eos_token_id in row
        if ended:
            row = row[: row.index(tokenizer.eos_token_id)]
        results.append((prompt, tokenizer.decode(row, skip_special_tokens=True), ended))
    return results


# ---------------------------------------------------------------------------------------------------------------
# Files

CONFIG_TEMPLATE = """\
# Demo REINFORCE / RLOO run on the tiny policy built by `aligner demo-assets` (see aligner/demo.py).
# Run it with
#     aligner train --config DIR/reinforce.yaml
# where DIR is this folder. Relative paths below resolve against this folder; the run goes to DIR/runs/reinforce.
# Reward (aligner.demo:reward): (#positive - #negative adjectives) / #adjectives of the response, minus 0.5 when
# it never names the prompt's subject; about 0 on average for this SFT policy, at most 1.
run_dir: runs/reinforce
seed: 1234
model:
  policy_path: policy
  dtype: float32
  device: auto
  attn_implementation: eager
data:
  train_file: prompts_train.jsonl
  val_file: prompts_val.jsonl
  max_prompt_length: 64
reward:
  function: aligner.demo:reward
  # server_url: http://127.0.0.1:8000   # instead of function: score with DIR/reward_model served by
  #                                     #   aligner serve-reward --model reward_model      (run in DIR)
generation:
  max_new_tokens: 48
  temperature: 1.0
  batch_size: 64
reinforce:
  num_prompts_per_step: 8
  num_rollouts_per_prompt: 4
  initial_policy_kl_penalty: 0.02
  kl_estimator: abs
  baseline: rloo
optim:
  lr: 3.0e-4
  min_lr: 3.0e-5
  warmup_steps: 5
  weight_decay: 0.0
  max_grad_norm: 1.0
  micro_batch_size: 16
trainer:
  max_steps: 80
  val_check_interval: 10
  save_interval: 20
  keep_checkpoints: 2
"""

PPO_CONFIG_HEADER = """\
# Demo PPO run: the settings of reinforce.yaml with `algorithm: ppo` and a critic (see aligner/ppo_trainer.py).
# Run it with
#     aligner train --config DIR/ppo.yaml
# where DIR is this folder. `aligner train` starts a critic server (aligner serve-critic) from DIR/reward_model,
# trains it beside the policy and stops it at the end; its log goes to DIR/runs/ppo/critic_server.log.
# Rewards still come from aligner.demo:reward (as in reinforce.yaml), so the two runs' rewards compare directly.
"""
PPO_CONFIG_EXTRA = """\
algorithm: ppo
ppo:
  initial_policy_kl_penalty: 0.02
  gae_lambda: 0.95
  normalize_advantages: true
critic:
  model_path: reward_model
  # The critic starts from the reward model, whose scale is not this reward's: a high rate lets it catch up.
  server_overrides: [lr=1.0e-3]
"""


def ppo_config_text() -> str:
    """ppo.yaml: reinforce.yaml's settings (its comment header replaced) plus the PPO sections."""
    body = CONFIG_TEMPLATE[CONFIG_TEMPLATE.index("run_dir:") :].replace("run_dir: runs/reinforce", "run_dir: runs/ppo")
    return PPO_CONFIG_HEADER + body + PPO_CONFIG_EXTRA


RM_CONFIG_TEMPLATE = """\
# Demo reward-model training (Bradley-Terry) on the preference pairs built by `aligner demo-assets` (aligner/demo.py).
# `aligner demo-assets DIR` already ran it into DIR/reward_model; run it again (after editing) with
#     aligner train-rm --config DIR/reward_model.yaml
# Relative paths below resolve against this folder. A pair is two SFT-style responses to one chat-formatted prompt,
# chosen = the one with the higher aligner.demo:reward (ties left out). The reward model starts from the SFT policy
# (its body, plus a new score head) and scores prompt + response. Use it in reinforce.yaml with
# `model_path: reward_model` in place of `function:` under `reward:`, or serve it (in DIR) with
#     aligner serve-reward --model reward_model
output_dir: reward_model
seed: 1234
model:
  init_path: policy
  dtype: float32
  device: cpu
data:
  train_file: preferences_train.jsonl
  val_file: preferences_val.jsonl
  max_length: 128
optim:
  lr: {lr}
  weight_decay: 0.0
  warmup_steps: 10
  max_grad_norm: 1.0
  batch_size: {batch_size}
trainer:
  max_steps: {max_steps}
  val_check_interval: 50
  progress_bar: true
"""


def _write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _check_out_dir(out_dir: Path) -> None:
    from aligner.cli import UserError

    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} exists and is not a folder")
    if out_dir.is_dir():
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in OWN_ENTRIES)
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise UserError(
                f"{out_dir} is not empty and not a demo-assets folder (it holds {shown}); give a new or empty folder"
            )


@contextlib.contextmanager
def _transformers_progress_bars(enabled: bool):
    """Let transformers show its own progress bars (saving shards) only when we show ours."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled and not enabled:
            hf_logging.enable_progress_bar()


def _status(progress: bool, message: str) -> None:
    if progress:
        print(f"[demo-assets] {message}", file=sys.stderr, flush=True)


def build_demo_assets(
    out_dir: Path,
    seed: int = 0,
    sft_steps: int | None = None,
    progress: bool = True,
    reward_model_steps: int | None = None,
) -> Path:
    """Build the demo folder (see the module docstring) and return the path of its reinforce.yaml.

    `sft_steps` and `reward_model_steps` shorten the supervised and the reward-model training (tests; 0 saves the
    untrained models); `progress` shows status lines, progress bars and, at the end of the SFT, the policy's mean
    reward and share of EOS-ended samples over 64 samples (a few seconds).
    An existing folder is rebuilt in place if it holds only files this function writes (and `runs/`).
    """
    import torch

    out_dir = Path(out_dir)
    steps = DEFAULT_SFT_STEPS if sft_steps is None else sft_steps
    rm_steps = DEFAULT_RM_STEPS if reward_model_steps is None else reward_model_steps
    if steps < 0:
        raise ValueError(f"sft_steps must be >= 0, got {steps}")
    if rm_steps < 0:
        raise ValueError(f"reward_model_steps must be >= 0, got {rm_steps}")
    _check_out_dir(out_dir)
    start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)

    pool = all_prompts()
    train_prompts, val_prompts = split_prompts(seed)
    for name, texts in (("prompts_train.jsonl", train_prompts), ("prompts_val.jsonl", val_prompts)):
        lines = [_prompt_line(t, chat_form=i % CHAT_FORM_EVERY == CHAT_FORM_EVERY - 1) for i, t in enumerate(texts)]
        _write_text(out_dir / name, "".join(lines))
    _status(progress, f"{len(train_prompts)} train and {len(val_prompts)} validation prompts written")

    rng = random.Random(f"demo-corpus-{seed}")
    corpus = make_examples(rng, pool, TOKENIZER_CORPUS_SIZE)
    tokenizer = train_tokenizer(text for example in corpus for text in example)
    _status(progress, f"tokenizer trained: {len(tokenizer)} tokens")

    pair_rng = random.Random(f"demo-preferences-{seed}")
    for name, texts, per_prompt in (
        ("preferences_train.jsonl", train_prompts, TRAIN_PAIRS_PER_PROMPT),
        ("preferences_val.jsonl", val_prompts, VAL_PAIRS_PER_PROMPT),
    ):
        pairs = make_preference_pairs(pair_rng, texts, per_prompt, lambda t: chat_prompt(tokenizer, t))
        _write_text(out_dir / name, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
    _status(
        progress,
        f"preference pairs written: {len(train_prompts) * TRAIN_PAIRS_PER_PROMPT} train, "
        f"{len(val_prompts) * VAL_PAIRS_PER_PROMPT} validation",
    )
    rm_config_path = out_dir / "reward_model.yaml"
    _write_text(rm_config_path, RM_CONFIG_TEMPLATE.format(lr=RM_LR, batch_size=RM_BATCH_SIZE, max_steps=rm_steps))

    partial = out_dir / ".policy.partial"
    shutil.rmtree(partial, ignore_errors=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = new_policy(tokenizer)
            n_params = sum(p.numel() for p in model.parameters())
            _status(progress, f"policy: Llama with {n_params / 1e6:.2f}M parameters; SFT for {steps} steps")
            loss = sft(model, tokenizer, random.Random(f"demo-sft-{seed}"), pool, steps, progress)
        with _transformers_progress_bars(progress):
            model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
        shutil.rmtree(out_dir / "policy", ignore_errors=True)
        os.replace(partial, out_dir / "policy")
        _status(progress, f"SFT loss {loss:.3f}; policy and tokenizer saved to {out_dir / 'policy'}")
        if progress:
            samples = sample_policy(model, tokenizer, val_prompts * 4, num_samples=1, seed=seed)
            rewards = reward([s[0] for s in samples], [s[1] for s in samples])
            eos_share = sum(s[2] for s in samples) / len(samples)
            _status(
                progress,
                f"SFT policy on {len(samples)} samples: mean reward {sum(rewards) / len(rewards):+.3f}, "
                f"{eos_share:.0%} end with EOS; e.g. {samples[0][1]!r}",
            )
        _train_demo_reward_model(out_dir, rm_config_path, rm_steps, progress)
    finally:
        torch.set_num_threads(threads)

    config_path = out_dir / "reinforce.yaml"
    _write_text(config_path, CONFIG_TEMPLATE)
    _write_text(out_dir / "ppo.yaml", ppo_config_text())
    _status(progress, f"done in {time.perf_counter() - start:.0f} s")
    return config_path


def _train_demo_reward_model(out_dir: Path, config_path: Path, steps: int, progress: bool) -> None:
    """Train DIR/reward_model with DIR/reward_model.yaml, starting from the SFT policy just saved."""
    from aligner.reward_model import load_rm_config, train_reward_model, validation_summary

    config = load_rm_config(config_path)
    config.trainer.progress_bar = progress
    shutil.rmtree(out_dir / "reward_model", ignore_errors=True)
    _status(progress, f"reward model: Bradley-Terry training for {steps} steps, from the SFT policy")
    with _transformers_progress_bars(progress):
        rm_dir = train_reward_model(config)
    _status(progress, f"reward model saved to {rm_dir}: {validation_summary(rm_dir)}")
