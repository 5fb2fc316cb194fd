"""The critic server a PPO job gets from its worker, when its config has no `critic.server_url`.

`aligner serve-critic` (aligner/servers/launch.py `launch_critic_server`) from `critic.model_path` with
`critic.server_overrides`, restoring the critic of the checkpoint the trainer resumes from
(`checkpoints/step_N/critic`), output in RUN_DIR/critic_server.log, its process group id in RUN_DIR/critic.pid.
It is confined as the trainer is: the overrides must be SAFE_CRITIC_OVERRIDES (`check_critic_overrides`, else the job
fails at launch), it listens on 127.0.0.1 only, writes (critic_save) only inside RUN_DIR, and gets the minimal
environment (`aligner.processes.minimal_env`), none of the worker's credentials.
It is stopped with its whole process group: SIGTERM, SIGKILL after `Settings.critic_stop_grace`. worker/runner.py
decides when (it starts before the trainer and goes before the job's final status is written, or on any other way
out of the run); worker/processes.py kills one that a SIGKILLed worker left.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aligner.processes import minimal_env
from aligner.run_layout import CRITIC_LOG, critic_checkpoint
from aligner.servers.launch import check_critic_overrides, launch_critic_server, stop_server
from webapp.db import PPO, REINFORCE
from worker.processes import wait_group_gone
from worker.run_files import CRITIC_PID_FILE


@dataclass
class CriticPlan:
    """The critic server a PPO job needs from its worker."""

    model_path: str
    overrides: list[str]
    checkpoint: Path | None  # the critic to restore: the resumed checkpoint's


def critic_plan(config: dict[str, Any], run_dir: Path, resume_step: int | None) -> CriticPlan | None:
    """The critic server the job of resolved `config` needs from its worker; None for a job that needs none (not
    PPO, or its own `critic.server_url`). A ValueError names what is missing or refused (an override a job may not
    set)."""
    section = config.get("critic") or {}
    if config.get("algorithm", REINFORCE) != PPO or section.get("server_url"):
        return None
    if not section.get("model_path"):
        raise ValueError("critic.model_path: a PPO job without critic.server_url needs the critic's model")
    return CriticPlan(
        model_path=str(section["model_path"]),
        overrides=check_critic_overrides([str(item) for item in section.get("server_overrides") or []]),
        checkpoint=critic_checkpoint(run_dir, resume_step) if resume_step is not None else None,
    )


class CriticServer:
    """A running critic server of one run of a job, recorded in RUN_DIR/critic.pid until it is stopped."""

    def __init__(self, run_dir: Path, proc: subprocess.Popen, url: str):
        self.run_dir, self.proc, self.url = run_dir, proc, url

    @classmethod
    def start(
        cls, run_dir: Path, plan: CriticPlan, timeout_s: float, owner: str, env: dict[str, str] | None = None
    ) -> CriticServer:
        """Start it and wait until its models are ready (aligner.errors.ServerStartError when it does not)."""
        proc, url = launch_critic_server(
            plan.model_path,
            run_dir / CRITIC_LOG,
            checkpoint=plan.checkpoint,
            overrides=plan.overrides,
            timeout_s=timeout_s,
            env=minimal_env(env),  # `env`: the job's CUDA_VISIBLE_DEVICES
            save_root=run_dir,
        )
        info = {"host": socket.gethostname(), "pgid": proc.pid, "url": url, "worker": owner}
        (run_dir / CRITIC_PID_FILE).write_text(json.dumps(info))
        return cls(run_dir, proc, url)

    def stop(self, grace_s: float) -> int | None:
        """Stop the whole process group; returns the server's exit status."""
        try:
            stop_server(self.proc, grace_s=grace_s)
            wait_group_gone(self.proc.pid, 10.0)  # the leader is reaped; its group's other processes die with it
        finally:
            with contextlib.suppress(OSError):
                (self.run_dir / CRITIC_PID_FILE).unlink()
        return self.proc.returncode
