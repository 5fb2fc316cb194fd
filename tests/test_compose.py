"""docker-compose.yml and the Dockerfile: no Docker engine runs here, so check what can be checked without one.

Every service the issue names is there, long-running ones have healthchecks, start order follows the
dependencies, and every `aligner ...` command in it parses with the real command line. The hardening
(docs/security.md "Deployment"): ports on 127.0.0.1 unless the operator opts in, passwords from an .env the operator
writes (compose refuses to start without them), a non-root user in the image, and each service given only the
settings it reads. `interpolate` does what compose does with `${VAR:-default}` and `${VAR:?error}`; where
`docker compose` (or `docker-compose`) is installed, it checks the file too.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from aligner.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PASSWORDS = {"POSTGRES_PASSWORD": "pg0secret1", "RABBITMQ_PASSWORD": "mq0secret2"}
SERVICE_URLS = {"ALIGNER_DATABASE_URL", "ALIGNER_BROKER_URL"}
# What each aligner service reads (webapp/settings.py; the dashboard and the reward server read their flags only).
SETTINGS = {
    "migrate": {"ALIGNER_DATABASE_URL"},
    "assets": {"ALIGNER_DATABASE_URL", "ALIGNER_DATA_DIR"},
    "reward": set(),
    "worker": {"ALIGNER_DATABASE_URL", "ALIGNER_BROKER_URL", "ALIGNER_DATA_DIR"},
    "api": {"ALIGNER_DATABASE_URL", "ALIGNER_BROKER_URL", "ALIGNER_DATA_DIR"},
    "ui": set(),
}
_VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


class MissingVariable(Exception):
    pass


def interpolate(value, env: dict[str, str]):
    """`value` (the parsed file or a part of it) with compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}`
    replaced from `env`; MissingVariable for a `:?` one that is unset or empty, as compose refuses it."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        name, kind, word = match.groups()
        if env.get(name):
            return env[name]
        if kind == "?":
            raise MissingVariable(f"{name}: {word}")
        return word if kind == "-" else ""

    return _VARIABLE.sub(one, value)


def published_hosts(service: dict) -> list[str]:
    """The host address of each `HOST:PUBLISHED:TARGET` port of an interpolated service."""
    return [str(port).rsplit(":", 2)[0] for port in service.get("ports", [])]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_volumes_and_healthchecks(compose):
    services = compose["services"]
    assert {"postgres", "rabbitmq", "migrate", "reward", "worker", "api", "ui"} <= set(services)
    for name in ("postgres", "rabbitmq", "reward", "api", "ui"):
        assert "healthcheck" in services[name], name
    assert set(compose["volumes"]) >= {"data", "pgdata", "rabbitmq"}
    for name in ("migrate", "assets", "worker", "api"):
        assert services[name]["environment"]["ALIGNER_DATABASE_URL"].startswith("postgresql://")
    for name in ("worker", "api"):
        assert services[name]["environment"]["ALIGNER_BROKER_URL"].startswith("amqp://")
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


def test_the_api_and_dashboard_are_published_on_loopback_unless_the_operator_opts_in(compose):
    services = interpolate(compose, PASSWORDS)["services"]
    published = {name: published_hosts(service) for name, service in services.items() if service.get("ports")}
    assert set(published) == {"api", "ui", "reward"}
    assert all(hosts and set(hosts) == {"127.0.0.1"} for hosts in published.values()), published
    opted_in = interpolate(compose, {**PASSWORDS, "ALIGNER_BIND": "0.0.0.0"})["services"]
    assert published_hosts(opted_in["api"]) == published_hosts(opted_in["ui"]) == ["0.0.0.0"]
    assert published_hosts(opted_in["reward"]) == ["127.0.0.1"]  # takes no credential: never beyond this host


def test_passwords_come_from_the_operators_env_file_and_compose_refuses_to_start_without_them(compose):
    for missing in PASSWORDS:
        unset = {name: value for name, value in PASSWORDS.items() if name != missing}
        for env in (unset, {**PASSWORDS, missing: ""}):
            with pytest.raises(MissingVariable, match=missing):
                interpolate(compose, env)
    services = interpolate(compose, PASSWORDS)["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == PASSWORDS["POSTGRES_PASSWORD"]
    assert services["rabbitmq"]["environment"]["RABBITMQ_DEFAULT_PASS"] == PASSWORDS["RABBITMQ_PASSWORD"]
    assert services["api"]["environment"]["ALIGNER_DATABASE_URL"].startswith("postgresql://aligner:pg0secret1@")
    assert services["api"]["environment"]["ALIGNER_BROKER_URL"].startswith("amqp://aligner:mq0secret2@")
    # The example is what the operator copies: every password variable, none of them set; .env itself is never
    # committed.
    example = dict(
        line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines() if re.match(r"^\w+=", line)
    )
    assert example == dict.fromkeys(PASSWORDS, "")
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_aligner_services_run_as_a_non_root_user_who_owns_the_data_volume(compose):
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, "the image names no USER: its processes run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000  # numeric: Kubernetes' runAsNonRoot can check it
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"--uid {uid}" in dockerfile
    assert "chown aligner:aligner /data" in dockerfile and "chmod 0700 /data" in dockerfile
    assert lines.index(f"USER {users[-1]}") > max(i for i, line in enumerate(lines) if line.startswith("RUN "))
    for name in SETTINGS:
        assert str(compose["services"][name].get("user", uid)).split(":")[0] not in ("0", "root"), name


def test_each_service_gets_only_the_settings_it_reads(compose):
    services = compose["services"]
    for name, wanted in SETTINGS.items():
        assert set(services[name].get("environment") or {}) == wanted, name
    for name in ("reward", "ui"):  # they read the demo's files, and write nothing there
        assert services[name]["volumes"] == ["data:/data:ro"], name
    assert "volumes" not in services["migrate"]


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_refuses_the_file_without_passwords_and_accepts_it_with_them(tmp_path):
    command = _compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    base = [*command, "--project-directory", str(ROOT), "-f", str(ROOT / "docker-compose.yml")]
    example = [*base, "--env-file", str(ROOT / ".env.example"), "config"]
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path)}
    refused = subprocess.run(example, capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode != 0 and "POSTGRES_PASSWORD" in refused.stderr, refused.stderr
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in PASSWORDS.items()))
    accepted = subprocess.run([*base, "--env-file", str(env_file), "config"], capture_output=True, text=True,
                              env=env, timeout=60)  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    assert "127.0.0.1:8080:8080" in accepted.stdout.replace("/tcp", "") or "host_ip: 127.0.0.1" in accepted.stdout
