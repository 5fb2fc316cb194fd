"""`aligner up`: the whole stack on embedded defaults (SQLite, its own Redis, reward server, worker, API)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from sqlalchemy import select

from aligner.demo.templates import CONFIG_TEMPLATE
from tests.helpers.api import bearer
from tests.helpers.catalogue import register_model
from webapp.db import ServerEndpoint
from webapp.stack import DEMO_POLICY, DEMO_REWARD_SERVER, _values, demo_job_config

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("ALIGNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"aligner up exited with {proc.returncode}"
        if path.is_file():
            return json.loads(path.read_text())
        time.sleep(0.3)
    raise AssertionError(f"{path} not written after {timeout} s")


def _read_events(stack: dict, job_id: int, arrivals: dict) -> None:
    """Note when the SSE stream first brings each step's metrics event."""
    headers = {"Authorization": f"Bearer {stack['token']}"}
    url = f"{stack['api_url']}/api/v1/jobs/{job_id}/events"
    with requests.get(url, headers=headers, stream=True, timeout=120) as response:
        kind = None
        for line in response.iter_lines(decode_unicode=True):
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind == "metrics":
                arrivals.setdefault(json.loads(line[5:])["step"], time.monotonic())


def _group_alive(pgid: int) -> list[str]:
    return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()


@pytest.fixture(params=["embedded", "postgres+redis"])
def service_env(request):
    """Embedded defaults (SQLite, a Redis of its own), or the machine's PostgreSQL (fresh schema) and Redis."""
    env = {k: v for k, v in os.environ.items() if k not in ("ALIGNER_DATABASE_URL", "ALIGNER_BROKER_URL")}
    if request.param == "embedded":
        yield env
        return
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Redis at {REDIS_URL} is unreachable: {err}")
        pytest.skip(f"Redis at {REDIS_URL} is unreachable: {err}")
    from tests.helpers.databases import postgres_schema

    with postgres_schema() as url:
        queue = f"aligner-test-{uuid.uuid4().hex[:8]}"
        yield {**env, "ALIGNER_DATABASE_URL": url, "ALIGNER_BROKER_URL": REDIS_URL, "ALIGNER_QUEUE": queue}


@pytest.mark.parametrize("served", [True, False])
def test_the_demo_job_names_catalogue_entries_only_and_scores_validation_with_the_rule(
    client, admin_token, db_session, data_dir, tmp_path, served
):
    demo_dir = tmp_path / "demo_assets"
    demo_dir.mkdir()
    (demo_dir / "reinforce.yaml").write_text(CONFIG_TEMPLATE)  # what `aligner demo-assets` writes
    with db_session() as session:  # what `register_demo_assets` puts in the catalogue
        register_model(session, data_dir / "models" / "tiny-sft", "policy", DEMO_POLICY)
        session.add(ServerEndpoint(name=DEMO_REWARD_SERVER, kind="reward", url="http://127.0.0.1:9", model_name="m"))
    config = demo_job_config(demo_dir, {"train": "train.jsonl", "val": "val.jsonl"}, served=served)
    created = client.post("/api/v1/jobs", json={"name": "demo", "config": config}, headers=bearer(admin_token))
    assert created.status_code == 201, created.json
    stored = created.json["config"]
    if served:  # the reward model may be gamed: the rule it learnt from is the gold reward of every validation
        assert stored["reward"]["server"] == DEMO_REWARD_SERVER
        assert stored["validation"]["extra_rewards"]["rule"]["function"] == "demo"
    else:  # scored by the rule itself
        assert stored["reward"]["function"] == "demo" and stored["validation"]["extra_rewards"] == {}


@pytest.mark.slow
def test_up_runs_a_job_end_to_end_and_stops_every_child(tmp_path, tiny_policy_dir, service_env):
    data_dir = tmp_path / "data"
    env = service_env
    cmd = [sys.executable, "-m", "aligner.cli", "up", "--data-dir", str(data_dir),
           "--reward-function", "tests.helpers.rewards:letter_reward"]  # fmt: skip
    up = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stack = _wait_for(data_dir / "stack.json", up)
        assert set(stack) >= {"api_url", "api_base", "ui_url", "reward_url", "token"}
        assert stack["api_base"] == f"{stack['api_url']}/api/v1"
        assert stat.S_IMODE((data_dir / "stack.json").stat().st_mode) == 0o600  # it holds a token
        if "ALIGNER_DATABASE_URL" not in env:
            assert stat.S_IMODE((data_dir / "aligner.db").stat().st_mode) == 0o600  # SQLite by default, private
        headers = {"Authorization": f"Bearer {stack['token']}"}
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the sea")))
        # The stack's token is the operator's: it registers what the job names, as `aligner up --demo` does.
        api = stack["api_base"]
        model = {"name": "tiny", "path": str(tiny_policy_dir), "kind": "policy"}
        assert requests.post(f"{api}/catalogue/models", json=model, headers=headers, timeout=30).status_code == 201
        server = {"name": "rm", "url": stack["reward_url"], "kind": "reward"}
        assert requests.post(f"{api}/catalogue/servers", json=server, headers=headers, timeout=30).status_code == 201
        with prompts.open("rb") as f:
            dataset = requests.post(f"{api}/datasets", files={"file": f}, headers=headers, timeout=30).json()["id"]
        config = {
            "model": {"policy": "tiny"},
            "data": {"train_dataset": dataset, "val_dataset": dataset},
            "reward": {"server": "rm"},
            "generation": {"max_new_tokens": 6},
            "reinforce": {"num_prompts_per_step": 2, "num_rollouts_per_prompt": 2},
            "optim": {"lr": 1e-3, "warmup_steps": 1},
            "trainer": {"max_steps": 3, "val_check_interval": 2, "save_interval": 2},
        }
        created = requests.post(f"{stack['api_url']}/api/v1/jobs", json={"name": "t", "config": config},
                                headers=headers, timeout=30)  # fmt: skip
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        arrivals, written = {}, {}
        reader = threading.Thread(target=_read_events, args=(stack, job_id, arrivals), daemon=True)
        reader.start()
        metrics_file = data_dir / "runs" / f"job_{job_id}" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(written) < 4:  # steps 0..3 appear in the trainer's file
            if metrics_file.is_file():
                for line in metrics_file.read_text().splitlines():
                    written.setdefault(json.loads(line)["step"], time.monotonic())
            time.sleep(0.02)
        reader.join(60)
        # Each step reaches an SSE client within 2 s of the trainer writing it.
        delays = {step: arrivals[step] - written[step] for step in written}
        assert set(delays) == {0, 1, 2, 3} and max(delays.values()) < 2.0, delays
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            job = requests.get(f"{stack['api_url']}/api/v1/jobs/{job_id}", headers=headers, timeout=10).json()
            if job["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        assert job["status"] == "succeeded", job
        metrics = requests.get(f"{stack['api_url']}/api/v1/jobs/{job_id}/metrics", headers=headers,
                               params={"name": "train_rollouts/rewards"}, timeout=10).json()  # fmt: skip
        assert [s for s, _ in metrics["metrics"]["train_rollouts/rewards"]] == [1, 2, 3]
        rewards = [v for _, v in metrics["metrics"]["train_rollouts/rewards"]]
        assert _values(metrics, "train_rollouts/rewards") == rewards  # what the demo summary reads
        # Other local users read nothing of it: every folder 0700 and file 0600, the logs, the broker's files, the
        # uploads and the job's run folder included (webapp/private.py) ...
        made = [data_dir, *data_dir.rglob("*")]
        assert {"logs", "runs", "datasets"} <= {p.name for p in made}
        assert not [p for p in made if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) & 0o077]
        # ... and the dashboard and the reward server hold no database or broker URL (SERVICE_ONLY_ENV).
        for name in ("ui", "reward_server"):
            environ = Path(f"/proc/{stack['pids'][name]}/environ").read_bytes().split(b"\0")
            assert not [v for v in environ if v.startswith((b"ALIGNER_DATABASE_URL=", b"ALIGNER_BROKER_URL="))]
    finally:
        up.send_signal(signal.SIGTERM)
        output, _ = up.communicate(timeout=90)
    assert up.returncode == 0, output
    assert "stopped" in output
    assert stack["token"] not in output and f"in {data_dir / 'stack.json'}" in output  # where it is, never itself
    own_redis = "ALIGNER_BROKER_URL" not in env
    if own_redis:  # what it prints names its Redis without the password
        password = (data_dir / "redis" / "redis.conf").read_text().split()[1]
        assert "broker redis://:***@127.0.0.1:" in output and password not in output
    assert set(stack["pids"]) == {"reward_server", "worker", "api", "ui"} | ({"redis"} if own_redis else set())
    for name, pid in stack["pids"].items():
        assert _group_alive(pid) == [], f"{name} (process group {pid}) still running"


def _start_redis(command: list[str], port: int, password: str) -> subprocess.Popen:
    """Start `command` (webapp.stack.redis_command) and wait until it answers a client that knows `password`."""
    import redis

    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(port=port, password=password, socket_connect_timeout=1)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            return proc
        except redis.exceptions.RedisError:  # not listening yet, or still loading its file
            assert proc.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)


def test_each_start_makes_an_expiring_operator_token_revokes_the_earlier_ones_and_prints_none(tmp_path):
    """`aligner up`'s token (Stack._token): one live at a time, with an expiry; written to stack.json (0600, whole
    or not at all), and the banner says where it is rather than what it is."""
    from webapp import db
    from webapp.stack import STACK_TOKEN_DAYS, Stack, banner, token_command, write_private_json

    url = f"sqlite:///{tmp_path / 'aligner.db'}"
    engine = db.make_engine(url)
    db.Base.metadata.create_all(engine)
    factory = db.make_session_factory(engine)
    with db.session_scope(factory) as session:
        own = db.create_token(session, "admin", "scripts", admin=True)  # `aligner token create`: not the stack's
    stack = Stack(tmp_path)
    stack.env["ALIGNER_DATABASE_URL"] = url
    first, second = stack._token(), stack._token()
    with db.session_scope(factory) as session:
        assert db.user_for_token(session, first) is None
        assert db.user_for_token(session, second).is_admin and db.user_for_token(session, own) is not None
        expires = session.scalar(select(db.ApiToken.expires_at).order_by(db.ApiToken.id.desc()))
    left = expires.replace(tzinfo=dt.UTC) - dt.datetime.now(dt.UTC)
    days = dt.timedelta(days=STACK_TOKEN_DAYS)
    assert days - dt.timedelta(minutes=1) < left <= days
    engine.dispose()

    stack_file = tmp_path / "stack.json"
    stack_file.write_text("{}")
    stack_file.chmod(0o644)  # one left by an older version
    write_private_json(stack_file, {"token": second})
    assert stat.S_IMODE(stack_file.stat().st_mode) == 0o600 and sorted(p.name for p in tmp_path.glob("*stack*")) == [
        "stack.json"
    ]
    shown = banner({"api_base": "http://h/api/v1", "ui_url": "http://h:2", "reward_url": None}, stack_file)
    assert second not in shown and f"token   in {stack_file}" in shown
    read = subprocess.run(token_command(stack_file), shell=True, capture_output=True, text=True, check=True)
    assert read.stdout.strip() == second


def test_the_embedded_broker_keeps_a_queued_job_through_a_sigkill(tmp_path):
    """`aligner up`'s own Redis (webapp.stack.redis_command) writes each message to its append-only file before it
    answers: killed with SIGKILL and started again, it still holds the job's message."""
    import redis

    from aligner.processes import free_port
    from webapp.queues import CeleryQueue
    from webapp.stack import redis_command, redis_server_binary, redis_url

    port, password = free_port(), "a-test-password"
    command = redis_command(redis_server_binary(), port, tmp_path, password)
    proc = _start_redis(command, port, password)
    try:
        CeleryQueue(queue="aligner", broker_url=redis_url(port, password)).enqueue(7)
        proc.kill()
        proc.wait()
        proc = _start_redis(command, port, password)
        messages = redis.Redis(port=port, password=password).lrange("aligner", 0, -1)
        assert [json.loads(m)["headers"]["argsrepr"] for m in messages] == ["[7]"]
    finally:
        proc.kill()
        proc.wait()


def test_the_printed_broker_url_hides_its_password():
    from webapp.stack import _hide_passwords

    assert _hide_passwords("amqp://aligner:s3cret@rabbitmq:5672//") == "amqp://aligner:***@rabbitmq:5672//"
    failover = "sentinel://:s3cret@a:26379;sentinel://:s3cret@b:26379"
    assert _hide_passwords(failover) == "sentinel://:***@a:26379;sentinel://:***@b:26379"
    assert _hide_passwords("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_the_embedded_broker_refuses_clients_without_its_password(tmp_path):
    """Every local user reaches 127.0.0.1: `aligner up`'s Redis answers only clients with the password it was
    started with, listens on 127.0.0.1 only, and keeps the password off its command line (ps shows that to all)."""
    import redis

    from aligner.processes import free_port
    from webapp.stack import REDIS_CONFIG, redis_command, redis_server_binary

    port, password = free_port(), "a-test-password"
    command = redis_command(redis_server_binary(), port, tmp_path, password)
    assert not any(password in part for part in command)
    assert stat.S_IMODE((tmp_path / REDIS_CONFIG).stat().st_mode) == 0o600
    proc = _start_redis(command, port, password)
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=port, socket_connect_timeout=1).ping()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=port, password="a-guess", socket_connect_timeout=1).ping()
        client = redis.Redis(port=port, password=password)
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
    finally:
        proc.kill()
        proc.wait()
