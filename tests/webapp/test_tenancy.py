"""Over the API a job names catalogue entries and its owner's datasets only: no path, URL or code reference gets
through, another user's uploads are "not found" exactly as a missing one, and the per-job limits hold."""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest

from tests.helpers.api import PROMPTS, bearer, both_backends, create_job
from webapp.settings import service_settings

JOBS = "/api/v1/jobs"


def post_job(client, token, config):
    return client.post(JOBS, json={"name": "j", "config": config}, headers=bearer(token))


def upload(client, token, name="mine.jsonl") -> dict:
    body = "".join(json.dumps(p) + "\n" for p in PROMPTS).encode()
    response = client.post(
        "/api/v1/datasets",
        data={"file": (io.BytesIO(body), name)},
        headers=bearer(token),
        content_type="multipart/form-data",
    )
    assert response.status_code == 201, response.json
    return response.json


@both_backends
@pytest.mark.parametrize(
    ("section", "field", "value", "instead"),
    [
        ("model", "policy_path", "/etc", "model.policy"),
        ("model", "tokenizer_path", "../runs/job_1/final_policy", "model.tokenizer"),
        ("data", "train_file", "/etc/passwd", "data.train_dataset"),
        ("data", "val_file", "datasets/user_1/x.jsonl", "data.val_dataset"),
        ("reward", "model_path", "/root", "reward.model"),
        ("reward", "server_url", "http://169.254.169.254/latest", "reward.server"),
        ("reward", "model_name", "../../x", "reward.server"),
        ("critic", "model_path", "/", "critic.model"),
        ("critic", "server_url", "http://127.0.0.1:5432", "critic.server"),
    ],
)
def test_paths_and_urls_are_refused_with_the_field_to_use_instead(
    client, token, config, section, field, value, instead
):
    config[section] = {**config.get(section, {}), field: value}
    response = post_job(client, token, config)
    assert response.status_code == 422, response.json
    assert response.json["errors"][f"config.{section}.{field}"] == [
        f"not accepted: name a catalogue entry with {instead}"
    ]


@pytest.mark.parametrize("uri", ["file:///etc", "http://169.254.169.254/latest", None])
def test_a_job_may_log_to_tensorboard_and_mlflow_but_not_choose_the_tracking_store(client, token, config, uri):
    config["logging"] = {"tensorboard": True, "mlflow": True, "mlflow_tracking_uri": uri}
    response = post_job(client, token, config)
    assert response.status_code == 422, response.json
    reason = "not accepted: a job's MLflow run is kept in its run folder (mlflow.db)"
    assert response.json["errors"] == {"config.logging.mlflow_tracking_uri": [reason]}
    del config["logging"]["mlflow_tracking_uri"]
    job = create_job(client, token, config)
    assert job["config"]["logging"] == {"tensorboard": True, "mlflow": True, "mlflow_experiment": "aligner"}


@both_backends
@pytest.mark.parametrize(
    "target", ["os:system", "subprocess:run", "pty:spawn", "builtins:exec", "aligner.demo:reward"]
)
def test_a_reward_function_is_a_catalogue_name_never_code(client, token, config, target):
    config["reward"] = {"function": target}
    response = post_job(client, token, config)
    assert response.status_code == 422
    assert "not found in the catalogue" in response.json["errors"]["config.reward.function"][0]
    assert client.get(JOBS, headers=bearer(token)).json["total"] == 0


@both_backends
def test_another_users_dataset_answers_exactly_as_a_missing_one(client, token, other_token, config):
    mine = upload(client, token)
    assert [d["id"] for d in client.get("/api/v1/datasets", headers=bearer(other_token)).json["items"]] == [
        d["id"] for d in client.get("/api/v1/datasets", headers=bearer(other_token)).json["items"] if d["shared"]
    ]
    answers = {}
    for ref in (mine["id"], 99999):
        config["data"] = {"train_dataset": ref, "val_dataset": "val.jsonl"}
        response = post_job(client, other_token, config)
        assert response.status_code == 422
        answers[ref] = response.json["errors"]["config.data.train_dataset"][0].replace(str(ref), "ID")
    assert answers[mine["id"]] == answers[99999]
    config["data"] = {"train_dataset": mine["id"], "val_dataset": "val.jsonl"}
    job = create_job(client, token, config)  # its owner may use it
    assert job["config"]["data"]["train_dataset"] == mine["id"]


@both_backends
def test_an_admin_shares_a_dataset_with_every_user(client, token, other_token, admin_token, config):
    mine = upload(client, token)
    config["data"] = {"train_dataset": mine["id"], "val_dataset": "val.jsonl"}
    assert post_job(client, other_token, config).status_code == 422
    shared = client.patch(f"/api/v1/datasets/{mine['id']}", json={"shared": True}, headers=bearer(admin_token))
    assert shared.status_code == 200 and shared.json["shared"]
    assert create_job(client, other_token, config)["config"]["data"]["train_dataset"] == mine["id"]
    listed = {d["id"]: d for d in client.get("/api/v1/datasets", headers=bearer(other_token)).json["items"]}
    assert listed[mine["id"]]["shared"] and not listed[mine["id"]]["mine"]


@both_backends
def test_the_stored_config_names_entries_with_every_default_and_no_server_path(client, token, config, data_dir):
    # NeMo's loop knobs pass the API's checks: validation off, a wall-clock limit as DD:HH:MM:SS (kept as seconds).
    config["trainer"] = {**config.get("trainer", {}), "val_check_interval": 0, "max_time": "00:01:00:30"}
    job = create_job(client, token, config)
    stored = job["config"]
    assert stored["trainer"]["val_check_interval"] == 0 and stored["trainer"]["max_time"] == 3630
    assert stored["model"]["policy"] == "tiny-sft" and "policy_path" not in stored["model"]
    assert isinstance(stored["data"]["train_dataset"], int) and "train_file" not in stored["data"]
    assert stored["reward"]["function"] == "demo"
    assert stored["trainer"]["keep_checkpoints"] == 3  # the service's default: checkpoints do not pile up
    assert str(data_dir / "models") not in json.dumps(stored)


@both_backends
def test_a_catalogue_folder_swapped_for_a_symlink_elsewhere_is_not_found(client, token, config, data_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = data_dir / "models" / "tiny-sft"
    shutil.rmtree(folder)
    os.symlink(outside, folder)
    response = post_job(client, token, config)
    assert response.status_code == 422
    assert "not found" in response.json["errors"]["config.model.policy"][0]


@both_backends
def test_a_dataset_file_that_resolves_outside_the_datasets_folder_is_not_found(client, token, config, tmp_path, app):
    mine = upload(client, token)
    stored = os.path.join(app.config["DATA_DIR"], mine["path"])
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"prompt": "private"}\n')
    os.remove(stored)
    os.symlink(secret, stored)
    config["data"] = {"train_dataset": mine["id"], "val_dataset": "val.jsonl"}
    response = post_job(client, token, config)
    assert response.status_code == 422
    assert "not found" in response.json["errors"]["config.data.train_dataset"][0]


@both_backends
def test_critic_server_overrides_are_an_allowlist(client, token, config):
    config.update(algorithm="ppo", critic={"model": "tiny-rm", "server_overrides": ["host=0.0.0.0"]})
    response = post_job(client, token, config)
    assert response.status_code == 422
    assert "host" in response.json["errors"]["config.critic.server_overrides"][0]
    config["critic"]["server_overrides"] = ["lr=1e-3"]
    assert create_job(client, token, config)["config"]["critic"]["model"] == "tiny-rm"


@both_backends
@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("model", "num_threads", 65),
        ("generation", "batch_size", 2**62),
        ("optim", "micro_batch_size", 1025),
        ("reinforce", "num_rollouts_per_prompt", 257),
        ("trainer", "train_samples_to_log", 2**62),
        ("trainer", "keep_checkpoints", 101),
    ],
)
def test_per_job_caps(client, token, config, section, field, value):
    config[section] = {**config.get(section, {}), field: value}
    response = post_job(client, token, config)
    assert response.status_code == 422
    assert "on this server" in response.json["errors"][f"config.{section}.{field}"][0]


def test_the_operator_sets_the_caps(app, client, token, config, monkeypatch):
    config["model"] = {**config["model"], "num_threads": 4}
    app.config["JOB_LIMITS"] = {"model.num_threads": 2}
    assert post_job(client, token, config).status_code == 422
    app.config["JOB_LIMITS"] = None
    monkeypatch.setenv("ALIGNER_JOB_LIMITS", '{"model.num_threads": 3}')
    service_settings.cache_clear()  # the API reads its environment once
    assert "at most 3" in post_job(client, token, config).json["errors"]["config.model.num_threads"][0]
    monkeypatch.setenv("ALIGNER_JOB_LIMITS", '{"model.num_threads": 8}')
    service_settings.cache_clear()
    assert post_job(client, token, config).status_code == 201


def test_a_builtin_reward_is_configured_by_data_checked_at_submission(client, token, config):
    config["reward"] = {"function": "numeric_match", "function_args": {"tolerance": -1}}
    response = post_job(client, token, config)
    assert response.status_code == 422 and "config.reward.function_args.tolerance" in response.json["errors"]
    config["reward"]["function_args"] = {"tolerance": 0.5}
    assert create_job(client, token, config)["config"]["reward"]["function_args"]["tolerance"] == 0.5
