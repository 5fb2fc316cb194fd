"""Operator-set limits (webapp/limits.py): failed sign-ins per address (429 + Retry-After), and per user active jobs
(429), dataset bytes (413) and open event streams (429)."""

from __future__ import annotations

import io
import uuid

import pytest
from sqlalchemy import select

from aligner.errors import ConfigError
from tests.helpers.api import bearer, both_backends, create_job
from webapp import create_app
from webapp.db import ApiToken, Checkpoint, Job, User, create_token, revoke_token, transition
from webapp.extensions import db
from webapp.limits import EXTENSION
from webapp.queues import InMemoryQueue
from webapp.settings import service_settings

JOBS, DATASETS = "/api/v1/jobs", "/api/v1/datasets"
ELSEWHERE = {"REMOTE_ADDR": "10.0.0.2"}


def set_status(db_session, job_id: int, status: str) -> None:
    with db_session() as session:
        session.get(Job, job_id).status = status


# ---------------------------------------------------------------------------------------------- failed sign-ins
def test_failed_signins_are_throttled_per_address_with_retry_after(app, client, token, db_session):
    assert app.config["SIGNIN_FAILURE_LIMIT"] == "10 per minute"
    with db_session() as session:
        expired = create_token(session, "carol", "old", expires_days=-1)
    bad = [{}, {"Authorization": "Bearer alg_wrong"}, {"Authorization": "Bearer"}, bearer(expired)]
    for i in range(9):
        assert client.get(JOBS, headers=bad[i % len(bad)]).status_code == 401
    for _ in range(20):  # successes do not count
        assert client.get(JOBS, headers=bearer(token)).status_code == 200
    assert client.post(JOBS, headers=bad[1]).status_code == 401  # the 10th failure

    response = client.get(f"{JOBS}/1/events", headers=bad[0])  # the 11th: any endpoint that needs a token
    assert response.status_code == 429
    assert 1 <= int(response.headers["Retry-After"]) <= 61
    assert response.json["message"] == "Too many failed sign-ins from this address"
    [reason] = response.json["errors"]["Authorization"]
    assert reason.startswith("10 requests without a valid token within 1 minute; retry after ")

    # Its failed attempts are refused; other addresses and /health are not throttled.
    assert client.get(DATASETS, headers=bad[3]).status_code == 429
    assert client.get(JOBS, headers=bearer(token), environ_base=ELSEWHERE).status_code == 200
    assert client.get(JOBS, headers=bad[1], environ_base=ELSEWHERE).status_code == 401
    assert client.get("/api/v1/health").status_code == 200


def test_a_valid_token_is_served_whatever_its_addresss_failures(app, client, token, admin_token, db_session):
    """Throttling refuses failed attempts only: a valid token is served from an address that used up its failures,
    and its requests count nothing; the same token once revoked is a failure like any other."""
    for _ in range(10):
        assert client.get(JOBS, headers={"Authorization": "Bearer alg_wrong"}).status_code == 401
    assert client.get(JOBS, headers={"Authorization": "Bearer alg_wrong"}).status_code == 429
    assert client.get(JOBS).status_code == 429  # no token at all is a failed attempt too
    for _ in range(20):
        assert client.get(JOBS, headers=bearer(token)).status_code == 200
        assert client.get("/api/v1/admin/jobs", headers=bearer(token)).status_code == 403  # signed in: no failure
    assert client.get("/api/v1/me", headers=bearer(admin_token)).status_code == 200
    with db_session() as session:
        revoke_token(session, session.scalar(select(ApiToken.id).join(User).where(User.name == "alice")))
    revoked = client.get(JOBS, headers=bearer(token))
    assert revoked.status_code == 429 and revoked.headers["Retry-After"]
    assert client.get(JOBS, headers=bearer(token), environ_base=ELSEWHERE).status_code == 401


def _app(tmp_path, **config):
    database = f"sqlite:///{tmp_path}/a.db"
    app = create_app({"DATA_DIR": str(tmp_path), "DATABASE_URL": database, "JOB_QUEUE": InMemoryQueue(), **config})
    with app.app_context():
        db.create_all()
    return app


def test_behind_trusted_proxies_each_forwarded_client_has_its_own_failure_budget(tmp_path, monkeypatch):
    """ALIGNER_TRUSTED_PROXIES=N: the client address is the Nth entry of X-Forwarded-For from the right (werkzeug's
    ProxyFix); entries further left are the client's own say and change nothing. Without it the header is ignored."""

    def failures(client, *chains: str) -> list[int]:
        return [client.get(JOBS, headers={"X-Forwarded-For": chain}).status_code for chain in chains]

    direct = _app(tmp_path / "a", SIGNIN_FAILURE_LIMIT="2/minute").test_client()
    assert failures(direct, "203.0.113.1", "203.0.113.2", "203.0.113.3") == [401, 401, 429]

    monkeypatch.setenv("ALIGNER_TRUSTED_PROXIES", "1")
    service_settings.cache_clear()
    app = _app(tmp_path / "b", SIGNIN_FAILURE_LIMIT="2/minute")
    assert app.config["TRUSTED_PROXIES"] == 1
    proxied = app.test_client()
    assert failures(proxied, "203.0.113.1", "1.1.1.1, 203.0.113.1", "2.2.2.2, 203.0.113.1") == [401, 401, 429]
    assert failures(proxied, "203.0.113.2", "203.0.113.2", "203.0.113.1") == [401, 401, 429]
    assert failures(proxied, "198.51.100.1, 203.0.113.3") == [401]  # its own budget, behind the proxy's address

    two_hops = _app(tmp_path / "c", SIGNIN_FAILURE_LIMIT="2/minute", TRUSTED_PROXIES=2).test_client()
    assert failures(two_hops, "9.9.9.9, 10.0.0.5", "8.8.8.8, 10.0.0.5", "9.9.9.9, 10.0.0.6") == [401, 401, 401]
    assert failures(two_hops, "9.9.9.9, 10.0.0.7") == [429]

    monkeypatch.setenv("ALIGNER_TRUSTED_PROXIES", "-1")
    service_settings.cache_clear()
    with pytest.raises(ConfigError, match="ALIGNER_TRUSTED_PROXIES='-1' is not valid"):
        _app(tmp_path / "d")


def test_limits_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNER_SIGNIN_LIMIT", "2 per hour")
    monkeypatch.setenv("ALIGNER_MAX_ACTIVE_JOBS", "7")
    monkeypatch.setenv("ALIGNER_MAX_DATASET_BYTES", "1000")
    monkeypatch.setenv("ALIGNER_MAX_EVENT_STREAMS", "1")
    app = _app(tmp_path)
    assert (
        app.config["MAX_ACTIVE_JOBS_PER_USER"],
        app.config["MAX_DATASET_BYTES_PER_USER"],
        app.config["MAX_EVENT_STREAMS_PER_USER"],
    ) == (7, 1000, 1)
    client = app.test_client()
    assert [client.get(JOBS).status_code for _ in range(3)] == [401, 401, 429]
    assert 3500 < int(client.get(JOBS).headers["Retry-After"]) <= 3601
    assert "2 requests without a valid token within 1 hour" in client.get(JOBS).json["errors"]["Authorization"][0]

    assert _app(tmp_path / "b", SIGNIN_FAILURE_LIMIT="5 per minute", RATELIMIT_ENABLED=False)  # config wins
    monkeypatch.setenv("ALIGNER_MAX_ACTIVE_JOBS", "four")
    service_settings.cache_clear()
    with pytest.raises(ValueError, match="ALIGNER_MAX_ACTIVE_JOBS='four'"):
        _app(tmp_path / "c")
    monkeypatch.delenv("ALIGNER_MAX_ACTIVE_JOBS")
    service_settings.cache_clear()
    with pytest.raises(ValueError, match="SIGNIN_FAILURE_LIMIT .*ten a minute"):
        _app(tmp_path / "d", SIGNIN_FAILURE_LIMIT="ten a minute")


def test_rate_limiting_can_be_switched_off(tmp_path):
    client = _app(tmp_path, RATELIMIT_ENABLED=False).test_client()
    assert {client.get(JOBS).status_code for _ in range(30)} == {401}


def test_failures_are_counted_in_the_configured_storage_shared_by_processes(tmp_path):
    redis = pytest.importorskip("redis")
    url = "redis://127.0.0.1:6379/13"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError as err:
        pytest.skip(f"no Redis at {url}: {err}")
    # Two apps stand for two API processes; the prefix keeps this test's counts apart from any other run's.
    config = {"RATELIMIT_STORAGE_URI": url, "RATELIMIT_KEY_PREFIX": uuid.uuid4().hex, "SIGNIN_FAILURE_LIMIT": "4/hour"}
    first, second = (_app(tmp_path / name, **config).test_client() for name in ("a", "b"))
    assert [c.get(JOBS).status_code for c in (first, second, first, second)] == [401] * 4
    assert first.get(JOBS).status_code == 429 and second.get(JOBS).status_code == 429


def test_an_unreachable_storage_falls_back_to_counting_in_memory(tmp_path):
    client = _app(tmp_path, RATELIMIT_STORAGE_URI="redis://127.0.0.1:1/0").test_client()  # nothing listens there
    assert [client.get(JOBS).status_code for _ in range(11)] == [401] * 10 + [429]


# -------------------------------------------------------------------------------------------------- active jobs
@both_backends
def test_active_jobs_are_limited_on_create_resume_and_retry(app, client, token, other_token, config, db_session):
    app.config["MAX_ACTIVE_JOBS_PER_USER"] = 3
    queued, running, cancelling = (create_job(client, token, config, name=n)["id"] for n in ("q", "r", "c"))
    set_status(db_session, running, "running")
    set_status(db_session, cancelling, "cancelling")

    response = client.post(JOBS, json={"name": "one too many", "config": config}, headers=bearer(token))
    assert response.status_code == 429
    assert "You have 3 active jobs" in response.json["message"] and "limit is 3 per user" in response.json["message"]
    assert create_job(client, other_token, config)["status"] == "queued"  # per user

    # Finished jobs do not count, and resume and retry, which would add one, are refused the same way.
    assert client.post(f"{JOBS}/{queued}/cancel", headers=bearer(token)).json["status"] == "cancelled"
    failed = create_job(client, token, config, name="f")["id"]
    set_status(db_session, failed, "failed")
    with db_session() as session:
        session.add(Checkpoint(job_id=failed, step=1, path="/nowhere"))
    create_job(client, token, config, name="takes the freed place")
    for action, job_id in (("resume", failed), ("retry", failed), ("retry", queued)):
        response = client.post(f"{JOBS}/{job_id}/{action}", headers=bearer(token))
        assert response.status_code == 429 and "limit is 3" in response.json["message"], action
    with db_session() as session:
        assert {session.get(Job, failed).status, session.get(Job, queued).status} == {"failed", "cancelled"}

    set_status(db_session, running, "succeeded")
    assert client.post(f"{JOBS}/{failed}/retry", headers=bearer(token)).json["status"] == "queued"
    assert client.post(f"{JOBS}/{queued}/retry", headers=bearer(token)).status_code == 429


# ------------------------------------------------------------------------------------------------ dataset bytes
def upload(client, token, content: bytes):
    return client.post(DATASETS, data={"file": (io.BytesIO(content), "p.jsonl")}, headers=bearer(token))


@both_backends
def test_dataset_bytes_per_user_are_limited_and_a_refused_upload_leaves_nothing(
    app, client, token, other_token, data_dir
):
    line = b'{"prompt": "Describe the cat."}\n'
    app.config["MAX_DATASET_BYTES_PER_USER"] = 5 * len(line)
    first = upload(client, token, line * 2)
    assert first.status_code == 201
    folder = (data_dir / first.json["path"]).parent
    response = upload(client, token, line * 4)
    assert response.status_code == 413
    assert response.json["message"] == f"Dataset storage limit reached ({5 * len(line)} bytes per user)"
    assert response.json["errors"]["file"] == [
        f"{4 * len(line)} bytes; with the {2 * len(line)} bytes of your datasets that passes the limit of "
        f"{5 * len(line)} bytes per user"
    ]
    assert [p.name for p in folder.iterdir()] == [first.json["path"].rsplit("/", 1)[1]]  # no partial upload left
    assert (data_dir / first.json["path"]).read_bytes() == line * 2  # nor anything stored lost
    assert [d["id"] for d in client.get(DATASETS, headers=bearer(token)).json["items"] if d["mine"]] == [
        first.json["id"]
    ]

    assert upload(client, token, line * 3).status_code == 201  # up to the limit exactly
    assert upload(client, token, line).status_code == 413
    assert upload(client, other_token, line * 5).status_code == 201  # per user


# ------------------------------------------------------------------------------------------------ event streams
def open_streams(app, user: str) -> int:
    with app.app_context():
        user_id = db.session.scalar(select(User.id).where(User.name == user))
        return app.extensions[EXTENSION].open_count(user_id)


@both_backends
def test_event_streams_per_user_are_limited_and_each_slot_comes_back(
    app, client, token, other_token, config, db_session
):
    app.config["MAX_EVENT_STREAMS_PER_USER"] = 2
    job = create_job(client, token, config)["id"]
    url = f"{JOBS}/{job}/events"
    first = client.get(url, headers=bearer(token), buffered=False)
    second = client.get(url, headers=bearer(token), buffered=False)
    assert first.status_code == second.status_code == 200 and open_streams(app, "alice") == 2
    refused = client.get(url, headers=bearer(token), buffered=False)
    assert refused.status_code == 429
    assert refused.json["message"] == "You have 2 event streams open and the limit is 2 per user: close one first"
    theirs = create_job(client, other_token, config)["id"]
    bobs = client.get(f"{JOBS}/{theirs}/events", headers=bearer(other_token), buffered=False)
    assert bobs.status_code == 200  # per user
    bobs.close()

    first.close()  # a client gone before the body started: the response's close hands the slot back
    assert open_streams(app, "alice") == 1
    third = client.get(url, headers=bearer(token), buffered=False)
    assert next(third.iter_encoded()).startswith(b"retry:")  # the body is running...
    third.close()  # ...and its client goes away: the server closes the generator
    assert open_streams(app, "alice") == 1

    with db_session() as session:  # a finished job's stream ends by itself
        transition(session, session.get(Job, job), "cancelled")
    assert b"cancelled" in client.get(url, headers=bearer(token)).get_data()
    second.close()
    assert open_streams(app, "alice") == 0 and open_streams(app, "bob") == 0
    head = client.head(url, headers=bearer(token))  # no body at all: the server's close hands the slot back
    head.close()
    assert head.status_code == 200 and open_streams(app, "alice") == 0
    assert client.get(f"{url}?timeout=0", headers=bearer(token)).get_data().startswith(b"retry:")  # timed out
    assert open_streams(app, "alice") == 0


def test_a_refused_stream_or_a_bad_request_takes_no_slot(app, client, token, config):
    app.config["MAX_EVENT_STREAMS_PER_USER"] = 1
    job = create_job(client, token, config)["id"]
    assert client.get(f"{JOBS}/{job}/events", headers={**bearer(token), "Last-Event-ID": "x"}).status_code == 422
    assert client.get(f"{JOBS}/{job + 1}/events", headers=bearer(token)).status_code == 404
    assert open_streams(app, "alice") == 0
    held = client.get(f"{JOBS}/{job}/events", headers=bearer(token), buffered=False)
    for _ in range(3):
        assert client.get(f"{JOBS}/{job}/events", headers=bearer(token)).status_code == 429
    held.close()
    assert open_streams(app, "alice") == 0
