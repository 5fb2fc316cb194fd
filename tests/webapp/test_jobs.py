"""Jobs: create, list (pagination, status filter), get, cancel, resume, retry, the actions a job lists; the queue
hand-off."""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import func, select

from tests.helpers.api import ACTIONS_BY_STATE, bearer, both_backends, create_job, put_in_state
from webapp.db import Checkpoint, Event, Job, Metric, Sample


def set_job(db_session, job_id: int, **fields) -> None:
    with db_session() as session:
        job = session.get(Job, job_id)
        for key, value in fields.items():
            setattr(job, key, value)


def count(db_session, model, job_id: int) -> int:
    with db_session() as session:
        return session.scalar(select(func.count()).select_from(model).where(model.job_id == job_id))


@both_backends
def test_create_job_resolves_config_sets_run_dir_and_enqueues(client, token, config, data_dir, queue, db_session):
    config["run_dir"] = "/tmp/somewhere-else"  # the server's choice wins
    config["health"] = {"pause_on": ["kl_growth"]}
    job = create_job(client, token, config, name="first", num_processes=2)
    assert job["status"] == "queued" and job["name"] == "first" and job["num_processes"] == 2
    assert job["run_dir"] == f"runs/job_{job['id']}"  # relative to the data folder: no server path shown
    assert job["config"]["run_dir"] == job["run_dir"]
    with db_session() as session:
        assert session.get(Job, job["id"]).run_dir == str(data_dir.resolve() / "runs" / f"job_{job['id']}")
    assert job["config"]["model"]["policy"] == "tiny-sft" and "policy_path" not in job["config"]["model"]
    assert job["config"]["optim"]["lr"] == 1e-6  # defaults filled in
    assert job["config"]["health"]["pause_on"] == ["kl_growth"] and job["config"]["health"]["kl_max"] == 1.0
    assert job["alarms"] == []
    assert job["max_steps"] == 5 and job["step"] == 0 and job["cancel_requested"] is False
    assert job["created_at"].endswith("+00:00")
    assert queue.job_ids == [job["id"]]
    with db_session() as session:
        events = session.scalars(select(Event).where(Event.job_id == job["id"])).all()
        assert [(e.kind, e.payload["status"]) for e in events] == [("status", "queued")]

    got = client.get(f"/api/v1/jobs/{job['id']}", headers=bearer(token))
    assert got.status_code == 200 and got.json == job


@both_backends
def test_list_jobs_paginates_newest_first_and_filters_by_status(app, client, token, other_token, config, db_session):
    app.config["MAX_ACTIVE_JOBS_PER_USER"] = 5  # five queued jobs to page through
    ids = [create_job(client, token, config, name=f"job{i}")["id"] for i in range(5)]
    create_job(client, other_token, config, name="bob's")  # never listed for alice
    set_job(db_session, ids[1], status="failed")
    set_job(db_session, ids[3], status="failed")

    page1 = client.get("/api/v1/jobs?per_page=2", headers=bearer(token)).json
    page3 = client.get("/api/v1/jobs?per_page=2&page=3", headers=bearer(token)).json
    assert page1["total"] == 5 and (page1["page"], page1["per_page"]) == (1, 2)
    assert [j["id"] for j in page1["items"]] == [ids[4], ids[3]]
    assert [j["id"] for j in page3["items"]] == [ids[0]]
    beyond = client.get("/api/v1/jobs?per_page=2&page=9", headers=bearer(token)).json
    assert beyond["items"] == [] and beyond["total"] == 5

    failed = client.get("/api/v1/jobs?status=failed", headers=bearer(token)).json
    assert failed["total"] == 2 and [j["id"] for j in failed["items"]] == [ids[3], ids[1]]


@both_backends
def test_cancel_each_status(client, token, config, db_session):
    url = "/api/v1/jobs/{}/cancel"
    queued = create_job(client, token, config)
    response = client.post(url.format(queued["id"]), headers=bearer(token))
    assert response.status_code == 200 and response.json["status"] == "cancelled"
    assert response.json["finished_at"] is not None

    running = create_job(client, token, config)
    set_job(db_session, running["id"], status="running")
    response = client.post(url.format(running["id"]), headers=bearer(token))
    assert response.json["status"] == "cancelling" and response.json["cancel_requested"] is True
    again = client.post(url.format(running["id"]), headers=bearer(token))  # idempotent while cancelling
    assert again.status_code == 200 and again.json["status"] == "cancelling"

    for final in ("succeeded", "failed", "cancelled", "paused"):
        set_job(db_session, running["id"], status=final)
        response = client.post(url.format(running["id"]), headers=bearer(token))
        assert response.status_code == 409, final
        assert final in response.json["message"]

    with db_session() as session:
        kinds = [e.payload["status"] for e in session.scalars(select(Event).where(Event.job_id == running["id"]))]
    assert kinds == ["queued", "cancelling"]


@both_backends
def test_resume_needs_a_finished_job_with_a_checkpoint_and_keeps_metrics(client, token, config, db_session, queue):
    job = create_job(client, token, config)
    url = f"/api/v1/jobs/{job['id']}/resume"
    assert client.post(url, headers=bearer(token)).status_code == 409  # queued: not finished
    set_job(db_session, job["id"], status="paused", step=2, error="stopped", attempts=3, worker="w1")
    set_job(db_session, job["id"], alarms=["kl_growth"])
    response = client.post(url, headers=bearer(token))
    assert response.status_code == 409 and "no checkpoint" in response.json["message"]

    with db_session() as session:
        session.add(Checkpoint(job_id=job["id"], step=2, path="/x/step_000002"))
        session.add(Metric(job_id=job["id"], step=1, name="train_rollouts/rewards", value=0.5))
    response = client.post(url, headers=bearer(token))
    assert response.status_code == 200, response.json
    assert response.json["status"] == "queued" and response.json["error"] is None
    assert response.json["step"] == 2 and response.json["finished_at"] is None
    assert response.json["attempts"] == 0 and response.json["worker"] is None
    assert response.json["alarms"] == ["kl_growth"]  # still firing: it pauses the job again only after it clears
    assert queue.job_ids == [job["id"], job["id"]]
    assert count(db_session, Metric, job["id"]) == 1 and count(db_session, Checkpoint, job["id"]) == 1

    set_job(db_session, job["id"], status="succeeded", step=job["max_steps"])  # did all its steps: nothing to do
    response = client.post(url, headers=bearer(token))
    assert response.status_code == 409 and response.json["message"] == (
        f"job {job['id']} has finished all its {job['max_steps']} steps: nothing to resume"
    )
    set_job(db_session, job["id"], status="succeeded", step=job["max_steps"] - 1)  # stopped early: resumable
    assert client.post(url, headers=bearer(token)).status_code == 200


@both_backends
def test_retry_starts_over(client, token, config, db_session, queue, data_dir):
    job = create_job(client, token, config)
    url = f"/api/v1/jobs/{job['id']}/retry"
    set_job(db_session, job["id"], status="succeeded", step=5)
    assert client.post(url, headers=bearer(token)).status_code == 409

    run_dir = data_dir / job["run_dir"]
    (run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
    set_job(db_session, job["id"], status="failed", step=2, error="boom", attempts=3, latest_reward=0.4)
    set_job(db_session, job["id"], alarms=["nonfinite"])
    with db_session() as session:
        session.add(Checkpoint(job_id=job["id"], step=2, path=str(run_dir / "checkpoints" / "step_000002")))
        session.add(Metric(job_id=job["id"], step=1, name="train_rollouts/rewards", value=0.5))
        session.add(Sample(job_id=job["id"], step=1, split="train", index=0, prompt="p", response="r", reward=1.0))
    response = client.post(url, headers=bearer(token))
    assert response.status_code == 200, response.json
    body = response.json
    assert (body["status"], body["step"], body["attempts"], body["error"], body["latest_reward"]) == (
        "queued",
        0,
        0,
        None,
        None,
    )
    assert body["alarms"] == []
    assert not run_dir.exists()
    assert [count(db_session, m, job["id"]) for m in (Metric, Sample, Checkpoint)] == [0, 0, 0]
    assert count(db_session, Event, job["id"]) == 2  # the first queued event is kept, then queued again
    assert queue.job_ids == [job["id"], job["id"]]
    set_job(db_session, job["id"], status="paused")
    assert client.post(url, headers=bearer(token)).json["status"] == "queued"


@both_backends
def test_a_broker_that_is_down_does_not_lose_the_job(app, client, token, config, db_session):
    class Down:
        def enqueue(self, job_id):
            raise ConnectionError("broker down")

    app.extensions["aligner_queue"] = Down()
    response = client.post("/api/v1/jobs", json={"name": "x", "config": config}, headers=bearer(token))
    assert response.status_code == 201 and response.json["status"] == "queued"
    with db_session() as session:
        job = session.get(Job, response.json["id"])
        logs = session.scalars(select(Event.payload).where(Event.job_id == job.id, Event.kind == "log")).all()
    assert job.status == "queued" and job.queued_at is not None  # the workers' sweep sends it again
    assert logs[-1]["level"] == "warning" and "stays queued and is sent again" in logs[-1]["message"]


def test_a_job_may_use_an_uploaded_dataset(client, token, config):
    upload = client.post(
        "/api/v1/datasets",
        data={"file": (io.BytesIO(b'{"prompt": "hi"}\n'), "p.jsonl")},
        headers=bearer(token),
    )
    dataset = upload.json["id"]
    config["data"] = {"train_dataset": dataset, "val_dataset": "p.jsonl"}  # by id, or by name
    job = create_job(client, token, config)
    assert job["config"]["data"] == {**job["config"]["data"], "train_dataset": dataset, "val_dataset": dataset}


def status_events(db_session, job_id: int) -> list[str]:
    with db_session() as session:
        stmt = select(Event.payload).where(Event.job_id == job_id, Event.kind == "status").order_by(Event.id)
        return [p["status"] for p in session.scalars(stmt)]


@both_backends
def test_a_job_carries_its_algorithm_and_the_actions_that_apply(client, token, admin_token, config, db_session):
    job = create_job(client, token, config)
    assert job["max_steps"] == 5 and job["actions"] == ["cancel"]
    for status, step, checkpoint, actions in ACTIONS_BY_STATE:
        put_in_state(db_session, job["id"], status, step, checkpoint)
        got = client.get(f"/api/v1/jobs/{job['id']}", headers=bearer(token)).json
        assert (got["algorithm"], got["kind"], got["actions"]) == ("reinforce", "reinforce", actions), status
        listed = client.get("/api/v1/jobs", headers=bearer(token)).json["items"]
        assert [j["actions"] for j in listed] == [actions], status
        admin = client.get(f"/api/v1/admin/jobs/{job['id']}", headers=bearer(admin_token)).json
        assert (admin["algorithm"], admin["actions"]) == ("reinforce", actions), status


@both_backends
def test_the_endpoints_accept_exactly_the_actions_the_job_lists(client, token, config, db_session):
    """Each action a job lists succeeds, every other one gets 409 (a cancel of a cancelling job: 200, unchanged)."""
    job = create_job(client, token, config)
    for status, step, checkpoint, actions in ACTIONS_BY_STATE:
        for action in ("cancel", "resume", "retry"):
            put_in_state(db_session, job["id"], status, step, checkpoint)
            response = client.post(f"/api/v1/jobs/{job['id']}/{action}", headers=bearer(token))
            if action in actions:
                assert response.status_code == 200, (status, step, checkpoint, action, response.json)
                assert response.json["status"] != status
            elif (status, action) == ("cancelling", "cancel"):
                assert response.status_code == 200 and response.json["status"] == "cancelling"
            else:
                assert response.status_code == 409, (status, step, checkpoint, action, response.json)


def all_at_once(n: int, request) -> list[int]:
    """`request()` from `n` threads released together; their status codes, sorted."""
    barrier = threading.Barrier(n)

    def go(_):
        barrier.wait()
        return request().status_code

    with ThreadPoolExecutor(n) as pool:
        return sorted(pool.map(go, range(n)))


@both_backends
def test_concurrent_resumes_and_cancels_apply_once(client, token, config, db_session, queue):
    """Four resumes of one job at the same moment: one queues it (one event, one message), three get 409; then four
    cancels: one cancels it, three get 409; the history says each once."""
    job = create_job(client, token, config)
    set_job(db_session, job["id"], status="failed", step=2)
    with db_session() as session:
        session.add(Checkpoint(job_id=job["id"], step=2, path="/x/step_000002"))
    codes = all_at_once(4, lambda: client.post(f"/api/v1/jobs/{job['id']}/resume", headers=bearer(token)))
    assert codes == [200, 409, 409, 409]
    assert queue.job_ids == [job["id"], job["id"]]  # the create, and one resume
    codes = all_at_once(4, lambda: client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=bearer(token)))
    assert codes == [200, 409, 409, 409]
    assert status_events(db_session, job["id"]) == ["queued", "queued", "cancelled"]
    response = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=bearer(token))
    assert response.status_code == 409 and "already finished (cancelled)" in response.json["message"]
