"""worker/processes.py: the worker keeps itself out of its trainers' reach (the rest is tested with the PPO jobs)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
def test_a_hidden_worker_is_not_dumpable_and_its_trainers_are():
    """Not dumpable: a process of the same user cannot read its /proc/PID/environ (the credentials). Checked in a
    child, as hiding cannot be undone; its own children (an exec) are ordinary again."""
    code = (
        "import ctypes, subprocess, sys\n"
        "from aligner.processes import hide_from_children\n"
        "hide_from_children()\n"
        "get = 'import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))'  # 3 = PR_GET_DUMPABLE\n"
        "child = subprocess.run([sys.executable, '-c', get], capture_output=True, text=True).stdout.strip()\n"
        "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), child)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "1"]
