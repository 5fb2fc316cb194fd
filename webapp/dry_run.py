"""The dry run (`POST /api/v1/jobs?dry_run=true`): a job's config checked in full, and no job created.

The cheap checks of every submit (webapp/preflight.py: policy, tokenizer, datasets), then the reward on
DRY_RUN_PROMPTS x DRY_RUN_SAMPLES samples in the bounded subprocess of a reward try (webapp/rewards_try.py
`run_try`), then `step_time`: an estimate of a step's seconds scaled from that try. The try and the estimate are
skipped when the policy or tokenizer check failed. A failed check is `"ok": false` in a 200 (PreflightOut); the
endpoint stays in webapp/jobs.py. Beside the checks, `warnings`: settings that pass but are likely to train nothing
(webapp/advice.py, the rules the dashboard's form shows too); they leave `ok` alone. See docs/service.md,
"Preflight".
"""

from __future__ import annotations

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

# The dry run's try: small, so it answers in seconds; the estimate scales from it.
DRY_RUN_PROMPTS, DRY_RUN_SAMPLES = 2, 2
# Training a step (reference pass, forward and backward) takes about twice its generation on the machines measured
# (docs/performance.md, where a steady SmolLM2 step goes: generate 1.9 s, reference 1.1 s, train 3.4-3.6 s): a rule
# of thumb, not a measure.
TRAIN_TO_GENERATE = 2.0


def estimate_step_s(train: TrainConfig, tried: TrainConfig, timings: dict[str, float]) -> float:
    """Seconds a step of `train` may take, from a try of `tried` (DRY_RUN_PROMPTS x DRY_RUN_SAMPLES): generation
    scaled by samples and by new tokens, scoring by samples, training taken as TRAIN_TO_GENERATE x generation."""
    samples = train.reinforce.num_prompts_per_step * train.reinforce.num_rollouts_per_prompt
    tried_samples = DRY_RUN_PROMPTS * DRY_RUN_SAMPLES
    tokens = max(1, int(timings.get("max_length") or tried.generation.max_new_tokens))
    generate = timings["generate_s"] * samples / tried_samples * train.generation.max_new_tokens / tokens
    score = timings["score_s"] * samples / tried_samples
    return generate * (1 + TRAIN_TO_GENERATE) + score


def dry_run(train: TrainConfig, stored: dict[str, Any], checks: list[dict[str, Any]]) -> Response:
    """The dry run's answer (PreflightOut, 200) for the resolved `train` config (`stored`: as the API stores it) and
    its cheap `checks` (webapp.preflight.cheap_checks): the reward tried on a few samples and the step time estimated
    from it, both skipped when the policy or tokenizer failed."""
    checks = [{key: value for key, value in check.items() if key != "field"} for check in checks]
    warnings = job_warnings(train, stored)
    estimate = None
    if all(check["ok"] for check in checks if check["name"] in ("policy", "tokenizer")):
        release = try_slot()
        start = time.perf_counter()
        try:
            db.close_session()  # no connection held while the try runs
            outcome = run_try(train, DRY_RUN_PROMPTS, DRY_RUN_SAMPLES, current_app.config["TRY_TIMEOUT_S"])
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
            estimate = estimate_step_s(train, outcome.train, result["timings"])
            samples = train.reinforce.num_prompts_per_step * train.reinforce.num_rollouts_per_prompt
            message = (
                f"an estimate, not a measure: about {estimate:.1f} s a step for {samples} samples of up to "
                f"{train.generation.max_new_tokens} tokens, scaled from the try's generation and scoring (training "
                "taken as twice the generation); on the worker's hardware it differs"
            )
            checks.append(_check("step_time", True, message, start, 0.0))
        finally:
            release()
    else:
        checks.append(_check("reward", False, "not tried: the policy or tokenizer check failed", time.perf_counter()))
    stored = {key: value for key, value in stored.items() if key != "run_dir"}  # a job's run_dir comes with its id
    body = {"ok": all(c["ok"] for c in checks), "checks": checks, "warnings": warnings, "estimated_step_s": estimate,
            "config": stored}  # fmt: skip
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
