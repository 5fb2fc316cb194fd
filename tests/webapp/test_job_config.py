"""webapp/job_config.py: ConfigError lines to per-field errors, the service's limits, path checks."""

from __future__ import annotations

from aligner.errors import ConfigError
from webapp.job_config import MAX_REASON_CHARS, config_errors, validate_job_config


def test_config_errors_maps_each_line_to_its_field():
    err = ConfigError(
        "invalid config:\n  optim.lr: Input should be greater than 0 (got -1)\n  optim.lr: another reason\n"
        "  reward: give exactly one of reward.function, reward.model_path or reward.server_url\n  config: whole"
    )
    assert config_errors(err) == {
        "config.optim.lr": ["Input should be greater than 0 (got -1)", "another reason"],
        "config.reward": ["give exactly one of reward.function, reward.model_path or reward.server_url"],
        "config": ["whole"],
    }
    assert config_errors(ConfigError("override 'x' is not of the form key=value")) == {
        "config": ["override 'x' is not of the form key=value"]
    }
    long = config_errors(ConfigError("invalid config:\n  seed: " + "x" * 5000))["config.seed"][0]
    assert len(long) == MAX_REASON_CHARS and long.endswith("...")


def test_validate_job_config_sets_run_dir_and_checks_limits_and_paths(tmp_path):
    (tmp_path / "policy").mkdir()
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    raw = {
        "run_dir": "/elsewhere",
        "model": {"policy_path": "policy"},
        "data": {"train_file": "p.jsonl", "val_file": "p.jsonl"},
        "reward": {"function": "m:f"},
    }
    config = validate_job_config(raw, tmp_path, tmp_path / "runs" / "job_7")
    assert config.run_dir == str(tmp_path / "runs" / "job_7")
    assert config.data.train_file == str(tmp_path / "p.jsonl")

    huge = {**raw, "trainer": {"max_steps": 1_000_001}, "optim": {"lr": float("inf")}, "seed": -(2**64)}
    errors = validate_job_config(huge, tmp_path, tmp_path / "r")
    assert set(errors) == {"config.trainer.max_steps", "config.optim.lr", "config.seed"}

    moved = {**raw, "model": {"policy_path": "p.jsonl"}}  # a file where a folder is needed
    assert validate_job_config(moved, tmp_path, tmp_path / "r") == {
        "config.model.policy_path": ["folder not found: p.jsonl"]
    }
    assert not isinstance(validate_job_config(moved, tmp_path, tmp_path / "r", check_paths=False), dict)
