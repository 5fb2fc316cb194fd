"""The catalogue as the dashboard shows it: the New job form's drop-down choices (models, reward functions, servers
and datasets, labelled for people, valued as the API names them) and the Catalogue tab's tables and actions (admins).

Everything comes from the API (GET /catalogue/..., GET /datasets); nothing here reads the server's disk. The API
decides who may do what: a non-admin's register or remove comes back as a 403, shown as such. A removal is asked
first (`removal_question`): it says what goes and what becomes of the jobs that name the entry.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pandas as pd

from webapp.ui.api import Api, ApiError

# The API's kinds (webapp/db.py MODEL_KINDS and SERVER_KINDS; a test keeps them equal).
MODEL_KINDS = ("policy", "reward", "critic", "tokenizer")
SERVER_KINDS = ("reward", "critic")
# Drop-down of the New job form -> (catalogue list, kinds it offers). critic.model takes a reward model too: the
# worker starts the critic from it. A tokenizer is the policy's own unless one is picked.
MODEL_PICKS = {
    "policy": ("policy",),
    "tokenizer": ("policy", "tokenizer"),
    "reward_model": ("reward",),
    "critic_model": ("reward", "critic"),
}
SERVER_PICKS = {"reward_server": "reward", "critic_server": "critic"}
DATASET_PICKS = ("train_dataset", "val_dataset")
OWN_TOKENIZER = ("(the policy's own)", "")
# The Catalogue tab's "remove" choices -> the API's list.
ENTRY_LISTS = {"model": "models", "reward function": "reward-functions", "server": "servers"}
# What a removal leaves alone, by kind: the API deletes the catalogue row only.
LEFT_ALONE = {
    "model": "Its folder on the server is left alone.",
    "reward function": "Its code is left alone.",
    "server": "The server itself keeps running.",
}

MODEL_COLUMNS = ["name", "kind", "architecture", "parameters", "size", "description", "path"]
FUNCTION_COLUMNS = ["name", "built-in", "description", "target"]
# The reward functions' column widths: the description wraps in the widest, so the target stays on screen.
FUNCTION_WIDTHS = ("16%", "9%", "45%", "30%")
SERVER_COLUMNS = ["name", "kind", "model name", "description", "url"]
DATASET_COLUMNS = ["id", "name", "prompts", "size", "shared", "yours"]


# ------------------------------------------------------------------------------------------------- labels
def human_count(n: int | None) -> str:
    """1234567 -> "1.2M"; 950 -> "950"."""
    if n is None:
        return "?"
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def human_bytes(n: int | None) -> str:
    """4812345 -> "4.8 MB" (powers of 1000, as disks are sold)."""
    if n is None:
        return "?"
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def model_label(model: dict, with_kind: bool = False) -> str:
    """The drop-down label `tiny-sft — LlamaForCausalLM, 1.2M params, 4.8 MB` (the kind too where kinds mix)."""
    facts = [model.get("architecture") or "?"]
    if model.get("num_parameters") is not None:
        facts.append(f"{human_count(model['num_parameters'])} params")
    facts.append(human_bytes(model.get("size_bytes")))
    if with_kind:
        facts.append(model["kind"])
    return f"{model['name']} — {', '.join(facts)}"


def dataset_label(dataset: dict) -> str:
    """The drop-down label `train.jsonl (120 prompts, shared)`: shared, yours, or both."""
    whose = [word for word, flag in (("yours", dataset.get("mine")), ("shared", dataset.get("shared"))) if flag]
    return f"{dataset['name']} ({dataset['num_prompts']} prompts, {', '.join(whose) or 'visible to you'})"


def function_label(function: dict) -> str:
    return f"{function['name']} — {'built-in' if function.get('builtin') else 'registered'}"


def server_label(server: dict) -> str:
    return f"{server['name']} — {server['description']}" if server.get("description") else server["name"]


# ------------------------------------------------------------------------------------------------- the form
def form_choices(api: Api) -> dict[str, Any]:
    """Each drop-down's [(label, value)] (value: an entry's name, a dataset's id), "functions": each reward
    function's {builtin, description, params} (for the help under the arguments box), and "parameters": each
    model's parameter count by name (for the form's warnings, webapp/advice.py)."""
    models = api.get("/catalogue/models")["items"]
    functions = api.get("/catalogue/reward-functions")["items"]
    servers = api.get("/catalogue/servers")["items"]
    datasets = api.get_all("/datasets")
    choices: dict[str, Any] = {}
    for key, kinds in MODEL_PICKS.items():
        choices[key] = [(model_label(m, len(kinds) > 1), m["name"]) for m in models if m["kind"] in kinds]
    choices["tokenizer"] = [OWN_TOKENIZER, *choices["tokenizer"]]
    for key, kind in SERVER_PICKS.items():
        choices[key] = [(server_label(s), s["name"]) for s in servers if s["kind"] == kind]
    for key in DATASET_PICKS:
        choices[key] = [(dataset_label(d), d["id"]) for d in datasets]
    choices["reward_function"] = [(function_label(f), f["name"]) for f in functions]
    choices["parameters"] = {m["name"]: m.get("num_parameters") for m in models}  # for the form's warnings
    choices["functions"] = {
        f["name"]: {"builtin": f.get("builtin", False), "description": f.get("description", ""),
                    "params": f.get("params") or {}}
        for f in functions
    }  # fmt: skip
    return choices


def choices_summary(choices: dict[str, Any]) -> str:
    counts = {
        "policies": len(choices.get("policy", [])),
        "datasets": len(choices.get("train_dataset", [])),
        "reward functions": len(choices.get("reward_function", [])),
        "reward models": len(choices.get("reward_model", [])),
        "reward servers": len(choices.get("reward_server", [])),
        "critic servers": len(choices.get("critic_server", [])),
    }
    return "From the catalogue: " + " · ".join(f"{what}: {n}" for what, n in counts.items())


def pick(choices: list, wanted: Any) -> Any:
    """The value among `choices` that `wanted` names: a value itself, or the newest (first) whose label starts with
    the name `wanted` (a preset names datasets, the drop-downs hold ids); `wanted` unchanged if none does."""
    values = [value for _label, value in choices]
    if wanted in values or wanted in (None, ""):
        return wanted
    for label, value in choices:
        if isinstance(wanted, str) and label.startswith(f"{wanted} ("):
            return value
    return wanted


def _param_type(schema: dict) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_param_type(option) for option in schema["anyOf"])
    return str(schema.get("type", "any"))


def function_help(functions: dict[str, dict], name: str | None) -> str:
    """Markdown for the reward function picked: what it does and the keys its arguments may have."""
    info = functions.get(name or "")
    if info is None:
        return ""
    lines = [f"**{name}**: {info['description']}" if info["description"] else f"**{name}**"]
    if not info["builtin"]:
        lines.append("A registered function: the arguments are passed to it as keyword arguments, unchecked.")
        return "\n\n".join(lines)
    params = info["params"].get("properties", {})
    required = set(info["params"].get("required", []))
    if not params:
        lines.append("It takes no arguments: leave the box empty.")
        return "\n\n".join(lines)
    items = []
    for key, schema in params.items():
        extra = "required" if key in required else f"default {json.dumps(schema.get('default'))}"
        items.append(f"- `{key}` ({_param_type(schema)}; {extra}): {schema.get('description', '')}")
    return "\n\n".join([*lines, "Arguments (a JSON object):\n" + "\n".join(items)])


# ------------------------------------------------------------------------------------------------- the tab
def tables(api: Api) -> dict[str, pd.DataFrame]:
    """The Catalogue tab's tables: models, reward functions, servers, and the datasets the admin sees."""
    models = api.get("/catalogue/models")["items"]
    functions = api.get("/catalogue/reward-functions")["items"]
    servers = api.get("/catalogue/servers")["items"]
    datasets = api.get_all("/datasets")
    return {
        "models": pd.DataFrame(
            [[m["name"], m["kind"], m["architecture"], human_count(m.get("num_parameters")),
              human_bytes(m.get("size_bytes")), m.get("description") or "", m.get("path") or ""] for m in models],
            columns=MODEL_COLUMNS,
        ),
        "functions": pd.DataFrame(
            [[f["name"], bool(f.get("builtin")), f.get("description") or "", f.get("target") or ""]
             for f in functions],
            columns=FUNCTION_COLUMNS,
        ),
        "servers": pd.DataFrame(
            [[s["name"], s["kind"], s["model_name"], s.get("description") or "", s.get("url") or ""]
             for s in servers],
            columns=SERVER_COLUMNS,
        ),
        "datasets": pd.DataFrame(
            [[d["id"], d["name"], d["num_prompts"], human_bytes(d.get("size_bytes")), bool(d.get("shared")),
              bool(d.get("mine"))] for d in datasets],
            columns=DATASET_COLUMNS,
        ),
    }  # fmt: skip


def empty_tables() -> dict[str, pd.DataFrame]:
    columns = {"models": MODEL_COLUMNS, "functions": FUNCTION_COLUMNS, "servers": SERVER_COLUMNS,
               "datasets": DATASET_COLUMNS}  # fmt: skip
    return {key: pd.DataFrame(columns=cols) for key, cols in columns.items()}


def _text(value: Any) -> str:
    return str(value or "").strip()


def register_model(api: Api, name: str, path: str, kind: str, description: str = "") -> str:
    body = {"name": _text(name), "path": _text(path), "kind": _text(kind), "description": _text(description)}
    entry = api.post("/catalogue/models", body)
    return f"Registered model **{entry['name']}**: {model_label(entry, with_kind=True)}."


def register_reward_function(api: Api, name: str, target: str, description: str = "") -> str:
    body = {"name": _text(name), "target": _text(target), "description": _text(description)}
    entry = api.post("/catalogue/reward-functions", body)
    return f"Registered reward function **{entry['name']}** (`{entry.get('target')}`)."


def register_server(api: Api, name: str, url: str, kind: str, model_name: str = "", description: str = "") -> str:
    body = {"name": _text(name), "url": _text(url), "kind": _text(kind), "description": _text(description)}
    if _text(model_name):
        body["model_name"] = _text(model_name)
    entry = api.post("/catalogue/servers", body)
    return f"Registered {entry['kind']} server **{entry['name']}** at {entry.get('url')}."


def removal_question(what: str, name: str) -> str:
    """The question Remove asks before removing entry `name` of kind `what`: what goes and what becomes of the jobs
    that name it (every launch, a resume or retry included, checks the job's names again: webapp/job_config.py
    `launch_config`)."""
    return (
        f"**Remove {what} {_text(name)} from the catalogue?** New jobs can no longer name it, and jobs that name it "
        "are refused when they next start (queued ones, a resume, a retry); running jobs go on and finished ones "
        f"keep their results. {LEFT_ALONE[what]}"
    )


def remove_entry(api: Api, what: str, name: str) -> str:
    if what not in ENTRY_LISTS:
        raise ApiError(422, f"remove what? one of {', '.join(ENTRY_LISTS)}")
    if not _text(name):
        raise ApiError(422, "give the name of the entry to remove", {"name": ["missing"]})
    api.delete(f"/catalogue/{ENTRY_LISTS[what]}/{quote(_text(name), safe='')}")
    return f"Removed {what} **{_text(name)}** from the catalogue."


def share_dataset(api: Api, dataset_id: Any, shared: bool) -> str:
    try:
        number = int(dataset_id)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise ApiError(422, "give the id of the dataset (a number from 1)", {"id": ["missing"]})
    dataset = api.patch(f"/datasets/{number}", {"shared": bool(shared)})
    state = "shared with every user" if dataset["shared"] else "its owner's only"
    return f"Dataset {dataset['id']} (**{dataset['name']}**) is now {state}."
