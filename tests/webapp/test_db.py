"""webapp/db.py without Flask: the job state machine and API tokens."""

import datetime as dt

import pytest

from webapp.db import (
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    ApiToken,
    Base,
    Event,
    Job,
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
