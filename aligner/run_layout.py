"""Where a run directory keeps its checkpoints and says how the run ended: shared by the trainers, which write them,
and the service's worker and ingestor, which read them. Torch-free on purpose, so the worker can import it without
loading torch.

    run_dir/checkpoints/step_000012/trainer_state.pt   a complete checkpoint (written as step_000012.tmp, renamed)
    run_dir/checkpoints/step_000012/critic/            PPO: the critic saved with that step
    run_dir/checkpoints/step_000012/manifest.json      size and CRC-32 of every other file, written last
    run_dir/checkpoints/step_000010.damaged/           a checkpoint that failed verification, set aside
    run_dir/checkpoints/best.json                      the best validation checkpoint (by trainer.best_metric)
    run_dir/best_policy/                               its policy as a Hugging Face folder
    run_dir/end.json                                   how the run ended (`RunEnd`), written once at its end

Every file of a checkpoint is fsync'd, then its manifest, then the folder, before the rename
(`aligner.trainers.checkpoint.commit_checkpoint`): a `step_N` folder is complete unless the disk lost or changed
data afterwards. `resume_checkpoint` checks that against the manifest and skips a damaged newest checkpoint for the
one before, so a crash (or a bad disk) costs the steps since that one instead of the whole resume. A folder without
a manifest was written by an older version and counts as intact.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from aligner.durable import CHECKSUM, file_checksum, replace_durably, write_text_durably

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"
BEST_FILE = "best.json"  # in checkpoints/: {step, <trainer.best_metric>: value, path} of the best checkpoint
CRITIC_DIR = "critic"  # in a checkpoint folder: the critic server's critic_save output
MANIFEST_FILE = "manifest.json"  # in a checkpoint folder: {"checksum": "crc32", "files": {path: {"size", "crc32"}}}
DAMAGED_SUFFIX = ".damaged"  # step_N.damaged: set aside by resume_checkpoint; never listed, pruned or resumed


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint of `step` in checkpoints/."""
    return f"step_{step:06d}"


def checkpoint_steps(run_dir: str | Path) -> dict[int, Path]:
    """Complete checkpoints {step: folder}, oldest first: `step_N` folders holding the trainer state (never a
    `.tmp` one, which is a checkpoint still being written, nor a `.damaged` one). Nothing is verified here: see
    `resume_checkpoint`."""
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


def checkpoint_files(folder: str | Path) -> list[str]:
    """The files of a checkpoint folder but its manifest, as sorted paths relative to it."""
    folder = Path(folder)
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE
    )


def make_manifest(folder: str | Path) -> dict:
    """What `checkpoint_problem` checks the folder against later: each file's size and checksum as they are now."""
    folder = Path(folder)
    files = {}
    for name in checkpoint_files(folder):
        path = folder / name
        files[name] = {"size": path.stat().st_size, CHECKSUM: file_checksum(path)}
    return {"checksum": CHECKSUM, "files": files}


def checkpoint_problem(folder: str | Path) -> str | None:
    """None when the checkpoint folder is intact, else a short reason ("trainer_state.pt: 1234 bytes, manifest says
    5678"). Reads every file in full (the checksums); sizes are compared first, so a torn file is found at once."""
    folder = Path(folder)
    if not (folder / STATE_FILE).is_file():
        return f"{STATE_FILE}: missing"
    if not (folder / MANIFEST_FILE).exists():
        return None  # written before checkpoints had manifests: nothing to check against
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        entries = sorted((str(name), int(e["size"]), e.get(CHECKSUM)) for name, e in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{MANIFEST_FILE}: unreadable ({type(err).__name__}: {err})"
    for name, size, _ in entries:
        try:
            actual = (folder / name).stat().st_size
        except FileNotFoundError:
            return f"{name}: missing"
        if actual != size:
            return f"{name}: {actual} bytes, manifest says {size}"
    for name, _, checksum in entries:
        if checksum is None:
            continue
        try:
            actual = file_checksum(folder / name)
        except OSError as err:
            return f"{name}: unreadable ({err.strerror or err})"
        if actual != checksum:
            return f"{name}: {CHECKSUM} {actual}, manifest says {checksum}"
    return None


def set_aside(folder: str | Path) -> Path:
    """Rename a damaged checkpoint `step_N` to `step_N.damaged` (replacing an older one of that name): kept for a
    look, out of every listing, and out of the way of the trainer writing step N again."""
    folder = Path(folder)
    aside = folder.with_name(folder.name + DAMAGED_SUFFIX)
    shutil.rmtree(aside, ignore_errors=True)
    replace_durably(folder, aside)
    return aside


def resume_checkpoint(run_dir: str | Path) -> tuple[int | None, Path | None, list[tuple[int, str]]]:
    """(step, folder) of the newest intact checkpoint ((None, None) when there is none), and the (step, reason) of
    each newer one that is damaged, newest first. Those are set aside (`set_aside`), so the trainer and the worker
    resuming agree, and pruning and best.json never pick them. The service's worker calls it before it launches
    the trainer (to prune what comes after the step chosen), and the trainer with `--resume`: both choose alike."""
    skipped: list[tuple[int, str]] = []
    for step, folder in reversed(checkpoint_steps(run_dir).items()):
        problem = checkpoint_problem(folder)
        if problem is None:
            return step, folder, skipped
        set_aside(folder)
        skipped.append((step, problem))
    return None, None, skipped


def damaged_message(step: int, reason: str, resume_step: int | None) -> str:
    """The warning for a damaged checkpoint skipped, the same from the trainer and from the worker."""
    where = f"step {resume_step}" if resume_step is not None else "the beginning"
    return f"checkpoint step {step} is damaged ({reason}): resuming from {where}"


METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
# What the trainer wants its user to know while it runs ("waiting for reward server", a damaged checkpoint skipped):
# one object per line, {"step", "level", "message", ...}; the worker relays each line as a job event.
EVENTS_FILE = "events.jsonl"
# logging.tensorboard / logging.mlflow (aligner/trainers/tracking.py): event files, the default MLflow store and the
# id of the run's MLflow run, which a resume continues.
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DB_FILE = "mlflow.db"
MLFLOW_RUN_ID_FILE = "mlflow_run_id"

FINAL_POLICY_DIR = "final_policy"
BEST_POLICY_DIR = "best_policy"  # the best checkpoint's policy, exported as final_policy is (written when it is saved)
ADAPTER_DIR = "adapter"  # in a checkpoint, instead of "policy", with model.lora
MEGATRON_OPTIMIZER_FILE = "megatron_optimizer_rank{rank:05d}.pt"  # model.backend=megatron: one per rank

CRITIC_LOG = "critic_server.log"  # in the run folder, when the critic server is started here


# How a run ended, written once by the trainer when its loop ends (`write_end`) and read by the service's worker
# (`read_end`), which decides the job's state from it. One of:
COMPLETED = "completed"  # its last step done, or trainer.stop_at_value reached: final_policy/ is written
MAX_TIME = "max_time"  # trainer.max_time was up: stopped at a step boundary with a checkpoint; --resume continues
STOPPED = "stopped"  # asked to stop (SIGTERM, a first Ctrl-C, a cancel): stopped at a step boundary with a checkpoint
SERVER_UNAVAILABLE = "server_unavailable"  # a reward or critic server stayed away past its unavailable_timeout_s
FAILED = "failed"  # an error ended the loop (the message says which)
END_REASONS = (COMPLETED, MAX_TIME, STOPPED, SERVER_UNAVAILABLE, FAILED)
# {"end": reason, "step": last completed step, "total_steps": the run's length, "message": for the user}. A launch
# killed outright (SIGKILL, the OOM killer), or failing before its loop starts, leaves none: the trainer removes the
# record of an earlier launch as it starts, and the worker before it launches one.
END_FILE = "end.json"


@dataclass(frozen=True)
class RunEnd:
    end: str  # one of END_REASONS
    step: int
    total_steps: int
    message: str = ""


def write_end(run_dir: str | Path, record: RunEnd) -> None:
    """Write the run's end record (atomically and durably: a reader sees all of it or nothing)."""
    if record.end not in END_REASONS:
        raise ValueError(f"unknown end {record.end!r}: one of {', '.join(END_REASONS)}")
    write_text_durably(Path(run_dir) / END_FILE, json.dumps(asdict(record)) + "\n")


def read_end(run_dir: str | Path) -> RunEnd | None:
    """The run's end record; None when there is none, or it cannot be read as one (then nothing was said)."""
    try:
        data = json.loads((Path(run_dir) / END_FILE).read_text())
        record = RunEnd(str(data["end"]), int(data["step"]), int(data["total_steps"]), str(data.get("message", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if record.end in END_REASONS else None


def clear_end(run_dir: str | Path) -> None:
    """Remove an earlier launch's end record: a launch starting says nothing yet."""
    (Path(run_dir) / END_FILE).unlink(missing_ok=True)
