"""The catalogue over REST (`/api/v1/catalogue`): every user lists it; only an admin adds or removes entries.

Users see what an entry is (kind, architecture, size, description, a built-in reward's parameters), not where it
lives: paths, URLs and `module:callable` targets are shown to admins only.
"""

from __future__ import annotations

from apiflask import APIBlueprint
from sqlalchemy import select

from aligner.rewards.builtins import BUILTIN_REWARDS
from webapp.auth import auth, current_user, require_admin
from webapp.catalogue import CatalogueError, add_model, add_reward_function, add_server, remove_entry
from webapp.db import CatalogueModel, RewardFunction, ServerEndpoint, column_values
from webapp.errors import abort_fields
from webapp.extensions import db
from webapp.schemas import (
    CatalogueNamePath,
    ModelIn,
    ModelList,
    ModelOut,
    ModelQuery,
    RewardFunctionIn,
    RewardFunctionList,
    RewardFunctionOut,
    ServerIn,
    ServerList,
    ServerOut,
)

bp = APIBlueprint("catalogue", __name__, url_prefix="/api/v1/catalogue", tag="Catalogue")
ADMIN_ONLY = {403: "Only an admin may change the catalogue"}


def _admin_view(entry, secret: str) -> dict:
    """The entry's columns, with its `secret` column (path, url, target) blanked for a non-admin."""
    row = column_values(entry)
    if not current_user().is_admin:
        row[secret] = None
    return row


def _register(add, **fields):
    require_admin()
    try:
        entry = add(db.session, **fields)
    except CatalogueError as err:
        abort_fields(409 if "already in the catalogue" in str(err) else 422, str(err), {err.field: [str(err)]})
    db.session.commit()
    return entry


def _remove(table, name: str, what: str) -> tuple[str, int]:
    require_admin()
    if not remove_entry(db.session, table, name):
        abort_fields(404, f"{what} {name!r} not found in the catalogue")
    db.session.commit()
    return "", 204


# ------------------------------------------------------------------------------------------------- models
@bp.post("/models")
@bp.auth_required(auth)
@bp.input(ModelIn, location="json")
@bp.output(ModelOut, status_code=201)
@bp.doc(responses={**ADMIN_ONLY, 409: "The name is taken"})
def register_model(json_data):
    """Register a model folder of the server (admin)

    The folder must be a Hugging Face folder (config.json and weights; a tokenizer's files for kind tokenizer).
    Its architecture, parameter count and size are read once, now.
    """
    return _admin_view(_register(add_model, **json_data), "path")


@bp.get("/models")
@bp.auth_required(auth)
@bp.input(ModelQuery, location="query")
@bp.output(ModelList)
def list_models(query_data):
    """List the models jobs may use (model.policy, model.tokenizer, reward.model, critic.model)"""
    query = select(CatalogueModel).order_by(CatalogueModel.name)
    if "kind" in query_data:
        query = query.where(CatalogueModel.kind == query_data["kind"])
    return {"items": [_admin_view(entry, "path") for entry in db.session.scalars(query)]}


@bp.delete("/models/<name>")
@bp.auth_required(auth)
@bp.input(CatalogueNamePath, location="path")
@bp.output({}, status_code=204)
@bp.doc(responses={**ADMIN_ONLY, 404: "No such model"})
def remove_model(name: str, path_data):
    """Remove a model from the catalogue (admin); its folder is left alone, queued jobs naming it are refused"""
    return _remove(CatalogueModel, name, "model")


# ------------------------------------------------------------------------------------------------- rewards
def _builtin_rows() -> list[dict]:
    return [
        {
            "id": None,
            "name": name,
            "builtin": True,
            "description": builtin.description,
            "params": builtin.params.model_json_schema() if builtin.params is not None else {},
            "target": builtin.target if current_user().is_admin else None,
        }
        for name, builtin in BUILTIN_REWARDS.items()
    ]


def _function_row(entry: RewardFunction) -> dict:
    return {**_admin_view(entry, "target"), "builtin": False, "params": {}}


@bp.post("/reward-functions")
@bp.auth_required(auth)
@bp.input(RewardFunctionIn, location="json")
@bp.output(RewardFunctionOut, status_code=201)
@bp.doc(responses={**ADMIN_ONLY, 409: "The name is taken"})
def register_reward_function(json_data):
    """Register a reward function `module:callable` (admin)

    The workers import and call it with users' prompts and responses: register only code you trust.
    """
    return _function_row(_register(add_reward_function, **json_data))


@bp.get("/reward-functions")
@bp.auth_required(auth)
@bp.output(RewardFunctionList)
def list_reward_functions():
    """List the reward functions jobs may name in reward.function: the built-ins, then the registered ones"""
    registered = db.session.scalars(select(RewardFunction).order_by(RewardFunction.name))
    return {"items": _builtin_rows() + [_function_row(entry) for entry in registered]}


@bp.delete("/reward-functions/<name>")
@bp.auth_required(auth)
@bp.input(CatalogueNamePath, location="path")
@bp.output({}, status_code=204)
@bp.doc(responses={**ADMIN_ONLY, 404: "No such reward function"})
def remove_reward_function(name: str, path_data):
    """Remove a registered reward function (admin)"""
    return _remove(RewardFunction, name, "reward function")


# ------------------------------------------------------------------------------------------------- servers
@bp.post("/servers")
@bp.auth_required(auth)
@bp.input(ServerIn, location="json")
@bp.output(ServerOut, status_code=201)
@bp.doc(responses={**ADMIN_ONLY, 409: "The name is taken"})
def register_server(json_data):
    """Register a running reward or critic server (admin)"""
    return _admin_view(_register(add_server, **json_data), "url")


@bp.get("/servers")
@bp.auth_required(auth)
@bp.output(ServerList)
def list_servers():
    """List the reward and critic servers jobs may name in reward.server and critic.server"""
    entries = db.session.scalars(select(ServerEndpoint).order_by(ServerEndpoint.name))
    return {"items": [_admin_view(entry, "url") for entry in entries]}


@bp.delete("/servers/<name>")
@bp.auth_required(auth)
@bp.input(CatalogueNamePath, location="path")
@bp.output({}, status_code=204)
@bp.doc(responses={**ADMIN_ONLY, 404: "No such server"})
def remove_server(name: str, path_data):
    """Remove a server from the catalogue (admin)"""
    return _remove(ServerEndpoint, name, "server")
