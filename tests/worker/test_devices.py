"""GPU leases (worker/devices.py) with fake device ids: no device is held twice, a dead holder frees its devices."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from webapp.settings import service_settings
from worker.devices import DeviceError, acquire_devices, devices_in_use, parse_devices
from worker.settings import Settings


def test_parse_devices():
    assert parse_devices("0,1, 2") == ("0", "1", "2")
    assert parse_devices("") == () and parse_devices(None) == ()
    assert parse_devices("GPU-8a1b,MIG-3c") == ("GPU-8a1b", "MIG-3c")
    with pytest.raises(DeviceError, match="listed twice"):
        parse_devices("0,0")
    with pytest.raises(DeviceError, match="'0;rm' is not a device id"):
        parse_devices("0;rm")


def test_settings_read_the_workers_devices(monkeypatch, tmp_path):
    monkeypatch.setenv("ALIGNER_WORKER_GPUS", "2,3")
    monkeypatch.setenv("ALIGNER_DEVICE_LOCK_DIR", str(tmp_path))
    service_settings.cache_clear()
    settings = Settings.from_env()
    assert settings.gpus == ("2", "3") and settings.device_lock_dir == tmp_path


def test_a_device_is_never_held_twice(tmp_path):
    devices = ("0", "1", "2")
    first = acquire_devices(devices, 2, tmp_path)
    assert first.devices == ("0", "1") and first.visible_devices == "0,1"
    assert acquire_devices(devices, 2, tmp_path) is None  # one left: nothing is held for a partial grant
    assert devices_in_use(devices, tmp_path) == ["0", "1"]
    second = acquire_devices(devices, 1, tmp_path)
    assert second.devices == ("2",)
    assert acquire_devices(devices, 1, tmp_path) is None
    first.release()
    assert acquire_devices(devices, 2, tmp_path).devices == ("0", "1")
    assert acquire_devices(devices, 4, tmp_path) is None  # more than the worker has
    empty = acquire_devices(devices, 0, tmp_path)
    assert empty.devices == () and empty.visible_devices == "" and empty.describe() is None


def test_a_holder_killed_with_sigkill_frees_its_devices(tmp_path):
    """Another process holds device 0 (the locks are the host's, not the process's); once it is SIGKILLed, the
    kernel has dropped its lock and the device can be leased again."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from worker.devices import acquire_devices; "
         f"lease = acquire_devices(('0',), 1, {str(tmp_path)!r}); print(lease is not None, flush=True); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "True"
        assert acquire_devices(("0",), 1, tmp_path) is None
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        deadline = time.monotonic() + 5
        while (lease := acquire_devices(("0",), 1, tmp_path)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease is not None and lease.devices == ("0",)
    finally:
        holder.kill()


@pytest.mark.parametrize(("gpus", "concurrency"), [("", 1), ("0,1,2", 3)])
def test_a_worker_runs_one_job_per_device(gpus, concurrency):
    code = "from worker.celery_app import app; print(app.conf.worker_concurrency)"
    env = {**os.environ, "ALIGNER_WORKER_GPUS": gpus, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert int(out) == concurrency
