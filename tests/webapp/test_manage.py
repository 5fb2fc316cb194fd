"""`aligner db upgrade|downgrade`, `aligner token create|list|revoke` (webapp/manage.py, through aligner.cli.main)."""

from __future__ import annotations

import datetime as dt
import stat

import pytest
from sqlalchemy import inspect, update

from aligner.cli import main
from webapp import create_app
from webapp.db import ApiToken, make_engine, utcnow
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


def _status(app, token: str) -> int:
    return app.test_client().get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code


def test_token_list_revoke_and_expiry(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'service.db'}"
    assert main(["db", "upgrade", "--database-url", url]) == 0
    assert main(["token", "create", "--user", "olga", "--admin", "--name", "ops", "--database-url", url]) == 0
    admin = capsys.readouterr().out.strip()
    assert main(["token", "create", "--user", "dan", "--expires", "30", "--database-url", url]) == 0
    user = capsys.readouterr().out.strip()
    app = create_app({"DATA_DIR": str(tmp_path), "DATABASE_URL": url, "JOB_QUEUE": InMemoryQueue()})
    assert _status(app, admin) == _status(app, user) == 200

    assert main(["token", "list", "--database-url", url]) == 0
    header, first, second = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["id", "user", "role", "label"]
    assert first.split()[:4] == ["1", "olga", "admin", "ops"] and first.endswith("active")
    assert second.split()[:3] == ["2", "dan", "user"] and second.endswith("active")
    assert str(utcnow().date() + dt.timedelta(days=30)) in second  # the expiry date

    assert main(["token", "revoke", "2", "--database-url", url]) == 0
    assert capsys.readouterr().out.strip() == "token 2 revoked"
    assert _status(app, user) == 401 and _status(app, admin) == 200
    assert main(["token", "revoke", "2", "--database-url", url]) == 2  # once only
    assert "no active token with id 2" in capsys.readouterr().err
    assert main(["token", "list", "--database-url", url]) == 0
    assert "revoked" in capsys.readouterr().out.splitlines()[2]

    # A token past its expiry stops working, and is listed as expired.
    assert main(["token", "create", "--user", "dan", "--expires", "1", "--database-url", url]) == 0
    short = capsys.readouterr().out.strip()
    assert _status(app, short) == 200
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(update(ApiToken).where(ApiToken.id == 3).values(expires_at=utcnow() - dt.timedelta(seconds=1)))
    engine.dispose()
    assert _status(app, short) == 401
    assert main(["token", "list", "--database-url", url]) == 0
    assert capsys.readouterr().out.splitlines()[3].endswith("expired")


@pytest.mark.parametrize("days", ["0", "-1", "soon", "1e9"])
def test_token_expiry_must_be_a_positive_number_of_days(tmp_path, days, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["token", "create", "--user", "x", "--expires", days, "--database-url", f"sqlite:///{tmp_path}/x.db"])
    assert exit_info.value.code == 2 and "--expires" in capsys.readouterr().err


def test_the_sqlite_database_is_private(tmp_path):
    url = f"sqlite:///{tmp_path / 'service.db'}"
    assert main(["db", "upgrade", "--database-url", url]) == 0
    assert stat.S_IMODE((tmp_path / "service.db").stat().st_mode) == 0o600
    (tmp_path / "old.db").touch(mode=0o644)  # a database made before: tightened when next opened
    make_engine(f"sqlite:///{tmp_path / 'old.db'}").dispose()
    assert stat.S_IMODE((tmp_path / "old.db").stat().st_mode) == 0o600
