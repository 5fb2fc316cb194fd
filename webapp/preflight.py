"""The cheap checks of a job's config, run on every submit (`POST /jobs`, a reward try, a dry run) before anything
loads a model.

No weights, no torch in the API process; milliseconds: the policy folder holds a config.json that parses into a model
transformers knows (`model_type`, or `architectures`), the tokenizer folder (model.tokenizer, else the policy's)
holds tokenizer files, the dataset files are there. A folder that fails is a 422 on its field
(`config.model.policy`) instead of a tokenizer traceback in the job's log minutes later. The dry run, which adds the
reward and a step-time estimate to these, is webapp/dry_run.py. See docs/service.md, "Preflight".
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import time
from pathlib import Path
from typing import Any

from aligner.config import TrainConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_CONFIG_PAIR = re.compile(r'\(\s*"([\w.-]+)",\s*"\w+Config"\s*\)')


@functools.lru_cache(maxsize=1)
def known_model_types() -> frozenset[str]:
    """The model_types transformers maps to a config class, read from its source (importing it costs seconds and
    torch); empty when that cannot be read, and then any model_type is accepted."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    auto = Path(spec.submodule_search_locations[0]) / "models" / "auto"
    names: set[str] = set()
    for name in ("configuration_auto.py", "auto_mappings.py"):
        try:
            names.update(_CONFIG_PAIR.findall((auto / name).read_text()))
        except OSError:
            continue
    return frozenset(names)


def model_folder_problem(path: str | Path) -> str | None:
    """Why folder `path` is not a Hugging Face model folder, as a predicate ("is not a model folder: ..."), or None."""
    folder = Path(path)
    if not folder.is_dir():
        return "does not exist"
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        return "is not a model folder: no config.json"
    except (OSError, ValueError) as err:
        return f"is not a model folder: config.json does not parse ({type(err).__name__})"
    if not isinstance(config, dict):
        return "is not a model folder: config.json is not a JSON object"
    model_type, architectures = config.get("model_type"), config.get("architectures")
    if not (isinstance(model_type, str) and model_type) and not (
        isinstance(architectures, list) and architectures and all(isinstance(a, str) for a in architectures)
    ):
        return "is not a model folder: config.json names no model_type or architectures"
    known = known_model_types()
    if isinstance(model_type, str) and model_type and known and model_type not in known:
        return f"has a config.json whose model_type {model_type[:100]!r} this server's transformers does not know"
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        return "is not a model folder: no weights (*.safetensors)"
    return None


def tokenizer_folder_problem(path: str | Path) -> str | None:
    folder = Path(path)
    if not folder.is_dir():
        return "does not exist"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return "holds no tokenizer (tokenizer.json or tokenizer_config.json)"
    return None


def cheap_checks(train: TrainConfig, stored: dict[str, Any]) -> list[dict[str, Any]]:
    """[{"name": "policy"|"tokenizer"|"datasets", "ok", "message", "seconds", "field"}] of the resolved `train`
    config (`stored`: the same with catalogue names, for the messages)."""
    model, data = stored.get("model") or {}, stored.get("data") or {}
    checks = []

    def timed(name: str, field: str, run) -> None:
        start = time.perf_counter()
        problem, ok_message = run()
        checks.append(
            {
                "name": name,
                "ok": problem is None,
                "message": problem or ok_message,
                "seconds": time.perf_counter() - start,
                "field": field,
            }
        )

    def policy():
        problem = model_folder_problem(train.model.policy_path)
        where = f"catalogue model {model.get('policy')!r}"  # its name: the folder is the server's own
        return (f"{where} {problem}" if problem else None), f"{where} is a model folder"

    def tokenizer():
        path = train.model.tokenizer_path or train.model.policy_path
        name = model.get("tokenizer") or model.get("policy")
        problem = tokenizer_folder_problem(path)
        where = f"catalogue model {name!r}"
        return (f"{where} {problem}" if problem else None), f"{where} holds a tokenizer"

    def datasets():
        missing = [
            f"dataset {data.get(api)!r}"
            for api, path in (("train_dataset", train.data.train_file), ("val_dataset", train.data.val_file))
            if not Path(path).is_file() or Path(path).stat().st_size == 0
        ]
        if missing:
            return f"{', '.join(missing)}: the file is missing or empty", ""
        return None, "the dataset files are there (checked line by line when uploaded)"

    timed("policy", "config.model.policy", policy)
    timed("tokenizer", "config.model.tokenizer" if train.model.tokenizer_path else "config.model.policy", tokenizer)
    timed("datasets", "config.data.train_dataset", datasets)
    return checks


def check_errors(checks: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The failed checks as the API's `{"config.model.policy": ["reason"]}`."""
    errors: dict[str, list[str]] = {}
    for check in checks:
        if not check["ok"]:
            errors.setdefault(check["field"], []).append(check["message"])
    return errors
