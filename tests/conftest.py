"""Shared fixtures: a tiny tokenizer and Llama policy built locally from configs (no model hub). Files with the most
slow seconds run first (`pytest_collection_modifyitems`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from tests.helpers.architectures import TINY_SHAPE, tokenizer_fields

CORPUS = [
    "the cat is happy and kind.",
    "the dog is sad and slow.",
    "a bird can sing a bright song.",
    "the old river runs to the sea.",
    "tell me about the cat.",
    "describe the dog.",
] * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# Seconds a slow test counts for in the ordering below unless its marker says more (`@pytest.mark.slow(90)`).
SLOW_TEST_SECONDS = 10


def pytest_collection_modifyitems(config, items) -> None:
    """Files with the most slow seconds first, each file's tests kept together and in order. `make test` hands whole
    files to two xdist workers in collection order (--dist loadfile, with --no-loadscope-reorder: by default xdist
    puts the files with the most tests first): long files started last would leave one worker running alone at the
    end, while started first they overlap with the many short ones. A slow test counts `SLOW_TEST_SECONDS`, or the
    seconds its marker gives (the longest ones, from `make test`'s --durations)."""
    slow = Counter()
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker:
            slow[item.path] += marker.args[0] if marker.args else SLOW_TEST_SECONDS
    items.sort(key=lambda item: -slow[item.path])  # stable: files keep their order among equals


def build_tiny_policy(out_dir: Path, chat_template: bool = True, seed: int = 0) -> Path:
    """A ~100k-parameter Llama and a byte-level BPE tokenizer, saved as a Hugging Face folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(**TINY_SHAPE, **tokenizer_fields(tokenizer))
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny_policy"))


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory, tiny_policy_dir) -> Path:
    """A tiny Llama sequence classifier (one label) with the tiny policy's tokenizer: a reward model, or a critic's
    start."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_policy_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("reward_model")
    LlamaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# Where `built_once` keeps what it builds across test runs (`make test` sets it: its second pass, and the next
# `make test`, reuse the first one's demo assets); unset, each run builds in its own temporary folder.
ASSETS_ENV = "ALIGNER_TEST_ASSETS"


def _sources_digest(*packages: str) -> str:
    """A digest of the packages' source and of the library versions a build depends on: a cached build whose
    sources changed is not reused."""
    import transformers

    digest = hashlib.sha256(f"{torch.__version__}|{transformers.__version__}".encode())
    root = Path(__file__).resolve().parent.parent
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None], sources: tuple[str, ...] = ()) -> Path:
    """`build(folder)` once, shared read-only: under pytest-xdist (`make test` runs two workers) the first worker to
    ask builds it and the other waits for it, instead of building it again on the same cores. With
    `ALIGNER_TEST_ASSETS` set, the build is kept there, keyed by the digest of `sources` (package folders), for later
    runs."""
    if os.environ.get(ASSETS_ENV):
        base = Path(os.environ[ASSETS_ENV])
        base.mkdir(parents=True, exist_ok=True)
        name = f"{name}-{_sources_digest(*sources)}"
    else:
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent  # the run's folder, above each worker's own
    folder = base / name
    with FileLock(str(base / f"{name}.lock")):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(autouse=True)
def fresh_service_settings():
    """Each test reads the service's settings (webapp/settings.py) from its own environment: a test that changes the
    environment after they were read calls `service_settings.cache_clear()` itself."""
    from webapp.settings import service_settings

    service_settings.cache_clear()
    yield
    service_settings.cache_clear()  # after monkeypatch restored the environment: nothing leaks into the next test


@pytest.fixture(scope="session")
def demo_assets_dir(tmp_path_factory) -> Path:
    """The full demo folder of `aligner demo-assets` (about a minute to build): slow tests only."""
    from aligner.demo.assets import build_demo_assets

    build = lambda folder: build_demo_assets(folder / "assets", seed=0, progress=False)  # noqa: E731
    return built_once(tmp_path_factory, "demo", build, sources=("aligner",)) / "assets"


@pytest.fixture
def run_config(tmp_path, tiny_policy_dir):
    """make(run_dir="run", **sections): a tiny REINFORCE config; each section given is merged over the default."""
    prompts = ["tell me about the cat.", "describe the dog.", "a bird", "the old river", "the sea", "a song"]
    for name in ("train", "val"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))

    def make(run_dir="run", **sections):
        data = {
            "run_dir": str(tmp_path / run_dir),
            "model": {"policy_path": str(tiny_policy_dir)},
            "data": {"train_file": str(tmp_path / "train.jsonl"), "val_file": str(tmp_path / "val.jsonl")},
            "reward": {"function": "tests.helpers.rewards:letter_reward"},
            "generation": {"max_new_tokens": 8},
            "reinforce": {"num_prompts_per_step": 4, "num_rollouts_per_prompt": 2, "baseline": "none"},
            "optim": {"lr": 1e-3, "warmup_steps": 1, "micro_batch_size": 3},
            "trainer": {"max_steps": 4, "val_check_interval": 2, "save_interval": 2, "progress_bar": False},
        }
        for section, values in sections.items():
            data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
        from aligner.config import config_from_dict

        return config_from_dict(data)

    return make
