"""Fixtures of the worker tests: real PostgreSQL and Redis (skipped when unreachable, failed when CI=true), fresh
databases, tiny training jobs, and a running service (the helpers they build on: tests/helpers/service.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.databases import require_postgres
from tests.helpers.service import PROMPTS, PgSchema, Service, require_redis
from webapp.db import Base, make_engine, make_session_factory


@pytest.fixture(scope="session")
def redis_url() -> str:
    return require_redis()


@pytest.fixture(scope="session")
def pg_available() -> None:
    require_postgres()


@pytest.fixture
def pg_schema(pg_available):
    schema = PgSchema()
    yield schema
    schema.drop()


@pytest.fixture(params=["sqlite", "postgresql"])
def factory(request, tmp_path):
    """A session factory on a fresh database: a SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'aligner.db'}")
        Base.metadata.create_all(engine)
        yield make_session_factory(engine)
        engine.dispose()
    else:
        request.getfixturevalue("pg_available")
        schema = PgSchema()
        yield schema.factory
        schema.drop()


# ------------------------------------------------------------------------------------------------- tiny jobs
@pytest.fixture(scope="session")
def prompt_files(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("prompts")
    for name in ("train", "val"):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return folder / "train.jsonl", folder / "val.jsonl"


@pytest.fixture(scope="session")
def job_config(tiny_policy_dir, prompt_files) -> Callable[..., dict[str, Any]]:
    """A tiny REINFORCE config as the API stores it (absolute paths); keyword sections update it."""

    def make(max_steps: int = 4, save_interval: int = 2, val_check_interval: int = 2, **sections) -> dict:
        config = {
            "model": {"policy_path": str(tiny_policy_dir), "num_threads": 1},
            "data": {"train_file": str(prompt_files[0]), "val_file": str(prompt_files[1])},
            "reward": {"function": "tests.helpers.rewards:letter_reward"},
            # Jobs of 500 steps (cancelled early) would otherwise compile the decode step (generation.compile=auto).
            "generation": {"max_new_tokens": 8, "compile": False},
            "reinforce": {"num_prompts_per_step": 4, "num_rollouts_per_prompt": 2, "baseline": "none"},
            "optim": {"lr": 1e-3, "warmup_steps": 1, "micro_batch_size": 8},
            "trainer": {
                "max_steps": max_steps,
                "save_interval": save_interval,
                "val_check_interval": val_check_interval,
            },
        }
        for section, values in sections.items():
            config[section] = {**config.get(section, {}), **values}
        return config

    return make


@pytest.fixture(scope="session")
def service(pg_available, redis_url, tmp_path_factory):
    """One PostgreSQL schema, one queue and one running worker shared by the tests that do not kill it."""
    schema = PgSchema()
    svc = Service(schema, redis_url, tmp_path_factory.mktemp("service"))
    svc.start_worker()
    yield svc
    svc.close()
    schema.drop()
