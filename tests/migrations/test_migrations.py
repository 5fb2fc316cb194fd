"""The Alembic migrations (migrations/) upgrade and downgrade on SQLite and PostgreSQL, and the upgraded schema is
exactly the models' (webapp/db.py): autogenerate finds nothing to change."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

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
