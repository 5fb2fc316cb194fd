"""The catalogue: the models, reward functions and servers jobs may use, and the datasets each user may use.

An admin registers models (server folders), reward functions (`module:callable`) and reward or critic servers (URLs)
with `aligner models|rewards|servers add` or the admin endpoints of /api/v1/catalogue; users upload datasets. A job
submitted over the API names entries (by name, or a dataset by id), never a path, URL or code reference
(webapp/job_config.py turns the names into the paths the trainer reads, in the API and again in the worker).

"Not found" is the one answer for an entry that does not exist, one the user may not use, and one whose files are
gone: no answer tells a user anything about the server's disk or another user's uploads.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from aligner.errors import AlignerError
from aligner.rewards.builtins import BUILTIN_REWARDS
from webapp.db import (
    INT32_MAX,
    MODEL_KINDS,
    SERVER_KINDS,
    CatalogueModel,
    Dataset,
    RewardFunction,
    ServerEndpoint,
    User,
)
from webapp.preflight import model_folder_problem

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_RULE = "1-100 characters: letters, digits, '.', '_' or '-', starting with a letter or digit"
TARGET_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
URL_AUTHORITY = re.compile(r"(\[[^\]]*\]|[^:\[\]]*)(:\d{1,5})?")  # after any user:password@
HOST_PATTERN = re.compile(r"[\w.-]+")  # a name (IDN too) or an IPv4 address
DATASETS_DIR = "datasets"
SAFETENSORS_HEADER_MAX = 100 * 1024 * 1024  # a larger header is no safetensors file


class CatalogueError(AlignerError, ValueError):
    """An entry that cannot be registered; the message says why, `field` which input is to blame."""

    def __init__(self, message: str, field: str = "name"):
        super().__init__(message)
        self.field = field


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise CatalogueError(f"name {name!r} is not valid: {NAME_RULE}")
    return name


# ------------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelInfo:
    path: Path
    architecture: str
    num_parameters: int | None
    size_bytes: int


def _safetensors_parameters(path: Path) -> int | None:
    """Parameters in a .safetensors file, from its JSON header (the weights are not read)."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > SAFETENSORS_HEADER_MAX:
                return None
            header = json.loads(f.read(length))
        total = 0
        for key, tensor in header.items():
            if key != "__metadata__":
                count = 1
                for dim in tensor["shape"]:
                    count *= int(dim)
                total += count
        return total
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def inspect_model_folder(path: str | Path, kind: str) -> ModelInfo:
    """A Hugging Face folder's resolved path, architecture, parameter count and size on disk.

    A tokenizer folder needs tokenizer files; any other kind a config.json naming a model transformers knows, and
    weights (webapp.preflight.model_folder_problem)."""
    try:
        return _inspect_model_folder(path, kind)
    except OSError as err:  # a name too long, a loop of symlinks, a folder it may not read, ...
        raise CatalogueError(f"folder cannot be read: {err.strerror or err}", "path") from None


def _inspect_model_folder(path: str | Path, kind: str) -> ModelInfo:
    try:
        folder = Path(path).expanduser().resolve()
    except RuntimeError as err:  # `~nobody/x`: no such user's home
        raise CatalogueError(f"folder not found: {err}", "path") from None
    if not folder.is_dir():
        raise CatalogueError(f"folder not found: {folder}", "path")
    if kind == "tokenizer":
        if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
            raise CatalogueError(f"{folder} holds no tokenizer (tokenizer.json or tokenizer_config.json)", "path")
        architecture = "tokenizer"
    else:
        problem = model_folder_problem(folder)  # the same check as every job submission's
        if problem:
            raise CatalogueError(f"{folder} {problem}", "path")
        config = json.loads((folder / "config.json").read_text())
        architectures = config.get("architectures") or [config.get("model_type") or "unknown"]
        architecture = str(architectures[0])[:200]
    counts = [_safetensors_parameters(file) for file in folder.glob("*.safetensors")]
    num_parameters = sum(counts) if counts and None not in counts else None
    size = sum(file.stat().st_size for file in folder.rglob("*") if file.is_file())
    return ModelInfo(folder, architecture, num_parameters, size)


def _check_unique(session: Session, table, name: str) -> None:
    if session.scalar(select(table.id).where(table.name == name)) is not None:
        raise CatalogueError(f"{name!r} is already in the catalogue: remove it first")


def add_model(session: Session, name: str, path: str | Path, kind: str, description: str = "") -> CatalogueModel:
    check_name(name)
    if kind not in MODEL_KINDS:
        raise CatalogueError(f"kind {kind!r} is not one of {', '.join(MODEL_KINDS)}", "kind")
    _check_unique(session, CatalogueModel, name)
    info = inspect_model_folder(path, kind)
    entry = CatalogueModel(
        name=name,
        kind=kind,
        path=str(info.path),
        architecture=info.architecture,
        num_parameters=info.num_parameters,
        size_bytes=info.size_bytes,
        description=description,
    )
    session.add(entry)
    session.flush()
    return entry


# ------------------------------------------------------------------------------------------------- rewards
def add_reward_function(session: Session, name: str, target: str, description: str = "") -> RewardFunction:
    """Register `module:callable` as reward function `name`; the module must be importable by the workers (it is
    looked up, not imported: importing runs its code in the API process)."""
    check_name(name)
    if name in BUILTIN_REWARDS:
        raise CatalogueError(f"{name!r} is a built-in reward function")
    if not isinstance(target, str) or not TARGET_PATTERN.fullmatch(target):
        raise CatalogueError(f"target {target!r} must look like 'package.module:function'", "target")
    module = target.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise CatalogueError(f"module {module!r} of {target!r} cannot be found on this server", "target")
    _check_unique(session, RewardFunction, name)
    entry = RewardFunction(name=name, target=target, description=description)
    session.add(entry)
    session.flush()
    return entry


# ------------------------------------------------------------------------------------------------- servers
def _url_host(url: str) -> str | None:
    """The host of an http(s) URL whose authority is `[user[:password]@]host[:port]`, or None."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port  # port: ValueError when not a number from 0 to 65535
    except ValueError:  # an unclosed IPv6 bracket (`http://[::1`), ...
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    authority = URL_AUTHORITY.fullmatch(parts.netloc.rpartition("@")[2])
    if authority is None or (port is not None and port < 1):
        return None  # text after the host (`http://[::1]x`)
    if authority.group(1).startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:  # `[v1.x]`: an IPvFuture address no client speaks
            return None
    elif not HOST_PATTERN.fullmatch(host):
        return None
    return host


def check_server_url(url: str) -> str:
    if not isinstance(url, str) or _url_host(url) is None:
        raise CatalogueError(f"url {url!r} must be an http:// or https:// URL with a host", "url")
    return url.rstrip("/")


def add_server(
    session: Session, name: str, url: str, kind: str, model_name: str = "reward_model", description: str = ""
) -> ServerEndpoint:
    check_name(name)
    if kind not in SERVER_KINDS:
        raise CatalogueError(f"kind {kind!r} is not one of {', '.join(SERVER_KINDS)}", "kind")
    if not NAME_PATTERN.fullmatch(model_name or ""):
        raise CatalogueError(f"model_name {model_name!r} is not valid: {NAME_RULE}", "model_name")
    _check_unique(session, ServerEndpoint, name)
    entry = ServerEndpoint(
        name=name, kind=kind, url=check_server_url(url), model_name=model_name, description=description
    )
    session.add(entry)
    session.flush()
    return entry


# ------------------------------------------------------------------------------------------------- lookups
CATALOGUE_TABLES = {"models": CatalogueModel, "rewards": RewardFunction, "servers": ServerEndpoint}


def _is_ref(ref: Any) -> bool:
    """Whether `ref` can name a row: a name, or an id that fits the id columns (SQLite fails on larger ones)."""
    if isinstance(ref, bool) or not isinstance(ref, int | str):
        return False
    return not isinstance(ref, int) or 0 < ref <= INT32_MAX


def find_entry(session: Session, table, ref: int | str):
    """The row of `table` named `ref` (or with id `ref`), or None."""
    if not _is_ref(ref):
        return None
    column = table.id if isinstance(ref, int) else table.name
    return session.scalar(select(table).where(column == ref))


def remove_entry(session: Session, table, ref: int | str) -> bool:
    entry = find_entry(session, table, ref)
    if entry is None:
        return False
    session.delete(entry)
    return True


def find_model(session: Session, ref: Any, kinds: tuple[str, ...]) -> CatalogueModel | None:
    """A catalogue model of one of `kinds` whose folder is still there."""
    entry = find_entry(session, CatalogueModel, ref)
    if entry is None or entry.kind not in kinds or not Path(entry.path).is_dir():
        return None
    return entry


def find_server(session: Session, ref: Any, kind: str) -> ServerEndpoint | None:
    entry = find_entry(session, ServerEndpoint, ref)
    return entry if entry is not None and entry.kind == kind else None


def reward_target(session: Session, ref: Any) -> tuple[str, str] | None:
    """(name, `module:callable`) of reward function `ref` (a built-in, or a registered one by name or id), or None."""
    if isinstance(ref, str) and ref in BUILTIN_REWARDS:
        return ref, BUILTIN_REWARDS[ref].target
    entry = find_entry(session, RewardFunction, ref)
    return (entry.name, entry.target) if entry is not None else None


def visible_datasets(user: User):
    """The SQL condition of the datasets `user` may use: their own and the shared ones."""
    return or_(Dataset.user_id == user.id, Dataset.shared.is_(True))


def dataset_file(data_dir: Path, dataset: Dataset) -> Path | None:
    """The dataset's file, when it resolves (symlinks too) inside DATA_DIR/datasets and exists."""
    root = (data_dir / DATASETS_DIR).resolve()
    path = (data_dir / dataset.path).resolve()
    return path if path.is_relative_to(root) and path.is_file() else None


def find_dataset(session: Session, user: User, ref: Any, data_dir: Path) -> tuple[Dataset, Path] | None:
    """Dataset `ref` (an id, or a name when exactly one visible dataset has it) that `user` may use, and its file."""
    if not _is_ref(ref):
        return None
    column = Dataset.id if isinstance(ref, int) else Dataset.name
    found = session.scalars(select(Dataset).where(column == ref, visible_datasets(user)).limit(2)).all()
    if len(found) != 1:
        return None
    path = dataset_file(Path(data_dir), found[0])
    return (found[0], path) if path is not None else None
