"""aligner serve-critic and RemoteCriticClient: the critic in-process, then real PyTriton servers on free ports.

Run: .venv/bin/python -m pytest tests/aligner/servers/test_critic_server.py -q
"""

from __future__ import annotations

import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

pytest.importorskip("pytriton")

from aligner.cli import main  # noqa: E402
from aligner.errors import AlignerError, CriticError
from aligner.processes import free_port  # noqa: E402
from aligner.rewards.critic_client import RemoteCriticClient  # noqa: E402
from aligner.rewards.http import RetrySettings  # noqa: E402
from aligner.servers.critic_server import (
    CHECKPOINT_FILE,
    BadRequest,
    Critic,
    CriticServerConfig,
    TokenValueModel,
    confined_path,
    lengths_from_mask,
)
from aligner.servers.reward_server import RewardScorer, RewardServerConfig  # noqa: E402
from aligner.servers.triton import DECLARED_MAX_BATCH_SIZE
from tests.helpers.triton_servers import ServerProcess  # noqa: E402

MODELS = ("critic_infer", "critic_train", "critic_save")
SERVER_SETTINGS = ("reward_mean=0.5", "reward_std=2.0", "lr=1e-3", "num_threads=1", "max_batch_size=2", "batch_size=2")


def Server(model_dir: Path, *args: str, settings=SERVER_SETTINGS) -> ServerProcess:  # noqa: N802
    sets = [x for s in settings for x in ("--set", s)]
    return ServerProcess("serve-critic", ["--model", str(model_dir), *sets, *args], MODELS)


def batch(rows: int = 5, width: int = 9, seed: int = 0):
    """Zero-padded token ids [rows, width] of lengths 2 .. width, and the lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.array([2 + (i * 3) % (width - 1) for i in range(rows)], dtype=np.int64)
    tokens = rng.integers(6, 250, size=(rows, width), dtype=np.int64)
    tokens[np.arange(width)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths


def targets(values: np.ndarray, lengths: np.ndarray, shift: float = 0.5):
    """Returns `shift` above the given values on every valid position, those values as prev_values, the mask."""
    mask = (np.arange(values.shape[1])[None, :] < lengths[:, None]).astype(np.float32)
    return values + shift * mask, values.copy(), mask


def critic_config(model_dir: Path, **fields) -> CriticServerConfig:
    return CriticServerConfig(model_path=str(model_dir), device="cpu", **fields)


# ------------------------------------------------------------------------------------------- in-process critic


@pytest.fixture(scope="module")
def critic(reward_model_dir) -> Critic:
    return Critic(critic_config(reward_model_dir, reward_mean=0.5, reward_std=2.0, lr=1e-2, micro_batch_size=2))


def test_initial_values_at_the_last_token_are_the_standardised_rewards(critic, reward_model_dir):
    tokens, lengths = batch()
    values, rewards = critic.values(tokens, lengths), critic.rewards(tokens, lengths)
    assert values.shape == tokens.shape and values.dtype == np.float32 and rewards.shape == (5,)
    # the value head is the score head: at the last token the value is the reward, standardised the same way
    np.testing.assert_allclose(values[np.arange(5), lengths - 1], rewards, atol=1e-5)
    plain = RewardScorer(RewardServerConfig(model_path=str(reward_model_dir))).score_tokens(tokens, lengths)
    np.testing.assert_allclose(rewards, (plain - 0.5) / 2.0, atol=1e-5)
    assert (values[tokens == 0] == 0).all()  # 0 past each length (the real tokens are >= 6)


def test_a_train_step_lowers_the_value_loss_down_to_the_clip(reward_model_dir):
    critic = Critic(critic_config(reward_model_dir, lr=3e-3, micro_batch_size=2))  # 5 rows: micro-batches 2, 2, 1
    tokens, lengths = batch()
    returns, prev, mask = targets(critic.values(tokens, lengths), lengths)
    losses = [critic.train_step(tokens, lengths, returns, prev, mask) for _ in range(4)]
    # values start at prev_values, 0.5 below the returns: 0.5 * 0.5^2 = 0.125 on every token. A value is credited
    # for moving at most loss_clip_val = 0.2 from prev_values, so the loss cannot fall below 0.5 * 0.3^2 = 0.045
    assert losses[0] == pytest.approx(0.125, abs=1e-6)
    assert losses[1] < losses[0] and losses[-1] < 0.05 and min(losses) > 0.045 - 1e-4
    assert critic.steps == 4
    # NeMo-Aligner's layout [B, S - 1] trains the same positions but the last
    assert 0.04 < critic.train_step(tokens, lengths, returns[:, :-1], prev[:, :-1], mask[:, :-1]) < 0.05

    unclipped = Critic(critic_config(reward_model_dir, lr=1e-3, micro_batch_size=2, loss_clip_val=0.0))
    losses = [unclipped.train_step(tokens, lengths, returns, prev, mask) for _ in range(5)]
    assert losses[0] == pytest.approx(0.125, abs=1e-6) and losses[-1] < 0.02


def test_bad_requests_say_what_is_wrong(critic):
    tokens, lengths = batch()
    returns, prev, mask = targets(np.zeros(tokens.shape, np.float32), lengths)
    cases = [
        (lambda: critic.values(tokens[0], lengths), r"tokens must be \[B, S\] with B >= 1"),
        (lambda: critic.values(tokens[:0], lengths[:0]), r"tokens must be \[B, S\] with B >= 1"),
        (lambda: critic.values(tokens, lengths[:3]), "got 5 rows of tokens but 3 sequence_lengths"),
        (lambda: critic.values(tokens, lengths + 9), r"sequence_lengths must lie in \[1, 9\]"),
        (lambda: critic.values(tokens, lengths * 0), r"sequence_lengths must lie in \[1, 9\]"),
        (lambda: critic.values(tokens + 10_000, lengths), "token ids must lie in"),
        (
            lambda: critic.train_step(tokens, lengths, returns[:, :4], prev, mask),
            r"returns must be \[B, S\] = \[5, 9\]",
        ),
        (lambda: critic.train_step(tokens, lengths, returns, prev, -mask), "mask must hold finite weights"),
        (
            lambda: critic.train_step(tokens, lengths, returns * np.nan, prev, mask),
            "returns and prev_values must be finite where",
        ),
        (lambda: critic.save("relative/critic.pt"), "path must be absolute"),
        (lambda: critic.save_fn([{"path": np.array([[b"/a"], [b"/b"]], dtype=object)}]), "send one path; got 2"),
        (lambda: critic.train_fn([{"tokens": tokens, "returns": returns}]), r"missing input\(s\) \['prev_values'"),
    ]
    for call, reason in cases:
        with pytest.raises(BadRequest, match="^bad request: " + reason):
            call()
    # padding past the lengths is ignored, NaN included; an empty mask makes no step
    steps = critic.steps
    assert critic.train_step(tokens, lengths, returns, prev, mask * 0) == 0.0 and critic.steps == steps


def test_lengths_from_the_mask_cover_every_masked_token():
    mask = np.array([[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 1]], dtype=np.float32)
    # [B, S - 1] (NeMo-Aligner's): position t is token t + 1's log-prob; [B, S]: position t is token t
    assert lengths_from_mask(mask, (3, 5)).tolist() == [4, 5, 5]
    assert lengths_from_mask(mask, (3, 4)).tolist() == [3, 4, 4]
    with pytest.raises(BadRequest, match=r"mask must be \[B, S\] = \[3, 7\]"):
        lengths_from_mask(mask, (3, 7))


def test_nemo_aligners_train_and_save_requests(reward_model_dir, tmp_path):
    """critic_train without sequence_lengths, [B, S - 1] targets (NeMo-Aligner's infer_sample) steps exactly as with
    them; critic_save with only `dummy_var` writes into save_dir and answers status 0."""
    first, second = (Critic(critic_config(reward_model_dir, lr=1e-2, save_dir=str(tmp_path))) for _ in range(2))
    tokens, lengths = batch()
    returns, prev, mask = (x[:, :-1] for x in targets(first.values(tokens, lengths), lengths))
    nemo = {"tokens": tokens, "returns": returns, "prev_values": prev, "mask": mask}
    out = first.train_fn([nemo])[0]
    loss = second.train_step(tokens, lengths, returns, prev, mask)
    assert out["loss_mean"].tolist() == [loss] and out["loss"].shape == (5, 1) and loss > 0
    np.testing.assert_array_equal(first.values(tokens, lengths), second.values(tokens, lengths))
    saved = first.save_fn([{"dummy_var": np.array([[0]])}])[0]
    assert saved["status"].tolist() == [[0]] and saved["path"][0, 0].decode() == str(tmp_path / CHECKPOINT_FILE)
    assert Critic(critic_config(reward_model_dir, checkpoint=str(tmp_path))).steps == 1
    small = Critic(critic_config(reward_model_dir, train_max_batch_size=4))
    with pytest.raises(BadRequest, match=r"a critic_train step takes at most 4 rows .* got 5"):
        small.train_fn([nemo])


def test_save_and_load_resume_exactly(reward_model_dir, tmp_path):
    first = Critic(critic_config(reward_model_dir, lr=1e-2))
    tokens, lengths = batch()
    returns, prev, mask = targets(first.values(tokens, lengths), lengths)
    for _ in range(2):
        first.train_step(tokens, lengths, returns, prev, mask)
    assert first.save(str(tmp_path) + "/") == tmp_path / CHECKPOINT_FILE  # a folder gets critic.pt
    loss_a = first.train_step(tokens, lengths, returns, prev, mask)

    resumed = Critic(critic_config(reward_model_dir, lr=1e-2, checkpoint=str(tmp_path)))
    assert resumed.steps == 2
    loss_b = resumed.train_step(tokens, lengths, returns, prev, mask)  # needs the optimiser state to match
    assert loss_a == loss_b
    assert np.array_equal(first.values(tokens, lengths), resumed.values(tokens, lengths))

    with pytest.raises(AlignerError, match="reward_mean=0.0, reward_std=1.0; start the server with the same"):
        Critic(critic_config(reward_model_dir, checkpoint=str(tmp_path), reward_mean=1.0))
    (tmp_path / "other.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(AlignerError, match="cannot be read"):
        Critic(critic_config(reward_model_dir, checkpoint=str(tmp_path / "other.pt")))
    with pytest.raises(AlignerError, match="does not exist"):
        Critic(critic_config(reward_model_dir, checkpoint=str(tmp_path / "missing.pt")))


def test_confined_paths_resolve_inside_the_root_only(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "elsewhere"
    (root / "checkpoints").mkdir(parents=True)
    outside.mkdir()
    (root / "checkpoints" / "escape").symlink_to(outside)
    assert confined_path(root / "checkpoints" / "step_1" / "critic.pt", root) == root / "checkpoints/step_1/critic.pt"
    assert confined_path(root / "checkpoints" / ".." / "critic.pt", root) == root / "critic.pt"
    assert confined_path(root / ".." / "elsewhere" / "critic.pt", root) is None
    assert confined_path(root / "checkpoints" / "escape" / "critic.pt", root) is None  # a symlink out
    assert confined_path(tmp_path / "run2" / "critic.pt", root) is None  # a sibling sharing the prefix
    assert confined_path("/anywhere/critic.pt", None) == Path("/anywhere/critic.pt")  # no root: the CLI's own server


def test_a_critic_with_a_save_root_writes_and_reads_inside_it_only(critic, reward_model_dir, tmp_path, monkeypatch):
    root, outside = tmp_path / "run", tmp_path / "elsewhere"
    (root / "checkpoints").mkdir(parents=True)
    outside.mkdir()
    (root / "checkpoints" / "escape").symlink_to(outside)
    monkeypatch.setattr(critic.config, "save_root", str(root))
    folder = root / "checkpoints" / "step_1" / "critic"
    assert critic.save(f"{folder}/") == folder / CHECKPOINT_FILE
    for path in (f"{root}/../elsewhere/critic.pt", f"{root}/checkpoints/escape/critic.pt"):
        with pytest.raises(BadRequest, match=f"^bad request: .* lies outside {re.escape(str(root))}, the only folder"):
            critic.save_fn([{"path": np.array([[path.encode()]], dtype=object)}])  # an answer, not a crash
    assert list(outside.iterdir()) == []
    config = critic_config(reward_model_dir, save_root=str(root), checkpoint=str(outside))
    with pytest.raises(AlignerError, match="lies outside save_root"):
        Critic(config)


def test_values_only_critic_and_models_without_a_score_head(reward_model_dir):
    critic = Critic(critic_config(reward_model_dir, combine_rm_and_critic_server=False))
    tokens, lengths = batch(rows=2)
    assert critic.scorer is None
    assert set(critic.infer_fn([{"tokens": tokens, "sequence_lengths": lengths[:, None]}])[0]) == {"values"}
    with pytest.raises(AlignerError, match="one-output linear `score` head"):
        TokenValueModel(torch.nn.Module(), 0.0, 1.0)


# ---------------------------------------------------------------------------------------------- live server


@pytest.fixture(scope="module")
def server(reward_model_dir, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("nemo_saves")
    server = Server(reward_model_dir, "--set", f"save_dir={save_dir}")
    server.save_dir = save_dir
    yield server
    server.stop()


def test_client_infers_values_and_rewards_in_chunks(server, reward_model_dir):
    client = RemoteCriticClient(server.url)
    # any batch is answered (NeMo-Aligner's clients never split); critic_train is unbatched, as NeMo-Aligner's
    assert client.max_batch_size == DECLARED_MAX_BATCH_SIZE and client.serves_rewards
    assert client.train_max_batch_size == 0
    tokens, lengths = batch()  # 5 rows, the server's batch_size 2: forward passes of 2, 2, 1
    values, rewards = client.infer(torch.from_numpy(tokens), torch.from_numpy(lengths)[:, None]).result(timeout=60)
    assert values.dtype == rewards.dtype == torch.float32 and values.shape == (5, 9) and rewards.shape == (5,)
    # the same critic (mean 0.5, std 2) in-process, before any training
    fresh = Critic(critic_config(reward_model_dir, reward_mean=0.5, reward_std=2.0))
    np.testing.assert_allclose(values.numpy(), fresh.values(tokens, lengths), atol=1e-5)
    np.testing.assert_allclose(rewards.numpy(), fresh.rewards(tokens, lengths), atol=1e-5)
    client.close()


def test_client_trains_and_saves(server, tmp_path):
    with RemoteCriticClient(server.url) as client:
        tokens, lengths = batch(seed=1)
        values, _ = client.infer(tokens, lengths).result(timeout=60)
        returns, prev, mask = targets(values.numpy(), lengths)
        losses = [client.train(tokens, lengths, returns, prev, mask) for _ in range(4)]
        assert losses[0] == pytest.approx(0.125, abs=1e-5) and losses[1] < losses[0] and losses[-1] < 0.6 * losses[0]
        after, _ = client.infer(tokens, lengths).result(timeout=60)
        assert ((after.numpy() - values.numpy()) * mask).sum() > 0  # towards the returns
        assert client.save(tmp_path / "step_4" / "critic.pt") == tmp_path / "step_4" / "critic.pt"
        assert (tmp_path / "step_4" / "critic.pt").stat().st_size > 0


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server):
    url = f"{server.url}/v2/models/critic_infer/infer"
    tokens = {"name": "tokens", "shape": [1, 3], "datatype": "INT64", "data": [7, 8, 9]}
    response = requests.post(url, json={"inputs": [tokens]}, timeout=10)
    assert response.status_code == 400 and "sequence_lengths" in response.json()["error"]
    mismatched = {"name": "sequence_lengths", "shape": [2, 1], "datatype": "INT64", "data": [3, 3]}
    response = requests.post(url, json={"inputs": [tokens, mismatched]}, timeout=10)
    assert response.status_code == 400 and "batch size does not match" in response.json()["error"]
    too_long = {"name": "sequence_lengths", "shape": [1, 1], "datatype": "INT64", "data": [4]}
    response = requests.post(url, json={"inputs": [tokens, too_long]}, timeout=10)
    assert response.status_code == 500 and "bad request: sequence_lengths must lie in [1, 3]" in response.text

    client = RemoteCriticClient(server.url, retry=RetrySettings(backoff_s=5.0))
    started = time.monotonic()
    refused = (
        rf"critic server {server.url} refused the request \(POST /v2/models/critic_save/infer: HTTP 500 Internal "
        r"Server Error; the server blames the request; its log says why\)$"
    )
    with pytest.raises(CriticError, match=refused):
        client._request("POST", "/v2/models/critic_save/infer", {"inputs": [_bytes("path", "relative.pt")]})
    assert time.monotonic() - started < 2  # not retried
    assert "bad request: path must be absolute" in server.output()  # the server's log says why; the client does not
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, 3\]"):
        client.infer([[7, 8, 9]], [4])
    with pytest.raises(CriticError, match="refused the request"):
        client.train(np.ones((1025, 2)), np.ones(1025), *(np.zeros((1025, 2)),) * 3)
    assert "bad request: a critic_train step takes at most 1024 rows" in server.output()
    values, rewards = client.infer([[7, 8, 9]], [3]).result(timeout=30)  # still serving
    assert values.shape == (1, 3) and rewards.shape == (1,)


def test_nemo_aligners_client_infers_trains_and_saves(server):
    """As NeMo-Aligner's PPO actor calls the critic: infer_batch (never split), infer_sample for a training step with
    [B, S - 1] targets and no lengths, infer_sample(dummy_var=[0]) to save."""
    from pytriton.client import FuturesModelClient

    def nemo(model: str) -> FuturesModelClient:
        return FuturesModelClient(server.url, model, init_timeout_s=60, inference_timeout_s=60)

    tokens, lengths = batch(rows=7, seed=3)  # 7 rows > the server's max_batch_size and batch_size (2)
    with nemo("critic_infer") as client:
        out = client.infer_batch(tokens=tokens, sequence_lengths=lengths[:, None]).result()
    assert out["values"].shape == (7, 9) and out["rewards"].shape == (7, 1)
    returns, prev, mask = (x[:, :-1] for x in targets(out["values"], lengths))
    with nemo("critic_train") as client:
        answer = client.infer_sample(tokens=tokens, returns=returns, prev_values=prev, mask=mask).result()
    # the values start at prev_values, 0.5 below the returns: the value loss is 0.5 * 0.5^2 on every token
    assert answer["loss_mean"].shape == (1,) and answer["loss_mean"][0] == pytest.approx(0.125, abs=1e-5)
    with nemo("critic_infer") as client:
        after = client.infer_batch(tokens=tokens, sequence_lengths=lengths[:, None]).result()["values"]
    assert ((after[:, :-1] - out["values"][:, :-1]) * mask).sum() > 0  # a step towards the returns
    with nemo("critic_save") as client:
        status = client.infer_sample(dummy_var=np.array([0])).result()["status"]
    assert status.tolist() == [0] and (server.save_dir / CHECKPOINT_FILE).stat().st_size > 0


def _bytes(name: str, value: str) -> dict:
    return {"name": name, "shape": [1, 1], "datatype": "BYTES", "data": [value]}


@pytest.mark.slow
def test_a_restarted_server_continues_exactly_and_sigterm_stops_it(server, reward_model_dir, tmp_path):
    tokens, lengths = batch(seed=2)
    with RemoteCriticClient(server.url) as client:
        values, _ = client.infer(tokens, lengths).result(timeout=60)
        returns, prev, mask = targets(values.numpy(), lengths)
        client.train(tokens, lengths, returns, prev, mask)
        checkpoint = client.save(tmp_path)  # a folder: critic.pt inside
        saved_values, _ = client.infer(tokens, lengths).result(timeout=60)
        next_loss = client.train(tokens, lengths, returns, prev, mask)
        next_values, _ = client.infer(tokens, lengths).result(timeout=60)

    restarted = Server(reward_model_dir, "--checkpoint", str(checkpoint))
    try:
        with RemoteCriticClient(restarted.url) as client:
            assert torch.equal(client.infer(tokens, lengths).result(timeout=60)[0], saved_values)
            assert client.train(tokens, lengths, returns, prev, mask) == next_loss  # optimiser state restored
            assert torch.equal(client.infer(tokens, lengths).result(timeout=60)[0], next_values)
        assert list(Path(tempfile.gettempdir()).glob(f"aligner-triton-{restarted.proc.pid}-*"))
    finally:
        assert restarted.stop(signal.SIGTERM) == 0
    deadline = time.monotonic() + 10  # three models: stragglers (the stubs' resource trackers) take a moment
    while (left := _group(restarted.proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
    assert not list(Path(tempfile.gettempdir()).glob(f"aligner-triton-{restarted.proc.pid}-*"))
    assert "critic server stopped" in restarted.output()


def _group(pgid: int) -> list[str]:
    return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()


def test_unreachable_server_is_a_clear_error_naming_the_url():
    port = free_port(3)
    with pytest.raises(CriticError, match=rf"http://127.0.0.1:{port} cannot be reached.*aligner serve-critic"):
        RemoteCriticClient(
            f"127.0.0.1:{port}", retry=RetrySettings(timeout_s=1, backoff_s=0.01, unavailable_timeout_s=0.05)
        )


def test_cli_without_a_model_is_a_user_error(capsys, tmp_path):
    assert main(["serve-critic", "--port", "1"]) == 2
    assert "model_path" in capsys.readouterr().err
