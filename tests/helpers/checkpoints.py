"""Checkpoint folders made by hand, committed as the trainer commits its own, and ways of damaging them."""

from __future__ import annotations

import os
from pathlib import Path

from aligner.run_layout import CHECKPOINT_DIR, STATE_FILE, checkpoint_name
from aligner.trainers.checkpoint import commit_checkpoint

FILES = {STATE_FILE: b"state" * 200, "policy/model.safetensors": b"weights" * 300, "config.yaml": b"seed: 1\n"}


def write_checkpoint(run_dir: Path, step: int, files: dict[str, bytes] | None = None, manifest: bool = True) -> Path:
    """`checkpoints/step_N` holding `files` (path -> bytes): with a manifest (`commit_checkpoint`), or without one,
    as an older version wrote it."""
    tmp = Path(run_dir) / CHECKPOINT_DIR / (checkpoint_name(step) + ".tmp")
    for name, data in (FILES if files is None else files).items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    final = tmp.with_name(checkpoint_name(step))
    if manifest:
        commit_checkpoint(tmp, final)
    else:
        os.replace(tmp, final)
    return final


def tear(path: Path) -> None:
    """Cut the file to half its size, as a crash before its data reached the disk can."""
    os.truncate(path, path.stat().st_size // 2)


def flip_byte(path: Path, offset: int = 0) -> None:
    """Change one byte and keep the size: damage only a checksum finds."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
