"""Alembic environment of the training service: runs migrations/versions/ against one database.

The database URL is, in order: the one `aligner db` passes (`config.attributes["database_url"]`), `alembic -x
database_url=URL`, else `webapp.db.database_url()` (env ALIGNER_DATABASE_URL, or a SQLite file in the data folder).
A caller may also hand over an open connection in `config.attributes["connection"]`.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from webapp.db import Base, database_url, make_engine

config = context.config
if config.config_file_name and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    return (
        config.attributes.get("database_url")
        or context.get_x_argument(as_dictionary=True).get("database_url")
        or database_url()
    )


def _run(connection: Connection) -> None:
    # SQLite alters tables only by copying them: later revisions' ALTERs need batch mode there.
    context.configure(
        connection=connection, target_metadata=target_metadata, render_as_batch=connection.dialect.name == "sqlite"
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """`alembic upgrade head --sql`: print the SQL instead of running it."""
    url = _url()
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _run(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
