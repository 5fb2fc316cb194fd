"""Chaos test of the training service: jobs submitted over the API finish exactly once, whatever restarts around them.

    .venv/bin/python bench/chaos.py                       # 20 jobs, 2 workers, RabbitMQ, every fault (3-5 minutes)
    .venv/bin/python bench/chaos.py --jobs 4 --steps 10 --reward-outage 5 --json     # the CI version (a slow test)
    .venv/bin/python bench/chaos.py --broker redis        # Redis (append-only file) instead of RabbitMQ

It starts a stack of its own: a fresh PostgreSQL schema (env ALIGNER_TEST_POSTGRES_URL, else
postgresql://postgres@127.0.0.1:5432/test; dropped at the end), a private broker it can restart (a RabbitMQ node of
its own on a free port with its data in a temp folder, or `redis-server` with an append-only file), a reward server
(`aligner serve-reward` with a paced rule reward, so steps last long enough for faults to land in them), the REST API
and `--workers` Celery workers. It registers a tiny policy, the reward server and two datasets in the catalogue
through the API as an admin, submits `--jobs` REINFORCE jobs through the API, and while they run, each once a job is
past step 2:

    sigkill-worker   SIGKILL a worker's process group (a crash), start a new worker
    sigterm-worker   SIGTERM a worker's main process only (a deploy, `docker stop`), start a new one when it exited
    restart-broker   stop the broker and start it again on its data
    kill-trainer     SIGKILL the trainer of a running job (the OOM killer)
    reward-outage    stop the reward server for `--reward-outage` seconds (default 30), then start it again
    clock-jump       every worker's wall clock (the seam `ALIGNER_CHAOS_CLOCK_FILE`: webapp.db.utcnow as the
                     workers read it) jumps an hour ahead for `--clock-window` s, then an hour back, then right
                     again; no job may be re-queued meanwhile (`clock_jump_requeued` must be 0)
    restart-postgres stop the database (a PostgreSQL cluster of its own, `pg_ctl stop -m fast`) for `--db-outage` s
                     and start it again
    disk-full        fill the data folder (a tmpfs of `--disk-mb` MiB mounted for the run: needs root) to within
                     256 KiB, so the next checkpoint save fails; once a job failed (or `--disk-window` s passed)
                     delete the filler and resume the failed jobs (retry one that failed before its first
                     checkpoint); each must have failed saying the disk is full, with no half checkpoint left and
                     its last checkpoint intact
    kill-api-upload  SIGKILL the API while a dataset upload is half sent, start it again: the datasets list (and
                     so the quota's count) is as before and no new file is in the datasets folder
    two-apis         start a second API process on the same database; cancel a running job from both at once, then
                     resume and retry it from both at once: one winner, the others 409, never a 5xx

The faults on the database and the data disk need a PostgreSQL cluster (`/usr/lib/postgresql/*/bin`, run as the
`postgres` user when this runs as root) and a tmpfs mount; without them they are skipped, and said so.

At the end it checks, from the database: every job succeeded, with exactly one `succeeded` status event; each
(job, step, metric) row exists once; every job has its `train_rollouts/rewards` at every step 1..max_steps. It prints
what it did and the counts; `--json` ends with one JSON line with the keys `jobs`, `succeeded_once`,
`duplicate_metric_rows`, `missing_steps`, `faults`, `fault_problems` (and `wall_s`, `broker`, `attempts`,
`handed_back`, `requeued`). The exit status is 0 only when every check holds and `fault_problems` is empty.
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import glob
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, suppress
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]

from api_load import postgres_schema  # noqa: E402  (bench/, next to this file)
from sqlalchemy.exc import OperationalError  # noqa: E402

from aligner.metrics import TRAIN_REWARD  # noqa: E402
from aligner.processes import free_port  # noqa: E402
from webapp.stack import http_ok, port_open  # noqa: E402

POSTGRES_URL = os.environ.get("ALIGNER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
PROMPTS = ["tell me about the cat.", "describe the dog.", "a bird", "the old river", "the sea", "a song"]
CORPUS = [p + " it is a fine day. the cat and the dog sing by the river and the sea." for p in PROMPTS] * 20
START_TIMEOUT_S = 90
FAULTS = (
    "clock-jump", "sigkill-worker", "sigterm-worker", "restart-broker", "restart-postgres", "kill-trainer",
    "two-apis", "kill-api-upload", "disk-full", "reward-outage",
)  # fmt: skip
CLOCK_FILE_ENV = "ALIGNER_CHAOS_CLOCK_FILE"
DISK_FULL_WORDS = "disk is full"  # what the error of a job stopped by a full disk must say


def paced_reward(prompts: list[str], responses: list[str]) -> list[float]:
    """The reward server's function: counts of 'e', at least 50 ms a batch (steps long enough to be interrupted)."""
    time.sleep(0.05)
    return [(len(r) % 7) / 7 + r.count("e") for r in responses]


def celery_with_clock() -> None:
    """A Celery worker whose wall clock (webapp.db.utcnow, as the worker's modules read it) is shifted by the seconds
    in the file `$ALIGNER_CHAOS_CLOCK_FILE` (re-read when it changes): the clock-jump fault's seam."""
    import webapp.db

    path, real = Path(os.environ[CLOCK_FILE_ENV]), webapp.db.utcnow
    seen = {"mtime": None, "offset": 0.0}

    def shifted() -> dt.datetime:
        with suppress(OSError, ValueError):
            mtime = path.stat().st_mtime_ns
            if mtime != seen["mtime"]:
                seen["offset"], seen["mtime"] = float(path.read_text() or 0), mtime
        return real() + dt.timedelta(seconds=seen["offset"])

    webapp.db.utcnow = shifted  # before the worker's modules import it by name
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", *sys.argv[1:]]
    celery_main()


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------- processes
class Child:
    """A process of the stack in its own session, its output in LOGS/<name>.log."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], logs: Path):
        self.name, self.command, self.env, self.logs = name, command, env, logs
        self.proc: subprocess.Popen | None = None

    def start(self) -> Child:
        with (self.logs / f"{self.name}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def log(self) -> str:
        path = self.logs / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 20, main_only: bool = False) -> None:
        """SIGTERM (to the main process alone with `main_only`, as `docker stop` does; else to the whole group),
        then SIGKILL to the group after `grace` seconds."""
        if self.proc is None:
            return
        if main_only:
            with suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        else:
            self.signal_group(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        self.signal_group(signal.SIGKILL)
        self.proc.wait()


def wait_until(check, timeout: float, what: str, child: Child | None = None, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(f"{child.name} exited ({child.proc.returncode}):\n{child.log()[-3000:]}")
        try:
            value = check()
        except OperationalError:  # the database is away (the restart-postgres fault): look again
            value = None
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


class Broker:
    """A broker this benchmark owns: RabbitMQ (a node of its own) or Redis (append-only file); `restart()` keeps
    its data, as a real broker restart does."""

    def __init__(self, kind: str, folder: Path, logs: Path):
        self.kind, self.port = kind, free_port()
        folder.mkdir(parents=True)
        env = dict(os.environ)
        if kind == "rabbitmq":
            folder.chmod(0o777)  # the node may run as the rabbitmq user
            node = f"chaos{self.port}@localhost"
            env.update(
                RABBITMQ_NODENAME=node, RABBITMQ_NODE_PORT=str(self.port), RABBITMQ_DIST_PORT=str(free_port()),
                RABBITMQ_MNESIA_BASE=str(folder / "mnesia"), RABBITMQ_LOG_BASE=str(folder / "log"),
                RABBITMQ_ENABLED_PLUGINS_FILE=str(folder / "plugins"), RABBITMQ_PID_FILE=str(folder / "pid"),
                RABBITMQ_FEATURE_FLAGS_FILE=str(folder / "feature_flags"),
                RABBITMQ_PLUGINS_EXPAND_DIR=str(folder / "plugins_expand"),
                RABBITMQ_CONFIG_FILE=str(folder / "rabbitmq"),
                # as docker-compose.yml: a job's message stays unacknowledged while it trains
                RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-rabbit consumer_timeout 604800000",
            )  # fmt: skip
            script = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
            command = [str(script if script.exists() else shutil.which("rabbitmq-server") or "rabbitmq-server")]
            self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        else:
            from webapp.stack import redis_command, redis_server_binary, redis_url

            password = uuid.uuid4().hex  # as `aligner up`'s: a password of its own
            command = redis_command(redis_server_binary(), self.port, folder, password)
            self.url = redis_url(self.port, password)
        self.child = Child("broker", command, env, logs)

    def start(self) -> None:
        self.child.start()
        self.wait_listening()

    def wait_listening(self) -> None:
        wait_until(lambda: port_open(self.port), START_TIMEOUT_S, f"{self.kind} to listen", self.child)

    def stop(self) -> None:
        self.child.stop(grace=30)

    def restart(self) -> None:
        self.stop()
        self.start()


class Postgres:
    """A PostgreSQL cluster of its own (initdb in a temp folder, a free port) that the run may stop and start; run as
    the `postgres` user when this process is root (the server refuses root)."""

    def __init__(self, logs: Path):
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        pg_ctl = found[-1] if found else shutil.which("pg_ctl")
        if pg_ctl is None:
            raise RuntimeError("no pg_ctl (PostgreSQL server binaries) found")
        self.bin, self.logs = Path(pg_ctl).parent, logs
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="aligner-chaos-pg-"))
        self.data, self.log = self.folder / "data", self.folder / "postgres.log"  # the server user writes both
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_postgres:
            shutil.chown(self.folder, "postgres", "postgres")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, *args: str, timeout: float = 120) -> None:
        done = subprocess.run([*self.as_postgres, *args], capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:1])} failed: {done.stdout}{done.stderr}\n{log}")

    def start(self) -> None:
        if not self.data.exists():
            self.run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        with suppress(subprocess.SubprocessError, RuntimeError):
            self.run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        self.stop("immediate")
        with suppress(OSError):
            shutil.copy(self.log, self.logs / "postgres.log")
        shutil.rmtree(self.folder, ignore_errors=True)


def mount_small_disk(folder: Path, megabytes: int) -> bool:
    """A tmpfs of `megabytes` MiB on `folder` (the run's data folder); False where mounting is not allowed."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0755", "tmpfs", str(folder)], capture_output=True
    )
    return done.returncode == 0


# ------------------------------------------------------------------------------------------------- the stack
class Stack:
    def __init__(self, args, folder: Path, database_url: str):
        self.args, self.folder, self.database_url = args, folder, database_url
        self.logs = folder / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.data_dir = folder / "data"
        self.queue = f"chaos-{uuid.uuid4().hex[:8]}"
        self.broker = Broker(args.broker, folder / "broker", self.logs)
        self.reward_port = free_port(3)
        self.api_port = free_port()
        self.api = f"http://127.0.0.1:{self.api_port}/api/v1"
        self.workers: list[Child] = []
        self.worker_count = 0
        self.reward: Child | None = None
        self.api_child: Child | None = None
        self.apis: list[Child] = []  # a second API process while the two-apis fault runs
        self.token = ""
        self.clock_file = folder / "clock_offset_s"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLASK_")}
        env.update(
            ALIGNER_DATABASE_URL=self.database_url, ALIGNER_BROKER_URL=self.broker.url, ALIGNER_QUEUE=self.queue,
            ALIGNER_DATA_DIR=str(self.data_dir), ALIGNER_LEASE_TIMEOUT="6", ALIGNER_SWEEP_INTERVAL="1",
            ALIGNER_REQUEUE_AFTER="10", ALIGNER_CANCEL_GRACE="20", ALIGNER_MAX_ATTEMPTS="6", PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            ALIGNER_MAX_ACTIVE_JOBS=str(max(4, self.args.jobs)),  # one user submits them all
            **{CLOCK_FILE_ENV: str(self.clock_file)},
        )  # fmt: skip
        return env

    def launch(self) -> None:
        """Migrate the database and start the broker, the reward server and the API, which need nothing of each
        other; `wait_started` waits for them and adds the workers."""
        from webapp import migrate
        from webapp.db import create_token, make_engine, make_session_factory, session_scope

        migrate.upgrade(self.database_url, configure_logger=False)
        engine = make_engine(self.database_url)
        with session_scope(make_session_factory(engine)) as session:
            self.token = create_token(session, "chaos", "bench/chaos.py", admin=True)
        engine.dispose()
        say(f"database {self.database_url.split('?')[0]} (schema of its own); starting {self.args.broker}")
        self.broker.child.start()
        self.launch_reward_server()
        self.api_child = self.launch_api("api", self.api_port)

    def launch_api(self, name: str, port: int) -> Child:
        command = [sys.executable, "-m", "flask", "--app", "webapp", "run", "--with-threads", "--no-reload",
                   "--no-debugger", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        child = Child(name, command, self.env(), self.logs).start()
        self.apis.append(child)
        return child

    def wait_api(self, child: Child, port: int) -> None:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/api/v1/health"), START_TIMEOUT_S, child.name, child)

    def wait_started(self) -> None:
        self.broker.wait_listening()
        self.wait_reward_server()
        self.wait_api(self.api_child, self.api_port)
        workers = [self.launch_worker() for _ in range(self.args.workers)]  # they boot side by side
        for worker in workers:
            self.wait_worker(worker)

    def start_reward_server(self) -> None:
        self.launch_reward_server()
        self.wait_reward_server()

    def launch_reward_server(self) -> None:
        command = [sys.executable, "-m", "aligner.cli", "serve-reward", "--function", "bench.chaos:paced_reward",
                   "--port", str(self.reward_port)]  # fmt: skip
        self.reward = Child("reward", command, self.env(), self.logs).start()

    def wait_reward_server(self) -> None:
        url = f"http://127.0.0.1:{self.reward_port}/v2/health/ready"
        wait_until(lambda: http_ok(url), START_TIMEOUT_S, "the reward server", self.reward)

    def start_worker(self) -> Child:
        return self.wait_worker(self.launch_worker())

    def launch_worker(self) -> Child:
        name = f"chaos{self.worker_count}"
        self.worker_count += 1
        bench = str(Path(__file__).parent)
        seam = f"import sys; sys.path.insert(0, {bench!r}); import chaos; chaos.celery_with_clock()"
        command = [sys.executable, "-c", seam, "-A", "worker.celery_app", "worker", "--pool=prefork",
                   "--concurrency=1", "-Q", self.queue, "-n", f"{name}@%h", "--without-mingle", "--without-gossip",
                   "--loglevel=INFO"]  # fmt: skip
        worker = Child(name, command, self.env(), self.logs).start()
        self.workers.append(worker)  # stopped with the stack even if it never becomes ready
        return worker

    def wait_worker(self, worker: Child) -> Child:
        wait_until(lambda: " ready." in worker.log(), START_TIMEOUT_S, f"worker {worker.name}", worker)
        return worker

    def stop(self) -> None:
        for child in [*self.workers, *self.apis, self.reward]:
            if child is not None:
                child.stop()
        self.broker.stop()

    # --------------------------------------------------------------------------------------------- API
    def call(self, method: str, path: str, api: str | None = None, **kwargs) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return requests.request(method, f"{api or self.api}{path}", headers=headers, timeout=60, **kwargs)

    def register(self, policy_dir: Path) -> dict:
        """The policy, the reward server and the prompts in the catalogue, as the admin would; the datasets' ids."""
        body = {"name": "chaos-policy", "path": str(policy_dir), "kind": "policy"}
        expect(self.call("POST", "/catalogue/models", json=body), 201)
        body = {"name": "chaos-reward", "url": f"http://127.0.0.1:{self.reward_port}", "kind": "reward"}
        expect(self.call("POST", "/catalogue/servers", json=body), 201)
        text = "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS).encode()
        ids = {}
        for split in ("train", "val"):
            files = {"file": (f"chaos-{split}.jsonl", text)}
            ids[split] = expect(self.call("POST", "/datasets", files=files, data={"name": f"chaos-{split}"}), 201)[
                "id"
            ]
        return ids

    def submit(self, datasets: dict, index: int) -> int:
        config = {
            "model": {"policy": "chaos-policy", "num_threads": 1},
            "data": {"train_dataset": datasets["train"], "val_dataset": datasets["val"]},
            "reward": {"server": "chaos-reward", "unavailable_timeout_s": 600},
            "generation": {"max_new_tokens": 8, "compile": False},
            "reinforce": {"num_prompts_per_step": 4, "num_rollouts_per_prompt": 2},
            "optim": {"lr": 1e-3, "warmup_steps": 1, "micro_batch_size": 8},
            "trainer": {"max_steps": self.args.steps, "save_interval": 2, "val_check_interval": 1000},
        }
        return expect(self.call("POST", "/jobs", json={"name": f"chaos {index}", "config": config}), 201)["id"]


def expect(response: requests.Response, status: int) -> dict:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.method} {response.url}: {response.status_code} {response.text[:500]}")
    return response.json()


def build_policy(folder: Path) -> Path:
    """A ~100k-parameter Llama and a byte-level BPE tokenizer (bench/workload.py's), saved as a Hugging Face folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from workload import bpe_tokenizer

    tokenizer = bpe_tokenizer(CORPUS, vocab_size=300)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------------------- faults
class Chaos:
    def __init__(self, stack: Stack, factory, job_ids: list[int], postgres: Postgres | None, disk: bool):
        self.stack, self.factory, self.job_ids = stack, factory, job_ids
        self.postgres, self.disk = postgres, disk
        self.started = time.monotonic()
        self.faults: list[dict] = []
        self.problems: list[str] = []  # what a fault found wrong (the run fails when there is any)
        self.clock_jump_requeued: int | None = None

    def problem(self, fault: str, what: str) -> None:
        self.problems.append(f"{fault}: {what}")
        say(f"PROBLEM {fault}: {what}")

    def note(self, fault: str, detail: str) -> None:
        self.faults.append({"fault": fault, "at_s": round(time.monotonic() - self.started, 1), "detail": detail})
        say(f"fault {fault}: {detail}")

    def running_job(self, min_step: int = 2, timeout: float = 120):
        """A running job past `min_step` (its id and run folder), or None when none comes within `timeout`."""
        from sqlalchemy import select

        from webapp.db import FINAL_STATUSES, RUNNING, Job, session_scope

        def find():
            with session_scope(self.factory) as session:
                row = session.execute(
                    select(Job.id, Job.run_dir, Job.worker)
                    .where(Job.id.in_(self.job_ids), Job.status == RUNNING, Job.step >= min_step)
                    .order_by(Job.step, Job.id)  # the least advanced: the fault lands before the job ends
                ).first()
                unfinished = session.scalar(
                    select(Job.id).where(Job.id.in_(self.job_ids), Job.status.not_in(FINAL_STATUSES)).limit(1)
                )
            return row or ("all done" if unfinished is None else None)

        try:
            found = wait_until(find, timeout, "a running job", interval=0.2)
        except RuntimeError:
            return None
        return None if found == "all done" else found

    def worker_of(self, lease_owner: str | None) -> Child | None:
        """The worker whose pool process holds this lease (`host:pid:token`), else any live worker."""
        pid = int(lease_owner.split(":")[1]) if lease_owner else None
        for worker in self.stack.workers:
            if worker.alive() and pid is not None and str(pid) in worker.log():
                return worker
        return next((w for w in self.stack.workers if w.alive()), None)

    def run(self, faults: list[str], outage: float) -> None:
        for i, fault in enumerate(faults):
            job = self.running_job()
            if job is None:
                say(f"no job running past step 2 any more: {fault} skipped")
                continue
            job_id, run_dir, owner = job
            getattr(self, fault.replace("-", "_"))(job_id, Path(run_dir), owner, outage)
            if i < len(faults) - 1:
                time.sleep(2)  # the stack settles before the next fault

    def sigkill_worker(self, job_id, run_dir, owner, outage) -> None:
        worker = self.worker_of(owner)
        worker.signal_group(signal.SIGKILL)
        worker.proc.wait()
        self.stack.workers.remove(worker)
        self.note("sigkill-worker", f"{worker.name} (running job {job_id}) killed; a new worker starts")
        self.stack.start_worker()

    def sigterm_worker(self, job_id, run_dir, owner, outage) -> None:
        worker = self.worker_of(owner)
        os.kill(worker.proc.pid, signal.SIGTERM)
        began = time.monotonic()
        status = worker.proc.wait(120)
        self.stack.workers.remove(worker)
        self.note(
            "sigterm-worker",
            f"{worker.name} (running job {job_id}) exited {status} {time.monotonic() - began:.1f} s after SIGTERM",
        )
        self.stack.start_worker()

    def restart_broker(self, job_id, run_dir, owner, outage) -> None:
        began = time.monotonic()
        self.stack.broker.restart()
        self.note("restart-broker", f"{self.stack.args.broker} down and up again in {time.monotonic() - began:.1f} s")

    def kill_trainer(self, job_id, run_dir, owner, outage) -> None:
        missing = None
        for _ in range(10):  # a job just re-queued by the fault before has no trainer yet: look again
            try:
                pid = json.loads((run_dir / "trainer.pid").read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, KeyError) as err:
                missing = err
            else:
                self.note("kill-trainer", f"job {job_id}: trainer pid {pid} SIGKILLed")
                return
            time.sleep(1)
            job = self.running_job(timeout=30)
            if job is None:
                break
            job_id, run_dir = job[0], Path(job[1])
        self.note("kill-trainer", f"job {job_id}: no trainer to kill ({missing})")

    def reward_outage(self, job_id, run_dir, owner, outage) -> None:
        self.stack.reward.stop(grace=45, main_only=True)  # as its operator would stop it (docker stop, systemctl)
        self.note("reward-outage", f"reward server stopped for {outage:g} s (job {job_id} was at step 2+)")
        time.sleep(outage)
        self.stack.start_reward_server()
        say("reward server back")

    def lost_lease_events(self) -> int:
        from sqlalchemy import select

        from webapp.db import Event, session_scope

        with session_scope(self.factory) as session:
            payloads = session.scalars(
                select(Event.payload).where(Event.job_id.in_(self.job_ids), Event.kind == "log")
            ).all()
        return sum("lost (no heartbeat" in p.get("message", "") for p in payloads)

    def clock_jump(self, job_id, run_dir, owner, outage) -> None:
        window = self.stack.args.clock_window
        before = self.lost_lease_events()
        for offset in (3600, -3600):
            self.stack.clock_file.write_text(str(offset))
            time.sleep(window)
        self.stack.clock_file.write_text("0")
        time.sleep(2)  # a sweep that began during the jump has ended
        self.clock_jump_requeued = self.lost_lease_events() - before
        if self.clock_jump_requeued:
            self.problem("clock-jump", f"{self.clock_jump_requeued} healthy jobs declared lost and re-queued")
        self.note(
            "clock-jump",
            f"workers' clocks +1 h for {window:g} s, then -1 h for {window:g} s (job {job_id} running): "
            f"{self.clock_jump_requeued} leases declared lost",
        )

    def restart_postgres(self, job_id, run_dir, owner, outage) -> None:
        if self.postgres is None:
            self.note("restart-postgres", "skipped: the run is not on a PostgreSQL cluster of its own")
            return
        began = time.monotonic()
        self.postgres.stop("fast")
        time.sleep(self.stack.args.db_outage)
        self.postgres.start()
        self.note("restart-postgres", f"database down and up again in {time.monotonic() - began:.1f} s (job {job_id})")

    def two_apis(self, job_id, run_dir, owner, outage) -> None:
        from webapp.db import CANCELLED

        port = free_port()
        second = self.stack.launch_api("api2", port)
        try:
            self.stack.wait_api(second, port)
            job = self.running_job()  # again: the job taken before the second API booted may have ended meanwhile
            if job is None:
                self.note("two-apis", "skipped: no job running past step 2 any more")
                return
            job_id = job[0]
            apis = [self.stack.api, f"http://127.0.0.1:{port}/api/v1"]
            cancels = self.race(job_id, [(api, "cancel") for api in apis for _ in range(2)])
            status = wait_until(lambda: self.final_status(job_id), 180, f"job {job_id} to stop")
            if status != CANCELLED and set(cancels) == {409}:  # it ended first: nothing was left to cancel
                self.note("two-apis", f"job {job_id} ended {status} before the cancels landed: {cancels}")
                return
            self.check_race("cancel", cancels, winners=None)
            if status != CANCELLED:  # the cancel landed as it ended its last step: nothing to resume or retry
                self.note("two-apis", f"job {job_id}: 4 cancels at once: {cancels}; it ended {status} even so")
                return
            again = self.race(job_id, [(api, action) for action in ("resume", "retry") for api in apis])
            self.check_race("resume/retry", again, winners=1)
            self.note("two-apis", f"job {job_id}: 4 cancels from 2 APIs at once: {cancels}; resume, resume, retry, "
                      f"retry at once: {again}")  # fmt: skip
        finally:
            second.stop()
            self.stack.apis.remove(second)

    def race(self, job_id: int, calls: list[tuple[str, str]]) -> list[int]:
        """POST /jobs/{id}/<action> to each (API, action) at the same moment: the status codes, in order."""
        barrier, codes = threading.Barrier(len(calls)), [0] * len(calls)

        def one(i: int, api: str, action: str) -> None:
            barrier.wait()
            codes[i] = self.stack.call("POST", f"/jobs/{job_id}/{action}", api=api).status_code

        threads = [threading.Thread(target=one, args=(i, *call)) for i, call in enumerate(calls)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return codes

    def check_race(self, what: str, codes: list[int], winners: int | None) -> None:
        if any(code not in (200, 409) for code in codes):
            self.problem("two-apis", f"{what}: status codes {codes} (only 200 and 409 are right)")
        elif winners is not None and codes.count(200) != winners:
            self.problem("two-apis", f"{what}: {codes.count(200)} requests won ({codes}); exactly {winners} must")
        elif codes.count(200) == 0:
            self.problem("two-apis", f"{what}: no request won ({codes})")

    def final_status(self, job_id: int) -> str | None:
        from webapp.db import FINAL_STATUSES, Job, session_scope

        with session_scope(self.factory) as session:
            status = session.get(Job, job_id).status
        return status if status in FINAL_STATUSES else None

    def datasets_state(self) -> tuple[list, set[str]]:
        listed = expect(self.stack.call("GET", "/datasets", params={"per_page": 100}), 200)
        items = sorted((d["id"], d["name"], d["size_bytes"]) for d in listed["items"])
        folder = self.stack.data_dir / "datasets"
        return [listed["total"], items], {str(p.relative_to(folder)) for p in folder.rglob("*.jsonl")}

    def kill_api_upload(self, job_id, run_dir, owner, outage) -> None:
        before, files_before = self.datasets_state()
        boundary = uuid.uuid4().hex
        text = "".join(json.dumps({"prompt": f"{p} {i}"}) + "\n" for i in range(40000) for p in PROMPTS[:1])
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nhalf\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="half.jsonl"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n{text}\r\n--{boundary}--\r\n"
        ).encode()
        connection = http.client.HTTPConnection("127.0.0.1", self.stack.api_port, timeout=30)
        connection.putrequest("POST", "/api/v1/datasets")
        connection.putheader("Authorization", f"Bearer {self.stack.token}")
        connection.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders()
        connection.send(body[: len(body) // 2])
        time.sleep(1)  # the API is reading the body
        api = self.stack.api_child
        api.signal_group(signal.SIGKILL)
        api.proc.wait()
        connection.close()
        self.stack.apis.remove(api)
        began = time.monotonic()
        self.stack.api_child = self.stack.launch_api("api", self.stack.api_port)
        self.stack.wait_api(self.stack.api_child, self.stack.api_port)
        after, files_after = self.datasets_state()
        if after != before:
            self.problem("kill-api-upload", f"datasets listed before {before}, after {after}")
        if files_after - files_before:
            self.problem("kill-api-upload", f"new files in the datasets folder: {sorted(files_after - files_before)}")
        self.note(
            "kill-api-upload",
            f"API SIGKILLed with {len(body) // 2 >> 10} of {len(body) >> 10} KiB of an upload sent, back in "
            f"{time.monotonic() - began:.1f} s; datasets {'unchanged' if after == before else 'CHANGED'}",
        )

    def disk_full(self, job_id, run_dir, owner, outage) -> None:
        from aligner.run_layout import checkpoint_problem, list_checkpoints
        from webapp.db import FAILED

        if not self.disk:
            self.note("disk-full", "skipped: no small filesystem could be mounted for the data folder (needs root)")
            return
        data_dir, window = self.stack.data_dir, self.stack.args.disk_window
        filler = data_dir / "chaos-filler"
        headroom = self.stack.args.disk_headroom_kb << 10
        with filler.open("wb") as f:
            for _ in range(50):  # the running jobs write meanwhile: a size just measured may be gone already
                try:
                    more = shutil.disk_usage(data_dir).free - headroom
                    if more > 0:
                        os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, more)
                    break
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
        began = time.monotonic()
        say(f"data folder full (filler {filler.stat().st_size >> 20} MiB, {headroom >> 10} KiB left)")

        def failed():
            from sqlalchemy import select

            from webapp.db import Job, session_scope

            with session_scope(self.factory) as session:
                rows = session.execute(
                    select(Job.id, Job.error, Job.run_dir).where(Job.id.in_(self.job_ids), Job.status == FAILED)
                ).all()
            return rows

        with suppress(RuntimeError):
            wait_until(failed, window, "a job to fail on the full disk", interval=0.5)
        time.sleep(2)  # the other jobs that hit the full disk meanwhile
        filler.unlink()
        rows = failed()
        for failed_id, error, failed_dir in rows:
            if DISK_FULL_WORDS not in (error or ""):
                self.problem("disk-full", f"job {failed_id} failed without saying the disk is full: {error[:400]!r}")
            checkpoints = Path(failed_dir) / "checkpoints"
            halves = sorted(p.name for p in checkpoints.glob("*.tmp")) if checkpoints.is_dir() else []
            if halves:
                self.problem("disk-full", f"job {failed_id}: half checkpoints left: {halves}")
            intact = list_checkpoints(failed_dir)
            damage = checkpoint_problem(intact[-1]) if intact else None
            if damage is not None:
                self.problem("disk-full", f"job {failed_id}: last checkpoint damaged: {damage}")
            # a job that failed saving its first checkpoint has none to resume from: it starts again
            response = self.stack.call("POST", f"/jobs/{failed_id}/{'resume' if intact else 'retry'}")
            if response.status_code != 200:
                self.problem("disk-full", f"job {failed_id}: resume answered {response.status_code} {response.text}")
        first = (rows[0][1] or "").splitlines()[0][:160] if rows else ""
        self.note(
            "disk-full",
            f"data folder full for {time.monotonic() - began:.1f} s: jobs {[r[0] for r in rows]} failed and were "
            f"resumed (retried without a checkpoint); {first}",
        )


# ------------------------------------------------------------------------------------------------- checks
def verify(factory, job_ids: list[int], steps: int) -> dict:
    from sqlalchemy import func, select

    from webapp.db import SUCCEEDED, Event, Job, Metric, session_scope

    with session_scope(factory) as session:
        jobs = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(job_ids)))}
        status_events = session.execute(
            select(Event.job_id, Event.payload).where(Event.job_id.in_(job_ids), Event.kind == "status")
        ).all()
        logs = session.scalars(select(Event.payload).where(Event.job_id.in_(job_ids), Event.kind == "log")).all()
        counts = session.execute(
            select(Metric.job_id, Metric.step, Metric.name, func.count())
            .where(Metric.job_id.in_(job_ids))
            .group_by(Metric.job_id, Metric.step, Metric.name)
        ).all()
    succeeded_events = {job_id: 0 for job_id in job_ids}
    for job_id, payload in status_events:
        if payload.get("status") == SUCCEEDED:
            succeeded_events[job_id] += 1
    succeeded_once = sum(1 for j in job_ids if jobs[j].status == SUCCEEDED and succeeded_events[j] == 1)
    duplicates = sum(n - 1 for *_, n in counts if n > 1)
    have = {(job_id, step) for job_id, step, name, _ in counts if name == TRAIN_REWARD}
    missing = sum(1 for j in job_ids for step in range(1, steps + 1) if (j, step) not in have)
    messages = [p.get("message", "") for p in logs]
    return {
        "jobs": len(job_ids),
        "succeeded_once": succeeded_once,
        "duplicate_metric_rows": duplicates,
        "missing_steps": missing,
        "attempts": sum(jobs[j].attempts for j in job_ids),
        "handed_back": sum("went back to the queue" in m for m in messages),
        "requeued": sum("re-queued" in m for m in messages),
        "not_succeeded": {
            j: f"{jobs[j].status}: {(jobs[j].error or '')[:300]}" for j in job_ids if jobs[j].status != SUCCEEDED
        },  # fmt: skip
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=16, help="max_steps of each job")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--broker", choices=("rabbitmq", "redis"), default="rabbitmq")
    parser.add_argument("--reward-outage", type=float, default=30, help="seconds the reward server is away")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"which, in order (default {','.join(FAULTS)})")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for all jobs to end after the faults")
    parser.add_argument("--clock-window", type=float, default=10, help="seconds each clock jump lasts")
    parser.add_argument("--db-outage", type=float, default=5, help="seconds the database is away")
    parser.add_argument("--disk-mb", type=int, default=512, help="size of the data folder's filesystem (disk-full)")
    parser.add_argument("--disk-headroom-kb", type=int, default=128, help="what the filler leaves free")
    parser.add_argument("--disk-window", type=float, default=60, help="most seconds the data folder stays full")
    parser.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL server, a schema of its own (default: a cluster of its own with restart-postgres, else "
        f"{POSTGRES_URL})",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs, run folders)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; choose from {FAULTS}")

    from sqlalchemy import select

    from webapp.db import FINAL_STATUSES, Job, make_engine, make_session_factory, session_scope

    folder = Path(tempfile.mkdtemp(prefix="aligner-chaos-"))
    began = time.monotonic()
    with ExitStack() as cleanup:
        if not args.keep:
            cleanup.callback(shutil.rmtree, folder, True)
        disk = "disk-full" in faults and mount_small_disk(folder / "data", args.disk_mb)
        if disk:
            cleanup.callback(subprocess.run, ["umount", "-l", str(folder / "data")], check=False)
        postgres, server_url = None, args.database_url or POSTGRES_URL
        if "restart-postgres" in faults and args.database_url is None:
            (folder / "logs").mkdir(parents=True)
            postgres = Postgres(folder / "logs")
            cleanup.callback(postgres.remove)
            postgres.start()
            server_url = postgres.url
        database_url = cleanup.enter_context(postgres_schema(server_url))
        stack = Stack(args, folder, database_url)
        cleanup.callback(stack.stop)
        stack.launch()
        policy = build_policy(folder / "policy")  # while the stack's processes boot
        stack.wait_started()
        engine = make_engine(database_url)
        cleanup.callback(engine.dispose)
        factory = make_session_factory(engine)
        datasets = stack.register(policy)
        job_ids = [stack.submit(datasets, i) for i in range(args.jobs)]
        say(f"{len(job_ids)} jobs submitted ({args.steps} steps each) to {args.workers} workers")
        chaos = Chaos(stack, factory, job_ids, postgres, disk)
        chaos.run(faults, args.reward_outage)

        def all_final():
            with session_scope(factory) as session:
                statuses = session.scalars(select(Job.status).where(Job.id.in_(job_ids))).all()
            return all(s in FINAL_STATUSES for s in statuses)

        try:
            wait_until(all_final, args.timeout, "every job to end", interval=0.2)
        except RuntimeError as err:
            say(str(err))
        result = verify(factory, job_ids, args.steps)
        result.update(
            faults=chaos.faults, fault_problems=chaos.problems, clock_jump_requeued=chaos.clock_jump_requeued,
            wall_s=round(time.monotonic() - began, 1), broker=args.broker,
        )  # fmt: skip
        if args.keep:
            say(f"kept {folder}")

    print(f"\n{'fault':<16} {'at (s)':>7}  detail")
    for fault in result["faults"]:
        print(f"{fault['fault']:<16} {fault['at_s']:>7.1f}  {fault['detail']}")
    print(
        f"\njobs {result['jobs']}, succeeded exactly once {result['succeeded_once']}, duplicate metric rows "
        f"{result['duplicate_metric_rows']}, missing steps {result['missing_steps']}; attempts {result['attempts']}, "
        f"handed back {result['handed_back']}, re-queued {result['requeued']}; {result['wall_s']:.0f} s "
        f"({args.broker})"
    )
    for job_id, why in result["not_succeeded"].items():
        print(f"job {job_id} did not succeed: {why}")
    for problem in result["fault_problems"]:
        print(f"problem: {problem}")
    if args.json:
        print(json.dumps(result))
    ok = (
        result["succeeded_once"] == result["jobs"]
        and result["duplicate_metric_rows"] == 0
        and result["missing_steps"] == 0
        and not result["fault_problems"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
