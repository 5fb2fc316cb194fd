"""Helpers of the REST API tests (the fixtures are in conftest.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import delete

from webapp.db import Checkpoint, Job

# Parametrises the `backend` fixture: the test runs on SQLite and on a fresh PostgreSQL schema.
both_backends = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)

PROMPTS = [{"prompt": "Describe the cat."}, {"messages": [{"role": "user", "content": "Describe the dog."}]}]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create_job(client, token: str, config: dict, name: str = "job", **extra) -> dict:
    response = client.post("/api/v1/jobs", json={"name": name, "config": config, **extra}, headers=bearer(token))
    assert response.status_code == 201, response.json
    return response.json


# (status, step, has a checkpoint, the actions that apply) of a job of 5 steps: the rules of webapp.db.refusal.
ACTIONS_BY_STATE = [
    ("queued", 0, False, ["cancel"]),
    ("running", 2, True, ["cancel"]),
    ("cancelling", 2, True, []),  # a second cancel changes nothing: not offered; nor a delete until it is cancelled
    ("cancelled", 2, True, ["resume", "retry", "delete"]),
    ("cancelled", 2, False, ["retry", "delete"]),  # nothing to resume from
    ("failed", 2, True, ["resume", "retry", "delete"]),
    ("failed", 5, True, ["resume", "retry", "delete"]),  # only a succeeded job's last step ends resuming
    ("paused", 2, True, ["resume", "retry", "delete"]),
    ("succeeded", 5, True, ["delete"]),  # did all its steps
    ("succeeded", 3, True, ["resume", "delete"]),  # stopped early
]


def put_in_state(db_session, job_id: int, status: str, step: int, checkpoint: bool) -> None:
    """Job `job_id` in `status` at `step`, with one checkpoint or none (`db_session`: the conftest fixture)."""
    with db_session() as session:
        job = session.get(Job, job_id)
        job.status, job.step = status, step
        session.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id))
        if checkpoint:
            session.add(Checkpoint(job_id=job_id, step=step, path="/x/step"))
