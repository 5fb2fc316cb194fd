"""docker-compose.yml: no Docker engine runs here, so check what can be checked without one.

Every service the issue names is there, long-running ones have healthchecks, start order follows the
dependencies, and every `aligner ...` command in it parses with the real command line.
"""

from pathlib import Path

import pytest
import yaml

from aligner.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_volumes_and_healthchecks(compose):
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "reward", "worker", "api", "ui"} <= set(services)
    for name in ("postgres", "redis", "reward", "api", "ui"):
        assert "healthcheck" in services[name], name
    assert set(compose["volumes"]) >= {"data", "pgdata"}
    for name in ("migrate", "worker", "api", "reward"):
        env = services[name]["environment"]
        assert env["ALIGNER_DATABASE_URL"].startswith("postgresql://")
        assert env["ALIGNER_BROKER_URL"].startswith("redis://")
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["worker"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["reward"]["depends_on"]["assets"]["condition"] == "service_completed_successfully"


def test_aligner_commands_parse(compose):
    parser = build_parser()
    commands = [s["entrypoint"] for s in compose["services"].values() if s.get("entrypoint", [None])[0] == "aligner"]
    assert len(commands) >= 2
    for cmd in commands:
        parser.parse_args(cmd[1:])  # exits (SystemExit) on an unknown command or flag
