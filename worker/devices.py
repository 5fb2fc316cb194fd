"""GPU leases: which of this host's devices a job's run holds, so that no device ever serves two jobs at once.

A worker is told its devices with `ALIGNER_WORKER_GPUS=0,1,2,3` (empty or unset: none, CPU only); Celery then runs
as many jobs at once as it has devices (worker/celery_app.py). A job asks for `num_gpus`; its run takes that many
free devices before it takes the job's lease, and holds them until the run ends; the trainer sees exactly them as
CUDA_VISIBLE_DEVICES (a job with none sees an empty CUDA_VISIBLE_DEVICES and runs on the CPU).

A device is held with an exclusive `flock` on DEVICE_LOCK_DIR/gpu-<id>.lock: every worker process of the host sees
the same locks, and the kernel drops a lock the moment its holder dies, even by SIGKILL, so a lost worker never
leaves a device taken. The lock folder must be local to the host (ALIGNER_DEVICE_LOCK_DIR; default in the system's
temporary folder): device ids are per host, and flock over a network file system is not to be trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from aligner.errors import AlignerError


class DeviceError(AlignerError, ValueError):
    """A malformed ALIGNER_WORKER_GPUS."""


def parse_devices(text: str | None) -> tuple[str, ...]:
    """`"0,1, 2"` -> ("0", "1", "2"); empty or None -> (). Ids are what CUDA_VISIBLE_DEVICES takes (indices or
    GPU-/MIG- UUIDs); each once."""
    ids = tuple(part.strip() for part in (text or "").split(",") if part.strip())
    bad = [i for i in ids if not all(c.isalnum() or c in "-_:" for c in i)]
    if bad:
        raise DeviceError(f"ALIGNER_WORKER_GPUS: {bad[0]!r} is not a device id (expected e.g. 0,1,2,3)")
    if len(set(ids)) != len(ids):
        raise DeviceError(f"ALIGNER_WORKER_GPUS: a device is listed twice in {text!r}")
    return ids


def default_lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"aligner-devices-{os.getuid()}"


@dataclass
class DeviceLease:
    """Devices held by this process until `release()` (or its death)."""

    devices: tuple[str, ...] = ()
    _files: list = field(default_factory=list, repr=False)

    @property
    def visible_devices(self) -> str:
        """The value of CUDA_VISIBLE_DEVICES for the trainer."""
        return ",".join(self.devices)

    def describe(self) -> str | None:
        """`host:0,1`, as stored in the job's row, or None without devices."""
        return f"{socket.gethostname()}:{self.visible_devices}" if self.devices else None

    def release(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        self._files.clear()
        self.devices = ()

    def __enter__(self) -> DeviceLease:
        return self

    def __exit__(self, *_exc) -> None:
        self.release()


def acquire_devices(devices: tuple[str, ...], count: int, lock_dir: Path | None = None) -> DeviceLease | None:
    """Hold `count` of `devices` that no other process holds, or None when fewer are free (nothing is held then).
    `count` 0 gives an empty lease."""
    if count <= 0:
        return DeviceLease()
    if count > len(devices):
        return None
    lock_dir = Path(lock_dir or default_lock_dir())
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    held = DeviceLease()
    for device in devices:
        f = (lock_dir / f"gpu-{device}.lock").open("a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        held._files.append(f)
        held.devices += (device,)
        if len(held.devices) == count:
            return held
    held.release()
    return None


def devices_in_use(devices: tuple[str, ...], lock_dir: Path | None = None) -> list[str]:
    """Which of `devices` some process of this host holds now (for messages and tests)."""
    lock_dir = Path(lock_dir or default_lock_dir())
    busy = []
    for device in devices:
        path = lock_dir / f"gpu-{device}.lock"
        if not path.exists():
            continue
        with path.open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
            except BlockingIOError:
                busy.append(device)
    return busy
