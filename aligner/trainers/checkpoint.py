"""Pieces of a REINFORCE/PPO checkpoint that are not the trainer's own state: the random-number streams, the
`best.json` pointer to the best-validated checkpoint, and the atomic write it goes through."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from aligner.run_layout import BEST_FILE, CHECKPOINT_DIR, STATE_FILE


def best_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the best validation reward (a new best is checkpointed when validated), if any."""
    pointer = Path(run_dir) / CHECKPOINT_DIR / BEST_FILE
    if not pointer.is_file():
        return None
    path = pointer.parent / json.loads(pointer.read_text())["path"]
    return path if (path / STATE_FILE).is_file() else None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """`data` as one JSON line in `path`; a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    tmp.replace(path)


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
