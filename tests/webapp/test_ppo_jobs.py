"""The job type: `algorithm` (reinforce | ppo) on create, list, get and the list filter; PPO's critic checks."""

from __future__ import annotations

import pytest

from tests.helpers.api import bearer, both_backends, create_job
from tests.helpers.catalogue import register_model
from webapp.db import ServerEndpoint


def ppo(config: dict, **critic) -> dict:
    return {**config, "algorithm": "ppo", "critic": critic or {"model": "critic-rm"}}


@pytest.fixture
def critic_dir(data_dir, db_session):
    """The catalogue's critic `critic-rm` and critic server `critic-1`."""
    (data_dir / "models" / "critic-rm").mkdir(parents=True)
    with db_session() as session:
        register_model(session, data_dir / "models" / "critic-rm", "critic", "critic-rm")
        session.add(ServerEndpoint(name="critic-1", kind="critic", url="http://127.0.0.1:5556"))
    return data_dir / "models" / "critic-rm"


@both_backends
def test_jobs_carry_their_algorithm_and_the_list_filters_by_it(client, token, other_token, config, critic_dir):
    reinforce = create_job(client, token, config, name="rloo")
    started = create_job(client, token, ppo(config), name="ppo-own-critic")
    external = create_job(client, token, ppo(config, server="critic-1"), name="ppo-external")
    create_job(client, other_token, ppo(config), name="bob's")  # never listed for alice
    assert reinforce["algorithm"] == "reinforce" and started["algorithm"] == "ppo"
    assert (reinforce["kind"], started["kind"]) == ("reinforce", "ppo")  # deprecated, the same for one release
    assert started["config"]["critic"]["model"] == "critic-rm"
    assert started["config"]["critic"]["server"] is None and started["config"]["ppo"]["ratio_eps"] == 0.2
    assert external["config"]["critic"]["server"] == "critic-1" and "server_url" not in external["config"]["critic"]
    got = client.get(f"/api/v1/jobs/{started['id']}", headers=bearer(token)).json
    assert got["algorithm"] == "ppo"

    ppo_page = client.get("/api/v1/jobs?algorithm=ppo", headers=bearer(token)).json
    assert ppo_page["total"] == 2 and [j["id"] for j in ppo_page["items"]] == [external["id"], started["id"]]
    rloo_page = client.get("/api/v1/jobs?algorithm=reinforce&status=queued", headers=bearer(token)).json
    assert [j["id"] for j in rloo_page["items"]] == [reinforce["id"]]
    bad = client.get("/api/v1/jobs?algorithm=a2c", headers=bearer(token))
    assert bad.status_code == 422 and "algorithm" in bad.json["errors"]


def test_an_unknown_algorithm_is_422_naming_the_field(client, token, config):
    for value in ("a2c", 3, ["ppo"]):
        response = client.post(
            "/api/v1/jobs", json={"name": "x", "config": {**config, "algorithm": value}}, headers=bearer(token)
        )
        assert response.status_code == 422, value
        errors = response.json["errors"]
        assert list(errors) == ["config.algorithm"] and "reinforce, ppo" in errors["config.algorithm"][0]


def test_ppo_without_a_critic_is_422(client, token, config, critic_dir):
    for critic in (None, {}, {"server": None, "model": None}, {"use_critic_rewards": True}):
        body = {**config, "algorithm": "ppo"} | ({"critic": critic} if critic is not None else {})
        response = client.post("/api/v1/jobs", json={"name": "x", "config": body}, headers=bearer(token))
        assert response.status_code == 422, critic
        errors = response.json["errors"]
        assert "config.critic" in errors and "critic.server" in errors["config.critic"][0], errors
        assert "config" not in errors  # said once, under the field
    missing = client.post(
        "/api/v1/jobs",
        json={"name": "x", "config": ppo(config, model="nope")},
        headers=bearer(token),
    )
    assert missing.status_code == 422
    assert missing.json["errors"] == {
        "config.critic.model": ["model 'nope' not found in the catalogue (GET /api/v1/catalogue/models)"]
    }
    unknown = client.post(
        "/api/v1/jobs",
        json={"name": "x", "config": {**ppo(config), "ppo": {"ratio_eps": -1, "clip": 1}}},
        headers=bearer(token),
    )
    assert unknown.status_code == 422
    assert set(unknown.json["errors"]) == {"config.ppo.ratio_eps", "config.ppo.clip"}


def test_a_ppo_job_may_take_its_rewards_from_the_critic(client, token, config, critic_dir):
    body = {k: v for k, v in config.items() if k != "reward"}
    job = create_job(client, token, ppo(body, model="critic-rm", use_critic_rewards=True))
    assert job["algorithm"] == "ppo" and job["config"]["reward"] is None
    response = client.post("/api/v1/jobs", json={"name": "x", "config": body}, headers=bearer(token))
    assert response.status_code == 422  # REINFORCE needs its reward source


def test_openapi_describes_the_job_type(client):
    spec = client.get("/api/v1/openapi.json").json
    job_out = spec["components"]["schemas"]["JobOut"]["properties"]
    assert job_out["algorithm"]["enum"] == ["reinforce", "ppo"] and not job_out["algorithm"].get("deprecated")
    assert job_out["kind"]["deprecated"] is True and "use `algorithm`" in job_out["kind"]["description"]
    assert job_out["actions"]["items"]["enum"] == ["cancel", "resume", "retry", "delete"]
    params = {p["name"]: p for p in spec["paths"]["/api/v1/jobs"]["get"]["parameters"]}
    assert params["algorithm"]["schema"]["enum"] == ["reinforce", "ppo"]
    assert "ppo" in spec["components"]["schemas"]["JobIn"]["properties"]["config"]["description"]
