"""A job's training config as the API accepts it: `aligner.config` validation plus the service's own limits.

`validate_job_config` returns the TrainConfig or a `{"config.optim.lr": ["reason", ...]}` mapping of every bad field:

- the config in the same shape as the YAML `aligner train` reads, checked by `aligner.config.config_from_dict`
  (unknown fields, wrong types, out-of-range values), relative paths taken relative to the data folder;
- `run_dir` is the server's (DATA_DIR/runs/job_<id>): a client's value is ignored;
- numbers must be finite and within the service's limits (SERVICE_LIMITS; any integer within 64 bits);
- `algorithm` is reinforce or ppo; a PPO job needs a critic: `critic.server_url` or `critic.model_path` (the worker
  then starts a critic server from it), an error under `config.critic` otherwise;
- the prompt files, policy, tokenizer, reward model and critic model folders must exist (unless CHECK_CONFIG_PATHS is
  off).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aligner.config import TrainConfig, config_from_dict
from aligner.errors import ConfigError
from webapp.db import ALGORITHMS, PPO

# Sizes a single job may ask for: larger values are almost surely typos, and max_steps lands in a 32-bit column.
SERVICE_LIMITS: dict[str, int] = {
    "trainer.max_steps": 1_000_000,
    "generation.max_new_tokens": 65_536,
    "data.max_prompt_length": 1_048_576,
    "reinforce.num_prompts_per_step": 65_536,
    "reinforce.num_rollouts_per_prompt": 4_096,
}
INT64_MAX = 2**63 - 1
MAX_REASON_CHARS = 300

# (dotted field, what must exist there)
PATH_CHECKS = (
    ("model.policy_path", "dir"),
    ("model.tokenizer_path", "dir"),
    ("data.train_file", "file"),
    ("data.val_file", "file"),
    ("reward.model_path", "dir"),
    ("critic.model_path", "dir"),
)
NEEDS_CRITIC = (
    "algorithm: ppo needs a critic: give critic.server_url (a running `aligner serve-critic`) or critic.model_path "
    "(a reward-model folder; the worker starts a critic server from it)"
)


def config_errors(err: ConfigError) -> dict[str, list[str]]:
    """`ConfigError` lines (`  optim.lr: reason`) as `{"config.optim.lr": ["reason"]}`."""
    lines = str(err).splitlines()
    errors: dict[str, list[str]] = {}
    if lines and lines[0].strip() == "invalid config:":
        for line in lines[1:]:
            field, _, reason = line.strip().partition(": ")
            key = "config" if field in ("", "config") else f"config.{field}"
            errors.setdefault(key, []).append(_short(reason))
    return errors or {"config": [_short(str(err))]}


def _short(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _walk(value: Any, prefix: str):
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, f"{prefix}.{key}")
    elif isinstance(value, list | tuple):
        for i, child in enumerate(value):
            yield from _walk(child, f"{prefix}.{i}")
    else:
        yield prefix, value


def limit_errors(config: TrainConfig, limits: dict[str, int] = SERVICE_LIMITS) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for field, value in _walk(config.model_dump(), "config"):
        if isinstance(value, bool):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            errors.setdefault(field, []).append(f"must be a finite number (got {value})")
        elif isinstance(value, int):
            limit = limits.get(field.removeprefix("config."), INT64_MAX)
            if value > limit:
                errors.setdefault(field, []).append(f"must be at most {limit} (got {value})")
            elif value < -limit:
                errors.setdefault(field, []).append(f"must be at least {-limit} (got {value})")
    return errors


def path_errors(config: TrainConfig, data_dir: Path) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for field, kind in PATH_CHECKS:
        section, name = field.split(".")
        value = getattr(getattr(config, section, None), name, None)  # a section may be absent (reward with PPO)
        if value is None:
            continue
        path = Path(value)
        ok = path.is_dir() if kind == "dir" else path.is_file()
        if not ok:
            shown = path.relative_to(data_dir) if path.is_relative_to(data_dir) else path
            errors[f"config.{field}"] = [f"{'folder' if kind == 'dir' else 'file'} not found: {shown}"]
    return errors


def algorithm_errors(raw: dict[str, Any]) -> dict[str, list[str]]:
    """The job type: `algorithm` is one of ALGORITHMS, and a PPO job names its critic (server or model)."""
    algorithm = raw.get("algorithm", "reinforce")
    if algorithm not in ALGORITHMS:
        return {"config.algorithm": [f"must be one of {', '.join(ALGORITHMS)} (got {_short(repr(algorithm))})"]}
    critic = raw.get("critic") or {}
    if algorithm == PPO and isinstance(critic, dict) and not (critic.get("server_url") or critic.get("model_path")):
        return {"config.critic": [NEEDS_CRITIC]}
    return {}


def validate_job_config(
    raw: dict[str, Any], data_dir: Path, run_dir: Path, check_paths: bool = True
) -> TrainConfig | dict[str, list[str]]:
    """The validated config with `run_dir` set, or the errors by dotted field."""
    raw = {**raw, "run_dir": str(run_dir)}
    try:
        config = config_from_dict(raw, data_dir)
    except ConfigError as err:
        errors, job_type = config_errors(err), algorithm_errors(raw)
        if "config.critic" in job_type:  # said under config.critic rather than at the root too
            errors["config"] = [reason for reason in errors.get("config", []) if "critic" not in reason]
            if not errors["config"]:
                del errors["config"]
        return {**errors, **job_type}
    errors = algorithm_errors(raw)
    if errors:
        return errors
    errors = limit_errors(config)
    if check_paths:
        for field, reasons in path_errors(config, data_dir.resolve()).items():
            errors.setdefault(field, []).extend(reasons)
    return errors or config
