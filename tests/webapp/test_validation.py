"""Bad input: each gets the right 4xx and names the field (`{"message": ..., "errors": {field: [reasons]}}`)."""

from __future__ import annotations

import pytest

from tests.helpers.api import bearer, both_backends, create_job


def post_job(client, token, body, **kwargs):
    return client.post("/api/v1/jobs", json=body, headers=bearer(token), **kwargs)


def test_malformed_json_is_400(client, token):
    response = client.post(
        "/api/v1/jobs", data='{"name": "x",', content_type="application/json", headers=bearer(token)
    )
    assert response.status_code == 400
    assert response.json["errors"]["body"][0].startswith("invalid JSON")


def test_missing_name_wrong_types_and_unknown_top_level_fields_are_422(client, token, config):
    response = post_job(client, token, {"config": config})
    assert response.status_code == 422 and "name" in response.json["errors"]

    response = post_job(client, token, {"name": 3, "config": [1], "num_processes": "2", "priority": 1})
    assert response.status_code == 422
    assert set(response.json["errors"]) == {"name", "config", "num_processes", "priority"}

    for processes in (0, 9, 1.5):
        response = post_job(client, token, {"name": "x", "config": config, "num_processes": processes})
        assert response.status_code == 422 and "num_processes" in response.json["errors"], processes
    assert post_job(client, token, {"name": "", "config": config}).json["errors"]["name"]
    assert post_job(client, token, {"name": "x" * 201, "config": config}).status_code == 422
    response = post_job(client, token, ["not", "an", "object"])
    assert response.status_code == 422 and response.json["errors"] == {"body": ["Invalid input type."]}


@both_backends
def test_bad_config_fields_are_422_each_named(client, token, config):
    config["optim"] = {"lr": -1, "betas": "fast"}
    config["trainer"] = {"max_steps": "many", "save_intervall": 5}
    config["colour"] = "blue"
    config["health"] = {"pause_on": ["kl_growth", "reward_hacking"]}
    response = post_job(client, token, {"name": "x", "config": config})
    assert response.status_code == 422
    errors = response.json["errors"]
    assert response.json["message"] == "Invalid config"
    assert set(errors) >= {
        "config.optim.lr",
        "config.trainer.max_steps",
        "config.trainer.save_intervall",
        "config.colour",
        "config.health.pause_on",
    }
    assert errors["config.colour"] == ["unknown field"]
    assert errors["config.health.pause_on"][0].startswith("unknown alarm 'reward_hacking': give some of")
    assert "greater than 0" in errors["config.optim.lr"][0]
    assert any(key.startswith("config.optim.betas") for key in errors)

    del config["model"]
    response = post_job(client, token, {"name": "x", "config": {"model": {"policy_path": "models/tiny-sft"}}})
    assert response.json["errors"]["config.data"] == ["required field is missing"]


@both_backends
@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("trainer", "max_steps", 10**12),
        ("seed", None, 10**30),
        ("generation", "max_new_tokens", 10**9),
        ("reward", "unavailable_timeout_s", 86_400.5),  # a float with a limit: a day
    ],
)
def test_huge_values_are_422(client, token, config, section, field, value):
    if field is None:
        config[section] = value
    else:
        config.setdefault(section, {})[field] = value
    response = post_job(client, token, {"name": "x", "config": config})
    assert response.status_code == 422, response.json
    key = f"config.{section}" + (f".{field}" if field else "")
    assert key in response.json["errors"] and "at most" in response.json["errors"][key][0]


def test_non_finite_numbers_are_422(client, token, config):
    config["optim"] = {"lr": "inf"}
    response = post_job(client, token, {"name": "x", "config": config})
    assert response.status_code == 422 and "finite" in response.json["errors"]["config.optim.lr"][0]


def test_a_10_mb_body_is_413(client, token):
    body = b'{"name": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    response = client.post("/api/v1/jobs", data=body, content_type="application/json", headers=bearer(token))
    assert response.status_code == 413 and "limit" in response.json["errors"]["body"][0]


def test_entries_missing_from_the_catalogue_are_422_naming_the_field(client, token, config):
    config["data"]["val_dataset"] = "nope.jsonl"
    config["model"]["tokenizer"] = "not-here"
    errors = post_job(client, token, {"name": "x", "config": config}).json["errors"]
    assert errors == {
        "config.data.val_dataset": [
            "dataset 'nope.jsonl' not found: give the id (or name) of one of your datasets (GET /api/v1/datasets)"
        ],
        "config.model.tokenizer": ["model 'not-here' not found in the catalogue (GET /api/v1/catalogue/models)"],
    }


def test_bad_query_parameters_are_422_and_unknown_ids_404(client, token, config):
    response = client.get("/api/v1/jobs?page=0&per_page=x&status=done", headers=bearer(token))
    assert response.status_code == 422 and set(response.json["errors"]) == {"page", "per_page", "status"}
    job = create_job(client, token, config)
    for suffix in ("", "/metrics", "/samples", "/checkpoints", "/model", "/best_model", "/events"):
        response = client.get(f"/api/v1/jobs/{job['id'] + 100}{suffix}", headers=bearer(token))
        assert response.status_code == 404, suffix
    assert client.get("/api/v1/jobs/99999999999999", headers=bearer(token)).status_code == 404
    assert client.get("/api/v1/jobs/abc", headers=bearer(token)).status_code == 404
    assert client.put(f"/api/v1/jobs/{job['id']}", headers=bearer(token)).status_code == 405
    assert client.delete(f"/api/v1/jobs/{job['id']}", headers=bearer(token)).status_code == 409  # queued: cancel first


def test_deeply_nested_json_is_400_not_a_recursion_error(client, token):
    for body in ('{"name": "x", "config": ' + '{"a": ' * 5000 + "1" + "}" * 5001, "[" * 100_000 + "]" * 100_000):
        response = client.post("/api/v1/jobs", data=body, content_type="application/json", headers=bearer(token))
        assert response.status_code == 400 and "nested deeper" in response.json["errors"]["body"][0]


@both_backends
def test_values_the_database_cannot_hold_are_422(client, token, config):
    assert post_job(client, token, {"name": "a\x00b", "config": config}).json["errors"]["name"]
    job = create_job(client, token, config)
    response = client.get(f"/api/v1/jobs/{job['id']}/events?last_event_id={2**40}", headers=bearer(token))
    assert response.status_code == 422 and "last_event_id" in response.json["errors"]
    response = client.get(f"/api/v1/jobs/{job['id']}/events", headers={**bearer(token), "Last-Event-ID": str(2**40)})
    assert response.status_code == 422 and "Last-Event-ID" in response.json["errors"]
    response = client.get(f"/api/v1/jobs/{job['id']}/samples?step={2**40}&min_reward=inf", headers=bearer(token))
    assert response.status_code == 422 and set(response.json["errors"]) == {"step", "min_reward"}
    assert client.get(f"/api/v1/jobs/{2**40}/metrics", headers=bearer(token)).status_code == 404
