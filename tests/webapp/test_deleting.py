"""Data a user can delete: a finished job (DELETE /jobs/{id}: its results and run folder go, its row stays as a
tombstone admins see with its events) and a dataset (DELETE /datasets/{id}, refused while an active job uses it);
admins delete anyone's. The dataset quota holds under concurrent uploads, and what a killed upload leaves behind
neither counts nor stays."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import func, select

from tests.helpers.api import ACTIONS_BY_STATE, PROMPTS, bearer, both_backends, create_job, put_in_state
from webapp import create_app
from webapp import datasets as datasets_module
from webapp.db import Checkpoint, Dataset, Job, Metric, Sample, add_event
from webapp.extensions import db

JOBS, DATASETS, ADMIN_JOBS = "/api/v1/jobs", "/api/v1/datasets", "/api/v1/admin/jobs"


def count(db_session, model, job_id: int) -> int:
    with db_session() as session:
        return session.scalar(select(func.count()).select_from(model).where(model.job_id == job_id))


def with_results(db_session, job: dict, status: str = "failed") -> Path:
    """Job `job` in `status` at step 2, with a run folder, a checkpoint, a metric, a sample and a samples event."""
    with db_session() as session:
        row = session.get(Job, job["id"])
        run_dir = Path(row.run_dir)  # the API shows it relative to the data folder; the row holds where it is
        (run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
        (run_dir / "checkpoints" / "step_000002" / "model.safetensors").write_bytes(b"weights")
        row.status, row.step = status, 2
        session.add(Checkpoint(job_id=job["id"], step=2, path=str(run_dir / "checkpoints" / "step_000002")))
        session.add(Metric(job_id=job["id"], step=1, name="train_rollouts/rewards", value=0.5))
        session.add(Sample(job_id=job["id"], step=1, split="train", index=0, prompt="secret", response="r", reward=1))
        example = {"prompt": "secret", "response": "r", "reward": 1.0}
        add_event(session, job["id"], "samples", {"step": 1, "split": "train", "count": 1, "example": example})
    return run_dir


# ------------------------------------------------------------------------------------------------------------ jobs
@both_backends
def test_deleting_a_finished_job_removes_its_results_and_leaves_an_audit_line(
    client, token, admin_token, config, db_session
):
    job = create_job(client, token, config)
    run_dir = with_results(db_session, job)
    assert client.get(f"{JOBS}/{job['id']}", headers=bearer(token)).json["actions"] == ["resume", "retry", "delete"]

    response = client.delete(f"{JOBS}/{job['id']}", headers=bearer(token))
    assert response.status_code == 204 and response.data == b""
    assert not run_dir.exists()
    assert [count(db_session, model, job["id"]) for model in (Metric, Sample, Checkpoint)] == [0, 0, 0]
    # Its owner sees it no more: not got, not listed, no results, no action.
    for path in ("", "/metrics", "/samples", "/checkpoints", "/events"):
        assert client.get(f"{JOBS}/{job['id']}{path}", headers=bearer(token)).status_code == 404, path
    for action in ("resume", "retry", "cancel"):
        assert client.post(f"{JOBS}/{job['id']}/{action}", headers=bearer(token)).status_code == 404, action
    assert client.delete(f"{JOBS}/{job['id']}", headers=bearer(token)).status_code == 404
    assert client.get(JOBS, headers=bearer(token)).json["total"] == 0

    # Admins see the tombstone: config scrubbed, nothing applies; its events end with who deleted it.
    tombstone = client.get(f"{ADMIN_JOBS}/{job['id']}", headers=bearer(admin_token)).json
    assert tombstone["deleted_at"] and tombstone["config"] == {} and tombstone["actions"] == []
    assert tombstone["status"] == "failed" and tombstone["user"] == "alice"
    listed = client.get(ADMIN_JOBS, headers=bearer(admin_token)).json["items"]
    assert [(j["id"], bool(j["deleted_at"])) for j in listed] == [(job["id"], True)]
    events = client.get(f"{ADMIN_JOBS}/{job['id']}/events", headers=bearer(admin_token)).json
    kinds = [e["kind"] for e in events["items"]]
    assert kinds == ["status", "samples", "deleted"] and events["total"] == 3
    assert events["items"][-1]["payload"] == {"status": "failed", "step": 2, "deleted_by": "alice"}
    assert "example" not in events["items"][1]["payload"]  # the samples' text went with them
    assert client.get(f"{ADMIN_JOBS}/{job['id']}/events", headers=bearer(token)).status_code == 403
    assert client.delete(f"{ADMIN_JOBS}/{job['id']}", headers=bearer(admin_token)).status_code == 409


@both_backends
def test_only_a_finished_job_can_be_deleted_as_its_actions_say(client, token, config, db_session):
    """DELETE answers 204 exactly where the job lists `delete` (finished or paused); 409 while it is queued, running
    or being cancelled, with the job and its results untouched."""
    for status, step, checkpoint, actions in ACTIONS_BY_STATE:
        job = create_job(client, token, config)
        put_in_state(db_session, job["id"], status, step, checkpoint)
        response = client.delete(f"{JOBS}/{job['id']}", headers=bearer(token))
        if "delete" in actions:
            assert response.status_code == 204, (status, response.json)
        else:
            assert response.status_code == 409, status
            assert response.json["message"] == (
                f"job {job['id']} is {status}: cancel it first; only a finished job can be deleted"
            )
            assert count(db_session, Checkpoint, job["id"]) == int(checkpoint)
            assert client.get(f"{JOBS}/{job['id']}", headers=bearer(token)).json["status"] == status


@both_backends
def test_a_job_is_deleted_once_and_a_deleted_job_is_never_resumed(client, token, config, db_session, queue):
    """Four deletes and four resumes of one job at the same moment: one delete applies; a resume either comes first
    (and the deletes then get 409) or gets 404/409; a deleted job never goes back to the queue."""
    job = create_job(client, token, config)
    with_results(db_session, job, status="cancelled")
    barrier = threading.Barrier(8)

    def go(method: str):
        barrier.wait()
        if method == "delete":
            return method, client.delete(f"{JOBS}/{job['id']}", headers=bearer(token)).status_code
        return method, client.post(f"{JOBS}/{job['id']}/resume", headers=bearer(token)).status_code

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(go, ["delete", "resume"] * 4))
    deleted = [code for method, code in results if method == "delete" and code == 204]
    resumed = [code for method, code in results if method == "resume" and code == 200]
    assert len(deleted) + len(resumed) == 1, results
    assert all(code in (200, 204, 404, 409) for _method, code in results), results
    with db_session() as session:
        row = session.get(Job, job["id"])
        assert (row.deleted_at is not None) == bool(deleted)
        assert row.status == ("queued" if resumed else "cancelled")


def test_an_admin_deletes_any_users_job_and_a_user_cannot(client, token, other_token, admin_token, config, db_session):
    job = create_job(client, token, config)
    run_dir = with_results(db_session, job, status="succeeded")
    assert client.delete(f"{JOBS}/{job['id']}", headers=bearer(other_token)).status_code == 404
    assert client.delete(f"{ADMIN_JOBS}/{job['id']}", headers=bearer(other_token)).status_code == 403
    assert client.delete(f"{ADMIN_JOBS}/{2**40}", headers=bearer(admin_token)).status_code == 404
    assert client.delete(f"{ADMIN_JOBS}/{job['id']}", headers=bearer(admin_token)).status_code == 204
    assert not run_dir.exists() and client.get(f"{JOBS}/{job['id']}", headers=bearer(token)).status_code == 404
    events = client.get(f"{ADMIN_JOBS}/{job['id']}/events", headers=bearer(admin_token)).json["items"]
    assert events[-1]["payload"]["deleted_by"] == "operator"


def test_a_deleted_jobs_run_folder_is_removed_only_inside_the_runs_folder(client, token, config, db_session, tmp_path):
    outside = tmp_path / "elsewhere"
    (outside / "keep").mkdir(parents=True)
    job = create_job(client, token, config)
    with db_session() as session:
        row = session.get(Job, job["id"])
        row.status, row.run_dir = "failed", str(outside)
    assert client.delete(f"{JOBS}/{job['id']}", headers=bearer(token)).status_code == 204
    assert (outside / "keep").is_dir()


# -------------------------------------------------------------------------------------------------------- datasets
def upload(client, token, content: bytes, name: str = "p.jsonl"):
    return client.post(DATASETS, data={"file": (io.BytesIO(content), name)}, headers=bearer(token))


LINES = "".join(json.dumps(p) + "\n" for p in PROMPTS).encode()


@both_backends
def test_a_dataset_is_deleted_unless_an_active_job_uses_it(client, token, other_token, config, data_dir, db_session):
    dataset = upload(client, token, LINES).json
    file = data_dir / dataset["path"]
    job = create_job(client, token, {**config, "data": {"train_dataset": dataset["id"], "val_dataset": "val.jsonl"}})

    for status in ("queued", "running", "cancelling"):
        put_in_state(db_session, job["id"], status, 0, False)
        response = client.delete(f"{DATASETS}/{dataset['id']}", headers=bearer(token))
        assert response.status_code == 409, status
        assert response.json["message"] == (
            f"dataset {dataset['id']} is used by 1 queued or running job (job {job['id']}): cancel it or wait for "
            "it to finish"
        )
        assert file.is_file()
    assert client.delete(f"{DATASETS}/{dataset['id']}", headers=bearer(other_token)).status_code == 404  # not theirs

    put_in_state(db_session, job["id"], "cancelled", 0, False)
    assert client.delete(f"{DATASETS}/{dataset['id']}", headers=bearer(token)).status_code == 204
    assert not file.exists()
    assert dataset["id"] not in [d["id"] for d in client.get(DATASETS, headers=bearer(token)).json["items"]]
    assert client.delete(f"{DATASETS}/{dataset['id']}", headers=bearer(token)).status_code == 404
    assert client.delete(f"{DATASETS}/{2**40}", headers=bearer(token)).status_code == 404
    # The job that named it, resumed, is refused at launch by the worker's lookup; submitted anew, at once.
    response = client.post(JOBS, json={"name": "again", "config": job["config"]}, headers=bearer(token))
    assert response.status_code == 422 and "config.data.train_dataset" in response.json["errors"]


def test_an_admin_deletes_any_dataset_and_a_user_cannot_delete_a_shared_one(
    client, token, other_token, admin_token, data_dir, db_session
):
    theirs = upload(client, other_token, LINES).json
    assert client.delete(f"{DATASETS}/{theirs['id']}", headers=bearer(token)).status_code == 404
    with db_session() as session:
        shared = session.scalar(select(Dataset.id).where(Dataset.name == "train.jsonl"))
    response = client.delete(f"{DATASETS}/{shared}", headers=bearer(token))
    assert response.status_code == 403 and "only its owner or an admin" in response.json["message"]
    for dataset_id in (theirs["id"], shared):
        assert client.delete(f"{DATASETS}/{dataset_id}", headers=bearer(admin_token)).status_code == 204
    assert not (data_dir / theirs["path"]).exists()
    with db_session() as session:
        assert (
            session.scalar(select(func.count()).select_from(Dataset).where(Dataset.id.in_([theirs["id"], shared])))
            == 0
        )


# ----------------------------------------------------------------------------------------------------- the quota
@both_backends
def test_concurrent_uploads_never_pass_the_dataset_quota(app, client, token, data_dir, monkeypatch):
    """Four uploads of one user released together, each of 2/5 of the quota, through two API apps (each its own
    engine and connections, as two API processes): at most two are kept, whatever the interleaving (the row-lock
    check alone let all four through on SQLite); every refused one leaves nothing."""
    app.config["MAX_DATASET_BYTES_PER_USER"] = 5 * len(LINES)
    keys = ("TESTING", "DATA_DIR", "DATABASE_URL", "JOB_QUEUE", "MAX_DATASET_BYTES_PER_USER")
    other = create_app({key: app.config[key] for key in keys})
    barrier = threading.Barrier(4)
    read = datasets_module.read_prompt_file

    def read_together(path):  # all four past the first check before any row exists: the race at its widest
        barrier.wait(timeout=20)
        return read(path)

    monkeypatch.setattr(datasets_module, "read_prompt_file", read_together)
    try:
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda i: upload((app, other)[i % 2].test_client(), token, LINES * 2), range(4)))
    finally:
        with other.app_context():
            db.engine.dispose()
    codes = sorted(r.status_code for r in responses)
    assert set(codes) <= {201, 413} and codes.count(201) <= 2, codes
    kept = [r.json["path"] for r in responses if r.status_code == 201]
    listed = [d["path"] for d in client.get(DATASETS, headers=bearer(token)).json["items"] if d["mine"]]
    assert sorted(listed) == sorted(kept)
    stored = [p.name for p in (data_dir / "datasets").glob("user_*/*")]
    assert sorted(stored) == sorted(Path(p).name for p in kept)  # nothing refused stays
    monkeypatch.setattr(datasets_module, "read_prompt_file", read)
    while upload(client, token, LINES * 2).status_code == 201:  # the quota is reached, not passed
        pass
    total = sum(d["size_bytes"] for d in client.get(DATASETS, headers=bearer(token)).json["items"] if d["mine"])
    assert 3 * len(LINES) < total + 2 * len(LINES) and total <= 5 * len(LINES)


def test_a_killed_uploads_leftovers_neither_count_nor_stay(app, client, token, data_dir):
    """What a killed API process leaves in a user's folder (a `.uploading` file; a renamed file whose row was never
    committed) is not counted, and the next upload removes it once it is STALE_UPLOAD_S old: never a fresh one,
    which may be another upload in progress."""
    app.config["MAX_DATASET_BYTES_PER_USER"] = 3 * len(LINES)
    first = upload(client, token, LINES).json
    folder = (data_dir / first["path"]).parent
    stale = [folder / ".0123abcd.uploading", folder / "0123abcd.jsonl"]
    fresh = folder / ".4567ef01.uploading"
    old = time.time() - datasets_module.STALE_UPLOAD_S - 60
    for path in (*stale, fresh):
        path.write_bytes(LINES * 10)
    for path in stale:
        os.utime(path, (old, old))

    second = upload(client, token, LINES * 2)  # exactly the quota with the first: the leftovers count for nothing
    assert second.status_code == 201, second.json
    assert not any(path.exists() for path in stale) and fresh.is_file()
    assert (data_dir / first["path"]).is_file() and (data_dir / second.json["path"]).is_file()
    mine = [d["id"] for d in client.get(DATASETS, headers=bearer(token)).json["items"] if d["mine"]]
    assert mine == [second.json["id"], first["id"]]


def test_a_dataset_row_from_before_sizes_were_kept_counts_by_its_file(app, client, token, data_dir, db_session):
    app.config["MAX_DATASET_BYTES_PER_USER"] = 3 * len(LINES)
    first = upload(client, token, LINES * 2).json
    with db_session() as session:
        session.get(Dataset, first["id"]).size_bytes = 0  # as migration 0003 left older rows
    assert upload(client, token, LINES * 2).status_code == 413
    assert upload(client, token, LINES).status_code == 201
