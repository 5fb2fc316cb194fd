"""schemathesis (a fuzzer that reads the OpenAPI document) against the in-process API: 0 server errors, 0 schema
violations.

Every operation (a test each, test_<method>_<path>) gets examples, coverage cases (each bound, enum and required
field, just inside and just outside) and positive and negative fuzzed cases; then the stateful phase chains
operations along the links schemathesis infers from the document (a created job's id into GET /jobs/{job_id}, ...).
Each response must conform to the document: its status is documented, its body matches the schema of that status,
and no 5xx. The sign-in throttle is set out of reach (else the fuzzer's bad tokens would turn every answer into 429,
and the operations' logic would go untested). Jobs go to an in-memory queue: no worker runs them.

Derandomized (the same cases each run); `ALIGNER_FUZZ_EXAMPLES` sets the fuzzed cases per operation (default 25).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from sqlalchemy import select
from sqlalchemy.engine import make_url

from tests.helpers.api import create_job
from webapp import create_app, dry_run, rewards_try
from webapp.db import ApiToken, User, hash_token
from webapp.extensions import db
from webapp.queues import InMemoryQueue

# About a second per operation (35 tests, 30-40 s together): counted so in the suite's ordering (tests/conftest.py).
pytestmark = pytest.mark.slow(1)

EXAMPLES = int(os.environ.get("ALIGNER_FUZZ_EXAMPLES", "25"))
ACCEPTED = ["2xx", 401, 403, 404, 409, 413, 429]  # a valid request may still be refused for these reasons
EVENTS_TIMEOUT_S = 0.05  # a job's event stream runs until the job ends: these jobs never run


@pytest.fixture
def app_config() -> dict:
    return {"SIGNIN_FAILURE_LIMIT": "1000000/minute"}


def _spec() -> dict:
    """The OpenAPI document of an app on a throwaway folder (schemathesis makes the tests from it at collection)."""
    with tempfile.TemporaryDirectory() as folder:
        app = create_app({"DATA_DIR": folder, "DATABASE_URL": "sqlite://", "JOB_QUEUE": InMemoryQueue()})
        return app.test_client().get("/api/v1/openapi.json").json


SPEC = _spec()
HYPOTHESIS = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": True, "database": None}
# The admin's token, fixed: schemathesis builds some cases (with their headers) when it collects the tests.
ADMIN_TOKEN = "alg_fuzz-admin-0123456789abcdefghijklmnopqrstuvwxyz"


class AdminToken:
    """Every case signs in as the admin; schemathesis leaves the header out or spoils it in negative cases."""

    def get(self, case, context) -> str:
        return ADMIN_TOKEN

    def set(self, case, data: str, context) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


CONFIG = {
    "seed": 29,
    "generation": {
        "mode": "all",
        "max-examples": EXAMPLES,
        "deterministic": True,
        "database": "none",
        # Unknown query parameters are ignored (webargs' rule for the query string), not refused.
        "allow-extra-parameters": False,
    },
    "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True}, "fuzzing": {"enabled": True}},
    "operations": [
        {
            # Bodies the server checks past what a schema can say: a job's config names catalogue entries
            # and datasets, a model's folder must hold a model, a reward function's module must be found,
            # a server's URL must parse, an upload must be a prompt file. A valid-looking one may get 422.
            "include-method": "POST",
            "include-path-regex": "^/api/v1/(jobs|rewards/try|datasets|catalogue/[a-z-]+)$",
            "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED + [422]}},
        }
    ],
}


def _load(spec: dict, one_operation: bool = False):
    config = CONFIG
    if one_operation:  # the path's other methods exist, though this document leaves them out
        off = {"enabled": False}
        config = {**CONFIG, "checks": {"allow_header_conformance": off, "unsupported_method": off}}
    schema = schemathesis.openapi.from_dict(spec, config=SchemathesisConfig.from_dict(config))
    schema.auth(refresh_interval=None)(AdminToken)
    return schema


schema = _load(SPEC)  # the stateful test's: every operation


TRY_RESULT = {
    "samples": [{"group": 0, "prompt": "p", "response": "r", "reward": 0.5, "length": 8}] * 2,
    "groups": [{"group": 0, "prompt": "p", "mean": 0.5, "std": 0.0, "zero_spread": True}],
    "reward_length_corr": 0.0,
    "frac_zero_std_groups": 1.0,
    "warnings": [],
    "timings": {
        "load_s": 1.0,
        "generate_s": 0.4,
        "score_s": 0.04,
        "max_length": 8,
        "batch_start_s": 0.05,
        "decode_step_s": 0.01,
    },
}


@pytest.fixture
def api(app, client, db_session, token, config, monkeypatch) -> Iterator[dict]:
    """How the fuzzer calls the app (the test's `app`, as an admin: every operation is open to it). A reward try
    (POST /rewards/try, a dry run) answers a canned result: a real one starts a process that loads a model."""

    def fake_try(train, num_prompts, num_samples, timeout_s, step_batch=None):
        return rewards_try.TryOutcome(TRY_RESULT, rewards_try._bounded(train))

    monkeypatch.setattr(rewards_try, "run_try", fake_try)
    monkeypatch.setattr(dry_run, "run_try", fake_try)
    with db_session() as session:
        admin = session.scalar(select(User).where(User.name == "operator"))
        session.add(ApiToken(user_id=admin.id, token_hash=hash_token(ADMIN_TOKEN), name="fuzz"))
    for user_token in (ADMIN_TOKEN, token):  # jobs for the links and ids to find: the admin's, another user's
        create_job(client, user_token, config)
    calls = {"app": app, "statuses": []}
    yield calls
    # Past the sign-in: the fuzzer reached each operation's own logic (the throttle or a lost token would answer
    # 401 or 429 to everything, and the run would test nothing). Its negative cases spoil the token on purpose.
    reached = [status for status in calls["statuses"] if status not in (401, 429)]
    assert len(reached) >= len(calls["statuses"]) / 4, sorted(calls["statuses"])


def prepare(case, api: dict) -> None:
    """The case goes to the test's app, its checks' own requests too (ignored_auth's, ...); an event stream ends
    after EVENTS_TIMEOUT_S (a valid timeout only: the negative cases stay as they are)."""
    case.operation.app = case.operation.schema.app = api["app"]
    if case.operation.path.endswith("/events") and isinstance(case.query, dict):
        timeout = case.query.get("timeout")
        if timeout is None or (isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout >= 0):
            case.query["timeout"] = min(timeout or EVENTS_TIMEOUT_S, EVENTS_TIMEOUT_S)


def _operation_test():
    @settings(**HYPOTHESIS)
    def test(case, api):
        prepare(case, api)
        response = case.call(app=api["app"])
        api["statuses"].append(response.status_code)
        case.validate_response(response, transport_kwargs={"app": api["app"]})

    return test


# One test function per operation, `test_<method>_<path>` (test_post_jobs, test_get_jobs_job_id_metrics, ...): under
# pytest 9 the items schemathesis makes for one function share a node id, and pytest-xdist would run only one.
for _path, _methods in SPEC["paths"].items():
    for _method in _methods:
        _name = re.sub(r"\W+", "_", f"test {_method} {_path.removeprefix('/api/v1/')}").strip("_")
        _one = _load(
            {**SPEC, "paths": {_path: {_method: _methods[_method]}}}, one_operation=True
        )  # include() does not filter here
        globals()[_name] = _one.parametrize()(_operation_test())


def test_stateful_links_answer_as_documented(api, app, tmp_path):
    # Each scenario starts from the same database: what it draws depends on what earlier calls answered, and
    # Hypothesis replays scenarios (to shrink one that failed) expecting the same answers.
    with app.app_context():
        engine = db.engine
    database = Path(make_url(app.config["DATABASE_URL"]).database)
    engine.dispose()
    snapshot = tmp_path / "start.db"
    shutil.copyfile(database, snapshot)

    class Workflow(schema.as_state_machine()):
        def setup(self) -> None:
            engine.dispose()
            shutil.copyfile(snapshot, database)

        def before_call(self, case) -> None:
            prepare(case, api)

        def get_call_kwargs(self, case) -> dict:
            return {"app": api["app"]}

        def after_call(self, response, case) -> None:
            api["statuses"].append(response.status_code)

    Workflow.run(settings=settings(max_examples=EXAMPLES, stateful_step_count=8, **HYPOTHESIS))
