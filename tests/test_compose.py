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
    assert {"postgres", "rabbitmq", "migrate", "reward", "worker", "api", "ui"} <= set(services)
    for name in ("postgres", "rabbitmq", "reward", "api", "ui"):
        assert "healthcheck" in services[name], name
    assert set(compose["volumes"]) >= {"data", "pgdata", "rabbitmq"}
    for name in ("migrate", "worker", "api", "reward"):
        env = services[name]["environment"]
        assert env["ALIGNER_DATABASE_URL"].startswith("postgresql://")
        assert env["ALIGNER_BROKER_URL"].startswith("amqp://")
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["worker"]["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    assert services["reward"]["depends_on"]["assets"]["condition"] == "service_completed_successfully"


def test_aligner_commands_parse(compose):
    parser = build_parser()
    commands = [s["entrypoint"] for s in compose["services"].values() if s.get("entrypoint", [None])[0] == "aligner"]
    assert len(commands) >= 2
    for cmd in commands:
        parser.parse_args(cmd[1:])  # exits (SystemExit) on an unknown command or flag


def test_the_broker_keeps_queued_jobs_and_the_worker_may_hand_its_job_back(compose):
    """A durable broker (its data on a volume, a fixed node name, no 30-minute ack timeout for long jobs) and a stop
    grace longer than the trainer's (ALIGNER_CANCEL_GRACE, 60 s): SIGKILL never comes before the hand-back."""
    services = compose["services"]
    rabbitmq = services["rabbitmq"]
    assert "rabbitmq:/var/lib/rabbitmq" in rabbitmq["volumes"] and rabbitmq["hostname"] == "rabbitmq"
    timeout_ms = int(rabbitmq["environment"]["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"].split("consumer_timeout")[1])
    assert timeout_ms >= 24 * 3600 * 1000
    grace = services["worker"]["stop_grace_period"]
    assert grace.endswith("m") and int(grace[:-1]) * 60 > 60 + 15
    assert "--concurrency=1" not in services["worker"]["entrypoint"]  # one job per GPU when it has some
