"""What leaves the service: no secret, no server path, no URL with credentials, no function target reaches a user,
in errors, events, dry-run messages, API fields or downloads (docs/security.md, "What leaves the service")."""

from __future__ import annotations

import io
import json
import os
import socket
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from tests.helpers.api import bearer, create_job
from tests.helpers.catalogue import register_model
from webapp.db import Checkpoint, Job, RewardFunction, ServerEndpoint, add_event, transition

PASSWORD = "pa55word-xyz"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def secret_server(db_session) -> str:
    """The URL of the catalogue's reward server `rm-secret`: a password in it, nothing listening."""
    url = f"http://alice:{PASSWORD}@127.0.0.1:{_closed_port()}"
    with db_session() as session:
        session.add(ServerEndpoint(name="rm-secret", kind="reward", url=url, model_name="reward_model"))
    return url


def _leaks(text: str, *secrets: str) -> list[str]:
    return [secret for secret in secrets if secret in text]


@pytest.mark.slow
def test_a_reward_try_names_the_server_never_its_url_or_password(
    client, token, secret_server, db_session, tiny_policy_dir
):
    with db_session() as session:
        register_model(session, tiny_policy_dir, "policy", "tiny-real")
    config = {
        "model": {"policy": "tiny-real", "num_threads": 1},
        "data": {"train_dataset": "train.jsonl"},
        "reward": {"server": "rm-secret", "unavailable_timeout_s": 0.2},
        "generation": {"max_new_tokens": 2},
    }
    response = client.post("/api/v1/rewards/try", json={"config": config, "num_prompts": 1, "num_samples": 2},
                           headers=bearer(token))  # fmt: skip
    assert response.status_code == 422, response.json
    text = response.get_data(as_text=True)
    host = secret_server.rsplit("@", 1)[1]
    assert not _leaks(text, PASSWORD, "alice", host, str(tiny_policy_dir)), text
    assert "<server rm-secret>" in text


def test_a_failed_jobs_error_and_events_name_entries_never_paths_or_urls(
    client, token, config, secret_server, db_session, data_dir
):
    job = create_job(client, token, config)
    with db_session() as session:
        session.add(RewardFunction(name="checker", target="mypkg.rewards:score"))
        session.flush()
        row = session.get(Job, job["id"])
        model = str((data_dir / "models" / "tiny-sft").resolve())
        said = (
            f"reward server {secret_server} cannot be reached; loading {model}/config.json; "
            f"in {row.run_dir}/train.log; mypkg.rewards:score raised; datasets at {data_dir.resolve()}/datasets"
        )
        add_event(session, row.id, "log", {"message": said, "level": "warning", "url": secret_server})
        transition(session, row, "running")
        transition(session, row, "failed", error=said)
    shown = client.get(f"/api/v1/jobs/{job['id']}", headers=bearer(token)).json["error"]
    events = client.get(f"/api/v1/jobs/{job['id']}/events", headers=bearer(token)).get_data(as_text=True)
    for text in (shown, events):
        assert not _leaks(text, PASSWORD, secret_server, str(data_dir.resolve()), "mypkg.rewards"), text
    assert shown == (
        "reward server <server rm-secret> cannot be reached; loading <model tiny-sft>/config.json; in <run "
        "folder>/train.log; <reward function checker> raised; datasets at <data dir>/datasets"
    )
    with db_session() as session:  # the row holds the same words: nothing said is kept elsewhere
        assert PASSWORD not in session.scalar(select(Job.error).where(Job.id == job["id"]))


def test_health_says_database_unavailable_never_the_drivers_error(tmp_path, caplog):
    from webapp import create_app
    from webapp.queues import InMemoryQueue

    url = f"sqlite:///{tmp_path}/no/such/dir/secret-name.db"
    app = create_app({"DATA_DIR": str(tmp_path), "DATABASE_URL": url, "JOB_QUEUE": InMemoryQueue()})
    response = app.test_client().get("/api/v1/health")
    assert response.status_code == 503
    assert response.json["database"] == "database unavailable" and "unable to open" not in response.text
    assert "unable to open" in caplog.text  # the operator reads why in the log


def test_the_cheap_checks_name_the_catalogue_entry_never_its_folder(client, token, config, db_session, data_dir):
    folder = data_dir / "models" / "broken"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    with db_session() as session:
        register_model(session, folder, "policy", "broken")
    config["model"] = {"policy": "broken"}
    for query in ("", "?dry_run=true"):
        response = client.post(f"/api/v1/jobs{query}", json={"name": "x", "config": config}, headers=bearer(token))
        text = response.get_data(as_text=True)
        assert "'broken'" in text and not _leaks(text, str(folder), str(data_dir)), text


def _checkpoint(data_dir: Path, job: dict, db_session, step: int = 2) -> Path:
    """A checkpoint folder of `job` as the trainer leaves it: its config.yaml holds the server's paths and URLs."""
    folder = data_dir / job["run_dir"] / "checkpoints" / f"step_{step:06d}"
    (folder / "policy").mkdir(parents=True)
    (folder / "trainer_state.pt").write_bytes(b"\1" * 10)
    with db_session() as session:
        session.add(Checkpoint(job_id=job["id"], step=step, path=str(folder.resolve())))
    return folder


def test_a_checkpoint_zip_names_catalogue_entries_and_follows_no_symlink(
    client, token, config, secret_server, db_session, data_dir
):
    config["reward"] = {"server": "rm-secret"}
    job = create_job(client, token, config)
    folder = _checkpoint(data_dir, job, db_session)
    model = str((data_dir / "models" / "tiny-sft").resolve())
    (folder / "config.yaml").write_text(f"model:\n  policy_path: {model}\nreward:\n  server_url: {secret_server}\n")
    (folder / "policy" / "config.json").write_text(json.dumps({"_name_or_path": model, "model_type": "llama"}))
    (folder / "passwd").symlink_to("/etc/passwd")  # planted: must not be followed
    (folder / "models").symlink_to(data_dir / "models", target_is_directory=True)
    response = client.get(f"/api/v1/jobs/{job['id']}/checkpoints/2/download", headers=bearer(token))
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.data)) as archive:
        names = sorted(archive.namelist())
        assert names == ["step_000002/config.yaml", "step_000002/policy/config.json", "step_000002/trainer_state.pt"]
        shown = yaml.safe_load(archive.read("step_000002/config.yaml"))
        everything = b"".join(archive.read(name) for name in names).decode(errors="replace")
    response.close()
    assert shown["model"]["policy"] == "tiny-sft" and shown["reward"]["server"] == "rm-secret"
    assert shown["run_dir"] == job["run_dir"] == f"runs/job_{job['id']}"
    assert not _leaks(everything, PASSWORD, secret_server, model, str(data_dir.resolve())), everything
    assert "<model tiny-sft>" in everything  # transformers' _name_or_path, named


def test_the_final_policy_zip_follows_no_symlink(client, token, config, db_session, data_dir):
    job = create_job(client, token, config)
    policy = data_dir / job["run_dir"] / "final_policy"
    policy.mkdir(parents=True)
    (policy / "model.safetensors").write_bytes(b"\0" * 10)
    (policy / "tokenizer.json").symlink_to("/etc/passwd")
    response = client.get(f"/api/v1/jobs/{job['id']}/model", headers=bearer(token))
    with zipfile.ZipFile(io.BytesIO(response.data)) as archive:
        assert archive.namelist() == ["final_policy/model.safetensors"]
    response.close()


def test_checkpoints_are_listed_by_step_and_size_never_the_servers_path(client, token, config, db_session, data_dir):
    job = create_job(client, token, config)
    _checkpoint(data_dir, job, db_session)
    (item,) = client.get(f"/api/v1/jobs/{job['id']}/checkpoints", headers=bearer(token)).json["items"]
    assert item["step"] == 2 and item["size_bytes"] == 10 and item["path"] == "checkpoints/step_000002"
    shown = client.get(f"/api/v1/jobs/{job['id']}", headers=bearer(token)).json
    assert str(data_dir.resolve()) not in json.dumps(shown)
    spec = client.get("/api/v1/openapi.json").json["components"]["schemas"]
    assert spec["CheckpointOut"]["properties"]["path"]["deprecated"] is True
    assert spec["JobOut"]["properties"]["run_dir"]["deprecated"] is True


def test_downloads_are_capped_per_user(app, client, token, other_token, config, db_session, data_dir):
    job = create_job(client, token, config)
    _checkpoint(data_dir, job, db_session)
    app.config["MAX_DOWNLOADS_PER_USER"] = 1
    url = f"/api/v1/jobs/{job['id']}/checkpoints/2/download"
    first = client.get(url, headers=bearer(token), buffered=False)  # still being sent: holds the slot
    assert first.status_code == 200
    second = client.get(url, headers=bearer(token))
    assert second.status_code == 429 and "downloads" in second.json["message"]
    first.close()  # sent: the slot comes back
    again = client.get(url, headers=bearer(token))
    assert again.status_code == 200
    again.close()


def test_the_dashboard_sweeps_the_checkpoint_zips_it_fetched():
    from webapp.ui import job_page

    folder = job_page.download_dir()
    old, new = job_page.download_target("job_1_step_000002.zip"), job_page.download_target("job_1_step_000002.zip")
    assert old != new and old.name == new.name  # the browser sees the plain name; two never collide
    old.write_bytes(b"x")
    new.write_bytes(b"y")
    os.utime(old, (time.time() - job_page.DOWNLOAD_MAX_AGE_S - 5,) * 2)
    assert job_page.download_dir() == folder  # one folder per process, removed at exit
    assert not old.exists() and not old.parent.exists() and new.exists()
    new.unlink()


def test_an_error_stored_before_redaction_is_shown_redacted(client, token, config, secret_server, db_session):
    job = create_job(client, token, config)
    with db_session() as session:  # written as an older version did: straight into the row
        session.get(Job, job["id"]).error = f"reward server {secret_server} cannot be reached"
    for url in (f"/api/v1/jobs/{job['id']}", "/api/v1/jobs"):
        assert PASSWORD not in client.get(url, headers=bearer(token)).get_data(as_text=True)


def test_a_config_error_quoting_a_catalogue_folder_names_the_entry(client, token, config, data_dir, monkeypatch):
    from webapp import jobs

    model = str((data_dir / "models" / "tiny-sft").resolve())
    said = {"config.model.policy": [f"cannot read {model}/config.json"]}  # as aligner's validation may word it
    monkeypatch.setattr(jobs, "validate_job_config", lambda *args: said)
    response = client.post("/api/v1/jobs", json={"name": "x", "config": config}, headers=bearer(token))
    assert response.status_code == 422
    assert response.json["errors"] == {"config.model.policy": ["cannot read <model tiny-sft>/config.json"]}
