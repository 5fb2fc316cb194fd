"""The demo assets: the reward by hand, a small build (files, config, reload), determinism, the folder rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aligner.config import load_config
from aligner.data.preferences import read_preference_file
from aligner.demo.assets import DEFAULT_RM_STEPS, build_demo_assets
from aligner.demo.sft import sample_policy
from aligner.demo.task import reward, sentiment
from aligner.demo.tokenizer import CHAT_TEMPLATE
from aligner.errors import AlignerError
from aligner.trainers.reward_model import load_rm_config

SMALL_STEPS = 20
SMALL_RM_STEPS = 3
CHAT_PROMPT = "<|bos|><|user|>\nDescribe the house.\n<|assistant|>\n"


# --- reward ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "response", "expected"),
    [
        ("Describe the cat.", "the cat is happy and kind.", 1.0),  # 2 positive, 0 negative: 2/2
        ("Describe the cat.", "the cat is sad. it is ugly.", -1.0),  # 0 - 2 over 2
        ("Describe the cat.", "the cat is sad. it is happy.", 0.0),  # 1 - 1 over 2
        ("Tell me about the old river.", "the old river is dark, cold and calm.", -1 / 3),  # (1 - 2) / 3
        ("Tell me about the old river.", "the river is warm. it likes the sun.", 1.0),  # bare noun is on topic
        ("Describe the cat.", "the cat likes the sun.", 0.0),  # no adjective at all
        ("Describe the cat.", "the cat is unhappy.", 0.0),  # whole words only: "unhappy" is not "happy"
        ("Describe the cat.", "the dog is happy.", 0.5),  # 1.0 minus the off-topic penalty 0.5
        ("Describe the cat.", "", -0.5),  # nothing: 0, off topic
        ("Describe the cat.", "it is bad, bad and rude.", -1.5),  # -1 and off topic: the minimum
        ("What is it?", "happy happy", 1.0),  # no known subject: no penalty; repeats count each time
        (CHAT_PROMPT, "The House is HAPPY and Calm!", 1.0),  # chat-formatted prompt; case does not matter
    ],
)
def test_reward_by_hand(prompt, response, expected):
    assert reward([prompt], [response]) == [pytest.approx(expected)]


def test_reward_is_batched_and_checks_lengths():
    prompts = ["Describe the cat.", "Describe the dog."]
    assert reward(prompts, ["the cat is good.", "the dog is bad."]) == [1.0, -1.0]
    assert reward([], []) == []
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        reward(prompts, ["the cat is good."])


def test_sentiment_counts_words():
    assert sentiment("good, GOOD and bad") == pytest.approx(1 / 3)
    assert sentiment("") == 0.0


# --- a small build ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "assets"
    config_path = build_demo_assets(
        out, seed=0, sft_steps=SMALL_STEPS, progress=False, reward_model_steps=SMALL_RM_STEPS
    )
    assert config_path == out / "reinforce.yaml"
    return out


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _prompt_text(obj: dict) -> str:
    return obj["prompt"] if "prompt" in obj else obj["messages"][-1]["content"]


def test_files_exist(built):
    for name in ("reinforce.yaml", "prompts_train.jsonl", "prompts_val.jsonl"):
        assert (built / name).is_file(), name
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (built / "policy" / name).is_file(), name
    assert not (built / ".policy.partial").exists()
    for name in ("preferences_train.jsonl", "preferences_val.jsonl", "reward_model.yaml"):
        assert (built / name).is_file(), name
    for name in ("config.json", "model.safetensors", "tokenizer.json", "metrics.jsonl", "train_config.yaml"):
        assert (built / "reward_model" / name).is_file(), name


def test_prompt_files_have_both_forms_and_are_disjoint(built):
    train = _read_jsonl(built / "prompts_train.jsonl")
    val = _read_jsonl(built / "prompts_val.jsonl")
    assert len(train) >= 200 and len(val) == 16
    for lines in (train, val):
        assert any("prompt" in obj for obj in lines) and any("messages" in obj for obj in lines)
    train_texts, val_texts = {_prompt_text(o) for o in train}, {_prompt_text(o) for o in val}
    assert len(train_texts) == len(train) and not train_texts & val_texts


def test_preference_pairs_follow_the_demo_reward(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built / "policy")
    for split, per_prompt in (("train", 8), ("val", 16)):
        prompts = [_prompt_text(o) for o in _read_jsonl(built / f"prompts_{split}.jsonl")]
        pairs = read_preference_file(built / f"preferences_{split}.jsonl")
        assert len(pairs) == per_prompt * len(prompts)
        # The prompt is what the policy sees in `aligner train` (chat template), so the reward model scores that.
        formatted = {
            tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        }
        assert {p.prompt for p in pairs} == formatted
        chosen = reward([p.prompt for p in pairs], [p.chosen for p in pairs])
        rejected = reward([p.prompt for p in pairs], [p.rejected for p in pairs])
        assert all(c > r for c, r in zip(chosen, rejected))  # chosen = the higher reward, ties left out


def test_config_loads_and_points_into_the_folder(built):
    config = load_config(built / "reinforce.yaml")
    root = built.resolve()
    assert Path(config.model.policy_path) == root / "policy"
    assert Path(config.data.train_file) == root / "prompts_train.jsonl"
    assert Path(config.data.val_file) == root / "prompts_val.jsonl"
    assert Path(config.run_dir) == root / "runs" / "reinforce"
    assert config.reward.function == "aligner.demo:reward"
    assert (built / "reinforce.yaml").read_text().startswith("#")
    assert "aligner train --config" in (built / "reinforce.yaml").read_text()
    assert "# server_url: http://127.0.0.1:8000" in (built / "reinforce.yaml").read_text()
    assert "aligner serve-reward --model reward_model" in (built / "reinforce.yaml").read_text()


def test_ppo_config_is_the_reinforce_run_with_a_critic(built):
    ppo, reinforce = load_config(built / "ppo.yaml"), load_config(built / "reinforce.yaml")
    assert ppo.algorithm == "ppo" and reinforce.algorithm == "reinforce"
    assert Path(ppo.critic.model_path) == built.resolve() / "reward_model"
    assert Path(ppo.run_dir) == built.resolve() / "runs" / "ppo"
    assert ppo.critic.server_overrides and ppo.critic.server_url is None
    for section in ("model", "data", "reward", "generation", "reinforce", "optim", "trainer"):
        assert getattr(ppo, section) == getattr(reinforce, section), section
    assert "aligner train --config DIR/ppo.yaml" in (built / "ppo.yaml").read_text()


def test_reward_model_config_and_model(built):
    from transformers import AutoModelForSequenceClassification

    from aligner.rewards.local import ModelRewardClient
    from aligner.trainers.run_log import read_jsonl

    config = load_rm_config(built / "reward_model.yaml")
    root = built.resolve()
    assert Path(config.model.init_path) == root / "policy" and Path(config.output_dir) == root / "reward_model"
    assert Path(config.data.train_file) == root / "preferences_train.jsonl"
    assert Path(config.data.val_file) == root / "preferences_val.jsonl"
    assert config.trainer.max_steps == SMALL_RM_STEPS and config.model.device == "cpu"
    assert "aligner train-rm --config" in (built / "reward_model.yaml").read_text()
    assert [r["step"] for r in read_jsonl(built / "reward_model" / "metrics.jsonl")] == list(range(SMALL_RM_STEPS + 1))

    model = AutoModelForSequenceClassification.from_pretrained(built / "reward_model")
    assert model.config.model_type == "llama" and model.config.num_labels == 1
    assert model.config.pad_token_id == model.config.pad_token_id is not None
    client = ModelRewardClient(built / "reward_model")
    assert client.tokenizer.chat_template == CHAT_TEMPLATE
    rewards = client.submit(
        [CHAT_PROMPT, CHAT_PROMPT], ["the house is happy.", "the house is sad."], [{}, {}]
    ).result()
    assert rewards.shape == (2,) and torch.isfinite(rewards).all()


def test_tokenizer_and_model_reload_with_plain_transformers(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    tok = AutoTokenizer.from_pretrained(built / "policy")
    assert tok.chat_template == CHAT_TEMPLATE
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    assert len(tok) <= 512
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Describe the house."}], tokenize=False, add_generation_prompt=True
    )
    assert text == CHAT_PROMPT
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.bos_token_id) == 1 and tok.decode(ids) == text
    assert tok("the cat")["input_ids"][0] == tok.bos_token_id  # plain text gets a BOS
    assert PreTrainedTokenizerFast.from_pretrained(built / "policy").chat_template == CHAT_TEMPLATE

    model = AutoModelForCausalLM.from_pretrained(built / "policy")
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tok)
    assert (model.config.eos_token_id, model.config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert next(model.parameters()).dtype == torch.float32
    samples = sample_policy(model, tok, ["Describe the cat."], num_samples=2, max_new_tokens=8)
    assert len(samples) == 2 and all(isinstance(s[1], str) for s in samples)


def test_same_seed_gives_identical_assets(built, tmp_path):
    again = build_demo_assets(
        tmp_path / "again", seed=0, sft_steps=SMALL_STEPS, progress=False, reward_model_steps=SMALL_RM_STEPS
    ).parent
    for name in ("reinforce.yaml", "prompts_train.jsonl", "prompts_val.jsonl"):
        assert (again / name).read_bytes() == (built / name).read_bytes(), name
    for name in ("preferences_train.jsonl", "preferences_val.jsonl", "reward_model.yaml"):
        assert (again / name).read_bytes() == (built / name).read_bytes(), name
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        assert (again / "policy" / name).read_bytes() == (built / "policy" / name).read_bytes(), name
    for name in ("config.json", "metrics.jsonl"):
        assert (again / "reward_model" / name).read_bytes() == (built / "reward_model" / name).read_bytes(), name

    from safetensors.torch import load_file

    for folder in ("policy", "reward_model"):
        a, b = load_file(built / folder / "model.safetensors"), load_file(again / folder / "model.safetensors")
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), folder


def test_another_seed_gives_other_prompts(tmp_path):
    # sft_steps=0: only the files, the (untrained) models are not what this test is about.
    a = build_demo_assets(tmp_path / "a", seed=0, sft_steps=0, progress=False, reward_model_steps=0).parent
    b = build_demo_assets(tmp_path / "b", seed=1, sft_steps=0, progress=False, reward_model_steps=0).parent
    assert (a / "prompts_train.jsonl").read_bytes() != (b / "prompts_train.jsonl").read_bytes()


# --- the output folder -----------------------------------------------------------------------------------------


def test_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(AlignerError, match="notes.txt"):
        build_demo_assets(tmp_path, sft_steps=0, progress=False, reward_model_steps=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_refuses_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(AlignerError, match="not a folder"):
        build_demo_assets(tmp_path / "file", sft_steps=0, progress=False, reward_model_steps=0)


def test_rebuilds_a_demo_folder_in_place_and_keeps_runs(tmp_path):
    out = tmp_path / "assets"
    build_demo_assets(out, sft_steps=0, progress=False, reward_model_steps=0)
    (out / "runs" / "reinforce").mkdir(parents=True)
    (out / "runs" / "reinforce" / "metrics.jsonl").write_text("{}\n")
    (out / "policy" / "stale.bin").write_text("old")
    (out / "reward_model" / "stale.bin").write_text("old")
    (out / ".policy.partial").mkdir()  # left by an interrupted build
    build_demo_assets(out, sft_steps=0, progress=False, reward_model_steps=0)
    assert (out / "runs" / "reinforce" / "metrics.jsonl").read_text() == "{}\n"
    assert not (out / "policy" / "stale.bin").exists()
    assert not (out / "reward_model" / "stale.bin").exists()
    assert not (out / ".policy.partial").exists()
    load_config(out / "reinforce.yaml")


def test_rejects_negative_steps(tmp_path):
    with pytest.raises(ValueError, match="sft_steps"):
        build_demo_assets(tmp_path / "x", sft_steps=-1, progress=False)
    with pytest.raises(ValueError, match="reward_model_steps"):
        build_demo_assets(tmp_path / "x", sft_steps=0, progress=False, reward_model_steps=-1)


# --- the full build (about a minute) ---------------------------------------------------------------------------


@pytest.mark.slow
def test_full_build_gives_a_policy_that_writes_the_task(demo_assets_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = demo_assets_dir
    tok = AutoTokenizer.from_pretrained(out / "policy")
    model = AutoModelForCausalLM.from_pretrained(out / "policy").eval()
    val = [_prompt_text(o) for o in _read_jsonl(out / "prompts_val.jsonl")]
    samples = sample_policy(model, tok, val, num_samples=4, max_new_tokens=48, seed=0)
    rewards = reward([s[0] for s in samples], [s[1] for s in samples])
    assert sum(s[2] for s in samples) / len(samples) >= 0.9  # ends with EOS
    assert -0.4 <= sum(rewards) / len(rewards) <= 0.4  # about 0: room to improve either way
    assert len(set(rewards)) >= 4  # spread within and between prompts, which RLOO needs


@pytest.mark.slow
def test_full_build_gives_a_reward_model_that_orders_the_validation_pairs(demo_assets_dir):
    from aligner.rewards.local import ModelRewardClient
    from aligner.trainers.run_log import read_jsonl

    out = demo_assets_dir
    assert load_rm_config(out / "reward_model.yaml").trainer.max_steps == DEFAULT_RM_STEPS
    pairs = read_preference_file(out / "preferences_val.jsonl")
    client = ModelRewardClient(out / "reward_model")
    prompts = [p.prompt for p in pairs]
    chosen = client.submit(prompts, [p.chosen for p in pairs], [{}] * len(pairs)).result()
    rejected = client.submit(prompts, [p.rejected for p in pairs], [{}] * len(pairs)).result()
    accuracy = (chosen > rejected).float().mean().item()
    assert accuracy >= 0.9  # measured: 0.961 (seed 0, 150 steps); chance is 0.5
    # The same figure as the last validation of the training run: ModelRewardClient scores exactly what was trained.
    assert accuracy == pytest.approx(read_jsonl(out / "reward_model" / "metrics.jsonl")[-1]["val/accuracy"])
