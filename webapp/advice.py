"""Settings that are valid but likely to train nothing, and why: the one place these rules live.

The dry run returns them as its `warnings` (`POST /api/v1/jobs?dry_run=true`, webapp/dry_run.py), so API users get
them too, and the dashboard's New job form shows them as its fields change, before any request (webapp/ui/new_job.py).
A warning never refuses a job. Each is `{"field": dotted path of the job body, "message": why}`:

- the validation prompts are the training prompts: validation then shows recall of the trained prompts, not learning
  (and on the demo the 16 validation prompts are a tenth of the training ones);
- the learning rate is LR_FAR_BELOW times or more under what a policy of its size trains at (TYPICAL_LR): the reward
  barely moves (the demo's 1M-parameter policy at aligner's default 1e-6 went nowhere where its 3e-4 raises it);
- the run ends before its learning-rate warm-up does, or within MIN_STEPS steps: too short for the reward to move.

Nothing here loads a model or reads a file: the caller gives the policy's parameter count (the catalogue's, or the
safetensors headers) and, when it knows, whether the two prompt sets are the same file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aligner.config import OptimConfig, TrainerConfig

# (largest parameter count, the learning rate RL fine-tuning such a policy typically uses): the demo's tiny policy
# trains at 3e-4 (aligner/demo/templates.py), SmolLM2-135M at 1e-5 (configs/), models of billions at 1e-6 (aligner's
# and NeMo-Aligner's default). A rate LR_FAR_BELOW times under the typical one is warned about.
TYPICAL_LR: tuple[tuple[float, float], ...] = ((20e6, 3e-4), (1e9, 1e-5), (float("inf"), 1e-6))
LR_FAR_BELOW = 10
# A run of fewer steps is too short for the reward to move measurably (the demo's rises over tens of steps).
MIN_STEPS = 10

TRAIN_FIELD, VAL_FIELD = "config.data.train_dataset", "config.data.val_dataset"
LR_FIELD, STEPS_FIELD = "config.optim.lr", "config.trainer.max_steps"


def typical_lr(parameters: int) -> float:
    """The learning rate RL fine-tuning typically uses for a policy of `parameters` (TYPICAL_LR)."""
    return next(lr for largest, lr in TYPICAL_LR if parameters <= largest)


def _number(section: Mapping[str, Any] | None, key: str, default: Any) -> float | None:
    """The section's value of `key` as a number (aligner's default when absent); None when it is not a number (the
    submit says what is wrong with it)."""
    value = (section or {}).get(key, default) if isinstance(section, Mapping) else default
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _parameters_text(parameters: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if parameters >= size:
            return f"{parameters / size:.1f}{unit}"
    return str(parameters)


def training_warnings(
    config: Mapping[str, Any], policy_parameters: int | None = None, same_prompts: bool | None = None
) -> list[dict[str, str]]:
    """Why a job of `config` (the job body's config: catalogue names and dataset ids, defaults left out or filled
    in) is likely to train nothing, one warning a rule that fires. `policy_parameters`: the policy's parameter count
    (None: the learning-rate rule is skipped). `same_prompts`: whether the train and validation datasets are one
    file (None: compared as named)."""
    warnings: list[dict[str, str]] = []
    data = config.get("data") if isinstance(config.get("data"), Mapping) else {}
    if same_prompts is None:
        train, val = data.get("train_dataset"), data.get("val_dataset")
        same_prompts = train not in (None, "") and str(train).strip() == str(val).strip()
    if same_prompts:
        warnings.append({
            "field": VAL_FIELD,
            "message": "the validation prompts are the training prompts: validation then shows how the policy does "
            "on prompts it trains on, not whether it learns; pick a held-out prompt file (on the demo, "
            "demo-prompts-val.jsonl for validation and demo-prompts-train.jsonl for training)",
        })  # fmt: skip
    optim, trainer = config.get("optim"), config.get("trainer")
    lr = _number(optim, "lr", OptimConfig.model_fields["lr"].default)
    if lr is not None and policy_parameters:
        typical = typical_lr(policy_parameters)
        if lr * LR_FAR_BELOW <= typical:
            warnings.append({
                "field": LR_FIELD,
                "message": f"learning rate {lr:g} is {typical / lr:.0f}x under the ~{typical:g} a policy of "
                f"{_parameters_text(policy_parameters)} parameters trains at: the reward will barely move",
            })  # fmt: skip
    steps = _number(trainer, "max_steps", TrainerConfig.model_fields["max_steps"].default)
    warmup = _number(optim, "warmup_steps", OptimConfig.model_fields["warmup_steps"].default)
    if steps is not None and warmup is not None and steps <= warmup:
        warnings.append({
            "field": STEPS_FIELD,
            "message": f"the run ends at step {steps:g}, before its learning-rate warm-up ({warmup:g} steps, "
            "optim.warmup_steps) is over: it never trains at the full rate",
        })  # fmt: skip
    elif steps is not None and steps < MIN_STEPS:
        warnings.append({
            "field": STEPS_FIELD,
            "message": f"{steps:g} steps are too few for the reward to move measurably (at least {MIN_STEPS})",
        })  # fmt: skip
    return warnings
