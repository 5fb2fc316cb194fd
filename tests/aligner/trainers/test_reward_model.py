"""Reward-model training (aligner train-rm): preference files, the config, a tiny learnable run, reload, the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from aligner.cli import main
from aligner.config import config_from_dict
from aligner.data.preferences import PreferencePair, read_preference_file, tokenize_pairs
from aligner.errors import AlignerError, ConfigError, PreferenceDataError, PromptDataError
from aligner.trainers.reward_model import (
    CONFIG_FILE,
    RM_PATH_FIELDS,
    RewardModelTrainConfig,
    load_rm_config,
    num_training_steps,
    train_reward_model,
    validation_summary,
)
from aligner.trainers.run_log import read_jsonl
from aligner.trainers.schedule import lr_multiplier

WORDS = ("the", "cat", "dog", "bird", "river", "sea", "old", "song", "runs", "can", "sing", "slow", "bright")
PROMPT = "<|user|>\ntell me about the cat.\n<|assistant|>\n"


def synthetic_pairs(rng: random.Random, n: int) -> list[dict[str, str]]:
    """A learnable preference: the chosen response has "happy" where the rejected one has "sad", else the same."""
    pairs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 6))]
        at = rng.randint(0, len(words))
        chosen = " ".join(words[:at] + ["happy"] + words[at:]) + "."
        rejected = " ".join(words[:at] + ["sad"] + words[at:]) + "."
        pairs.append({"prompt": PROMPT, "chosen": chosen, "rejected": rejected})
    return pairs


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def pref_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prefs")
    rng = random.Random(0)
    write_jsonl(out / "train.jsonl", synthetic_pairs(rng, 256))
    write_jsonl(out / "val.jsonl", synthetic_pairs(rng, 64))
    return out


def make_config(pref_dir: Path, init_path: Path, output_dir: Path, **sections) -> RewardModelTrainConfig:
    data = {
        "output_dir": str(output_dir),
        "seed": 0,
        "model": {"init_path": str(init_path), "device": "cpu"},
        "data": {"train_file": str(pref_dir / "train.jsonl"), "val_file": str(pref_dir / "val.jsonl")},
        "optim": {"lr": 1e-3, "batch_size": 16, "warmup_steps": 2},
        "trainer": {"max_steps": 30, "val_check_interval": 10, "progress_bar": False},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return config_from_dict(data, schema=RewardModelTrainConfig, path_fields=RM_PATH_FIELDS)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_policy_dir, pref_dir) -> Path:
    out = tmp_path_factory.mktemp("rm") / "reward_model"
    assert train_reward_model(make_config(pref_dir, tiny_policy_dir, out)) == out
    return out


# --- preference files ------------------------------------------------------------------------------------------


def test_bad_lines_are_reported_with_file_and_line(tmp_path):
    good = {"prompt": "p", "chosen": "a", "rejected": "b"}
    path = write_jsonl(
        tmp_path / "prefs.jsonl",
        [
            json.dumps(good),
            "{not json",
            "[1, 2]",
            json.dumps({"prompt": "p", "chosen": "a"}),
            json.dumps({**good, "chosen": 3}),
            json.dumps({**good, "rejected": "  "}),
            "",  # blank lines are skipped
            json.dumps({**good, "rejected": "a"}),
            json.dumps({**good, "score": 1.0}),  # extra keys are fine
        ],
    )
    with pytest.raises(PreferenceDataError) as info:
        read_preference_file(path)
    message = str(info.value)
    assert message.startswith("6 bad line(s) in preference file")
    for line, reason in [
        (2, "invalid JSON"),
        (3, "expected a JSON object, got list"),
        (4, 'missing field(s) "rejected"'),
        (5, 'field "chosen" must be a string, got int'),
        (6, 'field "rejected" must be a non-empty string'),
        (8, '"chosen" and "rejected" are the same text'),
    ]:
        assert f"{path}:{line}: {reason}" in message
    assert isinstance(info.value, PromptDataError)  # the CLI reports it without a traceback


def test_good_file_empty_file_and_missing_file(tmp_path):
    path = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "", "chosen": "a", "rejected": "b", "id": 7}])
    assert read_preference_file(path) == [PreferencePair("", "a", "b")]
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(PreferenceDataError, match="empty.jsonl: preference file has no pairs"):
        read_preference_file(tmp_path / "empty.jsonl")
    with pytest.raises(PreferenceDataError, match="nope.jsonl: preference file not found"):
        read_preference_file(tmp_path / "nope.jsonl")


def test_long_pairs_keep_their_end(tiny_policy_dir):
    from aligner.trainers.reward_model import load_rm_tokenizer

    tok = load_rm_tokenizer(tiny_policy_dir)
    pair = PreferencePair("the old river runs to the sea. ", "the cat is happy.", "the dog is sad.")
    full = tokenize_pairs([pair], tok, max_length=512)
    assert full.num_truncated == 0 and full.chosen[0] == tok(pair.prompt + pair.chosen)["input_ids"]
    short = tokenize_pairs([pair], tok, max_length=4)
    assert short.num_truncated == 1
    assert short.chosen[0] == full.chosen[0][-4:] and short.rejected[0] == full.rejected[0][-4:]


# --- config ----------------------------------------------------------------------------------------------------


def test_config_resolves_paths_against_the_yaml_and_applies_overrides(tmp_path):
    (tmp_path / "rm.yaml").write_text(
        "model: {init_path: policy}\ndata: {train_file: t.jsonl, val_file: v.jsonl}\noutput_dir: out\n"
    )
    config = load_rm_config(tmp_path / "rm.yaml", ["optim.lr=1e-4", "trainer.epochs=2"])
    root = tmp_path.resolve()
    assert Path(config.model.init_path) == root / "policy" and Path(config.output_dir) == root / "out"
    assert Path(config.data.train_file) == root / "t.jsonl" and config.model.tokenizer_path is None
    assert config.optim.lr == 1e-4 and config.trainer.epochs == 2 and config.trainer.max_steps is None


MINIMAL = "model: {init_path: p}\ndata: {train_file: t, val_file: v}\n"


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        ("model: {init_path: p}\n", [], "data: required field is missing"),
        (MINIMAL + "epochs: 3\n", [], "epochs: unknown field"),
        (MINIMAL, ["model.policy_path=q"], "model.policy_path: unknown field"),
        (MINIMAL, ["optim.lr=-1"], "optim.lr: Input should be greater than 0"),
        (MINIMAL, ["data.max_length=1"], "data.max_length: Input should be greater than or equal to 2"),
        (MINIMAL, ["trainer.max_steps=5", "trainer.epochs=1"], "give trainer.max_steps or trainer.epochs, not both"),
    ],
)
def test_config_errors_name_the_field(tmp_path, text, overrides, expected):
    (tmp_path / "rm.yaml").write_text(text)
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        load_rm_config(tmp_path / "rm.yaml", overrides)


def test_length_of_the_run_and_lr_schedule(pref_dir, tiny_policy_dir, tmp_path):
    def steps(**trainer):
        return num_training_steps(make_config(pref_dir, tiny_policy_dir, tmp_path, trainer=trainer), 100)

    assert steps(max_steps=7) == 7
    assert steps(max_steps=None) == 7  # 1 epoch: ceil(100 / 16)
    assert steps(max_steps=None, epochs=2.5) == 16  # ceil(250 / 16)
    # warmup 4: 1/4, ..., 4/4; then linear to 0 at step 20
    factors = [lr_multiplier(s, 4, 20, decay="linear") for s in (0, 3, 4, 12, 20)]
    assert factors == pytest.approx([0.25, 1.0, 1.0, 0.5, 0.0])
    assert lr_multiplier(0, 0, 10, decay="linear") == 1.0


# --- training --------------------------------------------------------------------------------------------------


def test_training_learns_the_preference(trained):
    rows = read_jsonl(trained / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(31))
    assert set(rows[0]) == {"step", "val/loss", "val/accuracy", "val/margin"}
    train_keys = {"train/loss", "train/accuracy", "train/margin", "train/grad_norm", "train/lr"}
    assert all(train_keys <= set(r) for r in rows[1:])
    val = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in val] == [0, 10, 20, 30]
    assert val[0]["val/loss"] == pytest.approx(0.693, abs=0.01)  # the new head starts at about log 2
    assert val[-1]["val/accuracy"] >= 0.9 and val[-1]["val/loss"] < 0.5 and val[-1]["val/margin"] > 0
    assert rows[1]["train/lr"] == pytest.approx(5e-4)  # warmup 2: half of lr at the first step
    assert "validation accuracy" in validation_summary(trained)


def test_saved_model_reloads_and_scores_like_training(trained, pref_dir):
    from transformers import AutoModelForSequenceClassification

    from aligner.rewards.local import ModelRewardClient
    from aligner.trainers.reward_model import _score_pairs

    for name in ("config.json", "model.safetensors", "tokenizer.json", CONFIG_FILE):
        assert (trained / name).is_file(), name
    model = AutoModelForSequenceClassification.from_pretrained(trained).eval()
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    assert model.config.architectures == ["LlamaForSequenceClassification"]
    saved = yaml.safe_load((trained / CONFIG_FILE).read_text())
    assert saved["output_dir"] == str(trained) and saved["trainer"]["max_steps"] == 30

    pairs = read_preference_file(pref_dir / "val.jsonl")
    client = ModelRewardClient(trained)
    rewards = client.submit(
        [p.prompt for p in pairs] * 2, [p.chosen for p in pairs] + [p.rejected for p in pairs], [{}] * 2 * len(pairs)
    ).result()
    chosen, rejected = rewards[: len(pairs)], rewards[len(pairs) :]
    assert (chosen > rejected).float().mean().item() >= 0.9
    # The text scored is prompt + response, tokenized and padded as in training: the same rewards.
    data = tokenize_pairs(pairs[:8], client.tokenizer, 512)
    with torch.no_grad():
        c, r = _score_pairs(model, data.chosen, data.rejected, client.tokenizer.pad_token_id, "cpu")
    torch.testing.assert_close(torch.cat([c, r]), torch.cat([chosen[:8], rejected[:8]]), atol=1e-5, rtol=1e-5)


def test_same_seed_same_weights_and_micro_batches_match(trained, pref_dir, tiny_policy_dir, tmp_path):
    short = {"max_steps": 3, "val_check_interval": 3}
    a = train_reward_model(make_config(pref_dir, tiny_policy_dir, tmp_path / "a", trainer=short))
    b = train_reward_model(make_config(pref_dir, tiny_policy_dir, tmp_path / "b", trainer=short))
    c = train_reward_model(
        make_config(pref_dir, tiny_policy_dir, tmp_path / "c", trainer=short, optim={"micro_batch_size": 5})
    )
    wa, wb, wc = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert all(torch.allclose(wa[k], wc[k], atol=1e-5) for k in wa)  # accumulation: the same step up to rounding
    assert read_jsonl(a / "metrics.jsonl") == read_jsonl(b / "metrics.jsonl")


def test_zero_steps_validates_and_saves_the_initial_model(pref_dir, tiny_policy_dir, tmp_path):
    out = train_reward_model(make_config(pref_dir, tiny_policy_dir, tmp_path / "rm", trainer={"max_steps": 0}))
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0]
    assert (out / "model.safetensors").is_file()


def test_output_dir_must_not_be_the_initial_model(pref_dir, tiny_policy_dir):
    with pytest.raises(AlignerError, match="output_dir is model.init_path"):
        train_reward_model(make_config(pref_dir, tiny_policy_dir, tiny_policy_dir))


# --- command line ----------------------------------------------------------------------------------------------


def _yaml(path: Path, config: RewardModelTrainConfig) -> Path:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def test_cli_trains_and_prints_accuracy_and_folder(pref_dir, tiny_policy_dir, tmp_path, capsys):
    path = _yaml(tmp_path / "rm.yaml", make_config(pref_dir, tiny_policy_dir, tmp_path / "rm"))
    assert main(["train-rm", "--config", str(path), "--set", "trainer.max_steps=2"]) == 0
    out = capsys.readouterr().out
    last = read_jsonl(tmp_path / "rm" / "metrics.jsonl")[-1]
    assert last["step"] == 2
    assert f"validation accuracy {last['val/accuracy']:.3f} at step 2" in out
    assert f"reward model: {tmp_path / 'rm'}" in out


def test_cli_user_errors_exit_2_without_traceback(pref_dir, tiny_policy_dir, tmp_path, capsys):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}, "{oops"])
    # Bad data is found before any model loads: the missing init_path is never reached.
    config = make_config(pref_dir, tmp_path / "no_model", tmp_path / "rm", data={"val_file": str(bad)})
    assert main(["train-rm", "--config", str(_yaml(tmp_path / "a.yaml", config))]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: invalid JSON" in err and "Traceback" not in err

    config = make_config(pref_dir, tmp_path / "no_model", tmp_path / "rm")
    assert main(["train-rm", "--config", str(_yaml(tmp_path / "b.yaml", config))]) == 2
    assert "model.init_path folder not found" in capsys.readouterr().err

    (tmp_path / "c.yaml").write_text("model: {init_path: p}\ndata: {train_file: t, val_file: v}\noptim: {lr: fast}\n")
    assert main(["train-rm", "--config", str(tmp_path / "c.yaml")]) == 2
    assert "optim.lr: Input should be a valid number" in capsys.readouterr().err

    assert main(["train-rm", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
