"""Admins see and cancel every user's jobs (`/api/v1/admin/jobs`); a user sees only their own."""

from __future__ import annotations

from tests.helpers.api import bearer, both_backends, create_job


@both_backends
def test_an_admin_lists_gets_and_cancels_every_users_jobs(client, token, other_token, admin_token, config):
    alices = create_job(client, token, config, name="alice's")
    bobs = create_job(client, other_token, config, name="bob's")
    page = client.get("/api/v1/admin/jobs", headers=bearer(admin_token)).json
    assert page["total"] == 2
    assert {(item["id"], item["user"]) for item in page["items"]} == {(alices["id"], "alice"), (bobs["id"], "bob")}
    only_bob = client.get("/api/v1/admin/jobs", query_string={"user": "bob"}, headers=bearer(admin_token)).json
    assert [item["id"] for item in only_bob["items"]] == [bobs["id"]] and only_bob["total"] == 1

    got = client.get(f"/api/v1/admin/jobs/{alices['id']}", headers=bearer(admin_token)).json
    assert got["user"] == "alice" and got["algorithm"] == "reinforce"
    cancelled = client.post(f"/api/v1/admin/jobs/{alices['id']}/cancel", headers=bearer(admin_token))
    assert cancelled.status_code == 200 and cancelled.json["status"] == "cancelled"
    assert client.get(f"/api/v1/jobs/{alices['id']}", headers=bearer(token)).json["status"] == "cancelled"
    again = client.post(f"/api/v1/admin/jobs/{alices['id']}/cancel", headers=bearer(admin_token))
    assert again.status_code == 409
    assert client.get("/api/v1/admin/jobs/99999", headers=bearer(admin_token)).status_code == 404

    # An admin's own job list is still their own; bob cannot see alice's job.
    assert client.get("/api/v1/jobs", headers=bearer(admin_token)).json["total"] == 0
    assert client.get(f"/api/v1/jobs/{alices['id']}", headers=bearer(other_token)).status_code == 404
