"""Benchmark the training service's REST API under load: requests/s and p50/p99 latency of the job listing and of
metric reads, with 100,000 metric rows stored, on SQLite and PostgreSQL.

    .venv/bin/python bench/api_load.py                               # SQLite, a temp file (under a minute)
    .venv/bin/python bench/api_load.py --backends sqlite,postgres    # and PostgreSQL: a temp schema, dropped after
    .venv/bin/python bench/api_load.py --database-url postgresql://user@host:5432/db   # that PostgreSQL database
    .venv/bin/python bench/api_load.py --json                        # one JSON line per cell, then a summary line
    .venv/bin/python bench/api_load.py --seconds 5 --clients 1 8 32 --server gunicorn

Data, inserted in bulk with SQLAlchemy before the server starts (schema by `webapp.manage.upgrade`, i.e. the Alembic
migrations): one user with 20 jobs (resolved default configs, 500 steps each), 10 metric names x 500 steps per job
(100,000 `metrics` rows), 8 train samples every 25 steps and 4 validation samples every 50 (4,000 `samples`
rows), 3 status events per job. PostgreSQL is ANALYZEd afterwards, as its autovacuum would soon do; SQLite is not
(nothing runs ANALYZE there in production either). `--jobs`, `--steps` change the sizes.

PostgreSQL: `--backends postgres` uses the local server (env ALIGNER_TEST_POSTGRES_URL, else
postgresql://postgres@127.0.0.1:5432/test), `--database-url` another one. Either way the benchmark works in a new
schema `bench_api_<hex>` (search_path in the URL's options) that it drops at the end, also on errors and Ctrl-C;
existing tables are never touched.

Server: a real HTTP server in a subprocess (own session, SIGTERM then SIGKILL on exit), by default the development
server the README documents, `python -m flask --app webapp run --with-threads` (Werkzeug, one thread per
connection, one process, a log line per request); `--server gunicorn` runs docker-compose's production command
instead (`gunicorn -k gthread --threads 16 -w 2`; gunicorn must be installed). The environment gives it
ALIGNER_DATA_DIR (a temp dir) and ALIGNER_DATABASE_URL.

Load: each client is a thread with its own `requests.Session` (keep-alive) sending `Authorization: Bearer <token>`
(a token made with `webapp.db.create_token`) in a closed loop, the job id rotating over the 20 jobs. A cell
(endpoint x clients) warms up for `--warmup` seconds (default 1; the first response is checked: status, item and
point counts), then measures for `--seconds` (default 3); latency is per request as the client sees it. Endpoints:

    jobs            GET /api/v1/jobs?page=1&per_page=50                                      (20 jobs)
    metric          GET /api/v1/jobs/{id}/metrics?name=train_rollouts/rewards                (500 points)
    metric_since    GET /api/v1/jobs/{id}/metrics?name=train_rollouts/rewards&since_step=450 (50 points)
    metrics_all     GET /api/v1/jobs/{id}/metrics                                            (10 x 500 points)

Clients, server and database share the machine's cores (on 2 cores): at 8 clients the client threads' own CPU (one
Python process, one GIL) is part of what is measured, as it would be for a dashboard on the same host.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import requests
from workload import closed_loop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # webapp/ and aligner/ from this tree, also without `pip install -e .`

from aligner.metrics import (  # noqa: E402
    BASELINE,
    GRAD_NORM,
    INIT_POLICY_KL,
    LOSS,
    LR,
    TIMER_GENERATE,
    TRAIN_PROPERLY_ENDED,
    TRAIN_RESPONSE_LENGTH,
    TRAIN_REWARD,
    TRAIN_REWARD_WITH_KL,
)

DEFAULT_POSTGRES_URL = os.environ.get("ALIGNER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
START_TIMEOUT_S = 60
METRIC_NAMES = (  # a REINFORCE step's metrics, as the seeded jobs have them
    TRAIN_REWARD,
    TRAIN_REWARD_WITH_KL,
    INIT_POLICY_KL,
    BASELINE,
    TRAIN_RESPONSE_LENGTH,
    TRAIN_PROPERLY_ENDED,
    LOSS,
    GRAD_NORM,
    LR,
    TIMER_GENERATE,
)
ENDPOINTS = ("jobs", "metric", "metric_since", "metrics_all")
SINCE_STEP_BEFORE_END = 50  # metric_since asks for the last 50 steps, as a polling dashboard would
WORDS = ("the", "cat", "river", "song", "old", "happy", "bright", "runs", "sings", "near", "under", "quiet", "moon")


# ------------------------------------------------------------------------------------------------- databases
@contextmanager
def postgres_schema(server_url: str) -> Iterator[str]:
    """A URL of `server_url` whose connections use a new, empty schema; the schema is dropped afterwards."""
    from sqlalchemy import text

    from webapp.db import make_engine

    schema = f"bench_api_{uuid.uuid4().hex[:12]}"
    admin = make_engine(server_url)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        separator = "&" if "?" in server_url else "?"
        yield f"{server_url}{separator}options={quote(f'-csearch_path={schema}')}"
    finally:  # also after an interrupted CREATE: the schema may exist
        try:
            with admin.begin() as conn:
                conn.execute(text("SET lock_timeout = '20s'"))
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        except Exception as err:  # noqa: BLE001 - say what may be left behind rather than hide the first error
            print(f"could not drop schema {schema} (if it exists): {err}; drop it by hand", file=sys.stderr)
        finally:
            admin.dispose()


@contextmanager
def database(backend: str, tmp: Path, postgres_url: str) -> Iterator[str]:
    if backend == "postgres":
        with postgres_schema(postgres_url) as url:
            yield url
    else:
        yield f"sqlite:///{tmp / 'aligner.db'}"


def job_config(session, user, data_dir: Path, max_steps: int) -> dict:
    """A resolved config as the API stores it (catalogue names, every default filled in), naming a stand-in policy
    registered in the catalogue and two datasets of `user`."""
    from webapp.db import CatalogueModel, Dataset, run_dir_for
    from webapp.job_config import validate_job_config

    policy = data_dir / "models" / "tiny-sft"
    policy.mkdir(parents=True, exist_ok=True)
    session.add(CatalogueModel(name="tiny-sft", kind="policy", path=str(policy.resolve()), architecture="bench"))
    datasets = data_dir / "datasets" / f"user_{user.id}"
    datasets.mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "val.jsonl"):
        (datasets / name).write_text('{"prompt": "Describe the cat."}\n')
        session.add(Dataset(user_id=user.id, name=name, path=f"datasets/user_{user.id}/{name}", num_prompts=1))
    session.flush()
    raw = {
        "model": {"policy": "tiny-sft"},
        "data": {"train_dataset": "train.jsonl", "val_dataset": "val.jsonl"},
        "reward": {"function": "demo"},
        "trainer": {"max_steps": max_steps},
    }
    config = validate_job_config(raw, session, user, data_dir, run_dir_for(data_dir, 0))
    if isinstance(config, dict):
        raise RuntimeError(f"invalid benchmark config: {config}")
    return config.stored


def seed(url: str, data_dir: Path, jobs: int, steps: int) -> tuple[str, list[int], dict[str, int]]:
    """Schema (Alembic) and rows; returns a bearer token, the job ids and the row counts."""
    from sqlalchemy import insert, select, text, update

    from webapp.db import (
        RUNNING,
        SUCCEEDED,
        Event,
        Job,
        Metric,
        Sample,
        User,
        create_token,
        make_engine,
        make_session_factory,
        run_dir_for,
        session_scope,
    )
    from webapp.migrate import upgrade

    upgrade(url, configure_logger=False)
    rng = random.Random(0)
    engine = make_engine(url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            token = create_token(session, "bench", "api_load")
            user = session.scalar(select(User).where(User.name == "bench"))
            user_id = user.id
            config = job_config(session, user, data_dir, steps)
            start = dt.datetime(2026, 1, 1)
            job_rows = []
            for j in range(jobs):
                running = j >= jobs - 2  # the two newest are still running
                created = start + dt.timedelta(hours=j)
                job_rows.append(
                    {
                        "user_id": user_id,
                        "name": f"rloo-sweep-{j:03d}",
                        "algorithm": "reinforce",
                        "status": RUNNING if running else SUCCEEDED,
                        "config": config,
                        "run_dir": "",
                        "num_processes": 1,
                        "created_at": created,
                        "started_at": created + dt.timedelta(minutes=1),
                        "finished_at": None if running else created + dt.timedelta(minutes=50),
                        "error": None,
                        "worker": f"worker-{j % 2}@bench" if running else None,
                        "heartbeat_at": created + dt.timedelta(minutes=50) if running else None,
                        "cancel_requested": False,
                        "attempts": 1,
                        "step": steps,
                        "max_steps": steps,
                        "latest_reward": rng.random(),
                    }
                )
            session.execute(insert(Job), job_rows)
            job_ids = list(session.scalars(select(Job.id).where(Job.user_id == user_id).order_by(Job.id)))
            for job_id in job_ids:
                run_dir = str(run_dir_for(data_dir, job_id))
                session.execute(update(Job).where(Job.id == job_id).values(run_dir=run_dir))

            metrics, samples, events = [], [], []
            for job_id in job_ids:
                for status in ("queued", "running", "succeeded"):
                    events.append({"job_id": job_id, "kind": "status", "payload": {"status": status, "error": None}})
                for step in range(1, steps + 1):
                    for name in METRIC_NAMES:
                        metrics.append({"job_id": job_id, "step": step, "name": name, "value": rng.gauss(0.5, 0.2)})
                    for split, every, count in (("train", 25, 8), ("validation", 50, 4)):
                        if step % every:
                            continue
                        for index in range(count):
                            prompt = "Describe " + " ".join(rng.choices(WORDS, k=8)) + "."
                            samples.append(
                                {
                                    "job_id": job_id,
                                    "step": step,
                                    "split": split,
                                    "index": index,
                                    "prompt": prompt,
                                    "response": " ".join(rng.choices(WORDS, k=40)),
                                    "reward": rng.random(),
                                    "kl": rng.random() / 10,
                                    "advantage": rng.gauss(0, 1) if split == "train" else None,
                                    "is_end": rng.random() < 0.9,
                                }
                            )
            for model, rows in ((Metric, metrics), (Sample, samples), (Event, events)):
                for i in range(0, len(rows), 10_000):
                    session.execute(insert(model), rows[i : i + 10_000])
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                conn.execute(text("ANALYZE"))  # this schema's tables (search_path)
                conn.commit()
    finally:
        engine.dispose()
    return token, job_ids, {"jobs": len(job_ids), "metrics": len(metrics), "samples": len(samples)}


# ------------------------------------------------------------------------------------------------- server
@contextmanager
def deferred_signals() -> Iterator[None]:
    """SIGINT and SIGTERM received inside the block take effect at its end (as KeyboardInterrupt / SystemExit)."""
    received: list[int] = []
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda number, _frame: received.append(number)) for s in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if received:
            signal.raise_signal(received[0])  # now handled by the restored handler


class ApiServer:
    """The API as a subprocess in its own session; `stop()` sends SIGTERM (SIGKILL to its group after 15 s)."""

    def __init__(self, kind: str, database_url: str, data_dir: Path):
        self.kind = kind
        from aligner.processes import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if kind == "gunicorn":
            cmd = [sys.executable, "-m", "gunicorn", "-k", "gthread", "--threads", "16", "-w", "2"]
            cmd += ["-b", f"127.0.0.1:{self.port}", "webapp:create_app()"]
        else:
            cmd = [sys.executable, "-m", "flask", "--app", "webapp", "run", "--with-threads"]
            cmd += ["--no-reload", "--no-debugger", "--host", "127.0.0.1", "--port", str(self.port)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLASK_")}
        env.update(ALIGNER_DATA_DIR=str(data_dir), ALIGNER_DATABASE_URL=database_url, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench-api-server-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen | None = None
        try:
            with deferred_signals():  # a Ctrl-C inside Popen would leave a server nobody stops
                # Own session: a Ctrl-C in the terminal reaches only this script, which then stops the server.
                self.proc = subprocess.Popen(
                    cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
                )
            self._wait_ready()
        except BaseException as err:
            self.stop(failed=not isinstance(err, KeyboardInterrupt | SystemExit))
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"API server exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                if requests.get(f"{self.url}/api/v1/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"API server not ready after {START_TIMEOUT_S} s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, failed: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        if failed or " 500 " in self.output() or "Traceback" in self.output():
            print(f"API server log kept: {self.log.name}", file=sys.stderr)
        else:
            Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.stop(failed=exc_type is not None and not issubclass(exc_type, KeyboardInterrupt | SystemExit))


# ------------------------------------------------------------------------------------------------- load
@dataclass
class Endpoint:
    name: str
    paths: list[str]  # one per job; clients rotate over them
    expected: int  # jobs listed, or [step, value] points returned


def endpoints(job_ids: list[int], steps: int) -> list[Endpoint]:
    rewards = f"name={TRAIN_REWARD}"
    since = max(0, steps - SINCE_STEP_BEFORE_END)
    base = "/api/v1/jobs"
    return [
        Endpoint("jobs", [f"{base}?page=1&per_page=50"], min(len(job_ids), 50)),
        Endpoint("metric", [f"{base}/{j}/metrics?{rewards}" for j in job_ids], steps),
        Endpoint("metric_since", [f"{base}/{j}/metrics?{rewards}&since_step={since}" for j in job_ids], steps - since),
        Endpoint("metrics_all", [f"{base}/{j}/metrics" for j in job_ids], steps * len(METRIC_NAMES)),
    ]


def check(endpoint: Endpoint, body: dict) -> None:
    got = len(body["items"]) if endpoint.name == "jobs" else sum(len(v) for v in body["metrics"].values())
    if got != endpoint.expected:
        raise RuntimeError(f"{endpoint.name}: {got} items in the response, expected {endpoint.expected}")


def run_cell(server: ApiServer, token: str, endpoint: Endpoint, clients: int, warmup_s: float, seconds: float):
    """`clients` threads in a closed loop: warm up, meet at a barrier, then measure for `seconds`."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    urls = [server.url + p for p in endpoint.paths]

    def get(session: requests.Session, i: int) -> requests.Response:
        response = session.get(urls[i % len(urls)], headers=headers, timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"GET {urls[i % len(urls)]}: HTTP {response.status_code}: {response.text[:300]}")
        return response

    try:
        latencies, elapsed, size = closed_loop(
            clients,
            warmup_s,
            seconds,
            lambda session, i: len(get(session, i).content),
            first=lambda session, i: check(endpoint, get(session, i).json()),  # and opens the connection
        )
    except RuntimeError as err:
        raise RuntimeError(f"{endpoint.name}, {clients} clients: {err}") from err
    lat = np.array(latencies) * 1000
    return {
        "requests": int(lat.size),
        "seconds": round(elapsed, 3),
        "requests_per_s": round(lat.size / elapsed, 2),
        "p50_ms": round(float(np.percentile(lat, 50)), 3),
        "p99_ms": round(float(np.percentile(lat, 99)), 3),
        "mean_ms": round(float(lat.mean()), 3),
        "bytes_per_response": round(size / lat.size),
    }


# ------------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", help="sqlite and/or postgres, comma-separated (default: sqlite)")
    parser.add_argument("--database-url", help=f"PostgreSQL for the postgres backend (default {DEFAULT_POSTGRES_URL})")
    parser.add_argument("--server", choices=["flask", "gunicorn"], default="flask", help="HTTP server (default flask)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8], help="concurrent client threads (1 8)")
    parser.add_argument("--endpoints", nargs="+", choices=ENDPOINTS, default=list(ENDPOINTS), help="default: all")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per cell (default 3)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell (default 1)")
    parser.add_argument("--jobs", type=int, default=20, help="jobs stored (default 20)")
    parser.add_argument("--steps", type=int, default=500, help="steps per job, each with 10 metrics (default 500)")
    parser.add_argument("--json", action="store_true", help="one JSON line per cell, then one summary line")
    args = parser.parse_args()
    backends = (args.backends or ("postgres" if args.database_url else "sqlite")).split(",")
    if not set(backends) <= {"sqlite", "postgres"} or not backends:
        parser.error(f"--backends: sqlite and/or postgres, not {args.backends!r}")
    if args.database_url and not args.database_url.startswith(("postgresql://", "postgresql+psycopg://")):
        parser.error(f"--database-url: a PostgreSQL URL (SQLite always uses a temp file), not {args.database_url!r}")
    if args.server == "gunicorn" and importlib.util.find_spec("gunicorn") is None:
        parser.error("--server gunicorn: gunicorn is not installed in this environment (pip install gunicorn)")
    if args.jobs < 1 or args.steps < 1:
        parser.error("--jobs and --steps must be at least 1")
    postgres_url = args.database_url or DEFAULT_POSTGRES_URL
    # SIGTERM to this script unwinds like Ctrl-C: the `finally` and `with` blocks stop the server, drop the schema.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    say = (lambda *a, **k: None) if args.json else (lambda *a, **k: print(*a, **k, flush=True))

    results: list[dict] = []
    load = {"start": round(os.getloadavg()[0], 2)}
    rows: dict[str, int] = {}
    for backend in backends:
        with (
            tempfile.TemporaryDirectory(prefix="bench-api-") as tmp,
            database(backend, Path(tmp), postgres_url) as url,
        ):
            data_dir = Path(tmp) / "data"
            data_dir.mkdir()
            t0 = time.perf_counter()
            token, job_ids, rows = seed(url, data_dir, args.jobs, args.steps)
            seed_s = time.perf_counter() - t0
            say(f"{backend}: {rows['metrics']:,} metric, {rows['samples']:,} sample rows in {seed_s:.1f} s", end="")
            with ApiServer(args.server, url, data_dir) as server:
                say(f"; {args.server} server on :{server.port}")
                for endpoint in [e for e in endpoints(job_ids, args.steps) if e.name in args.endpoints]:
                    for clients in args.clients:
                        cell = run_cell(server, token, endpoint, clients, args.warmup, args.seconds)
                        row = {"backend": backend, "server": args.server, "endpoint": endpoint.name}
                        row |= {"path": endpoint.paths[0], "clients": clients, **cell}
                        row["load_1min"] = round(os.getloadavg()[0], 2)
                        results.append(row)
                        if args.json:
                            print(json.dumps(row), flush=True)
                        else:
                            say(f"  {endpoint.name} x {clients}: {cell['requests_per_s']:.0f} req/s")
    load["end"] = round(os.getloadavg()[0], 2)

    summary = {"server": args.server, "backends": backends, "rows_per_backend": rows, "load_average_1min": load}
    summary |= {"seconds_per_cell": args.seconds, "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps({"summary": summary}))
        return
    print(f"\n{'backend':<8} {'endpoint':<12} {'clients':>7} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'KB/resp':>7}")
    for r in results:
        print(
            f"{r['backend']:<8} {r['endpoint']:<12} {r['clients']:7d} {r['requests_per_s']:8.1f} "
            f"{r['p50_ms']:7.1f} {r['p99_ms']:7.1f} {r['bytes_per_response'] / 1024:7.1f}"
        )
    print(
        f"server: {args.server}; {rows.get('metrics', 0):,} metric rows per backend; {os.cpu_count()} CPUs; "
        f"load average (1 min) before / after: {load['start']:.2f} / {load['end']:.2f}"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted; the API server is stopped and the temporary schema dropped", file=sys.stderr)
        sys.exit(130)
