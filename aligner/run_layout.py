"""Where a run directory keeps its checkpoints: shared by the trainers, which write them, and the service's
worker and ingestor, which read them. Torch-free on purpose, so the worker can import it without loading torch.

    run_dir/checkpoints/step_000012/trainer_state.pt   a complete checkpoint (written as step_000012.tmp, renamed)
    run_dir/checkpoints/step_000012/critic/            PPO: the critic saved with that step
    run_dir/checkpoints/best.json                      the best validation checkpoint
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"
BEST_FILE = "best.json"  # in checkpoints/: {"step", "val/rewards", "path"} of the best checkpoint
CRITIC_DIR = "critic"  # in a checkpoint folder: the critic server's critic_save output


def checkpoint_steps(run_dir: str | Path) -> dict[int, Path]:
    """Complete checkpoints {step: folder}, oldest first: `step_N` folders holding the trainer state (never a
    `.tmp` one, which is a checkpoint still being written)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    found: dict[int, Path] = {}
    if not folder.is_dir():
        return found
    for path in folder.glob("step_*"):
        suffix = path.name.removeprefix("step_")
        if suffix.isdigit() and (path / STATE_FILE).is_file():
            found[int(suffix)] = path
    return dict(sorted(found.items()))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    return list(checkpoint_steps(run_dir).values())


def critic_checkpoint(run_dir: str | Path, step: int | None = None) -> Path | None:
    """The critic saved with checkpoint `step` (default: the newest checkpoint holding one), or None."""
    steps = checkpoint_steps(run_dir)
    folders = ([steps[step]] if step in steps else []) if step is not None else list(reversed(steps.values()))
    for folder in folders:
        if (folder / CRITIC_DIR).is_dir():
            return folder / CRITIC_DIR
    return None


METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
# What the trainer wants its user to know while it runs ("waiting for reward server", a damaged checkpoint skipped):
# one object per line, {"step", "level", "message", ...}; the worker relays each line as a job event.
EVENTS_FILE = "events.jsonl"

FINAL_POLICY_DIR = "final_policy"
ADAPTER_DIR = "adapter"  # in a checkpoint, instead of "policy", with model.lora
MEGATRON_OPTIMIZER_FILE = "megatron_optimizer_rank{rank:05d}.pt"  # model.backend=megatron: one per rank

CRITIC_LOG = "critic_server.log"  # in the run folder, when the critic server is started here
