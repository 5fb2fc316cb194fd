"""Pieces of a REINFORCE/PPO checkpoint that are not the trainer's own state: the random-number streams, the
`best.json` pointer to the best-validated checkpoint, and the durable, atomic write both go through.

A checkpoint is written into `step_N.tmp` and committed by `commit_checkpoint`: every file fsync'd, the manifest
(aligner/run_layout.py) written and fsync'd last, the folders fsync'd, the rename to `step_N`, and `checkpoints/`
fsync'd. Without the fsyncs a power cut could leave a `step_N` whose files are torn or empty, since the kernel may
write the rename before the data; the manifest lets a resume find such a folder (and any later damage) and fall
back to the checkpoint before it.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from aligner.durable import fsync_dir, fsync_file, replace_durably, write_text_durably
from aligner.errors import AlignerError
from aligner.run_layout import (
    BEST_FILE,
    CHECKPOINT_DIR,
    MANIFEST_FILE,
    checkpoint_name,
    checkpoint_problem,
    checkpoint_steps,
    make_manifest,
)

DISK_FULL_FREE_BYTES = 1 << 20  # a write failed with less than this free: the disk was full, whatever the error says


def disk_full(err: BaseException, folder: Path) -> bool:
    """Whether `err`, raised writing into `folder`, is a full disk: ENOSPC or EDQUOT anywhere in its chain, or (torch
    and safetensors say only "file write failed") under DISK_FULL_FREE_BYTES left on the folder's filesystem."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(folder).free < DISK_FULL_FREE_BYTES
    except OSError:
        return False


@contextmanager
def writing_checkpoint(tmp: Path, step: int) -> Iterator[None]:
    """Around the writes into `tmp`: on an error the half-written folder is removed (it is never resumed from, but
    it holds the space a full disk needs back), and a full disk is said in words, not as torch's "file write
    failed"; the checkpoints before stay as they were."""
    try:
        yield
    except Exception as err:
        full = disk_full(err, tmp.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            then = (
                "the checkpoints before it are intact: free space on the run folder's disk, then resume the job"
                if checkpoint_steps(tmp.parent.parent)
                else "the job has no checkpoint yet: free space on the run folder's disk, then retry the job"
            )
            # not the error's own text: an OSError names the server's path (the log's traceback has it all)
            raise AlignerError(
                f"the disk is full ({os.strerror(errno.ENOSPC)}): checkpoint step {step} was not saved; {then}"
            ) from err
        raise


def commit_checkpoint(tmp: Path, final: Path) -> None:
    """Make the complete checkpoint folder `tmp` durable, with its manifest, and rename it to `final` (replacing a
    checkpoint of the same step). Every rank's files must be in `tmp` already: the manifest covers what is there."""
    tmp, final = Path(tmp), Path(final)
    manifest = make_manifest(tmp)
    for name in manifest["files"]:
        fsync_file(tmp / name)
    # The manifest is written last: a folder holding it holds everything it lists.
    with (tmp / MANIFEST_FILE).open("w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    # Deepest first, so each folder's entries are on disk before the folder that names it.
    for folder in sorted((p for p in tmp.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        fsync_dir(folder)
    fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    replace_durably(tmp, final)


class UnreadableCheckpoint(Exception):
    """A file of a checkpoint that cannot be loaded (torn or corrupted where no manifest could tell): the resume
    treats the checkpoint as damaged and falls back to the one before."""


@contextmanager
def reading(name: str) -> Iterator[None]:
    """Errors while loading the checkpoint file `name` become `UnreadableCheckpoint`. Not running out of memory,
    nor the user's errors (a checkpoint of another layout): those would fail the checkpoint before as well, and a
    good checkpoint must not be set aside for them."""
    try:
        yield
    except (AlignerError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as err:
        first_line = (str(err).strip().splitlines() or [""])[0][:200]
        raise UnreadableCheckpoint(f"{name}: cannot be loaded ({type(err).__name__}: {first_line})") from err


def best_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the best validation reward (a new best is checkpointed when validated), if it is there
    and intact (verified against its manifest)."""
    pointer = Path(run_dir) / CHECKPOINT_DIR / BEST_FILE
    if not pointer.is_file():
        return None
    path = pointer.parent / json.loads(pointer.read_text())["path"]
    return path if checkpoint_problem(path) is None else None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """`data` as one JSON line in `path`; a reader sees the old file or the new one, never a part, even after a
    power cut."""
    write_text_durably(path, json.dumps(data) + "\n")


def drop_best_after(run_dir: Path, step: int | None, best: dict[str, Any] | None) -> None:
    """After a resume from checkpoint `step` (None: from the beginning), best.json must not name a later checkpoint
    (one set aside as damaged, which the run may write again with other weights): it then names `best`, the resumed
    state's own, or goes."""
    pointer = Path(run_dir) / CHECKPOINT_DIR / BEST_FILE
    try:
        named = int(json.loads(pointer.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if step is not None and named <= step:
        return
    if best is not None:
        write_json_atomic(pointer, {**best, "path": checkpoint_name(best["step"])})
    else:
        pointer.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """This process's torch (CPU and CUDA) and Python random states."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Continue the random streams `rng_state` saved (CUDA's only where CUDA is available)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
