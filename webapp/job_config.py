"""A job's training config as the API accepts it, and as the worker launches it.

Over the API a job names catalogue entries (webapp/catalogue.py), never a path, URL or code reference:

    model.policy / model.tokenizer     a catalogue model (kind policy; tokenizer: policy or tokenizer)
    data.train_dataset / val_dataset   a dataset the user may use (id, or its name)
    reward.function                    a reward function: a built-in (demo, exact_match, ...) or a registered one,
                                       with reward.function_args, the data a built-in is configured by
    reward.model / reward.server       a catalogue reward model / reward server
    critic.model / critic.server       a catalogue reward or critic model / critic server
    validation.extra_rewards.<name>    a gold reward scoring the validation samples, named as `reward` is: its
                                       .function (with .function_args), .model or .server

Everything else is `aligner train`'s config (aligner/config.py). `validate_job_config` turns the names into the
paths and URLs the trainer reads (`JobConfig.train`) and keeps the names, with every default filled in, as the job's
stored config (`JobConfig.stored`, what the API shows). The worker runs the same code on the stored config before it
launches the trainer (`launch_config`): an entry removed since, a row edited to hold a path or a function, a folder
swapped for a symlink elsewhere, are refused at launch. Errors come as `{"config.optim.lr": ["reason", ...]}`.

`logging.tensorboard` and `logging.mlflow` may be switched on; their files go to the job's run folder, so
`logging.mlflow_tracking_uri` is refused (API_REFUSED) and not shown.

Numbers must be finite and within the operator's limits (`job_limits`: JOB_LIMIT_DEFAULTS, overridden by the env
ALIGNER_JOB_LIMITS, a JSON object, or the app's JOB_LIMITS), and so must what a step costs in all (PRODUCT_LIMITS:
e.g. `per_step.generated_tokens`, prompts x rollouts x max_new_tokens, limited under its name like a field);
`trainer.keep_checkpoints` defaults to DEFAULT_KEEP_CHECKPOINTS; `run_dir` is the server's (DATA_DIR/runs/job_<id>).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from aligner.config import EXTRA_REWARD_NAME, TrainConfig, config_from_dict
from aligner.errors import AlignerError, ConfigError
from aligner.generation.engines import VLLM_EXTRA, vllm_available
from aligner.rewards.builtins import BUILTIN_REWARDS, validate_builtin_params
from aligner.servers.launch import check_critic_overrides
from webapp.catalogue import (
    DATASETS_DIR,
    dataset_file,
    find_dataset,
    find_model,
    find_server,
    reward_target,
    visible_datasets,
)
from webapp.db import ALGORITHMS, CRITIC, POLICY, REWARD, TOKENIZER, CatalogueModel, Dataset, Job, User
from webapp.settings import service_settings, variable_of

# Sizes (and waits) a single job may ask for; an operator changes them with ALIGNER_JOB_LIMITS or the app's JOB_LIMITS.
# Integers are capped at INT64_MAX without a limit here; a float field only when it has one.
JOB_LIMIT_DEFAULTS: dict[str, int] = {
    "trainer.max_steps": 1_000_000,  # lands in a 32-bit column
    "generation.max_new_tokens": 65_536,
    "generation.batch_size": 1024,
    "data.max_prompt_length": 1_048_576,
    "reinforce.num_prompts_per_step": 4096,
    "reinforce.num_rollouts_per_prompt": 256,
    "ppo.num_mini_batches": 1024,
    "optim.micro_batch_size": 1024,
    "reward.batch_size": 1024,
    "model.num_threads": 64,
    "model.lora.r": 1024,  # the adapters' rank: a full-rank update of a 4096-wide layer needs no more than 4096
    "generation.kv_cache_memory_mb": 65_536,  # vLLM's KV cache, reserved at start: 64 GiB
    "trainer.train_samples_to_log": 256,
    "trainer.num_val_prompts": 10_000,
    "trainer.keep_checkpoints": 100,
    "reward.unavailable_timeout_s": 86_400,  # seconds a job waits for a server that went away: a day
    "critic.unavailable_timeout_s": 86_400,
    "validation.extra_rewards": 4,  # how many; each entry's fields have the limits of `reward`'s
    # Products of the fields above (PRODUCT_LIMITS): what a step costs in all, whatever each factor alone.
    "per_step.generated_tokens": 16_777_216,  # 2^24: e.g. 512 prompts x 16 rollouts x 2048 new tokens
    "per_step.sequence_tokens": 33_554_432,  # 2^25 tokens (prompt + response) held for a step's update
    "generation.tokens_in_flight": 4_194_304,  # 2^22 tokens in the KV cache of one generation batch
}


@dataclass(frozen=True)
class ProductLimit:
    """A limit on what a step costs in all: `factors` multiplied, each factor the sum of its fields (the smallest
    of them, with `smallest`), must be at most the limit of this name in `job_limits`."""

    factors: tuple[tuple[str, ...], ...]
    what: str
    smallest: tuple[bool, ...] = ()

    def value(self, config: TrainConfig) -> int:
        total = 1
        for i, fields in enumerate(self.factors):
            values = [_field_value(config, field) for field in fields]
            total *= min(values) if i < len(self.smallest) and self.smallest[i] else sum(values)
        return total

    def fields(self) -> list[str]:
        return list(dict.fromkeys(field for fields in self.factors for field in fields))

    def formula(self) -> str:
        """The rule as its error shows it, e.g. `min(a, b) x c x (d + e)`."""
        shown = []
        for i, fields in enumerate(self.factors):
            if i < len(self.smallest) and self.smallest[i]:
                shown.append(f"min({', '.join(fields)})")
            else:
                shown.append(f"({' + '.join(fields)})" if len(fields) > 1 else fields[0])
        return " x ".join(shown)


_PROMPTS, _ROLLOUTS = "reinforce.num_prompts_per_step", "reinforce.num_rollouts_per_prompt"
_LENGTH = ("data.max_prompt_length", "generation.max_new_tokens")
# Every product rule, in one place: each field is bounded alone (JOB_LIMIT_DEFAULTS), but 4096 prompts x 256 rollouts
# x 65,536 new tokens (2^36 tokens a step) would hold a worker for ever and its memory with it.
PRODUCT_LIMITS = {
    "per_step.generated_tokens": ProductLimit(
        ((_PROMPTS,), (_ROLLOUTS,), ("generation.max_new_tokens",)), "new tokens generated per step"
    ),
    "per_step.sequence_tokens": ProductLimit(((_PROMPTS,), (_ROLLOUTS,), _LENGTH), "tokens held for a step's update"),
    # A generation batch decodes min(batch_size, prompts) prompts x rollouts at once, each up to its whole length.
    "generation.tokens_in_flight": ProductLimit(
        (("generation.batch_size", _PROMPTS), (_ROLLOUTS,), _LENGTH),
        "tokens in the KV cache of one generation batch",
        smallest=(True,),
    ),
}
DEFAULT_KEEP_CHECKPOINTS = 3
INT64_MAX = 2**63 - 1
MAX_REASON_CHARS = 300

# (field over the API, field of aligner's config, what it names)
REFERENCES = (
    ("model.policy", "model.policy_path", "model"),
    ("model.tokenizer", "model.tokenizer_path", "model"),
    ("data.train_dataset", "data.train_file", "dataset"),
    ("data.val_dataset", "data.val_file", "dataset"),
    ("reward.function", "reward.function", "reward function"),
    ("reward.model", "reward.model_path", "model"),
    ("reward.server", "reward.server_url", "server"),
    ("critic.model", "critic.model_path", "model"),
    ("critic.server", "critic.server_url", "server"),
)
MODEL_KINDS_OF = {
    "model.policy": (POLICY,),
    "model.tokenizer": (POLICY, TOKENIZER),
    "reward.model": (REWARD,),
    "critic.model": (REWARD, CRITIC),
}
SERVER_KIND_OF = {"reward.server": REWARD, "critic.server": CRITIC}
# Fields the server fills in from catalogue entries: a request naming them is refused.
SERVER_ONLY = tuple(train for api, train, _ in REFERENCES if api != train) + ("reward.model_name",)
API_NAME_OF = {train: api for api, train, _ in REFERENCES if api != train} | {"reward.model_name": "reward.server"}
# validation.extra_rewards.<name> is a `reward` section: its fields are named, resolved and limited as reward.*'s.
EXTRA_REWARDS = "validation.extra_rewards"
# Fields of aligner's config a job may not set over the API, and why: where a job writes is the server's choice.
API_REFUSED = {
    "logging.mlflow_tracking_uri": "not accepted: a job's MLflow run is kept in its run folder (mlflow.db)",
}
NEEDS_CRITIC = "algorithm: ppo needs a critic: give critic.server or critic.model (the worker starts a critic server)"


class JobRefused(AlignerError, ValueError):
    """A stored job the worker will not launch: its config names what its owner may not use (or no longer can)."""


@dataclass(frozen=True)
class JobConfig:
    train: TrainConfig  # what the trainer reads: server paths and URLs
    stored: dict[str, Any]  # what the job keeps and the API shows: catalogue names, every default


# ------------------------------------------------------------------------------------------------- messages
def _short(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _api_words(text: str) -> str:
    """aligner's messages in the API's field names (reward.server, not reward.server_url)."""
    for train, api in sorted(API_NAME_OF.items(), key=lambda item: -len(item[0])):
        text = text.replace(train, api)
    return text.replace("`aligner train` starts a critic server from", "the worker starts a critic server from")


def _as_reward(field: str) -> tuple[str, str] | None:
    """("validation.extra_rewards.<name>", "reward.<rest>") for a field of an extra reward, else None."""
    prefix, dot, rest = field.partition(f"{EXTRA_REWARDS}.")
    name, dot2, inner = rest.partition(".")
    if prefix or not dot or not dot2:
        return None
    return f"{EXTRA_REWARDS}.{name}", f"reward.{inner}"


def _api_field(field: str) -> str:
    """aligner's field in the API's name (reward.model_path -> reward.model; the same within an extra reward)."""
    as_reward = _as_reward(field)
    if as_reward is not None:
        mapped = API_NAME_OF.get(as_reward[1])
        return f"{as_reward[0]}.{mapped.removeprefix('reward.')}" if mapped else field
    return API_NAME_OF.get(field, field)


def config_errors(err: ConfigError) -> dict[str, list[str]]:
    """`ConfigError` lines (`  optim.lr: reason`) as `{"config.optim.lr": ["reason"]}`, in the API's field names."""
    lines = str(err).splitlines()
    errors: dict[str, list[str]] = {}
    if lines and lines[0].strip() == "invalid config:":
        for line in lines[1:]:
            field, _, reason = line.strip().partition(": ")
            field = _api_field(field)
            key = "config" if field in ("", "config") else f"config.{field}"
            errors.setdefault(key, []).append(_short(_api_words(reason)))
    return errors or {"config": [_short(_api_words(str(err)))]}


# ------------------------------------------------------------------------------------------------- limits
def job_limits(overrides: dict[str, int] | None = None) -> dict[str, int]:
    """JOB_LIMIT_DEFAULTS, then the settings' job_limits (ALIGNER_JOB_LIMITS, a JSON object), then `overrides` (the
    app's JOB_LIMITS)."""
    limits = dict(JOB_LIMIT_DEFAULTS)
    raw = service_settings().job_limits
    if raw:
        env = variable_of("job_limits").name
        try:
            from_env = json.loads(raw)
        except ValueError as err:
            raise ConfigError(f"{env} is not a JSON object: {err}") from None
        if not isinstance(from_env, dict) or not all(isinstance(v, int) for v in from_env.values()):
            raise ConfigError(f'{env} must map fields to integers, e.g. {{"model.num_threads": 8}}')
        limits.update(from_env)
    limits.update(overrides or {})
    return limits


def _walk(value: Any, prefix: str):
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, f"{prefix}.{key}")
    elif isinstance(value, list | tuple):
        for i, child in enumerate(value):
            yield from _walk(child, f"{prefix}.{i}")
    else:
        yield prefix, value


def _extra_rewards_count_error(raw: dict[str, Any], limits: dict[str, int]) -> dict[str, list[str]]:
    """Too many extra rewards, said before any of them is looked up."""
    validation = raw.get("validation")
    extra = validation.get("extra_rewards") if isinstance(validation, dict) else None
    limit = limits.get(EXTRA_REWARDS, INT64_MAX)
    if isinstance(extra, dict) and len(extra) > limit:
        return {f"config.{EXTRA_REWARDS}": [f"at most {limit} extra rewards on this server (got {len(extra)})"]}
    return {}


def limit_errors(config: TrainConfig, limits: dict[str, int]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for field, value in _walk(config.model_dump(), "config"):
        if isinstance(value, bool):
            continue
        as_reward = _as_reward(field.removeprefix("config."))
        limited = as_reward[1] if as_reward else field.removeprefix("config.")  # an extra reward's are reward.*'s
        if isinstance(value, float) and not math.isfinite(value):
            errors.setdefault(field, []).append(f"must be a finite number (got {value})")
        elif isinstance(value, float) and limited in limits:
            limit = limits[limited]
            if value > limit:
                errors.setdefault(field, []).append(f"must be at most {limit} on this server (got {value:g})")
        elif isinstance(value, int):
            limit = limits.get(limited, INT64_MAX)
            if value > limit:
                errors.setdefault(field, []).append(f"must be at most {limit} on this server (got {value})")
            elif value < -limit:
                errors.setdefault(field, []).append(f"must be at least {-limit} (got {value})")
    return errors


def _field_value(config: TrainConfig, dotted: str) -> Any:
    value: Any = config
    for name in dotted.split("."):
        value = getattr(value, name)
    return value


def product_errors(config: TrainConfig, limits: dict[str, int]) -> dict[str, list[str]]:
    """PRODUCT_LIMITS' rules `config` breaks, on the first field of each (the reason names them all and the limit)."""
    errors: dict[str, list[str]] = {}
    for name, rule in PRODUCT_LIMITS.items():
        limit, value = limits.get(name, INT64_MAX), rule.value(config)
        if value > limit:
            errors.setdefault(f"config.{rule.fields()[0]}", []).append(
                f"{rule.formula()} = {value:,} {rule.what}: at most {limit:,} on this server ({name} of the job "
                "limits); lower one of them"
            )
    return errors


# ------------------------------------------------------------------------------------------------- references
def _get(data: dict, dotted: str) -> tuple[dict | None, str]:
    """(the mapping holding field `dotted`, or None, and the field's last name)."""
    *path, name = dotted.split(".")
    node: Any = data
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), name


def _extra_reward_prefixes(data: dict[str, Any]) -> list[str]:
    """`validation.extra_rewards.<name>` of each extra reward in `data` under a name aligner accepts (the others
    fail its validation, naming them)."""
    validation = data.get("validation")
    extra = validation.get("extra_rewards") if isinstance(validation, dict) else None
    if not isinstance(extra, dict):
        return []
    return [
        f"{EXTRA_REWARDS}.{name}"
        for name, entry in extra.items()
        if isinstance(name, str) and EXTRA_REWARD_NAME.fullmatch(name) and isinstance(entry, dict)
    ]


def _references(data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(field over the API, aligner's field, what it names, the REFERENCES field it is named like): REFERENCES', then
    the reward references of each extra reward in `data`."""
    refs = [(api, train, what, api) for api, train, what in REFERENCES]
    for prefix in _extra_reward_prefixes(data):
        for api, train, what in REFERENCES:
            if api.startswith("reward."):
                refs.append((prefix + api.removeprefix("reward"), prefix + train.removeprefix("reward"), what, api))
    return refs


def dataset_ids(stored: dict[str, Any]) -> set[int]:
    """The ids of the datasets a job's stored config names (data.train_dataset, data.val_dataset): what a dataset's
    deletion checks against (webapp/datasets.py)."""
    ids = set()
    for api_field, _train, what, _like in _references(stored):
        section, name = _get(stored, api_field)
        value = section.get(name) if section is not None and what == "dataset" else None
        if isinstance(value, int) and not isinstance(value, bool):
            ids.add(value)
    return ids


def _server_only(data: dict[str, Any]) -> list[str]:
    """SERVER_ONLY's fields, and their like in each extra reward."""
    in_reward = [field.removeprefix("reward") for field in SERVER_ONLY if field.startswith("reward.")]
    extra = [prefix + field for prefix in _extra_reward_prefixes(data) for field in in_reward]
    return list(SERVER_ONLY) + extra


def _not_found(api_field: str, what: str, ref: Any) -> str:
    shown = _short(repr(ref))
    if what == "dataset":
        return f"dataset {shown} not found: give the id (or name) of one of your datasets (GET /api/v1/datasets)"
    listing = {"model": "models", "server": "servers", "reward function": "reward-functions"}[what]
    return f"{what} {shown} not found in the catalogue (GET /api/v1/catalogue/{listing})"


def _resolve_references(
    raw: dict[str, Any], session: Session, user: User, data_dir: Path
) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[str]]]:
    """(aligner config dict, {api field: canonical name}, errors): names looked up for `user`, server-only fields
    refused."""
    data = copy.deepcopy(raw)
    names: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for field in _server_only(data):
        section, name = _get(data, field)
        if section is not None and name in section:
            del section[name]
            errors[f"config.{field}"] = [f"not accepted: name a catalogue entry with {_api_field(field)}"]
    for field, reason in API_REFUSED.items():
        section, name = _get(data, field)
        if section is not None and name in section:
            del section[name]
            errors[f"config.{field}"] = [reason]
    for api_field, train_field, what, like in _references(data):
        section, name = _get(data, api_field)
        if section is None or name not in section:
            continue
        ref = section.pop(name)
        if ref is None:
            continue
        train_name = train_field.rsplit(".", 1)[1]
        if what == "dataset":
            found = find_dataset(session, user, ref, data_dir)
            if found is not None:
                section[train_name], names[api_field] = str(found[1]), found[0].id
        elif what == "model":
            entry = find_model(session, ref, MODEL_KINDS_OF[like])
            if entry is not None:
                section[train_name], names[api_field] = entry.path, entry.name
        elif what == "server":
            entry = find_server(session, ref, SERVER_KIND_OF[like])
            if entry is not None:
                section[train_name], names[api_field] = entry.url, entry.name
                if like == "reward.server":
                    section["model_name"] = entry.model_name
        else:
            found = reward_target(session, ref)
            if found is not None:
                names[api_field], section[train_name] = found
        if api_field not in names:
            errors[f"config.{api_field}"] = [_not_found(api_field, what, ref)]
    return data, names, errors


def _function_args_errors(names: dict[str, Any], data: dict[str, Any]) -> dict[str, list[str]]:
    """Each built-in reward's function_args (`reward`'s, the extra rewards') checked against its parameters
    (normalised in place)."""
    errors: dict[str, list[str]] = {}
    for prefix in ["reward", *_extra_reward_prefixes(data)]:
        name = names.get(f"{prefix}.function")
        reward, _ = _get(data, f"{prefix}.function")
        if reward is None or name not in BUILTIN_REWARDS:
            continue
        try:
            reward["function_args"] = validate_builtin_params(name, reward.get("function_args") or {})
        except ConfigError as err:  # one `reward.function_args.<field>: reason` line per bad parameter
            for line in str(err).splitlines():
                field, _, reason = line.strip().partition(": ")
                field = prefix + field.removeprefix("reward")
                errors.setdefault(f"config.{field}", []).append(_short(reason))
    return errors


def _critic_override_errors(data: dict[str, Any]) -> dict[str, list[str]]:
    critic = data.get("critic") if isinstance(data.get("critic"), dict) else None
    overrides = (critic or {}).get("server_overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(item, str) for item in overrides):
        return {}  # aligner's own validation says what is wrong with the shape
    try:
        check_critic_overrides(overrides)
    except ConfigError as err:
        return {"config.critic.server_overrides": [_short(str(err))]}
    return {}


def _stored(train: TrainConfig, names: dict[str, Any]) -> dict[str, Any]:
    """The config the job keeps: aligner's, every default, with catalogue names in place of paths and URLs."""
    stored = train.model_dump(mode="json")
    for api_field, train_field, _, _ in _references(stored):
        section, api_name = _get(stored, api_field)
        if section is None:
            continue
        section.pop(train_field.rsplit(".", 1)[1], None)
        section[api_name] = names.get(api_field)
    for prefix in ["reward", *_extra_reward_prefixes(stored)]:
        section, _ = _get(stored, f"{prefix}.model_name")
        if section is not None:
            section.pop("model_name", None)
    for field in API_REFUSED:
        section, name = _get(stored, field)
        if section is not None:
            section.pop(name, None)
    return stored


def _dataset_file_allowed(session: Session, user: User, data_dir: Path, path: Path) -> bool:
    """`path` (resolved) is inside DATA_DIR/datasets and is the file of a dataset `user` may use (theirs or shared),
    and of no dataset they may not: a row of theirs edited to name another user's file is refused."""
    if not path.is_relative_to((data_dir / DATASETS_DIR).resolve()):
        return False
    # Rows naming a file of this name (however spelt: ../ and all), then only those that resolve to it.
    named = select(Dataset).where(Dataset.path.endswith(path.name, autoescape=True))
    rows = [row for row in session.scalars(named) if dataset_file(data_dir, row) == path]
    ids = {row.id for row in rows}
    visible = set(session.scalars(select(Dataset.id).where(Dataset.id.in_(ids), visible_datasets(user))))
    return bool(ids) and ids == visible


def confinement_errors(train: TrainConfig, session: Session, user: User, data_dir: Path) -> dict[str, list[str]]:
    """Every path the trainer will read resolves (symlinks too) inside a catalogue model's folder or is the file of a
    dataset `user` may use, inside DATA_DIR/datasets: what the names were turned into is checked once more, against
    the database as it is now, as it will be opened."""
    roots = [Path(path) for path in session.scalars(select(CatalogueModel.path))]
    errors: dict[str, list[str]] = {}
    resolved = train.model_dump()
    for api_field, train_field, what, _ in _references(resolved):
        if what not in ("model", "dataset"):
            continue
        section, name = _get(resolved, train_field)
        value = section.get(name) if section is not None else None
        if value is None:
            continue
        path = Path(value).resolve()
        if what == "dataset":
            inside = _dataset_file_allowed(session, user, data_dir, path)
        else:
            inside = any(path.is_relative_to(root) for root in roots)
        if not inside:
            errors[f"config.{api_field}"] = [_not_found(api_field, what, "(as resolved)")]
    return errors


# ------------------------------------------------------------------------------------------------- the API
def _engine_errors(train: TrainConfig) -> dict[str, list[str]]:
    """generation.engine vllm only where vLLM is installed (checked again by the worker at launch)."""
    if train.generation.engine != "vllm" or vllm_available():
        return {}
    return {
        "config.generation.engine": [f"vllm is not installed on this server (the {VLLM_EXTRA} extra): use torch or hf"]
    }


def validate_job_config(
    raw: dict[str, Any],
    session: Session,
    user: User,
    data_dir: Path,
    run_dir: Path,
    limits: dict[str, int] | None = None,
) -> JobConfig | dict[str, list[str]]:
    """The job's config for the trainer and for the record, or the errors by dotted field (`config.model.policy`)."""
    data_dir = Path(data_dir).resolve()
    algorithm = raw.get("algorithm", "reinforce")
    if algorithm not in ALGORITHMS:
        return {"config.algorithm": [f"must be one of {', '.join(ALGORITHMS)} (got {_short(repr(algorithm))})"]}
    errors = _extra_rewards_count_error(raw, job_limits(limits))
    if errors:
        return errors
    data, names, errors = _resolve_references(raw, session, user, data_dir)
    errors.update(_function_args_errors(names, data))
    errors.update(_critic_override_errors(data))
    data["run_dir"] = str(run_dir)
    trainer = data.get("trainer")
    if isinstance(trainer, dict) and trainer.get("keep_checkpoints") is None:
        trainer["keep_checkpoints"] = DEFAULT_KEEP_CHECKPOINTS
    elif trainer is None:
        data["trainer"] = {"keep_checkpoints": DEFAULT_KEEP_CHECKPOINTS}
    try:
        train = config_from_dict(data, data_dir)
    except ConfigError as err:
        # A name not found is said once: not again as a missing path, nor as its section's "give exactly one of".
        failed_sections = {field.split(".")[1] for field in errors if field.count(".") == 2}
        for field in errors:  # and an extra reward's, as validation.extra_rewards.<name>
            as_reward = _as_reward(field.removeprefix("config."))
            if as_reward is not None and as_reward[1].count(".") == 1:
                failed_sections.add(as_reward[0])
        for field, reasons in config_errors(err).items():
            if field == "config.critic" and any("needs a critic" in reason for reason in reasons):
                reasons = [NEEDS_CRITIC]  # said in the API's terms: catalogue entries, the worker's server
            if field not in errors and field.removeprefix("config.") not in failed_sections:
                errors[field] = reasons
        return errors
    if errors:
        return errors
    limits = job_limits(limits)
    errors = limit_errors(train, limits) or product_errors(train, limits)
    errors |= _engine_errors(train)
    if errors:
        return errors
    errors = confinement_errors(train, session, user, data_dir)
    return errors or JobConfig(train, _stored(train, names))


# ------------------------------------------------------------------------------------------------- the worker
def launch_config(
    session: Session, job: Job, data_dir: Path, run_dir: Path, limits: dict[str, int] | None = None
) -> TrainConfig:
    """The config the worker hands to the trainer: the stored config checked again, for the job's owner, as it is
    now (aligner.errors raised as JobRefused, naming every bad field)."""
    owner = session.get(User, job.user_id)
    stored = dict(job.config or {})
    if owner is None:
        raise JobRefused(f"job {job.id} has no owner")
    try:
        result = validate_job_config(stored, session, owner, data_dir, run_dir, limits)
    except (ValidationError, ConfigError) as err:
        raise JobRefused(f"the job's config is refused: {err}") from None
    if isinstance(result, dict):
        reasons = "; ".join(f"{field}: {', '.join(why)}" for field, why in result.items())
        raise JobRefused(f"the job's config is refused at launch: {reasons}")
    return result.train
