"""Database migrations (Alembic, migrations/) for `aligner db` and for `aligner up`, which migrates at start."""

from __future__ import annotations

from pathlib import Path

from aligner.errors import AlignerError

ROOT = Path(__file__).resolve().parent.parent
ALEMBIC_INI = ROOT / "alembic.ini"
MIGRATIONS_DIR = ROOT / "migrations"


def alembic_config(url: str | None = None, configure_logger: bool = True):
    """An Alembic `Config` for migrations/ and `url` (default `webapp.db.database_url()`)."""
    from alembic.config import Config

    from webapp.db import database_url

    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise AlignerError(
            f"migrations not found in {MIGRATIONS_DIR} (install Aligner from its source tree: pip -e .)"
        )
    config = Config(str(ALEMBIC_INI)) if ALEMBIC_INI.is_file() else Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Passed as an attribute, not an ini option: a URL may hold '%' (configparser interpolation).
    config.attributes["database_url"] = url or database_url()
    config.attributes["configure_logger"] = configure_logger
    return config


def upgrade(url: str | None = None, revision: str = "head", configure_logger: bool = True) -> None:
    from alembic import command

    command.upgrade(alembic_config(url, configure_logger), revision)


def downgrade(url: str | None, revision: str, configure_logger: bool = True) -> None:
    from alembic import command

    command.downgrade(alembic_config(url, configure_logger), revision)
