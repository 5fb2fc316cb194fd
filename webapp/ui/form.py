"""The New job form: its fields, defaults and presets, the POST /jobs body it builds, a 422's errors by field (one
field each), the short advanced YAML of the sections that apply, and what "Try the reward" and the dry run show.

The job names catalogue entries and datasets (model.policy, data.train_dataset, reward.function, ...), never paths:
the drop-downs' choices come from the API (webapp/ui/catalogue.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from aligner.config import ALGORITHM_PRESETS, ALGORITHM_SUMMARIES, ReinforceConfig, TrainConfig, load_yaml
from webapp.advice import training_warnings
from webapp.stack import DEMO_POLICY, DEMO_REWARD_MODEL, DEMO_REWARD_SERVER

# Form field -> (dotted path in the job body, label, kind). Kinds: text, int, float, choice (one of CHOICES),
# catalogue (a drop-down of catalogue names), dataset (a drop-down of dataset ids), json (a JSON object), source
# (which of a section's pickers applies: SOURCES), count (a whole number of the job body outside its config).
FORM_FIELDS: dict[str, tuple[str, str, str]] = {
    "name": ("name", "Job name", "text"),
    "algorithm": ("config.algorithm", "Algorithm", "choice"),
    "reinforce_algorithm": ("config.reinforce.algorithm", "REINFORCE preset", "choice"),
    "policy": ("config.model.policy", "Policy", "catalogue"),
    "tokenizer": ("config.model.tokenizer", "Tokenizer", "catalogue"),
    "backend": ("config.model.backend", "Backend", "choice"),
    "num_processes": ("num_processes", "Processes", "count"),
    "train_dataset": ("config.data.train_dataset", "Train prompts", "dataset"),
    "val_dataset": ("config.data.val_dataset", "Validation prompts", "dataset"),
    "reward_source": ("config.reward", "Reward from", "source"),
    "reward_function": ("config.reward.function", "Reward function", "catalogue"),
    "reward_model": ("config.reward.model", "Reward model (run in the trainer)", "catalogue"),
    "reward_server": ("config.reward.server", "Reward server", "catalogue"),
    "function_args": ("config.reward.function_args", "Reward function arguments (JSON object)", "json"),
    "critic_source": ("config.critic", "PPO: critic from", "source"),
    "critic_model": ("config.critic.model", "PPO: critic model (the worker starts a critic server)", "catalogue"),
    "critic_server": ("config.critic.server", "PPO: critic server", "catalogue"),
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
# A source field -> {its value: the field that then names the entry}; the other pickers are left out of the job.
SOURCES: dict[str, dict[str, str]] = {
    "reward_source": {"function": "reward_function", "model": "reward_model", "server": "reward_server"},
    "critic_source": {"model": "critic_model", "server": "critic_server"},
}
SOURCE_CHOICES: dict[str, list[tuple[str, str]]] = {
    "reward_source": [("reward function", "function"), ("reward model", "model"), ("reward server", "server")],
    "critic_source": [("critic model", "model"), ("critic server", "server")],
}
# Where a form gives a reward or critic, these keys of the advanced YAML give way (the paths and URLs of aligner's
# own config among them: the API refuses those, and the form's pick is what was meant).
SOURCE_KEYS = {
    "reward": ("function", "function_args", "model", "server", "model_path", "server_url", "model_name"),
    "critic": ("model", "server", "model_path", "server_url"),
}
PPO_ONLY = ("critic_source", "critic_model", "critic_server")
REINFORCE_ONLY = ("reinforce_algorithm",)
# The line under the Backend field: when to use which (docs/scaling.md, "Memory: which backend fits").
BACKEND_HELP = (
    "**hf**: the model's training state (about 16 bytes a parameter) fits one device; more processes are data "
    "parallel. **fsdp**: it does not: it is sharded over the processes. **megatron**: tensor/pipeline parallel "
    "(model.tensor_model_parallel_size and model.pipeline_model_parallel_size in the advanced YAML); needs the "
    "megatron extra. The dry run says whether the job fits the worker's memory."
)
JOB_DEFAULTS = {"num_processes": 1}  # webapp/schemas.py JobIn's defaults of the count fields
ALIGNER_KINDS = ("int", "float", "choice")  # the fields that are aligner.config's own, with its defaults


class FormError(ValueError):
    """A form value the dashboard refuses before asking the API; `field` is the form field to blame."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


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


# A choice field offers the values of its Literal in aligner.config (e.g. the algorithms); the REINFORCE preset, the
# keys of aligner.config's ALGORITHM_PRESETS, each shown with its line on what it is for (CHOICE_LABELS).
CHOICES: dict[str, list[str]] = {
    key: list(get_args(config_field(path).annotation))
    for key, (path, _label, kind) in FORM_FIELDS.items()
    if kind == "choice"
}
CHOICES["reinforce_algorithm"] = list(ALGORITHM_PRESETS)
CHOICE_LABELS: dict[str, list[tuple[str, str]]] = {
    "reinforce_algorithm": [(f"{name}: {ALGORITHM_SUMMARIES[name]}", name) for name in ALGORITHM_PRESETS]
}
# The form before a preset is chosen: aligner.config's defaults (the fields without one start empty), and the first
# of each source.
DEFAULTS: dict[str, Any] = {
    **{
        key: default
        for key, (path, _label, kind) in FORM_FIELDS.items()
        if kind in ALIGNER_KINDS and (default := config_default(path)) is not None
    },
    **{key: choices[0][1] for key, choices in SOURCE_CHOICES.items()},
    **JOB_DEFAULTS,
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


def visible_fields(values: dict[str, Any]) -> dict[str, bool]:
    """Which fields apply to the form's values: the picker of each chosen source (the function's arguments with a
    reward function), and the critic's fields for PPO only."""
    shown = {key: True for key in FORM_FIELDS}
    for source, pickers in SOURCES.items():
        for value, key in pickers.items():
            shown[key] = values.get(source) == value
    shown["function_args"] = shown["reward_function"]
    if values.get("algorithm") != "ppo":
        shown.update({key: False for key in PPO_ONLY})
    else:  # PPO has no use for the REINFORCE presets
        shown.update({key: False for key in REINFORCE_ONLY})
    return shown


def json_object(text: Any, field: str = "function_args") -> dict:
    """A JSON object typed in a text box (empty: {}); FormError naming `field` when it is something else."""
    if isinstance(text, dict):
        return text
    if not str(text or "").strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        raise FormError(field, f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise FormError(field, f'must be a JSON object, e.g. {{"tolerance": 0.01}}, not {type(value).__name__}')
    return value


def _form_value(key: str, kind: str, value: Any) -> Any:
    if kind in ("int", "count"):
        return int(value) if float(value).is_integer() else value
    if kind == "float":
        return float(value)
    if kind == "json":
        return json_object(value, key) or None
    if kind == "dataset":  # an id picked, or a name (or id) typed: the API takes either
        value = str(value).strip() if not isinstance(value, int) else value
        return int(value) if isinstance(value, str) and value.isdigit() else value
    return str(value).strip()


def build_job(values: dict[str, Any], advanced_yaml: str = "") -> dict:
    """The POST /jobs body: the advanced YAML (a config mapping) with the form's non-empty fields over it.

    Only the chosen source's picker goes into the job (the function's arguments only with a reward function, a
    critic only for PPO); a reward or critic in the form replaces the YAML's. Raises FormError for a field the
    dashboard can tell is wrong (arguments that are not a JSON object), ValueError when the YAML is not a mapping.
    """
    extra = load_yaml(advanced_yaml or "") or {}
    if not isinstance(extra, dict):
        raise ValueError("the advanced YAML must be a mapping (e.g. `optim: {warmup_steps: 0}`)")
    extra.pop("run_dir", None)  # the server sets it
    shown = visible_fields(values)
    form: dict[str, Any] = {}
    for key, (path, _label, kind) in FORM_FIELDS.items():
        value = values.get(key)
        if kind == "source" or not shown[key] or value is None or (isinstance(value, str) and not value.strip()):
            continue
        value = _form_value(key, kind, value)
        if value is not None:
            _set(form, path, value)
    config = form.get("config", {})
    for section, keys in SOURCE_KEYS.items():
        if section in config and isinstance(extra.get(section), dict):  # one source only: the form's
            extra[section] = {k: v for k, v in extra[section].items() if k not in keys}
    body = {"name": form.get("name", "job"), "config": deep_merge(extra, config)}
    counts = {path: form[path] for path, _label, kind in FORM_FIELDS.values() if kind == "count" and path in form}
    return {**body, **counts}


# An error at a section with no field of its own goes under the one field that stands for it; `reward` is the
# try-reward endpoint's name for the reward itself (its chosen picker: field_errors with the form's values).
SECTION_FIELDS = {"config.model": "policy", "config.data": "train_dataset", "config.algorithm": "algorithm"}
REWARD_ERROR = "reward"


def error_field(path: str, values: dict[str, Any] | None = None) -> str | None:
    """The one form field an error at `path` shows under: the field at the path (a source only at its own path), else
    the deepest field holding it (`config.reward.function_args.tolerance`: the arguments box), else the field that
    stands for its section; None for anything else (a field not on the form: the message lists it)."""
    holders = [
        (len(field_path), key)
        for key, (field_path, _label, kind) in FORM_FIELDS.items()
        if path == field_path or (kind != "source" and path.startswith(field_path + "."))
    ]
    if holders:
        return max(holders)[1]
    if path == REWARD_ERROR:
        source = (values or {}).get("reward_source") or DEFAULTS["reward_source"]
        return SOURCES["reward_source"].get(source, "reward_source")
    return SECTION_FIELDS.get(path)


def field_errors(
    errors: dict[str, list[str]], values: dict[str, Any] | None = None
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """A 422's `errors` -> (reasons by form field, reasons for the rest by dotted path): each error under exactly one
    field (error_field), or in the rest."""
    by_field: dict[str, list[str]] = {}
    other: dict[str, list[str]] = {}
    for path, reasons in (errors or {}).items():
        reasons = reasons if isinstance(reasons, list) else [str(reasons)]
        key = error_field(path, values)
        if key is None:
            other.setdefault(path, []).extend(reasons)
        else:
            by_field.setdefault(key, []).extend(reasons)
    return by_field, other


def per_field_errors(errors: dict[str, list[str]], values: dict[str, Any] | None = None) -> list[str]:
    """Each form field's error line (FORM_FIELDS order; "" for none), as shown under the field."""
    by_field, _other = field_errors(errors, values)
    return ["⚠ " + "; ".join(by_field[key]) if key in by_field else "" for key in FORM_FIELDS]


def errors_markdown(errors: dict[str, list[str]]) -> str:
    """Every error listed with its field: `- **Learning rate** (config.optim.lr): reason`."""
    labels = {path: label for path, label, _kind in FORM_FIELDS.values()} | {REWARD_ERROR: "Reward"}
    lines = []
    for path, reasons in (errors or {}).items():
        label = labels.get(path)
        where = f"**{label}** (`{path}`)" if label else f"`{path}`"
        lines += [f"- {where}: {reason}" for reason in (reasons if isinstance(reasons, list) else [reasons])]
    return "\n".join(lines)


def form_from_config(config: dict) -> dict[str, Any]:
    """Form values from a job config as the API takes it (a preset): the inverse of build_job for the form's
    fields, the sources included."""
    values: dict[str, Any] = {}
    for key, (path, _label, kind) in FORM_FIELDS.items():
        node: Any = {"config": config}
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and kind != "source":
            values[key] = json.dumps(node) if kind == "json" else node
    for source, pickers in SOURCES.items():
        chosen = next((value for value, key in pickers.items() if values.get(key) not in (None, "")), None)
        if chosen is not None:
            values[source] = chosen
    return values


# The demo's folders and files (aligner/demo/) -> the catalogue names `aligner up --demo` registers them under
# (webapp/stack.py register_demo_assets).
DEMO_NAMES = {
    "policy": DEMO_POLICY,
    "reward_model": DEMO_REWARD_MODEL,
    "prompts_train.jsonl": "demo-prompts-train.jsonl",
    "prompts_val.jsonl": "demo-prompts-val.jsonl",
}
DEMO_FUNCTION = "demo"  # the built-in behind aligner.demo:reward


def demo_job_config(config: dict, reward: dict[str, Any] | None = None) -> dict:
    """A demo YAML (aligner's shape: paths) as a job names the demo's catalogue entries (`aligner up --demo`);
    `reward` replaces its reward source."""
    config = copy.deepcopy(config)
    config.pop("run_dir", None)
    model, data = config.setdefault("model", {}), config.setdefault("data", {})
    model["policy"] = DEMO_NAMES["policy"]
    model.pop("policy_path", None)
    model.pop("tokenizer_path", None)
    for field, api_field in (("train_file", "train_dataset"), ("val_file", "val_dataset")):
        file_name = Path(str(data.pop(field, ""))).name
        data[api_field] = DEMO_NAMES.get(file_name, file_name)
    rest = {k: v for k, v in (config.get("reward") or {}).items() if k not in SOURCE_KEYS["reward"]}
    config["reward"] = {**rest, **(reward or {"function": DEMO_FUNCTION})}
    critic = config.get("critic")
    if isinstance(critic, dict) and critic.get("model_path"):
        critic.pop("model_path")
        critic["model"] = DEMO_NAMES["reward_model"]
    return config


def _preset(config: dict, name: str) -> dict[str, Any]:
    """{"form": values, "yaml": the rest of the config} of a job config."""
    form = {**JOB_DEFAULTS, **form_from_config(config), "name": name}
    form.setdefault("backend", DEFAULTS["backend"])
    form.setdefault("reinforce_algorithm", DEFAULTS["reinforce_algorithm"])
    rest = copy.deepcopy(config)
    for path, _label, kind in FORM_FIELDS.values():
        section, _, leaf = path.removeprefix("config.").partition(".")
        if leaf and isinstance(rest.get(section), dict) and kind != "source":
            rest[section].pop(leaf, None)
    rest = {key: value for key, value in rest.items() if value != {} and key != "algorithm"}
    form["algorithm"] = form.get("algorithm") or DEFAULTS["algorithm"]  # a config without one runs aligner's default
    rest = sections_that_apply(rest, form["algorithm"])
    return {"form": form, "yaml": yaml.safe_dump(rest, sort_keys=False) if rest else ""}


# The preset the form starts from; on a demo stack it is the demo's REINFORCE run (DEMO_DEFAULTS).
DEFAULT_PRESET = "defaults"
DEMO_DEFAULTS = "demo tiny model"


def presets(data_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Name -> {"form": values, "yaml": advanced YAML}; every preset names its algorithm. With the demo's configs in
    DATA_DIR/demo_assets, the demo's runs naming the entries `aligner up --demo` puts in the catalogue: REINFORCE
    scored by the demo reward function, or by the demo reward model behind the stack's reward server, and PPO; the
    defaults are then that REINFORCE run (its train and validation prompt files, its learning rate for the tiny
    policy), since aligner's own defaults (no datasets named, lr 1e-6 for models of billions) train that policy
    nothing. Without them, the defaults are aligner's (DEFAULTS)."""
    found: dict[str, dict[str, Any]] = {
        DEFAULT_PRESET: {"form": dict(DEFAULTS), "yaml": advanced_yaml(DEFAULTS["algorithm"])}
    }
    demo = data_dir / "demo_assets" if data_dir else None
    if demo is None:
        return found
    for preset_name, file_name, reward in [
        (DEMO_DEFAULTS, "reinforce.yaml", None),
        ("demo tiny model, reward server", "reinforce.yaml", {"server": DEMO_REWARD_SERVER}),
        ("demo tiny model, PPO", "ppo.yaml", None),
    ]:
        try:
            config = load_yaml((demo / file_name).read_text())
        except (OSError, yaml.YAMLError):  # a half-built or old demo folder: no preset rather than no dashboard
            continue
        if isinstance(config, dict):
            found[preset_name] = _preset(demo_job_config(config, reward), f"demo: {preset_name.removeprefix('demo ')}")
    if DEMO_DEFAULTS in found:
        found[DEFAULT_PRESET] = copy.deepcopy(found[DEMO_DEFAULTS])
    return found


# ---------------------------------------------------------------------------------------------------------------
# The advanced box: a short commented YAML of the knobs people change, for the sections that apply.

PPO_SECTIONS = ("ppo", "critic")  # a REINFORCE job has no use for these
ADVANCED_HEADER = (
    "# Advanced settings, merged under the fields above: this YAML is sent as shown.\n"
    "# The knobs people change most, at aligner's defaults (reinforce: the REINFORCE preset's); any other config key "
    "may be added.\n"
)
# section -> [(leaf, example, why)]: the example and why serve where aligner.config has no such field yet (a
# commented line then); otherwise its default and description are shown.
ADVANCED_KNOBS: dict[str, list[tuple[str, Any, str]]] = {
    "generation": [("top_p", 1.0, "nucleus sampling mass")],
    "optim": [("warmup_steps", 10, "linear warmup steps")],
    "reinforce": [("kl_estimator", "abs", "abs | k1 | k3"), ("baseline", "rloo", "rloo | none")],
    "ppo": [("ratio_eps", 0.2, "clip of the ratio"), ("entropy_bonus", 0.0, "entropy weight")],
    "health": [("pause_on", ["nonfinite", "kl_growth"], "pause the job when one of these alarms fires")],
    "logging": [("tensorboard", True, "also write TensorBoard event files")],
}
ADVANCED_EXAMPLE = (
    "# validation:\n"
    "#   extra_rewards:  # gold rewards, logged at each validation as val/extra_rewards/<name>\n"
    "#     rule: {function: exact_match}\n"
)


def preset_knobs(preset: str) -> dict[str, Any]:
    """Every reinforce knob as REINFORCE preset `preset` sets it (aligner.config resolves it: a knob no preset sets
    keeps its default)."""
    return ReinforceConfig(algorithm=preset).model_dump()


# The reinforce knobs some preset sets: choosing a preset gives these its values, in the form and the advanced box.
PRESET_KNOBS = frozenset(knob for knobs in ALGORITHM_PRESETS.values() for knob in knobs)
# The form's fields that are such knobs (the KL penalty), by their leaf in the reinforce section.
PRESET_FIELDS = {
    key: leaf
    for key, (path, _label, _kind) in FORM_FIELDS.items()
    if path.startswith("config.reinforce.") and (leaf := path.removeprefix("config.reinforce.")) in PRESET_KNOBS
}


def _knob_line(section: str, leaf: str, example: Any, why: str, preset: str) -> tuple[str, bool]:
    """(`  leaf: value  # why`, whether aligner.config knows the field): its default (a reinforce knob: as REINFORCE
    preset `preset` sets it) and description when it does."""
    try:
        field = config_field(f"config.{section}.{leaf}")
    except (KeyError, StopIteration):
        value, known = example, False
    else:
        value, known = config_default(f"config.{section}.{leaf}"), True
        if section == "reinforce":
            value = preset_knobs(preset)[leaf]
        why = (field.description or why).rstrip(".")
    dumped = yaml.safe_dump(value, default_flow_style=True, width=1000).removesuffix("...\n").strip()
    return f"  {leaf}: {dumped}  # {why}", known


def advanced_yaml(algorithm: str, preset: str = "rloo") -> str:
    """The advanced box's YAML for a new job of `algorithm` (REINFORCE: of REINFORCE preset `preset`): the few knobs
    people change (PPO's only for PPO), each at its default (the preset's) with what it does; knobs this aligner does
    not have yet are commented out."""
    parts = [ADVANCED_HEADER]
    for section, knobs in ADVANCED_KNOBS.items():
        if section in PPO_SECTIONS and algorithm != "ppo":
            continue
        if section == "reinforce" and algorithm == "ppo":
            continue
        lines = [_knob_line(section, *knob, preset if preset in ALGORITHM_PRESETS else "rloo") for knob in knobs]
        if all(known for _line, known in lines):
            parts.append(f"{section}:\n" + "".join(f"{line}\n" for line, _known in lines))
        else:
            parts.append(f"# {section}:\n" + "".join(f"# {line}\n" for line, _known in lines))
    parts.append(ADVANCED_EXAMPLE)
    return "".join(parts)


def sections_that_apply(config: dict, algorithm: str) -> dict:
    """`config` less the sections its algorithm does not use (PPO's for a REINFORCE job)."""
    if algorithm == "ppo":
        return config
    return {key: value for key, value in config.items() if key not in PPO_SECTIONS}


def is_template(text: str) -> bool:
    """Whether the advanced box holds nothing or one of its templates, as the form wrote it (no edit to keep)."""
    if not (text or "").strip():
        return True
    return text == advanced_yaml("ppo") or any(text == advanced_yaml("reinforce", p) for p in ALGORITHM_PRESETS)


def advanced_for(algorithm: str, current: str, preset: str = "rloo") -> str:
    """The advanced box after the algorithm changed: the new algorithm's template (REINFORCE: of preset `preset`)
    when the box still holds a template (or nothing), else the user's YAML less the sections that no longer apply
    (unchanged when none)."""
    if is_template(current):
        return advanced_yaml(algorithm, preset)
    try:
        parsed = load_yaml(current)
    except yaml.YAMLError:
        return current  # the submit says what is wrong with it
    if not isinstance(parsed, dict):
        return current
    kept = sections_that_apply(parsed, algorithm)
    if kept == parsed:
        return current
    return yaml.safe_dump(kept, sort_keys=False) if kept else ""


def choose_preset(preset: str, current: str) -> tuple[dict[str, Any], str]:
    """(form field -> value, advanced box) once REINFORCE preset `preset` is chosen: the form's fields that are knobs
    of a preset (PRESET_FIELDS: the KL penalty) and those knobs in the advanced box take the preset's values, so
    the job runs the preset as its paper sets it (the form sends every field it shows, and a knob sent wins over the
    preset). A template box becomes the preset's template; a box the user edited keeps every other key (and its
    text when it names no such knob). Change a knob after choosing the preset to depart from it."""
    knobs = preset_knobs(preset if preset in ALGORITHM_PRESETS else "rloo")
    fields = {key: knobs[leaf] for key, leaf in PRESET_FIELDS.items()}
    if is_template(current):
        return fields, advanced_yaml("reinforce", preset)
    try:
        parsed = load_yaml(current)
    except yaml.YAMLError:
        return fields, current  # the submit says what is wrong with it
    section = parsed.get("reinforce") if isinstance(parsed, dict) else None
    if not isinstance(section, dict) or not set(section) & (PRESET_KNOBS | {"algorithm"}):
        return fields, current
    section = {key: knobs[key] if key in PRESET_KNOBS else value for key, value in section.items()}
    section.pop("algorithm", None)  # the form's field says which preset
    return fields, yaml.safe_dump({**parsed, "reinforce": section}, sort_keys=False)


# ---------------------------------------------------------------------------------------------------------------
# Try the reward (POST /rewards/try) and the dry run (POST /jobs?dry_run=true): request bodies and what is shown.

TRY_PROMPTS = (1, 8, 4)  # (min, max, default) of the try's prompts, as the API takes them
TRY_SAMPLES = (2, 8, 4)
TRY_GROUP_COLUMNS = ["group", "prompt", "mean", "spread (std)", "n", "note"]
TRY_SAMPLE_COLUMNS = ["group", "prompt", "response", "reward", "length"]


def try_body(values: dict[str, Any], advanced_yaml_text: str, num_prompts: Any, num_samples: Any) -> dict:
    """The POST /rewards/try body: the config the form would submit, and how many prompts and samples each."""

    def clamp(value: Any, bounds: tuple[int, int, int]) -> int:
        low, high, default = bounds
        try:
            return min(high, max(low, int(value)))
        except (TypeError, ValueError):
            return default

    return {
        "config": build_job(values, advanced_yaml_text)["config"],
        "num_prompts": clamp(num_prompts, TRY_PROMPTS),
        "num_samples": clamp(num_samples, TRY_SAMPLES),
    }


def _number(value: Any, decimals: int = 3) -> float | None:
    try:
        return None if value is None else round(float(value), decimals)
    except (TypeError, ValueError):
        return None


def try_tables(result: dict) -> tuple[Any, Any]:
    """A try's result -> (groups: one row per prompt with its mean, spread and a zero-spread mark; samples: prompt |
    response | reward | length, a prompt's samples together, the prompt on the first of them)."""
    import pandas as pd

    from webapp.ui.samples import ZERO_SPREAD, clean_text, cut

    samples = sorted(result.get("samples") or [], key=lambda s: s.get("group", 0))  # stable: the order of each group
    counts: dict[Any, int] = {}
    for sample in samples:
        counts[sample.get("group")] = counts.get(sample.get("group"), 0) + 1
    groups = [
        [g.get("group"), cut(clean_text(g.get("prompt")), 160), _number(g.get("mean")), _number(g.get("std")),
         counts.get(g.get("group"), 0), ZERO_SPREAD if g.get("zero_spread") else ""]
        for g in result.get("groups") or []
    ]  # fmt: skip
    rows, seen = [], set()
    for sample in samples:
        group = sample.get("group")
        prompt = "" if group in seen else cut(clean_text(sample.get("prompt")), 160)
        seen.add(group)
        rows.append([group, prompt, cut(clean_text(sample.get("response")), 400), _number(sample.get("reward")),
                     sample.get("length")])  # fmt: skip
    return pd.DataFrame(groups, columns=TRY_GROUP_COLUMNS), pd.DataFrame(rows, columns=TRY_SAMPLE_COLUMNS)


def try_summary(result: dict) -> str:
    """A try's numbers in one line (samples, time, reward-length correlation, zero-spread share), then its warnings."""
    samples, groups = result.get("samples") or [], result.get("groups") or []
    zero = sum(1 for g in groups if g.get("zero_spread"))
    corr, frac = _number(result.get("reward_length_corr"), 2), result.get("frac_zero_std_groups")
    share = f"{float(frac):.0%}" if isinstance(frac, int | float) else "?"
    seconds = result.get("seconds")
    took = f"{float(seconds):.1f} s" if isinstance(seconds, int | float) else "?"
    line = (
        f"**{len(samples)} samples** of {len(groups)} prompts in {took} · reward-length correlation "
        f"**{'n/a' if corr is None else corr}** · zero-spread groups **{share}** ({zero} of {len(groups)})"
    )
    warnings = [f"- ⚠ {w}" for w in result.get("warnings") or []]
    said = any("zero spread" in w for w in result.get("warnings") or [])
    if zero and zero == len(groups) and not said:
        line += "\n\n**Every group has zero spread: RLOO gets no learning signal from this reward.**"
    return "\n".join([line, "", *warnings]).strip()


def warnings_markdown(warnings: list[dict[str, str]]) -> str:
    """Warnings (webapp/advice.py) one line each, with the field's label: `- ⚠ **Learning rate**: why`."""
    labels = {path: label for path, label, _kind in FORM_FIELDS.values()}
    lines = []
    for warning in warnings:
        path = str(warning.get("field", ""))
        where = labels.get(path) or f"`{path}`"
        lines.append(f"- ⚠ **{where}**: {warning.get('message', '')}")
    return "\n".join(lines)


def form_warnings(values: dict[str, Any], advanced_yaml_text: str, lists: dict[str, Any] | None) -> str:
    """What the form shows while it is filled in: why its job is likely to train nothing (webapp/advice.py, as the
    dry run says), the policy's size from the catalogue lists; "" when nothing is, or when the form does not build
    yet (the submit says why)."""
    try:
        config = build_job(values, advanced_yaml_text)["config"]
    except (ValueError, yaml.YAMLError):
        return ""
    parameters = ((lists or {}).get("parameters") or {}).get(values.get("policy"))
    warnings = training_warnings(config, parameters)
    if not warnings:
        return ""
    return "**This job is likely to train nothing:**\n\n" + warnings_markdown(warnings)


def memory_markdown(memory: dict | None) -> str:
    """The dry run's memory estimate as one line: what one process needs against the worker's device; "" without
    one."""
    if not isinstance(memory, dict) or not isinstance(memory.get("needed_bytes"), int | float):
        return ""
    processes = memory.get("world_size", 1)
    plural = "es" if processes != 1 else ""
    per = "all processes together" if memory.get("device_shared") else "per process"
    return (
        f"Estimated memory: **{memory['needed_bytes'] / 1e9:.2f} GB {per}** with backend {memory.get('backend')} on "
        f"{processes} process{plural}, of the worker's {memory.get('device_bytes', 0) / 1e9:.1f} GB "
        f"({memory.get('device_source')})"
    )


def dry_run_markdown(result: dict) -> str:
    """A dry run's checks, one line each (`✓ policy: message (0.01 s)`), its warnings, the estimated step time and
    the memory estimate."""
    verdict = "ready to submit" if result.get("ok") else "not ready"
    warnings = result.get("warnings") or []
    noted = f" (with {len(warnings)} warning{'s' if len(warnings) > 1 else ''})" if warnings else ""
    lines = [f"**Dry run: {verdict}**{noted}", ""]
    for check in result.get("checks") or []:
        mark = "✓" if check.get("ok") else "✗"
        seconds = check.get("seconds")
        took = f" ({float(seconds):.2f} s)" if isinstance(seconds, int | float) else ""
        lines.append(f"- {mark} **{check.get('name')}**: {check.get('message', '')}{took}")
    if warnings:
        lines += ["", "Likely to train nothing:", "", warnings_markdown(warnings)]
    step_s = result.get("estimated_step_s")
    if isinstance(step_s, int | float):
        lines += ["", f"Estimated step time: **{float(step_s):.1f} s** (an estimate from a short try)"]
    if memory := memory_markdown(result.get("memory")):
        lines += ["", memory]
    return "\n".join(lines)


def refusal_markdown(what: str, status: int, message: str, errors: dict[str, list[str]] | None) -> str:
    """An API refusal as shown on the form: `**Not submitted** (422): message`, then each field's reasons (those that
    only repeat the message left out)."""
    listed = errors_markdown({path: [r for r in (reasons if isinstance(reasons, list) else [reasons]) if r != message]
                              for path, reasons in (errors or {}).items()})  # fmt: skip
    head = f"**{what}** ({status}): {message}" if status else f"**{what}**: {message}"
    return f"{head}\n\n{listed}" if listed else head
