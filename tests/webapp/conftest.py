"""Fixtures of the REST API tests: `app` (SQLite file, or PostgreSQL for tests parametrised with `backend`),
`client`, `token` / `other_token` (two users), `admin_token`, a valid job `config` naming the catalogue's entries, and
`db_session` to insert rows directly.

    @both_backends    # (tests/helpers/api.py) runs the test on SQLite and on a fresh PostgreSQL schema
    def test_x(client, token, config): ...
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager, suppress
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
def app_config() -> dict:
    """More config keys of `app`: a test module overrides this fixture (tests/webapp/test_fuzz.py)."""
    return {}


@pytest.fixture
def app(backend, tmp_path, data_dir, app_config):
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
                **app_config,
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


@pytest.fixture(scope="module")
def shared_browser_stack(tmp_path_factory):
    """`aligner up` on embedded defaults, one for a module of dashboard browser tests (tests/helpers/browser.py):
    (its data folder, its stack.json)."""
    from tests.helpers.browser import up_stack

    data_dir = tmp_path_factory.mktemp("browser_stack") / "data"
    with up_stack(data_dir) as info:
        yield data_dir, info


@pytest.fixture
def browser_stack(shared_browser_stack, request):
    """The module's `aligner up` as a test's own admin: its stack.json with `token` that of a new admin user named
    after the test (`user`), so the test's jobs and datasets are its own. Jobs it leaves unfinished (a test that
    failed midway) are cancelled after it: the next test's jobs would wait behind them on the stack's one worker."""
    from tests.helpers.browser import admin_token
    from webapp.db import FINAL_STATUSES
    from webapp.ui.api import Api, ApiError

    data_dir, info = shared_browser_stack
    user = "-".join(request.node.name.removeprefix("test_").split("_")[:3])
    token = admin_token(data_dir, user)
    yield {**info, "user": user, "token": token}
    api = Api(info["api_url"], token)
    for job in api.get_all("/jobs"):
        if job["status"] not in FINAL_STATUSES:
            with suppress(ApiError):  # one that ended meanwhile, or is being cancelled already
                api.post(f"/jobs/{job['id']}/cancel")


@pytest.fixture(scope="module")
def shared_chromium():
    """One headless Chromium for a module of browser tests (tests/helpers/browser.py)."""
    from tests.helpers.browser import chromium

    with chromium() as browser:
        yield browser


@pytest.fixture
def browser_page(shared_chromium):
    """A page of its own (a fresh browser context: no cookies or storage of another test's), 1400 x 1000."""
    context = shared_chromium.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def api_url(app):
    """The `app` fixture's API served over HTTP on a free port (a thread): the dashboard's requests go over the
    network as they do in production."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(10)


@pytest.fixture
def session(api_url):
    """The dashboard's Session for that API (its components need a Blocks around them)."""
    import gradio as gr

    from webapp.ui import tabs

    with gr.Blocks():
        session, _sign_in = tabs.header(api_url)
    return session
