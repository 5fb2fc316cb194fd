"""The Alembic migrations (migrations/) upgrade and downgrade on SQLite and PostgreSQL, and the upgraded schema is
exactly the models' (webapp/db.py): autogenerate finds nothing to change. A migration that changes existing columns
keeps their rows, both ways."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from tests.helpers.databases import database_url
from webapp.db import Base, make_engine
from webapp.migrate import downgrade, upgrade


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_upgrade_matches_the_models_and_downgrade_drops_everything(backend, tmp_path):
    with database_url(backend, tmp_path) as url:
        engine = make_engine(url)
        try:
            upgrade(url, configure_logger=False)
            with engine.connect() as conn:
                assert set(inspect(conn).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}
                diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
                assert diff == [], diff

            downgrade(url, "base", configure_logger=False)
            with engine.connect() as conn:
                assert inspect(conn).get_table_names() == ["alembic_version"]

            upgrade(url, configure_logger=False)  # and back up again: the downgrade left nothing in the way
            with engine.connect() as conn:
                assert set(inspect(conn).get_table_names()) >= set(Base.metadata.tables)
        finally:
            engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0006_renames_jobs_kind_to_algorithm_keeping_the_jobs_and_their_rows(backend, tmp_path):
    """The algorithm survives the rename and its undoing, and so do the rows that hang off the job (a copy of the
    table on SQLite would have dropped them through ON DELETE CASCADE)."""
    with database_url(backend, tmp_path) as url:
        engine = make_engine(url)
        try:
            upgrade(url, "0005", configure_logger=False)
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO users (id, name, created_at, is_admin) VALUES (1, 'u', :t, false)"), T)
                for job_id, kind in ((1, "ppo"), (2, "reinforce")):
                    conn.execute(
                        text(
                            "INSERT INTO jobs (id, user_id, name, kind, status, config, run_dir, num_processes, "
                            "created_at, cancel_requested, attempts, num_gpus, step, max_steps, alarms) VALUES "
                            "(:id, 1, 'j', :kind, 'failed', '{}', '', 1, :t, false, 0, 0, 2, 5, '[]')"
                        ),
                        {"id": job_id, "kind": kind, **T},
                    )
                conn.execute(text("INSERT INTO metrics (job_id, step, name, value) VALUES (1, 1, 'm', 0.5)"))
                checkpoint = "INSERT INTO checkpoints (job_id, step, path, created_at) VALUES (1, 2, 'p', :t)"
                conn.execute(text(checkpoint), T)

            upgrade(url, "0006", configure_logger=False)
            with engine.connect() as conn:
                assert "kind" not in {c["name"] for c in inspect(conn).get_columns("jobs")}
                assert conn.execute(text("SELECT id, algorithm FROM jobs ORDER BY id")).all() == ALGORITHMS
                assert children(conn) == (1, 1)

            downgrade(url, "0005", configure_logger=False)
            with engine.connect() as conn:
                assert "algorithm" not in {c["name"] for c in inspect(conn).get_columns("jobs")}
                assert conn.execute(text("SELECT id, kind FROM jobs ORDER BY id")).all() == ALGORITHMS
                assert children(conn) == (1, 1)
        finally:
            engine.dispose()


T = {"t": "2026-11-28 12:00:00"}
ALGORITHMS = [(1, "ppo"), (2, "reinforce")]


def children(conn) -> tuple[int, int]:
    """(metrics, checkpoints) rows in the database."""
    return tuple(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() for table in ("metrics", "checkpoints"))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0007_adds_jobs_deleted_at_keeping_the_jobs_and_their_rows(backend, tmp_path):
    """The tombstone column is added and dropped in place: the jobs and the rows that hang off them stay."""
    with database_url(backend, tmp_path) as url:
        engine = make_engine(url)
        try:
            upgrade(url, "0006", configure_logger=False)
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO users (id, name, created_at, is_admin) VALUES (1, 'u', :t, false)"), T)
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, user_id, name, algorithm, status, config, run_dir, num_processes, "
                        "created_at, cancel_requested, attempts, num_gpus, step, max_steps, alarms) VALUES "
                        "(1, 1, 'j', 'ppo', 'failed', '{}', '', 1, :t, false, 0, 0, 2, 5, '[]')"
                    ),
                    T,
                )
                conn.execute(text("INSERT INTO metrics (job_id, step, name, value) VALUES (1, 1, 'm', 0.5)"))
                conn.execute(
                    text("INSERT INTO checkpoints (job_id, step, path, created_at) VALUES (1, 2, 'p', :t)"), T
                )

            upgrade(url, "0007", configure_logger=False)
            with engine.connect() as conn:
                assert conn.execute(text("SELECT id, deleted_at FROM jobs")).all() == [(1, None)]
                assert children(conn) == (1, 1)

            downgrade(url, "0006", configure_logger=False)
            with engine.connect() as conn:
                assert "deleted_at" not in {c["name"] for c in inspect(conn).get_columns("jobs")}
                assert conn.execute(text("SELECT id, algorithm FROM jobs")).all() == [(1, "ppo")]
                assert children(conn) == (1, 1)
        finally:
            engine.dispose()
