"""`POST /api/v1/rewards/try`: sample a few responses from a job's policy and score them with its reward, before a
job is submitted (`aligner try-reward`, aligner/rewards/trial.py, run for the API).

The config is resolved and checked by the same code as `POST /jobs` (webapp/job_config.py), so a try uses only
what its user may use; a missing `data.val_dataset` defaults to the train dataset. `generation.max_new_tokens` is
capped at TRY_MAX_NEW_TOKENS. The try runs BOUNDED, as the worker runs a trainer: `python -m aligner.cli try-reward
--json` in its own process group, with `aligner.processes.minimal_env()` (none of the API's credentials) and no
GPU, killed after TRY_TIMEOUT_S seconds (app config `TRY_TIMEOUT_S`, 120), its output read up to TRY_MAX_OUTPUT
bytes. A user runs one try at a time in each API process (MAX_TRIES_PER_USER, webapp/limits.py; then 429). A try
runs min(model.num_threads, TRY_MAX_THREADS) torch threads (TRY_NUM_THREADS when unset), and all the tries of an API
process, every user's, share a budget of TRY_THREADS threads (app config; settings' try_threads, the host's cores):
a try that finds it spent gets 503 (`run_try`, so a dry run too).

A reward that raises or returns NaN, inf, non-numbers or the wrong count is a 422 on `reward`; a try past the time
limit is a 422 on `timeout`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apiflask import APIBlueprint
from flask import current_app

from aligner.config import TrainConfig, save_config
from aligner.processes import die_with_parent, minimal_env
from webapp.auth import auth, current_user
from webapp.db import service_redactor
from webapp.errors import abort_fields
from webapp.extensions import db
from webapp.job_config import JobConfig, validate_job_config
from webapp.limits import try_slot
from webapp.preflight import cheap_checks, check_errors
from webapp.schemas import TryIn, TryOut

bp = APIBlueprint("rewards_try", __name__, url_prefix="/api/v1/rewards", tag="Jobs")

TRY_TIMEOUT_S = 120  # default of the app config TRY_TIMEOUT_S
TRY_MAX_NEW_TOKENS = 256
TRY_MAX_OUTPUT = 4 * 1024 * 1024  # bytes of the try's output read back: 64 samples of 256 tokens fit many times
TRY_NUM_THREADS = 2  # torch threads of a try whose config sets none: it shares the API's machine
TRY_MAX_THREADS = 4  # and of one that sets more: a try is a few samples, not worth the API host's every core
TRY_THREADS_EXTENSION = "aligner_try_threads"
MAX_MESSAGE_CHARS = 500
# The try's error types (aligner.errors) and the request field each is about.
ERROR_FIELDS = {
    "RewardError": "reward",
    "RewardServerUnavailableError": "reward",
    "ConfigError": "config",
    "ModelFolderError": "config.model.policy",
    "PromptDataError": "config.data.train_dataset",
}


class TryFailed(Exception):
    """A try that gave no result: `status`, `message` and the API's `errors` by field."""

    def __init__(self, status: int, message: str, errors: dict[str, list[str]]):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors


@dataclass(frozen=True)
class TryOutcome:
    result: dict[str, Any]  # aligner.rewards.trial.try_reward's, "timings" included
    train: TrainConfig  # the config the try ran


class ThreadBudget:
    """Torch threads of the tries running in this API process, all users together (per-user counts are
    webapp/limits.py's): without it, every user's one try at a time adds up to the host's cores many times over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.used = 0

    def acquire(self, threads: int, capacity: int) -> Callable[[], None] | None:
        """A release function for `threads` newly taken (safe to call more than once), or None when fewer than that
        are free of `capacity`."""
        with self._lock:
            if self.used + threads > capacity:
                return None
            self.used += threads
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released, self.used = True, self.used - threads

        return release


def _thread_budget() -> ThreadBudget:
    return current_app.extensions.setdefault(TRY_THREADS_EXTENSION, ThreadBudget())


def try_config(raw: dict[str, Any], user, run_dir: Path) -> JobConfig:
    """`raw` (a job's config) resolved for `user` as `POST /jobs` would (422 naming the fields), val_dataset
    defaulting to the train dataset, then the cheap preflight checks (422 on `config.model.policy`, ...)."""
    raw = copy.deepcopy(raw)
    data = raw.get("data")
    if isinstance(data, dict) and data.get("val_dataset") is None and data.get("train_dataset") is not None:
        data["val_dataset"] = data["train_dataset"]
    result = validate_job_config(
        raw,
        db.session,
        user,
        Path(current_app.config["DATA_DIR"]),
        run_dir,
        current_app.config["JOB_LIMITS"],
    )
    if isinstance(result, dict):
        abort_fields(422, "Invalid config", result)
    errors = check_errors(cheap_checks(result.train, result.stored))
    if errors:
        abort_fields(422, "Invalid config", errors)
    return result


def _bounded(train: TrainConfig, max_threads: int = TRY_MAX_THREADS) -> TrainConfig:
    generation = train.generation
    max_new = min(generation.max_new_tokens, TRY_MAX_NEW_TOKENS)
    capped = generation.model_copy(
        update={"max_new_tokens": max_new, "min_new_tokens": min(generation.min_new_tokens, max_new)}
    )
    threads = max(1, min(train.model.num_threads or TRY_NUM_THREADS, TRY_MAX_THREADS, max_threads))
    model = train.model.model_copy(update={"num_threads": threads})
    return train.model_copy(update={"generation": capped, "model": model})


def _read(path: Path) -> str:
    with path.open("rb") as f:
        return f.read(TRY_MAX_OUTPUT).decode("utf-8", errors="replace")


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def run_try(
    train: TrainConfig,
    num_prompts: int,
    num_samples: int,
    timeout_s: float,
    step_batch: tuple[int, int] | None = None,
) -> TryOutcome:
    """`aligner try-reward --json` on `train` (max_new_tokens and threads capped) in a bounded subprocess, once its
    threads are free of the process's TRY_THREADS (else 503); TryFailed when it gives no result (a reward error, the
    time limit, a crash). `step_batch`: also time a decode step of a batch that wide (--time-step-batch)."""
    capacity = current_app.config["TRY_THREADS"]
    train = _bounded(train, capacity)
    threads = train.model.num_threads
    release = _thread_budget().acquire(threads, capacity)
    if release is None:
        abort_fields(
            503,
            f"The server is running as many reward tries as it allows (all users' tries share {capacity} threads): "
            "try again in a minute",
        )
    try:
        return _run_try(train, num_prompts, num_samples, timeout_s, step_batch)
    finally:
        release()


def _run_try(
    train: TrainConfig, num_prompts: int, num_samples: int, timeout_s: float, step_batch: tuple[int, int] | None
) -> TryOutcome:
    with tempfile.TemporaryDirectory(prefix="aligner-try-") as tmp:
        config_path, out_path, err_path = Path(tmp) / "try.yaml", Path(tmp) / "out", Path(tmp) / "err"
        save_config(train.model_copy(update={"run_dir": str(Path(tmp) / "run")}), config_path)
        command = [sys.executable, "-m", "aligner.cli", "try-reward", "--config", str(config_path), "--json",
                   "--num-prompts", str(num_prompts), "--num-samples", str(num_samples)]  # fmt: skip
        if step_batch is not None:
            command += ["--time-step-batch", *map(str, step_batch)]
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=minimal_env({"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}),  # no credentials, no GPU
                start_new_session=True,  # its own process group: the kill reaches whatever it started
                preexec_fn=die_with_parent,
            )
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if returncode is None:
            reason = (
                f"the try did not finish within {timeout_s:g} s (the server's TRY_TIMEOUT_S): try fewer prompts or "
                "samples, a smaller generation.max_new_tokens, or a faster reward"
            )
            raise TryFailed(422, f"The try took longer than {timeout_s:g} s", {"timeout": [reason]})
        stdout, stderr = _read(out_path), _read(err_path)
    return TryOutcome(interpret(returncode, stdout, stderr), train)


def interpret(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    """The result of `aligner try-reward --json` from its exit status and output, or TryFailed: the error it printed
    as JSON on the field it is about (a RewardError on `reward`), anything else as a failed try."""
    answer = _last_json(stdout)
    if returncode == 0 and isinstance(answer, dict) and "samples" in answer:
        return answer
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        field = ERROR_FIELDS.get(str(error.get("type")), "config")
        message = "The reward does not work" if field == "reward" else "The try failed"
        raise TryFailed(422, message, {field: [_short(error["message"])]})
    current_app.logger.warning("a reward try exited with %s: %s", returncode, stderr[-2000:])
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {returncode}"
    raise TryFailed(422, "The try failed", {"reward": [_short(f"the try stopped with an error: {tail}")]})


def _last_json(text: str) -> Any:
    """The last line of `text` that is JSON (a reward function may print lines of its own first)."""
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    return None


def redacted(value: Any) -> Any:
    """`value` (an answer's errors, a result) with the server's folders, URLs and function targets replaced by
    their catalogue names (`webapp.db.service_redactor`): a try's messages come from the reward and the trainer's
    code, which name what they were given."""
    return service_redactor(db.session, data_dir=current_app.config["DATA_DIR"]).value(value)


def public_result(result: dict[str, Any]) -> dict[str, Any]:
    """The try's result as the API answers it (the timings are for the dry run's estimate, webapp/dry_run.py)."""
    return {key: value for key, value in result.items() if key != "timings"}


@bp.post("/try")
@bp.auth_required(auth)
@bp.input(TryIn, location="json")
@bp.output(TryOut, description="The sampled responses, their rewards, each prompt's statistics and warnings.")
@bp.doc(
    responses={
        422: "A config field is invalid (config.FIELD), the reward fails (reward: what it raised or returned), or "
        "the try passed the server's time limit (timeout)",
        429: "A try of yours is already running",
        503: "The server's reward tries, all users' together, use every thread it allows them: try again later",
    }
)
def try_reward(json_data):
    """Try a reward on a few sampled responses

    Resolves `config` like POST /api/v1/jobs (data.val_dataset may be left out), samples `num_samples` responses to
    each of the first `num_prompts` prompts of data.train_dataset with the config's policy and generation settings
    (generation.max_new_tokens capped at 256; the sampling seed is the config's), scores them with its reward, and
    answers every sample, each prompt's mean, std and whether all its samples got the same reward (RLOO learns
    nothing from such a group), the reward-length correlation and warnings. One try per user at a time (429), at
    most 4 torch threads, and 503 while all users' tries use every thread the server gives them; the try is
    stopped after the server's TRY_TIMEOUT_S (120 s by default): 422 on `timeout`.
    """
    user = current_user()
    resolved = try_config(json_data["config"], user, Path(tempfile.gettempdir()) / "aligner-try")
    release = try_slot()
    try:
        db.close_session()  # no connection held while the try runs
        start = time.perf_counter()
        outcome = run_try(
            resolved.train, json_data["num_prompts"], json_data["num_samples"], current_app.config["TRY_TIMEOUT_S"]
        )
    except TryFailed as err:
        abort_fields(err.status, err.message, redacted(err.errors))
    finally:
        release()
    result = redacted(public_result(outcome.result))
    result["seconds"] = time.perf_counter() - start  # the whole try, the subprocess's start included
    return result
