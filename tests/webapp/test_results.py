"""Job results: metrics and samples queries, checkpoints, the final policy zip, and the Server-Sent Events stream."""

from __future__ import annotations

import datetime as dt
import io
import json
import shutil
import time
import zipfile

from sqlalchemy import select

from aligner.run_layout import BEST_POLICY_DIR
from tests.helpers.api import bearer, both_backends, create_job
from webapp.db import (
    ApiToken,
    Checkpoint,
    Event,
    Job,
    Metric,
    Sample,
    User,
    add_event,
    create_token,
    revoke_token,
    transition,
)


def parse_sse(text: str) -> list[dict]:
    """The events of a text/event-stream body: [{"id": int, "event": str, "data": obj, "created_at": str}], comments
    left out."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if "data" in fields:
            event = {"id": int(fields["id"]), "event": fields["event"], "data": json.loads(fields["data"])}
            events.append({**event, **({"created_at": fields["created_at"]} if "created_at" in fields else {})})
    return events


@both_backends
def test_metrics_grouped_by_name_filtered_by_name_and_step(client, token, config, db_session):
    job = create_job(client, token, config)
    with db_session() as session:
        for step in range(4):
            session.add(Metric(job_id=job["id"], step=step, name="train_rollouts/rewards", value=step / 10))
            session.add(Metric(job_id=job["id"], step=step, name="train_optim/loss", value=-step))
        session.add(Metric(job_id=job["id"], step=0, name="val/rewards", value=0.25))
    url = f"/api/v1/jobs/{job['id']}/metrics"

    everything = client.get(url, headers=bearer(token)).json
    assert everything["job_id"] == job["id"]
    assert everything["metrics"]["train_rollouts/rewards"] == [[0, 0.0], [1, 0.1], [2, 0.2], [3, 0.3]]
    assert set(everything["metrics"]) == {"train_rollouts/rewards", "train_optim/loss", "val/rewards"}

    some = client.get(
        url, query_string={"name": ["train_optim/loss", "val/rewards"], "since_step": 1}, headers=bearer(token)
    ).json["metrics"]
    assert some == {"train_optim/loss": [[2, -2.0], [3, -3.0]]}
    assert client.get(url, query_string={"since_step": "x"}, headers=bearer(token)).status_code == 422


@both_backends
def test_samples_filters_and_pages(client, token, config, db_session):
    job = create_job(client, token, config)
    with db_session() as session:
        for step in (1, 2):
            for split in ("train", "validation"):
                for index in range(3):
                    reward = step + index / 10
                    gold = {"rule": reward / 2} if split == "validation" else None
                    session.add(
                        Sample(job_id=job["id"], step=step, split=split, index=index, prompt=f"p{index}",
                               response="r", reward=reward, kl=0.01, advantage=None, is_end=index != 2,
                               extra_rewards=gold)
                    )  # fmt: skip
    url = f"/api/v1/jobs/{job['id']}/samples"

    train2 = client.get(url, query_string={"step": 2, "split": "train"}, headers=bearer(token)).json
    assert train2["total"] == 3 and [s["index"] for s in train2["items"]] == [0, 1, 2]
    assert train2["items"][2] == {
        "step": 2, "split": "train", "index": 2, "prompt": "p2", "response": "r", "reward": 2.2, "kl": 0.01,
        "advantage": None, "is_end": False, "extra_rewards": None,
    }  # fmt: skip
    val1 = client.get(url, query_string={"step": 1, "split": "validation"}, headers=bearer(token)).json["items"]
    assert [s["extra_rewards"] for s in val1] == [{"rule": 0.5}, {"rule": 0.55}, {"rule": 0.6}]

    rich = client.get(url, query_string={"min_reward": 1.1, "max_reward": 2.05}, headers=bearer(token)).json
    assert rich["total"] == 6  # 1.1, 1.2 in both splits at step 1; 2.0 in both at step 2
    assert {(s["step"], s["reward"]) for s in rich["items"]} == {(1, 1.1), (1, 1.2), (2, 2.0)}

    page2 = client.get(url, query_string={"per_page": 5, "page": 2}, headers=bearer(token)).json
    assert page2["total"] == 12 and len(page2["items"]) == 5 and page2["items"][0]["step"] == 1
    bad = client.get(url, query_string={"split": "test", "per_page": 101}, headers=bearer(token))
    assert bad.status_code == 422 and set(bad.json["errors"]) == {"split", "per_page"}


def test_checkpoints_listed_in_step_order(client, token, config, db_session):
    job = create_job(client, token, config)
    with db_session() as session:
        for step in (20, 10):
            session.add(Checkpoint(job_id=job["id"], step=step, path=f"/runs/step_{step:06d}"))
    items = client.get(f"/api/v1/jobs/{job['id']}/checkpoints", headers=bearer(token)).json["items"]
    # The deprecated path is the folder in the run, never the server's; a folder gone has no size.
    assert [(c["step"], c["path"], c["size_bytes"]) for c in items] == [
        (10, "checkpoints/step_000010", None),
        (20, "checkpoints/step_000020", None),
    ]


def test_model_download_is_404_until_the_final_policy_exists_then_a_zip(client, token, config, data_dir):
    job = create_job(client, token, config)
    url = f"/api/v1/jobs/{job['id']}/model"
    missing = client.get(url, headers=bearer(token))
    assert missing.status_code == 404 and "no final policy" in missing.json["message"]

    policy = data_dir / job["run_dir"] / "final_policy"
    policy.mkdir(parents=True)
    (policy / "config.json").write_text('{"model_type": "llama"}')
    (policy / "model.safetensors").write_bytes(b"\0" * 1000)
    response = client.get(url, headers=bearer(token))
    assert response.status_code == 200 and response.mimetype == "application/zip"
    assert f"job_{job['id']}_final_policy.zip" in response.headers["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(response.data)) as archive:
        assert sorted(archive.namelist()) == ["final_policy/config.json", "final_policy/model.safetensors"]
        assert archive.read("final_policy/config.json") == b'{"model_type": "llama"}'
    response.close()

    time.sleep(0.01)
    (policy / "config.json").write_text('{"model_type": "llama", "v": 2}')  # newer than the cached zip: rebuilt
    with zipfile.ZipFile(io.BytesIO(client.get(url, headers=bearer(token)).data)) as archive:
        assert b'"v": 2' in archive.read("final_policy/config.json")


def test_the_best_policy_downloads_for_its_owner_only_once_written(client, token, other_token, config, data_dir):
    job = create_job(client, token, config)
    url = f"/api/v1/jobs/{job['id']}/best_model"
    missing = client.get(url, headers=bearer(token))
    assert missing.status_code == 404 and missing.json["message"] == f"job {job['id']} has no best policy yet " + (
        "(status queued)"
    )
    run_dir = data_dir / job["run_dir"]
    elsewhere = data_dir / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.json").write_text("{}")
    run_dir.mkdir(parents=True)
    (run_dir / BEST_POLICY_DIR).symlink_to(elsewhere)  # a folder planted elsewhere is never read
    refused = client.get(url, headers=bearer(token))
    assert refused.status_code == 404 and str(data_dir) not in refused.get_data(as_text=True)
    (run_dir / BEST_POLICY_DIR).unlink()

    def write_best(version: int) -> None:  # as the trainer does: a new folder renamed over the old one
        new = run_dir / f"{BEST_POLICY_DIR}.tmp"
        new.mkdir()
        (new / "config.json").write_text(json.dumps({"model_type": "llama", "v": version}))
        (new / "model.safetensors").write_bytes(b"\0" * 100)
        if (run_dir / BEST_POLICY_DIR).exists():
            shutil.rmtree(run_dir / BEST_POLICY_DIR)
        new.rename(run_dir / BEST_POLICY_DIR)

    write_best(1)
    response = client.get(url, headers=bearer(token))
    assert response.status_code == 200 and response.mimetype == "application/zip"
    assert f"job_{job['id']}_best_policy.zip" in response.headers["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(response.data)) as archive:
        assert sorted(archive.namelist()) == ["best_policy/config.json", "best_policy/model.safetensors"]
        assert json.loads(archive.read("best_policy/config.json"))["v"] == 1
    response.close()
    assert client.get(url, headers=bearer(other_token)).status_code == 404  # another user's job
    assert client.get(f"/api/v1/jobs/{job['id']}/model", headers=bearer(token)).status_code == 404  # not final

    time.sleep(0.01)
    write_best(2)  # a better validation since: the kept zip is built again
    with zipfile.ZipFile(io.BytesIO(client.get(url, headers=bearer(token)).data)) as archive:
        assert json.loads(archive.read("best_policy/config.json"))["v"] == 2


def test_a_checkpoint_downloads_as_a_zip_for_its_owner_only(client, token, other_token, config, db_session, data_dir):
    job = create_job(client, token, config)
    folder = data_dir / job["run_dir"] / "checkpoints" / "step_000002"
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "config.json").write_text('{"model_type": "llama"}')
    (folder / "state.pt").write_bytes(b"\1" * 100)
    outside = (data_dir / job["run_dir"]).parent / "elsewhere"
    outside.mkdir()
    with db_session() as session:
        session.add(Checkpoint(job_id=job["id"], step=2, path=str(folder)))
        session.add(Checkpoint(job_id=job["id"], step=4, path=str(outside)))  # a row pointing out of the run
    url = f"/api/v1/jobs/{job['id']}/checkpoints/{{}}/download"
    response = client.get(url.format(2), headers=bearer(token))
    assert response.status_code == 200 and response.mimetype == "application/zip"
    assert f"job_{job['id']}_step_000002.zip" in response.headers["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(response.data)) as archive:
        assert sorted(archive.namelist()) == [
            "step_000002/config.yaml",  # the job's config, as the API shows it
            "step_000002/policy/config.json",
            "step_000002/state.pt",
        ]
        assert archive.read("step_000002/state.pt") == b"\1" * 100
    response.close()
    for step in (3, 4, 2**40):  # no such step, a folder outside the job's checkpoints, past any column
        missing = client.get(url.format(step), headers=bearer(token))
        assert missing.status_code == 404 and f"no checkpoint of step {step}" in missing.json["message"]
    assert client.get(url.format(2), headers=bearer(other_token)).status_code == 404


@both_backends
def test_event_stream_sends_events_then_ends_when_the_job_is_final(client, token, config, db_session):
    job = create_job(client, token, config)
    with db_session() as session:
        row = session.get(Job, job["id"])
        transition(session, row, "running")
        add_event(session, job["id"], "metrics", {"step": 1, "train_rollouts/rewards": 0.5})
        transition(session, row, "succeeded", step=1)

    # ?timeout only bounds a broken stream here: a finished job's stream ends by itself, at once.
    started = time.monotonic()
    response = client.get(f"/api/v1/jobs/{job['id']}/events?timeout=5", headers=bearer(token))
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-cache"
    events = parse_sse(response.get_data(as_text=True))
    assert [(e["event"], e["data"].get("status")) for e in events] == [
        ("status", "queued"),
        ("status", "running"),
        ("metrics", None),
        ("status", "succeeded"),
    ]
    assert events[2]["data"] == {"step": 1, "train_rollouts/rewards": 0.5}
    # Each event says when it was recorded, in UTC (the dashboard's event log shows it).
    with db_session() as session:
        recorded = {e.id: e.created_at for e in session.scalars(select(Event).where(Event.job_id == job["id"]))}
    for event in events:
        created = dt.datetime.fromisoformat(event["created_at"])
        assert created.utcoffset() == dt.timedelta(0) and created.replace(tzinfo=None) == recorded[event["id"]]
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    assert time.monotonic() - started < 2

    # Resumption: the Last-Event-ID header (what EventSource sends on reconnecting), or the query parameter.
    after = client.get(
        f"/api/v1/jobs/{job['id']}/events?timeout=5", headers={**bearer(token), "Last-Event-ID": str(events[1]["id"])}
    )
    assert [e["id"] for e in parse_sse(after.get_data(as_text=True))] == [events[2]["id"], events[3]["id"]]
    url = f"/api/v1/jobs/{job['id']}/events?timeout=5&last_event_id={events[2]['id']}"
    after = client.get(url, headers=bearer(token))
    assert [e["id"] for e in parse_sse(after.get_data(as_text=True))] == [events[3]["id"]]


def test_event_stream_of_a_running_job_follows_new_events_until_timeout(app, client, token, config, db_session):
    app.config["SSE_HEARTBEAT_INTERVAL"] = 0.05
    job = create_job(client, token, config)
    with db_session() as session:
        transition(session, session.get(Job, job["id"]), "running")
    response = client.get(f"/api/v1/jobs/{job['id']}/events?timeout=0.6", headers=bearer(token), buffered=False)
    chunks = response.iter_encoded()
    text = ""
    while text.count("event: status") < 2:  # queued and running are there at once
        text += next(chunks).decode()
    with db_session() as session:  # written while the stream is open
        add_event(session, job["id"], "log", {"message": "hello"})
    started = time.monotonic()
    text += b"".join(chunks).decode()  # the rest, until the timeout ends the stream
    assert time.monotonic() - started < 2
    assert [e["event"] for e in parse_sse(text)] == ["status", "status", "log"]
    assert parse_sse(text)[-1]["data"] == {"message": "hello"}
    assert ": heartbeat" in text and text.startswith("retry: ")


def test_event_stream_rejects_a_bad_last_event_id(client, token, config):
    job = create_job(client, token, config)
    response = client.get(f"/api/v1/jobs/{job['id']}/events", headers={**bearer(token), "Last-Event-ID": "abc"})
    assert response.status_code == 422 and "Last-Event-ID" in response.json["errors"]


def test_event_ids_are_per_job(client, token, config, db_session):
    first, second = create_job(client, token, config), create_job(client, token, config)
    with db_session() as session:
        add_event(session, second["id"], "log", {"message": "not yours"})
        transition(session, session.get(Job, first["id"]), "cancelled")
    response = client.get(f"/api/v1/jobs/{first['id']}/events?timeout=5", headers=bearer(token))
    assert [e["data"]["status"] for e in parse_sse(response.get_data(as_text=True))] == ["queued", "cancelled"]


@both_backends
def test_an_open_event_stream_ends_once_its_token_is_revoked_or_expired(app, client, token, config, db_session):
    """Signing in once is not enough for a stream that may run for hours: each poll checks the token again, and a
    revoked or expired one gets no event written after that."""
    job = create_job(client, token, config)
    url = f"/api/v1/jobs/{job['id']}/events?timeout=10"
    with db_session() as session:
        transition(session, session.get(Job, job["id"]), "running")
        token_id = session.scalar(select(ApiToken.id).join(User).where(User.name == "alice"))

    response = client.get(url, headers=bearer(token), buffered=False)
    chunks = response.iter_encoded()
    text = ""
    while text.count("event: status") < 2:  # queued, running
        text += next(chunks).decode()
    with db_session() as session:
        revoke_token(session, token_id)
        add_event(session, job["id"], "log", {"message": "after the revocation"})
    started = time.monotonic()
    text += b"".join(chunks).decode()
    assert time.monotonic() - started < 2  # well before the 10 s timeout
    assert "after the revocation" not in text and text.endswith(": signed out (the token was revoked or expired)\n\n")
    assert client.get(url, headers=bearer(token)).status_code == 401

    with db_session() as session:
        short = create_token(session, "alice", "short-lived", expires_days=1 / 86400)  # 1 s
    started = time.monotonic()
    response = client.get(url, headers=bearer(short), buffered=False)
    assert response.status_code == 200
    text = b"".join(response.iter_encoded()).decode()
    assert "after the revocation" in text  # served while the token lived...
    assert text.endswith(": signed out (the token was revoked or expired)\n\n")  # ...ended at its expiry
    assert time.monotonic() - started < 3
