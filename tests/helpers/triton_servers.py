"""An `aligner serve-reward` / `serve-critic` subprocess on free loopback ports, for the server tests; and a
PyTriton server declaring exactly NeMo-Aligner's reward and critic interfaces, for Aligner's clients to be tested
against (`nemo_interface_server`; run here as `python -m tests.helpers.triton_servers nemo --port P`):

- `reward_model`: optional `sentences` (BYTES), `tokens`, `sequence_lengths` (INT64), output `rewards`, batched
  up to NeMo's MAX_BATCH. A sentence scores its length in characters; a token row 1000 * its length + the sum of its
  tokens (padding past the length ignored).
- `critic_infer`: the same inputs, outputs `values` (0.5 * token, 0 past the length) and `rewards` (the length).
- `critic_train`, not batched: `tokens` [B, S], `returns`, `prev_values`, `mask` [B, S - 1] (refused otherwise), output
  `loss_mean` = sum(mask * (returns - prev_values)^2) / sum(mask).
- `critic_save`, not batched: `dummy_var` [1], output `status` 0; it writes `saved` into `--save-dir`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from aligner.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90


class ServerProcess:
    """`python -m <module> <command> --port P <args>` (`aligner ...` by default) in a session of its own; ready when
    every model in `models` is, or with no `models` when Triton's /v2/health/ready says so (what a client that knows
    no model names waits for)."""

    def __init__(self, command: str, args: list[str], models: tuple[str, ...], module: str = "aligner.cli"):
        self.port = free_port(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 - lives with the server
        cmd = [sys.executable, "-m", module, command, "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            if all(self._ready(m) for m in models) if models else self._ready(None):
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not ready after {START_TIMEOUT_S} s:\n{self.output()}")

    def _ready(self, model: str | None) -> bool:
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        try:
            return requests.get(self.url + path, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def stop(self, sig=signal.SIGTERM, timeout=60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """Stop at once (a graceful stop takes Triton seconds): SIGKILL, whose children die with it (PDEATHSIG); then
        remove what it leaves, its workspace and its shared-memory blocks (named after its pid)."""
        from aligner.servers.triton import remove_stale_workspaces

        self.stop(signal.SIGKILL)
        remove_stale_workspaces(Path(tempfile.gettempdir()))
        for block in Path("/dev/shm").glob(f"pytrtion{self.proc.pid}-*"):
            block.unlink(missing_ok=True)


NEMO_MAX_BATCH = 9999999  # NeMo-Aligner's reward and critic servers declare this: they split batches themselves
NEMO_MODELS = ("reward_model", "critic_infer", "critic_train", "critic_save")


def nemo_interface_server(save_dir: Path) -> ServerProcess:
    return ServerProcess("nemo", ["--save-dir", str(save_dir)], NEMO_MODELS, module="tests.helpers.triton_servers")


def _serve_nemo_interface(port: int, save_dir: Path) -> None:
    import numpy as np
    from pytriton.decorators import batch, sample
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    from aligner.servers.triton import TritonEndpointConfig, run_triton

    def rows(inputs):
        if "sentences" in inputs:
            return [bytes(s[0]).decode() for s in inputs["sentences"]], None
        return inputs["tokens"], inputs["sequence_lengths"].reshape(-1)

    @batch
    def reward(**inputs):
        texts, lengths = rows(inputs)
        if lengths is None:
            scores = [float(len(t)) for t in texts]
        else:
            scores = [1000.0 * n + float(t[:n].sum()) for t, n in zip(texts, lengths)]
        return {"rewards": np.asarray(scores, dtype=np.float32)[:, None]}

    @batch
    def critic_infer(**inputs):
        tokens, lengths = rows(inputs)
        keep = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
        values = np.where(keep, 0.5 * tokens, 0.0).astype(np.float32)
        return {"values": values, "rewards": lengths.astype(np.float32)[:, None]}

    @sample
    def critic_train(tokens, returns, prev_values, mask):
        b, s = tokens.shape
        if not returns.shape == prev_values.shape == mask.shape == (b, s - 1):
            raise ValueError(
                f"NeMo-Aligner's critic_train takes [B, S - 1] targets; got {mask.shape} for {tokens.shape}"
            )
        loss = (mask * (returns - prev_values) ** 2).sum() / mask.sum()
        return {"loss_mean": np.asarray([loss], dtype=np.float32)}

    @sample
    def critic_save(dummy_var):
        (save_dir / "saved").write_text("saved")
        return {"status": np.asarray([0], dtype=np.int64)}

    def optional(name, dtype, shape=(-1,)):
        return Tensor(name=name, dtype=dtype, shape=shape, optional=True)

    query = [optional("sentences", bytes), optional("tokens", np.int64), optional("sequence_lengths", np.int64)]
    batched = ModelConfig(max_batch_size=NEMO_MAX_BATCH, batcher=DynamicBatcher(max_queue_delay_microseconds=0))
    single = ModelConfig(batching=False, max_batch_size=0)
    train_inputs = [Tensor(name="tokens", dtype=np.int64, shape=(-1, -1))]
    train_inputs += [Tensor(name=n, dtype=np.float32, shape=(-1, -1)) for n in ("returns", "prev_values", "mask")]

    def bind(triton) -> None:
        rewards = Tensor(name="rewards", dtype=np.float32, shape=(1,))
        triton.bind("reward_model", reward, query, [rewards], config=batched)
        values = Tensor(name="values", dtype=np.float32, shape=(-1,))
        triton.bind(
            "critic_infer",
            critic_infer,
            query,
            [values, Tensor(name="rewards", dtype=np.float32, shape=(-1,))],
            config=batched,
        )
        loss = Tensor(name="loss_mean", dtype=np.float32, shape=(1,))
        triton.bind("critic_train", critic_train, train_inputs, [loss], config=single)
        save_in, save_out = (
            Tensor(name="dummy_var", dtype=np.int64, shape=(1,)),
            Tensor(name="status", dtype=np.int64, shape=(1,)),
        )
        triton.bind("critic_save", critic_save, [save_in], [save_out], config=single)

    run_triton(TritonEndpointConfig(http_port=port), bind, "NeMo-interface test server", "NeMo-Aligner's models")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["nemo"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--save-dir", type=Path, required=True)
    args = parser.parse_args()
    _serve_nemo_interface(args.port, args.save_dir)
