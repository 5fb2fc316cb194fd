"""`aligner db upgrade|downgrade` and `aligner token create` (webapp/manage.py, through aligner.cli.main)."""

from __future__ import annotations

from sqlalchemy import inspect

from aligner.cli import main
from webapp import create_app
from webapp.db import make_engine
from webapp.queues import InMemoryQueue


def test_db_upgrade_then_token_create_then_the_token_works(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'service.db'}"
    assert main(["db", "upgrade", "--database-url", url]) == 0
    assert main(["token", "create", "--user", "carol", "--name", "laptop", "--database-url", url]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("alg_")

    app = create_app({"DATA_DIR": str(tmp_path), "DATABASE_URL": url, "JOB_QUEUE": InMemoryQueue()})
    response = app.test_client().get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200 and response.json["total"] == 0

    assert main(["db", "downgrade", "base", "--database-url", url]) == 0
    engine = make_engine(url)
    assert inspect(engine).get_table_names() == ["alembic_version"]
    engine.dispose()


def test_errors_are_one_line_and_status_2(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["token", "create", "--user", "x", "--database-url", url]) == 2
    assert "run `aligner db upgrade` first" in capsys.readouterr().err
    assert main(["db", "upgrade", "--database-url", "postgresql://postgres@127.0.0.1:1/none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aligner db: error: database postgresql://postgres@127.0.0.1:1/none") and err[-1] == "\n"
