"""Fixtures of the REST API tests: `app` (SQLite file, or PostgreSQL for tests parametrised with `backend`),
`client`, `token` / `other_token` (two users), `admin_token`, a valid job `config` naming the catalogue's entries, and
`db_session` to insert rows directly.

    @both_backends    # (tests/helpers/api.py) runs the test on SQLite and on a fresh PostgreSQL schema
    def test_x(client, token, config): ...
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.helpers.api import PROMPTS
from tests.helpers.catalogue import add_dataset, register_model, stand_in_model
from tests.helpers.databases import database_url
from webapp import create_app
from webapp.db import User, create_token, session_scope
from webapp.extensions import db
from webapp.queues import InMemoryQueue


@pytest.fixture
def backend(request) -> str:
    return getattr(request, "param", "sqlite")


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """The server's data folder, with (stand-in) model folders and two prompt files a config can name."""
    folder = tmp_path / "data"
    for model in ("tiny-sft", "tiny-rm"):
        stand_in_model(folder / "models" / model)
    for name in ("train.jsonl", "val.jsonl"):
        (folder / name).write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return folder


@pytest.fixture
def app(backend, tmp_path, data_dir):
    """The API on a fresh database whose catalogue holds the policy `tiny-sft` and the reward model `tiny-rm`
    (stand-in folders), and whose admin `operator` shared the datasets `train.jsonl` and `val.jsonl`."""
    with database_url(backend, tmp_path) as url:
        app = create_app(
            {
                "TESTING": True,
                "DATA_DIR": str(data_dir),
                "DATABASE_URL": url,
                "JOB_QUEUE": InMemoryQueue(),
                "SSE_POLL_INTERVAL": 0.02,
            }
        )
        with app.app_context():
            db.create_all()
            with session_scope(db.session_factory) as session:
                register_model(session, data_dir / "models" / "tiny-sft", "policy", "tiny-sft")
                register_model(session, data_dir / "models" / "tiny-rm", "reward", "tiny-rm")
                session.add(User(name="operator", is_admin=True))
                session.flush()
                operator = session.scalar(select(User).where(User.name == "operator"))
                for name in ("train.jsonl", "val.jsonl"):
                    add_dataset(session, operator, data_dir / name, data_dir, shared=True, name=name)
        yield app
        with app.app_context():
            db.engine.dispose()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def db_session(app):
    """`with db_session() as s:` a session on the app's database, committed at the end of the block."""

    @contextmanager
    def scope():
        with app.app_context():
            factory = db.session_factory
        with session_scope(factory) as session:
            yield session

    return scope


def _token(app, user: str) -> str:
    with app.app_context(), session_scope(db.session_factory) as session:
        return create_token(session, user, "tests")


@pytest.fixture
def token(app) -> str:
    return _token(app, "alice")


@pytest.fixture
def other_token(app) -> str:
    return _token(app, "bob")


@pytest.fixture
def admin_token(app) -> str:
    with app.app_context(), session_scope(db.session_factory) as session:
        return create_token(session, "operator", "tests", admin=True)


@pytest.fixture
def config() -> dict:
    """A valid job config naming the catalogue's entries (see `app`)."""
    return {
        "model": {"policy": "tiny-sft"},
        "data": {"train_dataset": "train.jsonl", "val_dataset": "val.jsonl"},
        "reward": {"function": "demo"},
        "trainer": {"max_steps": 5},
    }


@pytest.fixture
def queue(app) -> InMemoryQueue:
    return app.extensions["aligner_queue"]


@pytest.fixture
def browser_stack(tmp_path):
    """`aligner up` on embedded defaults for a dashboard browser test (tests/helpers/browser.py): its stack.json."""
    from tests.helpers.browser import up_stack

    with up_stack(tmp_path / "data") as info:
        yield info
