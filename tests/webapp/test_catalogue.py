"""The catalogue over REST: every user lists it, only admins change it, users never see paths, URLs or targets."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.api import bearer, both_backends

MODELS = "/api/v1/catalogue/models"
REWARDS = "/api/v1/catalogue/reward-functions"
SERVERS = "/api/v1/catalogue/servers"


@pytest.fixture
def model_folder(tmp_path):
    """A Hugging Face-shaped folder: config.json and a safetensors file of 2 x 3 + 4 parameters."""
    folder = tmp_path / "server-models" / "small"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(4)}, str(folder / "model.safetensors"))
    return folder


@both_backends
def test_an_admin_registers_a_model_and_every_user_lists_it_without_its_path(client, admin_token, token, model_folder):
    body = {"name": "small-sft", "path": str(model_folder), "kind": "policy", "description": "a small one"}
    created = client.post(MODELS, json=body, headers=bearer(admin_token))
    assert created.status_code == 201, created.json
    assert created.json["architecture"] == "LlamaForCausalLM"
    assert created.json["num_parameters"] == 10
    assert created.json["size_bytes"] > 0 and created.json["path"] == str(model_folder.resolve())

    listed = client.get(MODELS, query_string={"kind": "policy"}, headers=bearer(token)).json["items"]
    small = next(item for item in listed if item["name"] == "small-sft")
    assert small["path"] is None and small["architecture"] == "LlamaForCausalLM" and small["num_parameters"] == 10
    assert all(item["kind"] == "policy" for item in listed)

    again = client.post(MODELS, json=body, headers=bearer(admin_token))
    assert again.status_code == 409 and "already in the catalogue" in again.json["message"]
    assert client.delete(f"{MODELS}/small-sft", headers=bearer(admin_token)).status_code == 204
    assert client.delete(f"{MODELS}/small-sft", headers=bearer(admin_token)).status_code == 404


@both_backends
def test_only_admins_change_the_catalogue(client, token, model_folder):
    attempts = [
        ("post", MODELS, {"name": "x", "path": str(model_folder), "kind": "policy"}),
        ("post", REWARDS, {"name": "x", "target": "os:system"}),
        ("post", SERVERS, {"name": "x", "url": "http://169.254.169.254", "kind": "reward"}),
        ("delete", f"{MODELS}/tiny-sft", None),
        ("patch", "/api/v1/datasets/1", {"shared": True}),
        ("get", "/api/v1/admin/jobs", None),
    ]
    for method, url, body in attempts:
        response = getattr(client, method)(url, json=body, headers=bearer(token))
        assert response.status_code == 403, (method, url, response.json)
        assert "admin" in response.json["message"]
    names = [item["name"] for item in client.get(MODELS, headers=bearer(token)).json["items"]]
    assert "tiny-sft" in names and "x" not in names


def test_registration_refuses_what_is_not_a_model_a_function_or_a_url(client, admin_token, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"hidden_size": 8}')  # JSON, but of no model
    (tmp_path / "odd" / "model.safetensors").write_bytes(b"")
    cases = [
        (MODELS, {"name": "m", "path": str(tmp_path / "missing"), "kind": "policy"}, "path", "folder not found"),
        (MODELS, {"name": "m", "path": str(tmp_path / "empty"), "kind": "policy"}, "path", "no config.json"),
        (MODELS, {"name": "m", "path": str(tmp_path / "odd"), "kind": "policy"}, "path", "no model_type"),
        (MODELS, {"name": "../m", "path": str(tmp_path), "kind": "policy"}, "name", "not valid"),
        (REWARDS, {"name": "f", "target": "no_such_module_x:f"}, "target", "cannot be found"),
        (REWARDS, {"name": "f", "target": "os.system"}, "target", "package.module:function"),
        (REWARDS, {"name": "exact_match", "target": "os:system"}, "name", "built-in"),
        (SERVERS, {"name": "s", "url": "file:///etc/passwd", "kind": "reward"}, "url", "http"),
    ]
    for url, body, field, reason in cases:
        response = client.post(url, json=body, headers=bearer(admin_token))
        assert response.status_code == 422, (body, response.json)
        assert reason in " ".join(response.json["errors"][field]), response.json


@both_backends
def test_reward_functions_list_the_builtins_with_their_parameters_and_hide_targets(client, admin_token, token):
    created = client.post(
        REWARDS, json={"name": "letters", "target": "tests.helpers.rewards:letter_reward"}, headers=bearer(admin_token)
    )
    assert created.status_code == 201, created.json
    items = {item["name"]: item for item in client.get(REWARDS, headers=bearer(token)).json["items"]}
    assert {"demo", "exact_match", "numeric_match", "regex_match", "length_penalty", "letters"} <= set(items)
    assert items["numeric_match"]["builtin"] and "tolerance" in items["numeric_match"]["params"]["properties"]
    assert not items["letters"]["builtin"]
    assert all(item["target"] is None for item in items.values())
    admin_view = client.get(REWARDS, headers=bearer(admin_token)).json["items"]
    assert {item["name"]: item["target"] for item in admin_view}["letters"] == "tests.helpers.rewards:letter_reward"


@both_backends
def test_servers_are_listed_by_name_and_their_urls_shown_to_admins_only(client, admin_token, token):
    body = {"name": "rm-1", "url": "http://10.0.0.5:8000/", "kind": "reward", "model_name": "reward_model"}
    assert client.post(SERVERS, json=body, headers=bearer(admin_token)).status_code == 201
    [user_view] = client.get(SERVERS, headers=bearer(token)).json["items"]
    assert user_view["name"] == "rm-1" and user_view["url"] is None
    [admin_view] = client.get(SERVERS, headers=bearer(admin_token)).json["items"]
    assert admin_view["url"] == "http://10.0.0.5:8000"
