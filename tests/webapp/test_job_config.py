"""webapp/job_config.py: aligner's errors in the API's field names, the operator's limits, and the worker's second
check of a stored config (launch_config)."""

from __future__ import annotations

import pytest

from aligner.errors import ConfigError
from webapp.job_config import MAX_REASON_CHARS, JobRefused, config_errors, job_limits, launch_config


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
    limits = job_limits({"trainer.max_steps": 20})
    assert limits["model.num_threads"] == 8 and limits["trainer.max_steps"] == 20
    assert limits["generation.batch_size"] == 1024  # the defaults stay
    for bad in ("[1]", '{"x": "many"}', "not json"):
        monkeypatch.setenv("ALIGNER_JOB_LIMITS", bad)
        with pytest.raises(ConfigError, match="ALIGNER_JOB_LIMITS"):
            job_limits()


def test_launch_config_refuses_a_job_without_an_owner(db_session, app, tmp_path):
    from webapp.db import Job

    with db_session() as session:
        job = Job(id=7, user_id=12345, name="orphan", config={}, run_dir="")
        with pytest.raises(JobRefused, match="no owner"):
            launch_config(session, job, tmp_path, tmp_path / "run")
