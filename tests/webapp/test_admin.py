"""Admins see and act on every user's jobs (`/api/v1/admin/jobs`); a user sees only their own."""

from __future__ import annotations

from sqlalchemy import func, select

from tests.helpers.api import bearer, both_backends, create_job, put_in_state
from webapp.db import Checkpoint


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


@both_backends
def test_an_admin_resumes_retries_and_deletes_another_users_job(app, client, token, admin_token, config, db_session):
    """As the owner would, under the same state machine (409 with its reason), counting the owner's active jobs."""
    admin = bearer(admin_token)
    job = create_job(client, token, config, name="alice's")["id"]
    put_in_state(db_session, job, "failed", 2, True)
    resumed = client.post(f"/api/v1/admin/jobs/{job}/resume", headers=admin)
    assert resumed.status_code == 200 and resumed.json["status"] == "queued" and resumed.json["user"] == "alice"
    assert client.get(f"/api/v1/jobs/{job}", headers=bearer(token)).json["status"] == "queued"
    again = client.post(f"/api/v1/admin/jobs/{job}/resume", headers=admin)
    assert again.status_code == 409
    assert again.json["message"] == f"job {job} is queued: only a finished job can be resumed"

    put_in_state(db_session, job, "cancelled", 2, True)
    app.config["MAX_ACTIVE_JOBS_PER_USER"] = 1
    busy = create_job(client, token, config, name="busy")["id"]  # the owner's one active job: the admin has none
    refused = client.post(f"/api/v1/admin/jobs/{job}/retry", headers=admin)
    assert refused.status_code == 429 and refused.json["message"].startswith("The job owner has 1 active jobs")
    client.post(f"/api/v1/jobs/{busy}/cancel", headers=bearer(token))
    retried = client.post(f"/api/v1/admin/jobs/{job}/retry", headers=admin)
    assert retried.status_code == 200 and retried.json["status"] == "queued" and retried.json["step"] == 0
    with db_session() as session:
        assert session.scalar(select(func.count()).select_from(Checkpoint).where(Checkpoint.job_id == job)) == 0

    put_in_state(db_session, job, "failed", 0, False)
    assert client.delete(f"/api/v1/admin/jobs/{job}", headers=admin).status_code == 204
    for action in ("resume", "retry"):
        gone = client.post(f"/api/v1/admin/jobs/{job}/{action}", headers=admin)
        assert gone.status_code == 409 and gone.json["message"] == f"job {job} was deleted"
        assert client.post(f"/api/v1/admin/jobs/{2**31}/{action}", headers=admin).status_code == 404
        not_admin = client.post(f"/api/v1/admin/jobs/{busy}/{action}", headers=bearer(token))
        assert not_admin.status_code == 403
