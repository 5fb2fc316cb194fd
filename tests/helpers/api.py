"""Helpers of the REST API tests (the fixtures are in conftest.py)."""

from __future__ import annotations

import pytest

# Parametrises the `backend` fixture: the test runs on SQLite and on a fresh PostgreSQL schema.
both_backends = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)

PROMPTS = [{"prompt": "Describe the cat."}, {"messages": [{"role": "user", "content": "Describe the dog."}]}]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create_job(client, token: str, config: dict, name: str = "job", **extra) -> dict:
    response = client.post("/api/v1/jobs", json={"name": name, "config": config, **extra}, headers=bearer(token))
    assert response.status_code == 201, response.json
    return response.json
