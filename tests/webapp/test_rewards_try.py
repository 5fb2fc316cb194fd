"""POST /api/v1/rewards/try and the cheap checks on every submit (the dry run: tests/webapp/test_dry_run.py)."""

from __future__ import annotations

import io
import json
import time

import pytest
from sqlalchemy import select

from tests.helpers.api import bearer
from tests.helpers.catalogue import register_model
from webapp import rewards_try
from webapp.db import RewardFunction, User
from webapp.limits import TRY_EXTENSION

TRY, JOBS = "/api/v1/rewards/try", "/api/v1/jobs"
TRY_KEYS = {"samples", "groups", "reward_length_corr", "frac_zero_std_groups", "seconds", "warnings"}


@pytest.fixture
def real_config(db_session, tiny_policy_dir) -> dict:
    """A try's config on the real tiny policy, scored by the registered `letters` function."""
    with db_session() as session:
        register_model(session, tiny_policy_dir, "policy", "tiny-real")
        session.add(RewardFunction(name="letters", target="tests.helpers.rewards:letter_reward"))
    return {
        "model": {"policy": "tiny-real", "num_threads": 1},
        "data": {"train_dataset": "train.jsonl"},
        "reward": {"function": "letters"},
        "generation": {"max_new_tokens": 4},
    }


def test_a_try_samples_and_scores_in_a_subprocess(client, token, real_config):
    body = {"config": real_config, "num_prompts": 2, "num_samples": 3}
    response = client.post(TRY, json=body, headers=bearer(token))
    assert response.status_code == 200, response.json
    body = response.json
    assert set(body) == TRY_KEYS
    assert [s["group"] for s in body["samples"]] == [0, 0, 0, 1, 1, 1]
    assert set(body["samples"][0]) == {"group", "prompt", "response", "reward", "length"}
    for sample in body["samples"]:  # the registered function scored each response
        response_text = sample["response"]
        assert sample["reward"] == pytest.approx(response_text.count("e") / max(1, len(response_text)), abs=1e-6)
        assert 1 <= sample["length"] <= 4
    assert [set(g) for g in body["groups"]] == [{"group", "prompt", "mean", "std", "zero_spread"}] * 2
    assert "Describe the cat." in body["groups"][0]["prompt"] and body["seconds"] > 0


def test_a_broken_reward_is_422_on_reward_with_its_message(client, token, config, monkeypatch):
    # What `aligner try-reward --json` prints for a reward that raised (tests/aligner/rewards/test_trial.py).
    printed = json.dumps({"error": {"type": "RewardError", "message": "the reward function raised ValueError: boom"}})
    monkeypatch.setattr(rewards_try, "run_try", lambda *args: rewards_try.interpret(2, f"a print\n{printed}\n", ""))
    response = client.post(TRY, json={"config": config}, headers=bearer(token))
    assert response.status_code == 422
    assert response.json == {
        "message": "The reward does not work",
        "errors": {"reward": ["the reward function raised ValueError: boom"]},
    }
    crashed = lambda *args: rewards_try.interpret(-9, "", "Traceback...\nMemoryError\n")  # noqa: E731
    monkeypatch.setattr(rewards_try, "run_try", crashed)
    response = client.post(TRY, json={"config": config}, headers=bearer(token))
    assert response.status_code == 422 and response.json["errors"]["reward"] == [
        "the try stopped with an error: MemoryError"
    ]


def test_a_try_past_the_time_limit_is_422_naming_it(app, client, token, config):
    app.config["TRY_TIMEOUT_S"] = 0.05  # the subprocess cannot even import torch in that time
    start = time.perf_counter()
    response = client.post(TRY, json={"config": config}, headers=bearer(token))
    assert response.status_code == 422 and time.perf_counter() - start < 10
    assert "within 0.05 s" in response.json["errors"]["timeout"][0]


def test_a_try_checks_the_config_like_a_submit(client, token, other_token, config):
    mine = client.post(
        "/api/v1/datasets",
        data={"file": (io.BytesIO(b'{"prompt": "mine"}\n'), "mine.jsonl")},
        headers=bearer(token),
    ).json
    config["data"] = {"train_dataset": mine["id"]}
    theirs = client.post(TRY, json={"config": config}, headers=bearer(other_token))
    assert theirs.status_code == 422 and "not found" in theirs.json["errors"]["config.data.train_dataset"][0]
    config["reward"] = {"function": "no-such-function"}
    config["optim"] = {"lr": -1}
    bad = client.post(TRY, json={"config": config, "num_samples": 1, "num_prompts": 9}, headers=bearer(token))
    assert bad.status_code == 422 and {"num_samples", "num_prompts"} <= set(bad.json["errors"])
    bad = client.post(TRY, json={"config": config}, headers=bearer(token))
    assert bad.status_code == 422 and {"config.reward.function", "config.optim.lr"} <= set(bad.json["errors"])


def test_one_try_at_a_time_per_user(app, client, token, other_token, config, db_session, monkeypatch):
    monkeypatch.setattr(rewards_try, "run_try", lambda *args: pytest.fail("a try ran"))
    with db_session() as session:
        alice = session.scalar(select(User.id).where(User.name == "alice"))
    release = app.extensions[TRY_EXTENSION].acquire(alice, 1)  # a try of alice's is running
    try:
        response = client.post(TRY, json={"config": config}, headers=bearer(token))
        assert response.status_code == 429 and "reward try running" in response.json["message"]
    finally:
        release()


# ------------------------------------------------------------------------------------------------- cheap checks
@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({}, "is not a model folder: no config.json"),
        ({"config.json": "{not json"}, "config.json does not parse"),
        ({"config.json": "[]"}, "config.json is not a JSON object"),
        ({"config.json": '{"model_type": "no-such-arch"}'}, "model_type 'no-such-arch' this server's"),
        ({"config.json": '{"model_type": "llama"}'}, "no weights"),
        ({"config.json": '{"model_type": "llama"}', "model.safetensors": ""}, "holds no tokenizer"),
    ],
)
def test_a_policy_folder_that_is_not_a_model_is_422_at_once(
    client, token, config, db_session, data_dir, files, reason
):
    folder = data_dir / "models" / "not-a-model"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    with db_session() as session:
        register_model(session, folder, "policy", "not-a-model")
    config["model"] = {"policy": "not-a-model"}
    start = time.perf_counter()
    response = client.post(JOBS, json={"name": "x", "config": config}, headers=bearer(token))
    assert response.status_code == 422 and time.perf_counter() - start < 1
    message = response.json["errors"]["config.model.policy"][0]  # then the tokenizer's, when the folder has none
    assert message.startswith("catalogue model 'not-a-model' ") and str(folder) not in message  # its name only
    assert reason in " ".join(response.json["errors"]["config.model.policy"])
    assert client.get(JOBS, headers=bearer(token)).json["total"] == 0


def test_openapi_documents_the_try_and_the_dry_run(client):
    spec = client.get("/api/v1/openapi.json").json
    create = spec["paths"]["/api/v1/jobs"]["post"]
    assert "dry_run" in [p["name"] for p in create["parameters"]] and "200" in create["responses"]
    tried = spec["paths"]["/api/v1/rewards/try"]["post"]
    assert {"200", "422", "429"} <= set(tried["responses"])
    assert json.dumps(spec).count("zero_spread") >= 1
