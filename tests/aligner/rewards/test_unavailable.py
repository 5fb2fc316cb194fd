"""Reward and critic servers that go away: the clients wait with backoff (aligner/rewards/http.py ServerConnection),
report the wait to their callback, continue when the server is back, and past `unavailable_timeout_s` fail with one
clear error; a request the server refuses still fails at once. The clock and the sleeps are fake: milliseconds."""

from __future__ import annotations

import numpy as np
import pytest

from aligner.errors import (
    CriticError,
    CriticServerUnavailableError,
    RewardError,
    RewardServerUnavailableError,
    ServerUnavailableError,
)
from aligner.rewards.critic_client import RemoteCriticClient
from aligner.rewards.http import REPORT_INTERVAL_S, RetrySettings, ServerWait
from aligner.rewards.remote import RemoteRewardClient
from tests.helpers.flaky_server import FakeTime, FlakyServer


@pytest.fixture
def server():
    server = FlakyServer()
    yield server
    server.stop()


def reward_client(server, time, waits=None, **retry):
    retry = RetrySettings(
        **{"backoff_s": 0.5, "max_backoff_s": 20.0, "unavailable_timeout_s": 600.0, "timeout_s": 5, **retry}
    )
    on_wait = waits.append if waits is not None else None
    return RemoteRewardClient(server.url, retry=retry, on_wait=on_wait, sleep=time.sleep, clock=time.clock)


def states(waits: list[ServerWait]) -> list[str]:
    return [w.state for w in waits]


def test_a_server_that_goes_away_and_comes_back_is_waited_for(server):
    time, waits = FakeTime(), []
    client = reward_client(server, time, waits)
    server.stop()  # the port closes: connection refused
    time.on_sleep(4, server.start)
    assert client.score(["p"], ["abc"]).tolist() == pytest.approx([3 / 7])
    assert time.sleeps == [0.5, 1.0, 2.0, 4.0]  # exponential backoff, until it answered
    assert states(waits) == ["waiting", "back"]
    assert waits[0].message == f"waiting for reward server {server.url}: connection refused; retrying for up to 600 s"
    assert waits[1].message == f"reward server {server.url} is back after 7.5 s"
    client.close()


@pytest.mark.parametrize("mode", ["503", "502", "504", "loading", "reset", "unknown"])
def test_each_kind_of_unavailability_is_waited_for(server, mode):
    time, waits = FakeTime(), []
    client = reward_client(server, time, waits)  # answered once: an unknown model is now one being reloaded
    server.fail(mode, times=3)
    assert client.score(["p", "q"], ["a", "bb"]).shape == (2,)
    assert time.sleeps == [0.5, 1.0, 2.0] and states(waits) == ["waiting", "back"]
    assert "SECRET" not in waits[0].message
    client.close()


def test_a_stopping_server_that_fails_with_500_and_says_it_is_not_ready_is_waited_for(server):
    """A stopping PyTriton keeps taking requests for up to 30 s and fails each with 500; its readiness says why. The
    same 500 from a server that says it is ready stays a bounded retry (the next test)."""
    time, waits = FakeTime(), []
    client = reward_client(server, time, waits, max_retries=1)
    server.fail("500", times=None)
    server.ready = False

    def back():
        server.recover()

    time.on_sleep(5, back)  # more than max_retries: only a wait gets this far
    assert client.score(["p"], ["abc"]).shape == (1,)
    assert states(waits) == ["waiting", "back"]
    assert "HTTP 500 Internal Server Error (the server is not ready: stopping or starting)" in waits[0].message
    client.close()


def test_the_backoff_is_capped_and_a_long_wait_is_reported_once_a_minute(server):
    time, waits = FakeTime(), []
    client = reward_client(server, time, waits, max_backoff_s=20.0)
    server.fail("503", times=10)  # failures at 0, 0.5, 1.5, 3.5, ..., 31.5, 51.5, 71.5 and 91.5 s
    client.score(["p"], ["a"])
    assert time.sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0] + [20.0] * 4
    assert states(waits) == ["waiting", "waiting", "back"]  # the second a minute (or more) into the wait
    assert waits[1].waited_s == 71.5 >= REPORT_INTERVAL_S
    assert waits[1].message.endswith("503 Service Unavailable; away for 72 s, retrying for up to 528 s more")


def test_past_the_limit_one_clear_error_names_the_url_the_wait_and_the_key(server):
    time, waits = FakeTime(), []
    client = reward_client(server, time, waits, unavailable_timeout_s=0.5)
    server.stop()
    with pytest.raises(RewardServerUnavailableError) as info:
        client.score(["p"], ["a"])
    message = str(info.value)
    assert message.startswith(f"reward server {server.url} cannot be reached: waited 0.5 s for it (POST ")
    assert "connection refused" in message and "raise reward.unavailable_timeout_s (now 0.5 s)" in message
    assert isinstance(info.value, RewardError) and isinstance(info.value, ServerUnavailableError)
    assert info.value.url == server.url and info.value.waited_s == pytest.approx(0.5)
    assert time.sleeps == [0.5]  # the last sleep ends at the limit, for one last try
    assert states(waits) == ["waiting"]


def test_zero_waits_not_at_all(server):
    time = FakeTime()
    client = reward_client(server, time, unavailable_timeout_s=0)
    server.fail("503")
    with pytest.raises(RewardServerUnavailableError, match="raise reward.unavailable_timeout_s"):
        client.score(["p"], ["a"])
    assert time.sleeps == []


def test_a_request_the_server_refuses_fails_at_once(server):
    time, waits = FakeTime(), []
    client = reward_client(server, time, waits)
    server.fail("400")
    with pytest.raises(RewardError, match=r"refused the request \(POST .*HTTP 400 Bad Request") as info:
        client.score(["p"], ["a"])
    assert not isinstance(info.value, ServerUnavailableError) and "SECRET" not in str(info.value)
    assert time.sleeps == [] and waits == []


def test_an_unknown_model_at_the_first_contact_is_a_server_starting_or_a_wrong_name(server):
    time, waits = FakeTime(), []
    server.fail("unknown")  # PyTriton's HTTP endpoint is up a moment before its models
    reward_client(server, time, waits, max_retries=2).close()
    assert time.sleeps == [0.5] and waits == []
    server.fail("unknown", times=None)  # a wrong model name: refused after the retries
    with pytest.raises(RewardError, match=r"refused the request \(GET .*: HTTP 404 Not Found; its log") as info:
        reward_client(server, time, waits, max_retries=2)
    assert not isinstance(info.value, ServerUnavailableError) and time.sleeps == [0.5, 0.5, 1.0]


def test_transient_server_errors_keep_their_bounded_retries(server):
    time = FakeTime()
    client = reward_client(server, time, max_retries=2)
    server.fail("500", times=None)
    with pytest.raises(RewardError, match="failed 3 times; last error: HTTP 500 Internal Server Error") as info:
        client.score(["p"], ["a"])
    assert not isinstance(info.value, ServerUnavailableError) and time.sleeps == [0.5, 1.0]


def test_the_critic_client_waits_too_and_names_its_own_key(server):
    time, waits = FakeTime(), []
    critic = RemoteCriticClient(
        server.url,
        retry=RetrySettings(unavailable_timeout_s=30),
        on_wait=waits.append,
        sleep=time.sleep,
        clock=time.clock,
    )
    tokens, lengths = np.ones((2, 3)), [3, 2]
    server.fail("loading", times=2)
    values, _ = critic.infer(tokens, lengths).result(timeout=10)
    assert values.shape == (2, 3) and time.sleeps == [0.5, 1.0]
    assert [(w.state, w.server) for w in waits] == [("waiting", "critic server"), ("back", "critic server")]
    # A training step that cannot have been applied (503) is waited for; past the limit, the critic's key.
    server.fail("503", times=1)
    assert critic.train(tokens, lengths, np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 3))) == 0.5
    server.stop()
    with pytest.raises(CriticServerUnavailableError, match=r"critic server .* raise critic.unavailable_timeout_s"):
        critic.infer(tokens, lengths).result(timeout=10)
    critic.close()


def test_a_critic_training_step_that_may_have_been_applied_is_not_retried(server):
    time = FakeTime()
    critic = RemoteCriticClient(server.url, sleep=time.sleep, clock=time.clock)
    server.fail("reset")  # the server went away with the request: it may have trained on it
    with pytest.raises(CriticError, match="not retried: it may have been applied"):
        critic.train(np.ones((1, 2)), [2], np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)))
    assert time.sleeps == []
    critic.close()


def test_closing_the_client_ends_a_wait():
    import threading
    import time as real_time

    server = FlakyServer()
    client = RemoteRewardClient(server.url, retry=RetrySettings(backoff_s=30))  # the real sleep, cut short by close
    server.stop()
    future = client.submit(["p"], ["a"], [{}])
    real_time.sleep(0.1)
    started = real_time.monotonic()
    threading.Timer(0.05, client.close).start()
    with pytest.raises(RewardError, match="closed while"):
        future.result(timeout=10)
    assert real_time.monotonic() - started < 5


def test_a_program_that_ends_while_a_request_waits_exits_at_once():
    """Its client's threads are joined at exit: a wait for a server that is away must not hold the exit up."""
    import subprocess
    import sys
    import time as real_time
    from pathlib import Path

    script = (
        "import time\n"
        "from aligner.rewards.remote import RemoteRewardClient\n"
        "from tests.helpers.flaky_server import FlakyServer\n"
        "server = FlakyServer()\n"
        "client = RemoteRewardClient(server.url)\n"  # waits up to 600 s
        "server.stop()\n"
        "client.submit(['p'], ['a'], [{}])\n"
        "time.sleep(0.2)\n"
        "raise SystemExit(3)\n"  # a crash, or a forgotten close
    )
    started = real_time.monotonic()
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert real_time.monotonic() - started < 30
