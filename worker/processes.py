"""This host's processes, by process group and through /proc: the worker starts each trainer and critic server in a
session of its own, so one group id reaches the process and all its children.

A worker killed with SIGKILL can leave them running: the trainer normally dies with it (PR_SET_PDEATHSIG), the
critic server does not. The next run of the job on this host, or a recovery sweep on this host, kills what the pid
files of the run directory name, but only after /proc shows the process still is that trainer or server (never an
unrelated process that reused the id).

The worker itself is kept out of its trainers' reach (`aligner.processes.hide_from_children`): they run as its user.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from worker.run_files import CRITIC_PID_FILE, JOB_CONFIG_FILE, TRAINER_PID_FILE

log = logging.getLogger(__name__)


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to a process group known by its id; False when the group no longer exists.

    (aligner.processes.signal_group does the same for a Popen when whether the group still existed does not matter.)
    """
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("no permission to signal process group %d", pgid)
        return False


def wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds until no process of group `pgid` is left; False when one still is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not kill_group(pgid, 0):
            return True
        time.sleep(0.05)
    return False


def _live_processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, [state, ppid, pgrp, ...]) of each live process of this host, from /proc (zombies, dead already, are
    left out)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces and parentheses
        if len(fields) > 2 and fields[0] != "Z":
            yield int(proc.name), fields


def group_members(pgid: int) -> list[int]:
    """Live processes of this host in process group `pgid`."""
    return [pid for pid, fields in _live_processes() if fields[2] == str(pgid)]


def child_pids(parent: int | None = None) -> list[int]:
    """Live children of `parent` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    return [pid for pid, fields in _live_processes() if fields[1] == str(parent)]


def cmdline(pid: int) -> str:
    """The command line of process `pid`, arguments joined by spaces; "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_leftover_trainer(run_dir: Path) -> None:
    """Kill a trainer that a lost worker on this host left running in `run_dir` (from its trainer.pid file).

    Linux's PDEATHSIG normally kills it with its worker; this also covers other platforms' leftovers only when
    /proc shows the process is still that trainer.
    """
    path = run_dir / TRAINER_PID_FILE
    try:
        info = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int):
        return
    if str(run_dir / JOB_CONFIG_FILE) not in cmdline(pid):  # "" when the process is gone
        return
    log.warning("killing trainer process group %d left running in %s by a lost worker", pid, run_dir)
    kill_group(pid, signal.SIGKILL)
    wait_group_gone(pid, 10.0)


def kill_leftover_critic(run_dir: Path) -> bool:
    """Kill a critic server that a lost worker on this host left running for `run_dir` (from its critic.pid file).

    Only a process group that still is that server is killed: its leader runs `serve-critic`, or (the leader gone)
    a member runs Triton. True when one was killed.
    """
    path = Path(run_dir) / CRITIC_PID_FILE
    try:
        info = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return False
    pgid = info.get("pgid")
    if info.get("host") != socket.gethostname() or not isinstance(pgid, int) or pgid <= 1:
        return False
    killed = False
    members = group_members(pgid)
    leader = cmdline(pgid) if pgid in members else ""
    if ("serve-critic" in leader) or (not leader and any("triton" in cmdline(pid) for pid in members)):
        log.warning("killing critic server process group %d left running for %s by a lost worker", pgid, run_dir)
        kill_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        killed = True
    with contextlib.suppress(OSError):
        path.unlink()
    return killed
