"""aligner/servers/launch.py without a server: the overrides a job may give its critic server, and what the
launcher forces after them (no PyTriton needed)."""

from __future__ import annotations

import os

import pytest

from aligner.errors import ConfigError, ServerStartError
from aligner.servers import launch
from aligner.servers.launch import SAFE_CRITIC_OVERRIDES, check_critic_overrides


def test_safe_overrides_are_fields_of_the_critic_server_and_none_says_where_it_listens_or_writes():
    from aligner.servers.critic_server import CriticServerConfig

    fields = set(CriticServerConfig.model_fields)
    assert fields >= SAFE_CRITIC_OVERRIDES
    unsafe = {"host", "http_port", "grpc_port", "metrics_port", "model_path", "checkpoint", "device", "save_root"}
    assert unsafe <= fields and not unsafe & SAFE_CRITIC_OVERRIDES


def test_check_critic_overrides_refuses_keys_a_job_may_not_set():
    assert check_critic_overrides(["lr=1e-3", " num_threads =1", "betas=[0.9, 0.95]"]) == [
        "lr=1e-3", "num_threads=1", "betas=[0.9, 0.95]"
    ]  # fmt: skip
    assert check_critic_overrides([]) == []
    for item in ("host=0.0.0.0", "http_port=80", "save_root=/", "checkpoint=/etc/passwd", "lr.x=1"):
        key = item.partition("=")[0]
        with pytest.raises(ConfigError, match=rf"'{key}' cannot be set by a job; allowed: .*\blr\b"):
            check_critic_overrides(["lr=1e-3", item])
    with pytest.raises(ConfigError, match="not of the form key=value"):
        check_critic_overrides(["lr"])
    for threads in ("0", str((os.cpu_count() or 1) + 1), "many"):
        with pytest.raises(ConfigError, match="num_threads must be an integer from 1 to"):
            check_critic_overrides([f"num_threads={threads}"])


def test_the_server_listens_on_loopback_and_writes_in_save_root_whatever_the_overrides(monkeypatch, tmp_path):
    started = {}

    class Exited:
        returncode = 1

        def __init__(self, cmd, **kw):
            started.update(cmd=cmd, env=kw["env"])

        def poll(self):
            return 1

    monkeypatch.setattr(launch.subprocess, "Popen", Exited)
    env = {"PATH": os.environ["PATH"]}
    with pytest.raises(ServerStartError, match="exited with status 1"):
        launch.launch_critic_server(
            "model", tmp_path / "log", overrides=["host=0.0.0.0", "save_root=/"], env=env, save_root=tmp_path
        )
    sets = [started["cmd"][i + 1] for i, arg in enumerate(started["cmd"]) if arg == "--set"]
    assert sets[-2:] == ["host=127.0.0.1", f"save_root={tmp_path}"]  # the last --set of a key wins
    assert started["env"] is env
