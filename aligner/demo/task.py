"""The demo task: describe a thing kindly. Prompts, example responses, preference pairs and the reward function.

The reward counts kind words minus unkind ones in a response about the prompt's subject (off-topic answers lose
`OFF_TOPIC_PENALTY`): cheap, deterministic, and something a tiny policy measurably learns within minutes.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence

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
POSITIVE_SET, NEGATIVE_SET, SUBJECT_SET = frozenset(POSITIVE), frozenset(NEGATIVE), frozenset(SUBJECTS)
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
OFF_TOPIC_PENALTY = 0.5
_WORD = re.compile(r"[a-z]+")
NUM_TRAIN_PROMPTS = 384
NUM_VAL_PROMPTS = 16
CHAT_FORM_EVERY = 4  # every 4th prompt line uses the {"messages": [...]} form
# Reward model: preference pairs per training prompt and per validation prompt, and its training (reward_model.yaml).
TRAIN_PAIRS_PER_PROMPT = 8
VAL_PAIRS_PER_PROMPT = 16


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
