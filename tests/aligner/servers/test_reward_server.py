"""aligner serve-reward and RemoteRewardClient against real PyTriton servers on free loopback ports.

The servers run as `aligner serve-reward` subprocesses; they are queried with the project's client, with Triton's
own `tritonclient` (HTTP and gRPC) and with plain KServe-v2 JSON.
"""

from __future__ import annotations

import json
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

from aligner.errors import RewardError  # noqa: E402
from aligner.processes import free_port  # noqa: E402
from aligner.rewards.http import RetrySettings  # noqa: E402
from aligner.rewards.local import ModelRewardClient
from aligner.rewards.remote import RemoteRewardClient  # noqa: E402
from aligner.servers.reward_server import PromptSplitter
from aligner.servers.triton import DECLARED_MAX_BATCH_SIZE
from tests.helpers.learning import assert_reward_rises  # noqa: E402
from tests.helpers.triton_servers import ServerProcess  # noqa: E402


def Server(*args: str) -> ServerProcess:  # noqa: N802 - reads as the class it was
    return ServerProcess("serve-reward", list(args), ("reward_model",))


@pytest.fixture(scope="module")
def function_server(tiny_policy_dir):
    args = ["--function", "tests.helpers.rewards:length_reward", "--max-batch-size", "4"]
    server = Server(*args, "--tokenizer", str(tiny_policy_dir))
    yield server
    server.kill()  # at once: a graceful stop takes seconds and is test_sigterm_stops_everything's


@pytest.fixture(scope="module")
def model_server(reward_model_dir):
    server = Server("--model", str(reward_model_dir), "--set", "reward_mean=0.5", "--set", "reward_std=2.0")
    yield server
    server.kill()


def test_project_client_sends_prompts_responses_and_metadata(function_server):
    client = RemoteRewardClient(function_server.url)
    assert client.max_batch_size == DECLARED_MAX_BATCH_SIZE  # NeMo-Aligner's: any batch is answered
    config = requests.get(f"{function_server.url}/v2/models/reward_model/config", timeout=10).json()
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]  # --max-batch-size: what Triton merges to
    rewards = client.submit(["p1", "p2"], ["abc", "hello"], [{}, {"answer": "hello"}]).result(timeout=30)
    assert rewards.dtype == torch.float32 and rewards.tolist() == [3.0, 105.0]


def test_batches_larger_than_the_preferred_batch_are_answered(function_server):
    client = RemoteRewardClient(function_server.url)
    responses = ["x" * i for i in range(11)]  # 11 rows, preferred batch 4
    assert client.score(["p"] * 11, responses).tolist() == [float(i) for i in range(11)]


def conversations(tokenizer, rows: int):
    """NeMo-Aligner's reward request: chat prompts and responses tokenized apart, as the policy wrote them, joined and
    zero-padded [rows, S], with their lengths [rows, 1]; and the response texts."""
    ids, texts = [], []
    for i in range(rows):
        turns = [{"role": "user", "content": f"tell me about cat {i}"}]
        if i % 3 == 0:  # a multi-turn prompt: the last assistant marker counts
            turns = [*turns, {"role": "assistant", "content": "a dog"}, {"role": "user", "content": "why"}]
        prompt = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        response = "the cat is kind and slow"[: i % 23]
        ids.append(
            tokenizer.encode(prompt, add_special_tokens=False)
            + tokenizer.encode(response, add_special_tokens=False)
            + [tokenizer.eos_token_id]
        )
        texts.append(response)
    width = max(map(len, ids))
    tokens = np.array([row + [0] * (width - len(row)) for row in ids], dtype=np.int64)
    return tokens, np.array([[len(row)] for row in ids], dtype=np.int64), texts


def test_nemo_aligners_client_gets_each_rows_reward_from_a_function(function_server, tiny_policy_dir):
    """NeMo-Aligner's actor calls `infer_batch(tokens=, sequence_lengths=)` and never splits: 130 rows, far above
    the preferred batch (4) and the old maximum (64). The function sees each response alone, special tokens left
    out; the `sentences` form (the decoded conversations) splits the same way."""
    from pytriton.client import FuturesModelClient
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_policy_dir)
    tokens, lengths, responses = conversations(tokenizer, 130)
    expected = np.array([[float(len(r))] for r in responses], dtype=np.float32)
    sentences = np.array([[tokenizer.decode(t[:n]).encode()] for t, (n,) in zip(tokens, lengths)], dtype=object)
    with FuturesModelClient(function_server.url, "reward_model", init_timeout_s=60, inference_timeout_s=60) as client:
        by_tokens = client.infer_batch(tokens=tokens, sequence_lengths=lengths).result()["rewards"]
        by_text = client.infer_batch(sentences=sentences).result()["rewards"]
    assert by_tokens.shape == (130, 1) and len(set(by_tokens.ravel().tolist())) == 23  # every length 0 .. 22
    np.testing.assert_array_equal(by_tokens, expected)
    np.testing.assert_array_equal(by_text, expected)


def test_prompt_splitter_finds_the_last_assistant_turn(tiny_policy_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_policy_dir)
    splitter = PromptSplitter(tokenizer)
    assert splitter.marker == "<|assistant|>\n"  # the chat template's generation prompt
    tokens, lengths, responses = conversations(tokenizer, 4)
    prompt, response = splitter.split(tokens[3, : lengths[3, 0]].tolist())
    assert (prompt, response) == ("\ntell me about cat 3\n\na dog\n\nwhy\n\n", responses[3])
    plain = tokenizer.encode("no turns at all</s>", add_special_tokens=False)
    assert splitter.split(plain) == ("", "no turns at all")  # no marker: all of it is the response
    tokenizer.chat_template = None
    assert PromptSplitter(tokenizer).marker is None
    assert PromptSplitter(tokenizer, "cat 3").split(tokens[3, : lengths[3, 0]].tolist())[1].startswith("\n\na dog")


def test_plain_kserve_json_and_the_curl_form(function_server):
    body = {"inputs": [{"name": "sentences", "shape": [2, 1], "datatype": "BYTES", "data": ["ab", "abcd"]}]}
    out = requests.post(f"{function_server.url}/v2/models/reward_model/infer", json=body, timeout=10).json()
    assert out["outputs"][0]["name"] == "rewards" and out["outputs"][0]["shape"] == [2, 1]
    assert out["outputs"][0]["data"] == [2.0, 4.0]
    assert requests.get(f"{function_server.url}/v2/health/ready", timeout=5).status_code == 200
    metrics = requests.get(f"http://127.0.0.1:{function_server.port + 2}/metrics", timeout=5).text
    assert "nv_inference_request_success" in metrics


def test_tritonclient_http_and_grpc(function_server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    sentences = np.array([[b"a"], [b"abc"], [b"hello"]], dtype=object)
    for module, port in ((httpclient, function_server.port), (grpcclient, function_server.port + 1)):
        client = module.InferenceServerClient(url=f"127.0.0.1:{port}")
        inp = module.InferInput("sentences", list(sentences.shape), "BYTES")
        inp.set_data_from_numpy(sentences)
        result = client.infer("reward_model", [inp], outputs=[module.InferRequestedOutput("rewards")])
        assert result.as_numpy("rewards").tolist() == [[1.0], [3.0], [5.0]], module.__name__


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(function_server):
    url = f"{function_server.url}/v2/models/reward_model/infer"
    wrong_name = {"inputs": [{"name": "sentencez", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}]}
    response = requests.post(url, json=wrong_name, timeout=10)
    assert response.status_code == 400 and "sentencez" in response.json()["error"]

    half_pair = {"inputs": [{"name": "prompts", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}]}
    response = requests.post(url, json=half_pair, timeout=10)
    assert response.status_code >= 400 and "responses" in response.json()["error"]
    # PyTriton answers a model function's exception with 500: the marker tells clients not to retry it.
    assert "bad request: " in response.json()["error"]

    wrong_shape = {"inputs": [{"name": "sentences", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]}
    assert requests.post(url, json=wrong_shape, timeout=10).status_code == 400

    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{function_server.port}")
    inp = httpclient.InferInput("sentences", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"\xff\xfe bad"]], dtype=object))
    with pytest.raises(Exception, match="not valid UTF-8"):
        client.infer("reward_model", [inp])

    # Still serving, and the project's client reports a refused request without retrying it.
    assert RemoteRewardClient(function_server.url).score(["p"], ["ok"]).tolist() == [2.0]
    with pytest.raises(RewardError, match="refused"):
        RemoteRewardClient(function_server.url, model_name="no_such_model", retry=RetrySettings(backoff_s=0.01))


def test_model_server_scores_text_and_tokens_like_the_in_process_model(model_server, reward_model_dir):
    from pytriton.client import FuturesModelClient

    local = ModelRewardClient(reward_model_dir)
    texts = ["tell me about the cat.", "the dog is sad and slow"]
    expected = (local.score(texts) - 0.5) / 2.0  # the server standardises with mean 0.5, std 2
    client = RemoteRewardClient(model_server.url)
    torch.testing.assert_close(client.score(texts, ["", ""]), expected, atol=1e-5, rtol=1e-5)

    ids = [local.tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, ids))
    tokens = [row + [0] * (width - len(row)) for row in ids]  # zero-padded, as NeMo-Aligner sends them
    body = {
        "inputs": [
            {"name": "tokens", "shape": [2, width], "datatype": "INT64", "data": [t for row in tokens for t in row]},
            {"name": "sequence_lengths", "shape": [2, 1], "datatype": "INT64", "data": [len(r) for r in ids]},
        ]
    }
    out = requests.post(f"{model_server.url}/v2/models/reward_model/infer", json=body, timeout=10).json()
    torch.testing.assert_close(torch.tensor(out["outputs"][0]["data"]), expected, atol=1e-5, rtol=1e-5)

    # NeMo-Aligner's client: one unsplit batch of 130 rows (the server's batch_size is 32, max_batch_size 64)
    many = np.array([tokens[i % 2] for i in range(130)], dtype=np.int64)
    many_lengths = np.array([[len(ids[i % 2])] for i in range(130)], dtype=np.int64)
    with FuturesModelClient(model_server.url, "reward_model", init_timeout_s=60, inference_timeout_s=60) as nemo:
        rewards = nemo.infer_batch(tokens=many, sequence_lengths=many_lengths).result()["rewards"]
    torch.testing.assert_close(torch.tensor(rewards[:, 0]), expected.repeat(65), atol=1e-5, rtol=1e-5)


def test_unreachable_server_is_a_clear_error_naming_the_url():
    port = free_port(3)
    with pytest.raises(RewardError, match=rf"http://127.0.0.1:{port} cannot be reached"):
        RemoteRewardClient(
            f"127.0.0.1:{port}", retry=RetrySettings(timeout_s=1, backoff_s=0.01, unavailable_timeout_s=0.05)
        )


def group_members(pgid: int) -> list[str]:
    return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()


def members_after(pgid: int, seconds: float) -> list[str]:
    """The group's processes once it is empty, or after `seconds` (what is still there then)."""
    deadline = time.monotonic() + seconds
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_sigterm_stops_everything_and_removes_the_workspace():
    server = Server("--function", "tests.helpers.rewards:length_reward")
    assert list(Path(tempfile.gettempdir()).glob(f"aligner-triton-{server.proc.pid}-*"))
    assert len(group_members(server.proc.pid)) >= 2  # the server and Triton at least
    assert server.stop(signal.SIGTERM) == 0
    assert members_after(server.proc.pid, 1) == []
    assert not list(Path(tempfile.gettempdir()).glob(f"aligner-triton-{server.proc.pid}-*"))
    assert "reward server stopped" in server.output()


def test_a_sigkilled_servers_workspace_is_removed_at_the_next_start():
    killed = Server("--function", "tests.helpers.rewards:length_reward")
    assert killed.stop(signal.SIGKILL) == -signal.SIGKILL
    # Left behind; checked at once: any server starting on this machine (another xdist worker's) removes it.
    assert list(Path(tempfile.gettempdir()).glob(f"aligner-triton-{killed.proc.pid}-*"))
    subprocess.run(["pkill", "-KILL", "-g", str(killed.proc.pid)], check=False)  # Triton dies with it anyway
    assert members_after(killed.proc.pid, 10) == []  # none of it is left to clean up
    fresh = Server("--function", "tests.helpers.rewards:length_reward")
    try:
        assert not list(Path(tempfile.gettempdir()).glob(f"aligner-triton-{killed.proc.pid}-*"))
    finally:
        fresh.kill()


def test_cli_without_a_source_is_a_user_error(capsys):
    from aligner.cli import main

    assert main(["serve-reward", "--port", "1"]) == 2
    assert "exactly one of model_path (--model) or function (--function)" in capsys.readouterr().err


def test_metadata_json_travels(function_server):
    body = {
        "inputs": [
            {"name": "prompts", "shape": [1, 1], "datatype": "BYTES", "data": ["q"]},
            {"name": "responses", "shape": [1, 1], "datatype": "BYTES", "data": ["42"]},
            {"name": "metadata", "shape": [1, 1], "datatype": "BYTES", "data": [json.dumps({"answer": "42"})]},
        ]
    }
    out = requests.post(f"{function_server.url}/v2/models/reward_model/infer", json=body, timeout=10).json()
    assert out["outputs"][0]["data"] == [102.0]


@pytest.mark.slow
def test_training_against_the_live_server_raises_the_reward(demo_assets_dir, tmp_path):
    """The demo run, shortened, scored through `aligner serve-reward` serving the demo's reward function.

    The function rather than the demo reward model: a reward model's scores scatter several times more from step to
    step (measured: 0.7-0.8 against 0.14), so 40 steps would not show learning reliably. That the server scores with
    a model exactly as `ModelRewardClient` does is checked above.
    """
    from aligner.config import load_config
    from aligner.trainers.reinforce import ReinforceTrainer
    from aligner.trainers.run_log import read_jsonl

    server = Server("--function", "aligner.demo:reward")
    try:
        config = load_config(
            demo_assets_dir / "reinforce.yaml",
            [
                f"run_dir={tmp_path / 'run'}",
                "reward.function=null",
                f"reward.server_url={server.url}",
                "trainer.max_steps=40",
                "trainer.progress_bar=false",
                "model.num_threads=1",
            ],
        )
        trainer = ReinforceTrainer(config)
        trainer.setup()
        trainer.fit()
    finally:
        server.stop()
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    rewards = [r["train_rollouts/rewards"] for r in rows]
    assert_reward_rises(rewards)
    assert all(r["timers/reward"] < 5 for r in rows)


def test_dynamic_batching_can_be_switched_off_and_ready_means_it_answers():
    args = ["--function", "tests.helpers.rewards:length_reward", "--set", "dynamic_batching=false"]
    server = ServerProcess("serve-reward", args, models=())  # waits for /v2/health/ready only
    try:
        # the first inference right after /v2/health/ready turned 200 (Triton used to be ready before the model)
        body = {"inputs": [{"name": "sentences", "shape": [1, 1], "datatype": "BYTES", "data": ["abc"]}]}
        first = requests.post(f"{server.url}/v2/models/reward_model/infer", json=body, timeout=10)
        assert first.status_code == 200 and first.json()["outputs"][0]["data"] == [3.0]
        config = requests.get(f"{server.url}/v2/models/reward_model/config", timeout=10).json()
        assert "dynamic_batching" not in config and config["max_batch_size"] == DECLARED_MAX_BATCH_SIZE
        assert RemoteRewardClient(server.url).score(["p", "q"], ["ab", "abcd"]).tolist() == [2.0, 4.0]
    finally:
        server.kill()
