"""The dry run (`POST /api/v1/jobs?dry_run=true`): a job's config checked in full, and no job created.

The cheap checks of every submit (webapp/preflight.py: policy, tokenizer, datasets), then the reward on
DRY_RUN_PROMPTS x DRY_RUN_SAMPLES samples in the bounded subprocess of a reward try (webapp/rewards_try.py
`run_try`), which also times a warm decode step of one generation batch of the job's step (`step_batch`), then
`step_time`: an estimate of a step's seconds from that timing. The try and the estimate are skipped when the policy
or tokenizer check failed. A failed check is `"ok": false` in a 200 (PreflightOut); the endpoint stays in
webapp/jobs.py. Beside the checks, `warnings`: settings that pass but are likely to train nothing (webapp/advice.py,
the rules the dashboard's form shows too); they leave `ok` alone. And `memory`: one process's estimated memory for
the job's backend and processes against the worker's device (webapp/memory_plan.py; a job that does not fit is a
422 before any of this). See docs/service.md, "Preflight".

The try runs on the API server's CPU: a worker with a GPU takes less.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from flask import Response, current_app
from sqlalchemy import select

from aligner.config import TrainConfig
from webapp.advice import training_warnings
from webapp.db import CatalogueModel
from webapp.extensions import db
from webapp.limits import try_slot
from webapp.rewards_try import TryFailed, redacted, run_try
from webapp.schemas import PreflightOut

# The dry run's try: small, so it answers in seconds; the estimate comes from its timing of a step's batch.
DRY_RUN_PROMPTS, DRY_RUN_SAMPLES = 2, 2
# Training a step (reference pass, forward and backward) takes about twice its generation on the machines measured
# (docs/performance.md, where a steady SmolLM2 step goes: generate 1.9 s, reference 1.1 s, train 3.4-3.6 s): a rule
# of thumb, not a measure.
TRAIN_TO_GENERATE = 2.0
# The widest batch (rows: prompts x samples) the try times: a wider one, slow on the API's CPU, is taken as costing
# in proportion to its rows, as a batch that wide does once compute, not per-step overhead, sets its pace.
TIMED_ROWS = 64


def step_batch(train: TrainConfig) -> tuple[int, int]:
    """(prompts, samples each) of the generation batch the try times: a step's batch (generation.batch_size counts
    prompts), narrowed to about TIMED_ROWS rows."""
    samples = train.reinforce.num_rollouts_per_prompt
    prompts = min(train.reinforce.num_prompts_per_step, train.generation.batch_size)
    return min(prompts, max(1, TIMED_ROWS // samples)), samples


def estimate_step_s(train: TrainConfig, timings: dict[str, float]) -> float:
    """Seconds a step of `train` may take, from a try's timings of a generation batch (`step_batch`): its first
    token (`batch_start_s`) and a decode step (`decode_step_s`) x the rest of generation.max_new_tokens (a batch
    decodes until its longest response ends: with many samples, often the cap), in proportion to the rows of a
    step's batch when it was narrowed, x the step's batches; scoring scaled by samples from the try's
    (DRY_RUN_PROMPTS x DRY_RUN_SAMPLES); training taken as TRAIN_TO_GENERATE x generation.

    Not the try's own generation scaled by samples: a batch decodes its rows together, so 8x the samples cost far
    less than 8x the time (that scaling put the demo's step at about 5x its measure), and the try's first generation
    pays the cold start."""
    reinforce = train.reinforce
    samples = reinforce.num_prompts_per_step * reinforce.num_rollouts_per_prompt
    prompts = min(reinforce.num_prompts_per_step, train.generation.batch_size)
    timed_prompts, _ = step_batch(train)
    per_batch = timings["batch_start_s"] + timings["decode_step_s"] * (train.generation.max_new_tokens - 1)
    generate = per_batch * prompts / timed_prompts * math.ceil(reinforce.num_prompts_per_step / prompts)
    score = timings["score_s"] * samples / (DRY_RUN_PROMPTS * DRY_RUN_SAMPLES)
    return generate * (1 + TRAIN_TO_GENERATE) + score


def dry_run(
    train: TrainConfig, stored: dict[str, Any], checks: list[dict[str, Any]], memory: dict[str, Any] | None = None
) -> Response:
    """The dry run's answer (PreflightOut, 200) for the resolved `train` config (`stored`: as the API stores it) and
    its cheap `checks` (webapp.preflight.cheap_checks): the reward tried on a few samples and the step time estimated
    from it, both skipped when the policy or tokenizer failed; `memory`, the job's memory estimate
    (webapp/memory_plan.py), passed through."""
    checks = [{key: value for key, value in check.items() if key != "field"} for check in checks]
    warnings = job_warnings(train, stored)
    estimate = None
    if all(check["ok"] for check in checks if check["name"] in ("policy", "tokenizer")):
        release = try_slot()
        start = time.perf_counter()
        try:
            db.close_session()  # no connection held while the try runs
            timeout = current_app.config["TRY_TIMEOUT_S"]
            outcome = run_try(train, DRY_RUN_PROMPTS, DRY_RUN_SAMPLES, timeout, step_batch(train))
        except TryFailed as err:
            reasons = "; ".join(reason for field in redacted(err.errors).values() for reason in field)
            checks.append(_check("reward", False, reasons, start))
            checks.append(_check("step_time", False, "not estimated: the reward try failed", start, 0.0))
        else:
            result = outcome.result
            rewards = ", ".join(f"{sample['reward']:.3g}" for sample in result["samples"])
            warned = f"; warnings: {'; '.join(redacted(result['warnings']))}" if result["warnings"] else ""
            message = f"{len(result['samples'])} samples scored: {rewards}{warned}"
            checks.append(_check("reward", True, message, start))
            estimate = estimate_step_s(train, result["timings"])
            samples = train.reinforce.num_prompts_per_step * train.reinforce.num_rollouts_per_prompt
            message = (
                f"an estimate, not a measure: about {estimate:.1f} s a step for {samples} samples of up to "
                f"{train.generation.max_new_tokens} tokens, from a timed decode step of the step's batch and the "
                "try's scoring (training taken as twice the generation), on the API server's CPU: a worker with a "
                "GPU takes less"
            )
            checks.append(_check("step_time", True, message, start, 0.0))
        finally:
            release()
    else:
        checks.append(_check("reward", False, "not tried: the policy or tokenizer check failed", time.perf_counter()))
    stored = {key: value for key, value in stored.items() if key != "run_dir"}  # a job's run_dir comes with its id
    body = {"ok": all(c["ok"] for c in checks), "checks": checks, "warnings": warnings, "estimated_step_s": estimate,
            "memory": memory, "config": stored}  # fmt: skip
    return current_app.json.response(PreflightOut().dump(body))  # a Response: not dumped again as a JobOut


def job_warnings(train: TrainConfig, stored: dict[str, Any]) -> list[dict[str, str]]:
    """webapp.advice's warnings for the resolved config: the policy's parameter count from its catalogue entry, the
    datasets compared as the files they resolved to (a name and an id of one dataset are the same prompts)."""
    policy = (stored.get("model") or {}).get("policy")
    parameters = db.session.scalar(select(CatalogueModel.num_parameters).where(CatalogueModel.name == policy))
    same = Path(train.data.train_file).resolve() == Path(train.data.val_file).resolve()
    return training_warnings(stored, parameters, same_prompts=same)


def _check(name: str, ok: bool, message: str, start: float, seconds: float | None = None) -> dict[str, Any]:
    elapsed = time.perf_counter() - start if seconds is None else seconds
    return {"name": name, "ok": ok, "message": message, "seconds": elapsed}
