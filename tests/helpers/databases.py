"""Test databases: a SQLite file, or a fresh PostgreSQL schema per test (dropped afterwards).

PostgreSQL is `postgresql://postgres@127.0.0.1:5432/test` (env ALIGNER_TEST_POSTGRES_URL overrides). When it cannot
be reached its tests are skipped, unless CI=true, where they fail: CI must exercise PostgreSQL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from urllib.parse import quote

import pytest
from sqlalchemy import text

from webapp.db import make_engine

POSTGRES_URL = os.environ.get("ALIGNER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@cache
def _postgres_error() -> str | None:
    engine = make_engine(POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + "connect_timeout=3")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as err:  # unreachable, no such database, refused: all mean "no PostgreSQL here"
        return str(err).splitlines()[0]
    finally:
        engine.dispose()
    return None


def require_postgres() -> None:
    error = _postgres_error()
    if error is None:
        return
    message = f"PostgreSQL at {POSTGRES_URL} is unreachable: {error}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A URL whose connections use a new, empty schema (search_path); the schema is dropped afterwards."""
    require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        separator = "&" if "?" in POSTGRES_URL else "?"
        yield f"{POSTGRES_URL}{separator}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def database_url(backend: str, tmp_path) -> Iterator[str]:
    if backend == "postgresql":
        with postgres_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'aligner.db'}"
