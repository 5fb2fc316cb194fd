"""webapp/db.py without Flask: the job state machine and API tokens."""

import datetime as dt

import pytest
from sqlalchemy import select

from tests.helpers.databases import database_url
from webapp.db import (
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    ApiToken,
    Base,
    Event,
    Job,
    TransitionConflict,
    TransitionError,
    create_token,
    make_engine,
    make_session_factory,
    session_scope,
    transition,
    user_for_token,
)


@pytest.fixture
def factory(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


def test_transitions_follow_the_state_machine_and_leave_events(factory):
    with session_scope(factory) as s:
        token = create_token(s, "alice")
        user = user_for_token(s, token)
        job = Job(user_id=user.id, name="j", config={})
        s.add(job)
        s.flush()
        transition(s, job, RUNNING)
        transition(s, job, SUCCEEDED)
        assert job.started_at is not None and job.finished_at is not None
        with pytest.raises(TransitionError, match="succeeded; it cannot become running"):
            transition(s, job, RUNNING)
        transition(s, job, QUEUED)  # resume / retry
        assert job.finished_at is None and job.status == QUEUED
        with pytest.raises(TransitionError):
            transition(s, job, SUCCEEDED)
        transition(s, job, FAILED, error="boom")
        kinds = [(e.kind, e.payload["status"]) for e in s.query(Event).order_by(Event.id)]
        assert kinds == [("status", RUNNING), ("status", SUCCEEDED), ("status", QUEUED), ("status", FAILED)]


def test_tokens_are_stored_hashed_and_record_their_use_to_the_minute(factory):
    with session_scope(factory) as s:
        token = create_token(s, "bob", "laptop")
        row = s.query(ApiToken).one()
        assert token not in row.token_hash and len(row.token_hash) == 64
        assert user_for_token(s, token).name == "bob" and user_for_token(s, "alg_wrong") is None
        first = row.last_used_at
        assert first is not None
        user_for_token(s, token)
        assert row.last_used_at == first  # a use within the minute writes nothing
        row.last_used_at = first - dt.timedelta(minutes=2)
        user_for_token(s, token)
        assert row.last_used_at > first - dt.timedelta(minutes=2)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_of_two_concurrent_transitions_only_one_applies(backend, tmp_path):
    """Two sessions read the same queued job; both ask to cancel it. The second finds the status changed under it:
    TransitionConflict, nothing written (one `cancelled` event), and its session can go on."""
    with database_url(backend, tmp_path) as url:
        engine = make_engine(url)
        Base.metadata.create_all(engine)
        factory = make_session_factory(engine)
        with session_scope(factory) as s:
            user = user_for_token(s, create_token(s, "alice"))
            job = Job(user_id=user.id, name="j", config={}, status=QUEUED)
            s.add(job)
            s.flush()
            job_id = job.id
        first, second = factory(), factory()
        try:
            a, b = first.get(Job, job_id), second.get(Job, job_id)
            assert a.status == b.status == QUEUED
            transition(first, a, "cancelled", cancel_requested=True)
            first.commit()
            with pytest.raises(TransitionConflict, match="it is cancelled now, not queued"):
                transition(second, b, "cancelled", cancel_requested=True)
            second.rollback()
        finally:
            first.close()
            second.close()
        with session_scope(factory) as s:
            events = s.scalars(select(Event.payload).where(Event.job_id == job_id, Event.kind == "status")).all()
            assert [e["status"] for e in events] == ["cancelled"]
            assert s.get(Job, job_id).finished_at is not None
        engine.dispose()
