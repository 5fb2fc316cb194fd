"""A reward server that goes away during a run: the trainer waits for it (events "waiting for reward server ..." and
"... is back"), and past `reward.unavailable_timeout_s` stops with a checkpoint of its last completed step and a
clear error, from which it resumes once the server is back (that a resumed run equals an uninterrupted one is
test_reinforce.py's test)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import torch

from aligner.data.prompts import PromptSampler
from aligner.errors import CriticServerUnavailableError, RewardServerUnavailableError
from aligner.rewards.http import ServerWait
from aligner.run_layout import STATE_FILE, RunEnd, checkpoint_steps, read_end
from aligner.trainers.ppo import PPOTrainer
from aligner.trainers.reinforce import ReinforceTrainer
from aligner.trainers.run_log import read_jsonl
from tests.helpers.flaky_server import FlakyServer
from tests.helpers.training import train


@pytest.fixture
def server():
    server = FlakyServer()
    yield server
    server.stop()


def assert_waited(message: str, who: str, limit_s: float, request: str) -> None:
    """`message` opens with `who` waited at least `limit_s` for the request: the clock's time, which is past the limit
    when the last retry's sleep overran it under load."""
    opening = rf"{re.escape(who)} cannot be reached: waited ([0-9.]+) s for it \({re.escape(request)}"
    waited = re.match(opening, message)
    assert waited and limit_s <= float(waited[1]) < limit_s + 5, message


def test_a_reward_server_away_past_the_limit_stops_the_run_with_a_checkpoint_and_resume_continues(server, run_config):
    # Validation at step 0 and 4 only, checkpoints only at the end: the one the failure leaves is the trainer's.
    config = run_config(
        reward={"function": None, "server_url": server.url, "unavailable_timeout_s": 0.6},
        trainer={"max_steps": 4, "val_check_interval": 10, "save_interval": 10},
    )
    # Requests: the model's config and metadata, validation at step 0, steps 1, 2 (fails once: 0.5 s of waiting), then
    # away for good.
    server.fail("503", times=1, after=4)
    server.fail("503", times=None, after=1)
    with pytest.raises(RewardServerUnavailableError) as info:
        train(config)
    message = str(info.value)
    assert_waited(message, f"reward server {server.url}", 0.6, "POST /v2/")
    assert "raise reward.unavailable_timeout_s (now 0.6 s)" in message
    assert message.endswith("The run stopped at step 2; its newest checkpoint is step 2: resume the run (--resume) "
                            "once the server is back.")  # fmt: skip
    run_dir = Path(config.run_dir)
    checkpoints = checkpoint_steps(run_dir)
    assert list(checkpoints) == [2]  # step 3 was dropped; step 2, completed, checkpointed
    state = torch.load(checkpoints[2] / STATE_FILE, weights_only=False)
    two_steps = PromptSampler(6, config.seed, True)
    two_steps.next_batch(4), two_steps.next_batch(4)
    assert state["step"] == 2 and state["sampler"] == two_steps.state_dict()  # not the failed step's data position
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2]
    events = read_jsonl(run_dir / "events.jsonl")
    assert [(e["step"], e["level"], e["wait"], e["server"]) for e in events] == [
        (1, "warning", "waiting", "reward"),
        (1, "info", "back", "reward"),
        (2, "warning", "waiting", "reward"),
        (2, "error", "failed", "reward"),
    ]
    assert events[0]["message"] == (
        f"waiting for reward server {server.url}: HTTP 503 Service Unavailable; retrying for up to 0.6 s"
    )
    assert events[1]["message"].startswith(f"reward server {server.url} is back after 0.")
    assert events[3]["message"] == message
    assert read_end(run_dir) == RunEnd("server_unavailable", 2, 4, message)

    server.recover()
    assert train(config, resume=True).step == 4
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_a_wait_during_setup_is_an_event_before_the_run_log_exists(run_config, capsys):
    trainer = ReinforceTrainer(run_config())  # not set up: the clients connect before the run log is made
    trainer._server_wait(ServerWait("waiting", "critic server", "http://c:1", "connection refused", 0.0, 60.0))
    (event,) = read_jsonl(trainer.run_dir / "events.jsonl")
    message = "waiting for critic server http://c:1: connection refused; retrying for up to 60 s"
    assert event == {"step": 0, "level": "warning", "message": message, "waited_s": 0.0, "server": "critic",
                     "url": "http://c:1", "wait": "waiting"}  # fmt: skip
    assert message in capsys.readouterr().err  # train.log has it too
    assert not (trainer.run_dir / "metrics.jsonl").exists()


def test_a_ppo_critic_server_away_past_the_limit_stops_the_run_without_a_checkpoint_it_cannot_write(
    server, run_config
):
    """The critic server is the fake too (values 0.25, loss 0.5): a checkpoint holds the critic, which only its
    server writes, so with the critic away none is attempted."""
    config = run_config(
        algorithm="ppo",
        critic={"server_url": server.url, "unavailable_timeout_s": 0.3},
        trainer={"max_steps": 3, "val_check_interval": 10, "save_interval": 10},
    )
    # critic_infer's and critic_train's configs and metadata, step 1's critic_infer and critic_train; then away
    server.fail("503", times=None, after=6)
    trainer = PPOTrainer(config)
    trainer.setup()
    with pytest.raises(CriticServerUnavailableError) as info:
        trainer.fit()
    message = str(info.value)
    assert_waited(message, f"critic server {server.url}", 0.3, "POST /v2/models/")
    assert "Is `aligner serve-critic` running there? To wait longer, raise critic.unavailable_timeout_s" in message
    assert message.endswith("The run stopped at step 1; it has no checkpoint: run it again once the server is back.")
    assert checkpoint_steps(trainer.run_dir) == {} and trainer.critic is None  # the client is closed
    assert read_end(trainer.run_dir) == RunEnd("server_unavailable", 1, 3, message)  # PPO's too
    events = read_jsonl(trainer.run_dir / "events.jsonl")
    assert [(e["step"], e["level"], e["wait"], e["server"]) for e in events] == [
        (1, "warning", "waiting", "critic"),
        (1, "error", "failed", "critic"),
    ]


def test_a_stop_request_ends_the_wait_and_stops_at_the_last_completed_step(server, run_config, capsys):
    config = run_config(
        reward={"function": None, "server_url": server.url},  # the default limit: 10 minutes
        trainer={"max_steps": 4, "val_check_interval": 10, "save_interval": 10},
    )
    trainer = ReinforceTrainer(config)
    trainer.setup()
    server.fail("503", times=None, after=2)  # validation at step 0, step 1 (after the config and metadata); then away
    # SIGTERM (a cancel) while step 2 waits: it is dropped, and the run stops as at a step boundary.
    server.on_request = lambda n: n == 5 and threading.Timer(0.1, trainer.request_stop).start()
    started = time.monotonic()
    trainer.fit()
    assert time.monotonic() - started < 5 and trainer.step == 1
    assert list(checkpoint_steps(trainer.run_dir)) == [1]
    assert "stopped at step 1; continue with --resume" in capsys.readouterr().err
    events = read_jsonl(trainer.run_dir / "events.jsonl")
    assert [(e["step"], e["wait"]) for e in events] == [(1, "waiting"), (1, "stopped")]
    assert read_end(trainer.run_dir).end == "stopped"
    assert [e["level"] for e in events] == ["warning", "warning"]
    assert events[1]["message"] == f"stopped waiting for reward server {server.url}: the run was asked to stop"
