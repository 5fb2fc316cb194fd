"""The API's process keeps its environment (database and broker credentials) from other processes of its user."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
def test_the_api_process_is_not_dumpable_after_create_app(tmp_path):
    """Run in a child, as it cannot be undone: before create_app the process is dumpable, after it is not (its
    /proc/PID/environ is root's to read), and a reward try it starts (an exec) is an ordinary process again."""
    code = (
        "import ctypes, subprocess, sys\n"
        "get = lambda: ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # 3 = PR_GET_DUMPABLE\n"
        "before = get()\n"
        "from webapp import create_app\n"
        f"create_app({{'DATA_DIR': {str(tmp_path)!r}, 'JOB_QUEUE': object()}})\n"
        "show = 'import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))'\n"
        "child = subprocess.run([sys.executable, '-c', show], capture_output=True, text=True).stdout.strip()\n"
        "print(before, get(), child)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "0", "1"]
