"""Catalogue entries for tests: `api_config` turns an `aligner train` config (paths, URLs, module:callable) into the
config a job keeps, registering what it names as an admin would and copying its prompt files into the user's
datasets, so that tests written with paths run jobs through the catalogue."""

from __future__ import annotations

import copy
import hashlib
import shutil
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aligner.rewards.builtins import builtin_for_target
from webapp.catalogue import DATASETS_DIR
from webapp.db import CatalogueModel, Dataset, RewardFunction, ServerEndpoint, User

# (section, aligner's field, the API's field, model kind or what it is)
PATHS = (
    ("model", "policy_path", "policy", "policy"),
    ("model", "tokenizer_path", "tokenizer", "tokenizer"),
    ("reward", "model_path", "model", "reward"),
    ("critic", "model_path", "model", "critic"),
)


def _name(prefix: str, value: str) -> str:
    return f"{prefix}-{hashlib.sha256(value.encode()).hexdigest()[:12]}"


def stand_in_model(folder: Path) -> Path:
    """A folder that passes the API's cheap checks (webapp/preflight.py) without weights worth loading: a Llama
    config.json, an empty safetensors file and a tokenizer config."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


def register_model(session: Session, path: str | Path, kind: str, name: str | None = None) -> str:
    """A catalogue row for folder `path` (no checks: test folders may be stand-ins); its name."""
    path = str(Path(path).resolve())
    name = name or _name(kind, path)
    if session.scalar(select(CatalogueModel.id).where(CatalogueModel.name == name)) is None:
        session.add(CatalogueModel(name=name, kind=kind, path=path, architecture="test", size_bytes=0))
        session.flush()
    return name


def add_dataset(
    session: Session, user: User, source: str | Path, data_dir: Path, shared: bool = False, name: str | None = None
) -> int:
    """A copy of prompt file `source` as a dataset of `user` in DATA_DIR/datasets (user_ID/, or shared/ for a shared
    one, out of the way of tests that look at what uploads left); its id."""
    folder = Path(data_dir) / DATASETS_DIR / ("shared" if shared else f"user_{user.id}")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{_name('ds', str(Path(source).resolve()))}.jsonl"
    if not target.exists():
        shutil.copyfile(source, target)
    row = Dataset(
        user_id=user.id,
        name=name or Path(source).name,
        path=str(target.relative_to(data_dir)),
        num_prompts=sum(1 for line in target.read_text().splitlines() if line.strip()),
        size_bytes=target.stat().st_size,
        shared=shared,
    )
    session.add(row)
    session.flush()
    return row.id


def api_config(session: Session, user: User, config: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """`config` (aligner's shape) as a job over the API names it; the entries it needs are registered."""
    config = copy.deepcopy(config)
    for section, field, api_field, kind in PATHS:
        values = config.get(section) or {}
        if values.get(field):
            values[api_field] = register_model(session, values.pop(field), kind)
    data = config.get("data") or {}
    for field, api_field in (("train_file", "train_dataset"), ("val_file", "val_dataset")):
        if data.get(field):
            data[api_field] = add_dataset(session, user, data.pop(field), data_dir)
    reward = config.get("reward") or {}
    if reward.get("function"):
        target = reward["function"]
        builtin = getattr(builtin_for_target(target), "name", None)
        if builtin is None:
            builtin = _name("fn", target)
            if session.scalar(select(RewardFunction.id).where(RewardFunction.name == builtin)) is None:
                session.add(RewardFunction(name=builtin, target=target))
        reward["function"] = builtin
    for section, kind in (("reward", "reward"), ("critic", "critic")):
        values = config.get(section) or {}
        if values.get("server_url"):
            url = values.pop("server_url")
            name = _name(f"{kind}-server", url)
            if session.scalar(select(ServerEndpoint.id).where(ServerEndpoint.name == name)) is None:
                model_name = values.pop("model_name", "reward_model")
                session.add(ServerEndpoint(name=name, kind=kind, url=url, model_name=model_name))
            values.pop("model_name", None)
            values["server"] = name
    session.flush()
    return config
