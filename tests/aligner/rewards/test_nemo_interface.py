"""Aligner's reward and critic clients against servers with NeMo-Aligner's interface: what to send is read from the
model's declared inputs (a unit test on metadata JSON), then one PyTriton process declaring exactly NeMo-Aligner's
reward_model, critic_infer, critic_train and critic_save (tests/helpers/triton_servers.py) for every client test."""

from __future__ import annotations

import numpy as np
import pytest

from aligner.config import RewardConfig
from aligner.errors import RewardError
from aligner.rewards.kserve import declared_inputs
from aligner.rewards.remote import choose_inputs


def metadata(*names: str) -> dict:
    """A KServe v2 model metadata answer (`GET /v2/models/NAME`) declaring `names`."""
    return {
        "name": "reward_model",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": n, "datatype": "BYTES", "shape": [-1, -1]} for n in names],
        "outputs": [{"name": "rewards", "datatype": "FP32", "shape": [-1, 1]}],
    }


def test_the_inputs_sent_are_the_first_the_model_declares_and_an_override_must_be_declared():
    nemo = declared_inputs(metadata("sentences", "tokens", "sequence_lengths"))
    aligner = declared_inputs(metadata("sentences", "prompts", "responses", "metadata", "tokens", "sequence_lengths"))
    assert choose_inputs(nemo) == "sentences" and choose_inputs(aligner) == "aligner"
    assert choose_inputs(declared_inputs(metadata("tokens", "sequence_lengths"))) == "tokens"
    assert choose_inputs(declared_inputs({"name": "m"})) == "aligner"  # a server that does not say
    assert choose_inputs(nemo, "tokens") == "tokens" and choose_inputs(aligner, "sentences") == "sentences"
    with pytest.raises(RewardError, match="server_inputs is aligner, but the model declares no prompts or"):
        choose_inputs(nemo, "aligner")
    with pytest.raises(RewardError, match="declares none of the inputs") as info:
        choose_inputs(declared_inputs(metadata("SECRET", "tokens")))  # tokens without their lengths
    assert "SECRET" not in str(info.value)
    with pytest.raises(ValueError, match="server_inputs must be"):
        choose_inputs(nemo, "text")
    with pytest.raises(ValueError, match="server_inputs"):
        RewardConfig(server_url="http://h:1", server_inputs="text")


class CharTokenizer:
    """Token = character code; special tokens: a BOS of 1."""

    bos_token = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [1] * add_special_tokens + [ord(c) for c in text]}


@pytest.fixture(scope="module")
def nemo_server(tmp_path_factory):
    pytest.importorskip("pytriton")
    from tests.helpers.triton_servers import nemo_interface_server

    save_dir = tmp_path_factory.mktemp("nemo-critic")
    server = nemo_interface_server(save_dir)
    server.save_dir = save_dir
    yield server
    server.kill()


def test_rewards_from_nemo_reward_server_sentences_then_tokens_each_row_its_own(nemo_server):
    from aligner.rewards.build import build_reward_client
    from aligner.rewards.remote import RemoteRewardClient
    from tests.helpers.triton_servers import NEMO_MAX_BATCH

    client = build_reward_client(RewardConfig(server_url=nemo_server.url))
    assert (client.inputs, client.sends_metadata, client.max_batch_size) == ("sentences", False, NEMO_MAX_BATCH)
    prompts = [f"p{'x' * (i % 7)}" for i in range(70)]  # more than any Aligner server's default max_batch_size
    responses = [f"{'r' * (i % 5)}" for i in range(70)]
    rewards = client.score(prompts, responses, [{"id": i} for i in range(70)])  # metadata is not sent: not declared
    assert rewards.tolist() == [float(len(p + r)) for p, r in zip(prompts, responses)]  # the whole text, per row
    client.close()

    with pytest.raises(RewardError, match="needs the policy's tokenizer"):
        RemoteRewardClient(nemo_server.url, server_inputs="tokens")
    client = RemoteRewardClient(nemo_server.url, server_inputs="tokens", load_tokenizer=CharTokenizer)
    rewards = client.score(["ab", "c"], ["cd", ""])
    # Prompt tokens with the BOS (1), the response's without, zero padding past each length left out.
    assert rewards.tolist() == [1000 * 5 + 1 + 97 + 98 + 99 + 100, 1000 * 2 + 1 + 99]
    client.close()


def test_the_critic_client_infers_trains_and_saves_on_nemos_critic_server(nemo_server):
    from aligner.rewards.critic_client import RemoteCriticClient

    with RemoteCriticClient(nemo_server.url) as critic:
        assert not critic.train_sends_lengths and critic.serves_rewards
        tokens = np.array([[3, 4, 5, 6], [7, 8, 0, 0]])
        values, rewards = critic.infer(tokens, [4, 2]).result(timeout=30)
        assert values.tolist() == [[1.5, 2.0, 2.5, 3.0], [3.5, 4.0, 0.0, 0.0]] and rewards.tolist() == [4.0, 2.0]

        returns = np.array([[1.0, 2.0, 3.0, 9.0], [0.5, 9.0, 9.0, 9.0]])
        prev = np.zeros((2, 4))
        mask = np.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
        # [B, S] is sent as NeMo's [B, S - 1]; masked-out targets as 0.
        assert critic.train(tokens, [4, 2], returns, prev, mask) == pytest.approx((1 + 4 + 9 + 0.25) / 4)
        loss = critic.train(tokens, [4, 2], returns[:, :3], prev[:, :3] + 1, mask[:, :3])
        assert loss == pytest.approx((0 + 1 + 4 + 0.25) / 4)
        mask[0, 3] = 1.0
        with pytest.raises(ValueError, match="last position must be 0"):
            critic.train(tokens, [4, 2], returns, prev, mask)

        assert critic.save(nemo_server.save_dir / "ignored") is None  # NeMo's server saves where its config says
        assert (nemo_server.save_dir / "saved").read_text() == "saved"
