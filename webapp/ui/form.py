"""The New job form: its fields, defaults and presets, the POST /jobs body it builds, and a 422's errors by field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from aligner.config import TrainConfig, load_config

# Form field -> (dotted path in the job body, label, kind). Kinds: text, int, float, choice (one of CHOICES).
FORM_FIELDS: dict[str, tuple[str, str, str]] = {
    "name": ("name", "Job name", "text"),
    "algorithm": ("config.algorithm", "Algorithm", "choice"),
    "critic_model_path": ("config.critic.model_path", "PPO: critic model (reward-model folder on the server)", "text"),
    "policy_path": ("config.model.policy_path", "Policy (Hugging Face folder on the server)", "text"),
    "train_file": ("config.data.train_file", "Train prompts (JSONL)", "text"),
    "val_file": ("config.data.val_file", "Validation prompts (JSONL)", "text"),
    "reward_server_url": ("config.reward.server_url", "Reward server URL", "text"),
    "reward_function": ("config.reward.function", "or reward function (module:callable)", "text"),
    "num_prompts_per_step": ("config.reinforce.num_prompts_per_step", "Prompts per step", "int"),
    "num_rollouts_per_prompt": ("config.reinforce.num_rollouts_per_prompt", "Rollouts per prompt", "int"),
    "kl_penalty": ("config.reinforce.initial_policy_kl_penalty", "KL penalty", "float"),
    "lr": ("config.optim.lr", "Learning rate", "float"),
    "max_steps": ("config.trainer.max_steps", "Max steps", "int"),
    "max_new_tokens": ("config.generation.max_new_tokens", "Max new tokens", "int"),
    "temperature": ("config.generation.temperature", "Temperature", "float"),
    "val_check_interval": ("config.trainer.val_check_interval", "Validation interval (steps)", "int"),
    "save_interval": ("config.trainer.save_interval", "Checkpoint interval (steps)", "int"),
}


def config_field(path: str) -> FieldInfo:
    """The aligner.config field at a path of the job body, e.g. `config.reinforce.num_prompts_per_step`."""
    *sections, leaf = path.removeprefix("config.").split(".")
    model: type[BaseModel] = TrainConfig
    for name in sections:
        annotation = model.model_fields[name].annotation
        candidates = (annotation, *get_args(annotation))  # an optional section, `RewardConfig | None`: its model
        model = next(c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel))
    return model.model_fields[leaf]


def config_default(path: str) -> Any:
    """aligner.config's default of a field (see config_field); None when it has none."""
    field = config_field(path)
    return None if field.is_required() else field.get_default(call_default_factory=True)


# A choice field offers the values of its Literal in aligner.config (e.g. the algorithms).
CHOICES: dict[str, list[str]] = {
    key: list(get_args(config_field(path).annotation))
    for key, (path, _label, kind) in FORM_FIELDS.items()
    if kind == "choice"
}
# The form before a preset is chosen: aligner.config's defaults (the fields without one start empty).
DEFAULTS: dict[str, Any] = {
    key: default
    for key, (path, _label, _kind) in FORM_FIELDS.items()
    if path.startswith("config.") and (default := config_default(path)) is not None
}


def _set(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def deep_merge(base: dict, over: dict) -> dict:
    """`over` merged into a copy of `base` (nested dicts merged, anything else replaced)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def build_job(values: dict[str, Any], advanced_yaml: str = "") -> dict:
    """The POST /jobs body: the advanced YAML (a config mapping) with the form's non-empty fields over it.

    A reward server URL in the form replaces any reward source of the YAML, and so does a reward function.
    Raises ValueError (naming the problem) when the YAML is not a mapping.
    """
    extra = yaml.safe_load(advanced_yaml or "") or {}
    if not isinstance(extra, dict):
        raise ValueError("the advanced YAML must be a mapping (e.g. `optim: {warmup_steps: 0}`)")
    extra.pop("run_dir", None)  # the server sets it
    form: dict[str, Any] = {}
    for key, (path, _label, kind) in FORM_FIELDS.items():
        value = values.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if kind == "int":
            value = int(value) if float(value).is_integer() else value
        elif kind == "float":
            value = float(value)
        else:
            value = str(value).strip()
        _set(form, path, value)
    config = form.get("config", {})
    if "reward" in config:  # one source only: the form's replaces the YAML's
        extra["reward"] = {
            k: v for k, v in extra.get("reward", {}).items() if k not in ("function", "model_path", "server_url")
        }
    return {"name": form.get("name", "job"), "config": deep_merge(extra, config)}


def field_errors(errors: dict[str, list[str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """A 422's `errors` -> (reasons by form field, reasons for the rest by dotted path).

    An error belongs to a field when its path is the field's, inside it, or a section holding it (e.g.
    `config.reward`, "give exactly one of ...", goes to both reward fields); the root `config` is not a section here.
    """
    by_field: dict[str, list[str]] = {}
    other: dict[str, list[str]] = {}
    for path, reasons in errors.items():
        reasons = reasons if isinstance(reasons, list) else [str(reasons)]
        owners = [
            key
            for key, (field_path, _label, _kind) in FORM_FIELDS.items()
            if path == field_path
            or path.startswith(field_path + ".")
            or (path != "config" and field_path.startswith(path + "."))
        ]
        for key in owners:
            by_field.setdefault(key, []).extend(reasons)
        if not owners:
            other.setdefault(path, []).extend(reasons)
    return by_field, other


def errors_markdown(errors: dict[str, list[str]]) -> str:
    """Every error listed with its field: `- **Learning rate** (config.optim.lr): reason`."""
    labels = {path: label for path, label, _kind in FORM_FIELDS.values()}
    lines = []
    for path, reasons in errors.items():
        label = labels.get(path)
        where = f"**{label}** (`{path}`)" if label else f"`{path}`"
        lines += [f"- {where}: {reason}" for reason in (reasons if isinstance(reasons, list) else [reasons])]
    return "\n".join(lines)


def form_from_config(config: dict) -> dict[str, Any]:
    """Form values from a config mapping (a preset): the inverse of build_job for the form's fields."""
    values: dict[str, Any] = {}
    for key, (path, _label, _kind) in FORM_FIELDS.items():
        node: Any = {"config": config}
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            values[key] = node
    return values


def presets(data_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Name -> {"form": values, "yaml": advanced YAML}. The demo tiny model when DATA_DIR/demo_assets has it."""
    found: dict[str, dict[str, Any]] = {"defaults": {"form": dict(DEFAULTS), "yaml": ""}}
    demo = data_dir / "demo_assets" / "reinforce.yaml" if data_dir else None
    if demo is not None and demo.is_file():
        try:
            config = load_config(demo).model_dump(mode="json")  # paths made absolute against the YAML's folder
        except Exception:  # a half-built or old demo folder: no preset rather than no dashboard
            config = None
        if config is not None:
            config.pop("run_dir", None)
            form = {**form_from_config(config), "name": "demo: tiny policy"}
            rest = copy.deepcopy(config)
            for path, _label, _kind in FORM_FIELDS.values():
                section, _, leaf = path.removeprefix("config.").partition(".")
                if leaf and isinstance(rest.get(section), dict):
                    rest[section].pop(leaf, None)
            found["demo tiny model"] = {"form": form, "yaml": yaml.safe_dump(rest, sort_keys=False)}
    return found
