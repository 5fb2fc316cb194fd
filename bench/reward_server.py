"""Benchmark `aligner serve-reward`: throughput and latency of a reward model behind PyTriton, with and without
Triton's dynamic batching.

    .venv/bin/python bench/reward_server.py                  # table (about 2 minutes on 2 cores)
    .venv/bin/python bench/reward_server.py --seconds 2      # shorter cells (default 5 s each)
    .venv/bin/python bench/reward_server.py --json           # one JSON line per cell, then one summary line
    .venv/bin/python bench/reward_server.py --inputs sentences --batch-sizes 1 8 --clients 1 4 16

Workload: a reward model built here, offline, in a temp dir: `LlamaForSequenceClassification` (num_labels=1,
hidden 128, 4 layers, 4 heads, vocab 512, about 2M parameters, fp32, random init) with a byte-level BPE tokenizer
trained on a synthetic corpus (as bench/rloo_step.py builds its policy); texts of 30-60 tokens (prompt + response).
It is served by real `aligner serve-reward` subprocesses on free loopback ports, one at a time: first with
dynamic batching (the server's defaults: preferred batch 64, max_queue_delay_us 2000, batch_size 32 rows per
forward pass), then with `--set dynamic_batching=false` (Triton runs every request on its own). Clients are
threads, each with its own `requests.Session`, posting KServe-v2 JSON (`prompts` + `responses`, or `sentences`)
to /v2/models/reward_model/infer in a closed loop. A cell (request batch size x concurrent clients) warms up for
`--warmup` seconds, then runs for `--seconds`; latency is per request, as the client sees it; `rows/exec` is the
mean number of rows per model execution from Triton's metrics (nv_inference_count / nv_inference_exec_count).
Clients and server share the machine's cores, as a trainer and its reward server on one host would; the server's
torch uses one thread (`--threads`): on 2 cores, two OpenMP threads competing with the clients and Triton made
forward passes several times slower and the results swing from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests
from workload import closed_loop

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "reward_model"
START_TIMEOUT_S = 120
WORDS = [
    *("the", "a", "cat", "dog", "bird", "river", "sea", "song", "old", "happy", "sad", "kind", "slow", "bright"),
    *("runs", "sings", "to", "of", "and", "is", "small", "green", "house", "light", "warm", "cold", "tree", "road"),
    *("moon", "sun", "walks", "sleeps", "near", "under", "quiet", "loud"),
]


# ------------------------------------------------------------------------------------------------- workload
def build_reward_model(folder: Path) -> Path:
    """Byte-level BPE tokenizer (vocab 512) and a random Llama sequence classifier with one label."""
    import torch
    from transformers import LlamaForSequenceClassification
    from workload import bpe_tokenizer, llama_config

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(2000)]
    tokenizer = bpe_tokenizer(corpus)
    torch.manual_seed(0)
    config = llama_config(tokenizer, num_labels=1)
    out = folder / "reward_model"
    LlamaForSequenceClassification(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def make_texts(n: int, seed: int = 1) -> list[tuple[str, str]]:
    """(prompt, response) pairs: 6-12 prompt words and 17-35 response words, 30-60 tokens together."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        prompt = "Describe " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 11))) + "."
        response = " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(17, 35))) + "."
        pairs.append((prompt, response))
    return pairs


def make_payloads(pairs: list[tuple[str, str]], batch: int, inputs: str, count: int = 16) -> list[bytes]:
    """`count` different pre-encoded request bodies of `batch` rows each (rotating through `pairs`), as the reward
    client builds them."""
    from aligner.rewards.kserve import bytes_column

    bodies = []
    for k in range(count):
        rows = [pairs[(k * batch + i) % len(pairs)] for i in range(batch)]
        if inputs == "sentences":
            body = {"inputs": [bytes_column("sentences", [p + r for p, r in rows])]}
        else:
            prompts, responses = [p for p, _ in rows], [r for _, r in rows]
            body = {"inputs": [bytes_column("prompts", prompts), bytes_column("responses", responses)]}
        bodies.append(json.dumps(body).encode())
    return bodies


# ------------------------------------------------------------------------------------------------- servers
class RewardServer:
    """`aligner serve-reward` as a subprocess in its own session; `stop()` sends SIGTERM (SIGKILL after 60 s)."""

    def __init__(self, model_dir: Path, dynamic_batching: bool, extra: list[str]):
        from aligner.processes import free_port

        self.port = free_port(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench-reward-server-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [sys.executable, "-m", "aligner.cli", "serve-reward", "--model", str(model_dir)]
        cmd += ["--port", str(self.port), "--set", f"dynamic_batching={str(dynamic_batching).lower()}"]
        for item in extra:
            cmd += ["--set", item]
        started = time.perf_counter()
        # Own session: a Ctrl-C in the terminal reaches only this script, which then stops the server itself.
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - started

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"reward server exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                if requests.get(f"{self.url}/v2/models/{MODEL_NAME}/ready", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"reward server not ready after {START_TIMEOUT_S} s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def model_config(self) -> dict:
        return requests.get(f"{self.url}/v2/models/{MODEL_NAME}/config", timeout=10).json()

    def counters(self) -> tuple[float, float]:
        """(rows inferred, model executions) so far, from Triton's Prometheus metrics."""
        text = requests.get(f"http://127.0.0.1:{self.port + 2}/metrics", timeout=10).text

        def total(metric: str) -> float:
            pattern = rf'^{metric}{{[^}}]*model="{MODEL_NAME}"[^}}]*}} (\S+)$'
            return sum(float(v) for v in re.findall(pattern, text, flags=re.M))

        return total("nv_inference_count"), total("nv_inference_exec_count")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        if self.proc.returncode == 0:
            Path(self.log.name).unlink(missing_ok=True)
        else:
            print(f"reward server exited with {self.proc.returncode}; its log: {self.log.name}", file=sys.stderr)
        return self.proc.returncode

    def __enter__(self) -> RewardServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------- load
def run_cell(server: RewardServer, bodies: list[bytes], batch: int, clients: int, warmup_s: float, seconds: float):
    """`clients` threads in a closed loop: warm up, meet at a barrier, then measure for `seconds`."""
    url = f"{server.url}/v2/models/{MODEL_NAME}/infer"
    headers = {"Content-Type": "application/json"}
    before: list[tuple[float, float]] = []

    def post(session: requests.Session, i: int) -> None:
        response = session.post(url, data=bodies[i % len(bodies)], headers=headers, timeout=120)
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        data = response.json()["outputs"][0]["data"]
        if len(data) != batch:
            raise RuntimeError(f"{len(data)} rewards for {batch} rows")

    try:
        latencies, elapsed, _ = closed_loop(
            clients, warmup_s, seconds, post, on_start=lambda: before.append(server.counters())
        )
    except RuntimeError as err:
        raise RuntimeError(f"{clients} clients, batch {batch}: {err}") from err
    after = server.counters()
    lat = np.array(latencies) * 1000
    rows, execs = after[0] - before[0][0], after[1] - before[0][1]
    return {
        "requests": int(lat.size),
        "seconds": elapsed,
        "requests_per_s": lat.size / elapsed,
        "samples_per_s": lat.size * batch / elapsed,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "rows_per_exec": rows / execs if execs else float("nan"),
    }


# ------------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per cell (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell (default 1)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64], help="rows per request")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16], help="concurrent client threads")
    parser.add_argument("--inputs", choices=["pairs", "sentences"], default="pairs", help="prompts+responses or one")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server (default 1)")
    parser.add_argument(
        "--server-set", action="append", default=[], metavar="KEY=VALUE", help="extra `--set` for both servers"
    )
    parser.add_argument("--json", action="store_true", help="one JSON line per cell, then one summary line")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # SIGTERM to this script unwinds like Ctrl-C: the `finally` and `with` blocks stop the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    say = (lambda *a, **k: None) if args.json else (lambda *a, **k: print(*a, **k, flush=True))

    results: list[dict] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-reward-") as tmp:
        model_dir = build_reward_model(Path(tmp))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        pairs = make_texts(512)
        lengths = [len(tokenizer(p + r)["input_ids"]) for p, r in pairs]
        say(
            f"reward model: Llama sequence classifier, hidden 128, 4 layers, vocab 512; texts {min(lengths)}-"
            f"{max(lengths)} tokens (mean {np.mean(lengths):.0f}); inputs: {args.inputs}; {args.seconds:g} s per "
            f"cell after {args.warmup:g} s warm-up; {os.cpu_count()} CPUs, load average {load_before[0]:.2f}"
        )
        bodies = {b: make_payloads(pairs, b, args.inputs) for b in args.batch_sizes}
        extra = [f"num_threads={args.threads}", *args.server_set]
        for dynamic in (True, False):
            with RewardServer(model_dir, dynamic, extra) as server:
                has_batcher = "dynamic_batching" in server.model_config()
                if has_batcher != dynamic:
                    raise RuntimeError(f"dynamic_batching={dynamic} asked, but Triton's model config says otherwise")
                say(f"server with dynamic batching {'on ' if dynamic else 'off'} ready in {server.start_s:.1f} s")
                for batch in args.batch_sizes:
                    for clients in args.clients:
                        cell = run_cell(server, bodies[batch], batch, clients, args.warmup, args.seconds)
                        row = {"dynamic_batching": dynamic, "batch": batch, "clients": clients, **cell}
                        results.append(row)
                        if args.json:
                            print(json.dumps(row), flush=True)

    summary = {"inputs": args.inputs, "seconds_per_cell": args.seconds, "load_average": [load_before[0]]}
    summary["load_average"].append(os.getloadavg()[0])
    cell = {(r["dynamic_batching"], r["batch"], r["clients"]): r for r in results}
    key_on, key_off = (True, 1, max(args.clients)), (False, 1, max(args.clients))
    if key_on in cell and key_off in cell:
        on, off = cell[key_on], cell[key_off]
        summary.update(
            gain_batch1_clients=max(args.clients),
            gain_requests_per_s=on["requests_per_s"] / off["requests_per_s"],
            gain_p50=off["p50_ms"] / on["p50_ms"],
        )
    if args.json:
        print(json.dumps({"summary": summary}))
        return

    header = f"{'batching':>8} {'batch':>5} {'clients':>7} {'req/s':>8} {'samples/s':>9} {'p50 ms':>7} {'p99 ms':>7}"
    print(f"\n{header} {'rows/exec':>9}")
    for r in results:
        print(
            f"{'on' if r['dynamic_batching'] else 'off':>8} {r['batch']:5d} {r['clients']:7d} "
            f"{r['requests_per_s']:8.1f} {r['samples_per_s']:9.1f} {r['p50_ms']:7.1f} {r['p99_ms']:7.1f} "
            f"{r['rows_per_exec']:9.1f}"
        )
    if "gain_requests_per_s" in summary:
        on, off = cell[key_on], cell[key_off]
        print(
            f"\ndynamic batching at batch 1 x {max(args.clients)} clients: {on['requests_per_s']:.1f} vs "
            f"{off['requests_per_s']:.1f} requests/s ({summary['gain_requests_per_s']:.2f}x), p50 "
            f"{on['p50_ms']:.1f} vs {off['p50_ms']:.1f} ms, p99 {on['p99_ms']:.1f} vs {off['p99_ms']:.1f} ms "
            f"(rows per model execution {on['rows_per_exec']:.1f} vs {off['rows_per_exec']:.1f})"
        )
    print(f"load average (1 min) before / after: {load_before[0]:.2f} / {summary['load_average'][1]:.2f}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted; the reward servers are stopped", file=sys.stderr)
        sys.exit(130)
