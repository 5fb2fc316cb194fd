"""The worker checks a job again before launching it: a job row edited in SQL to hold a path, a URL, code, another
user's dataset, or a catalogue entry swapped since, is refused at launch and its trainer never starts."""

from __future__ import annotations

import os
import shutil

import pytest
from sqlalchemy.orm.attributes import flag_modified

from tests.helpers.catalogue import add_dataset
from tests.helpers.service import create_job
from webapp.db import CatalogueModel, Dataset, Job, User, session_scope
from worker.runner import run_job
from worker.settings import Settings


def edit_config(factory, job_id, edit) -> None:
    with session_scope(factory) as session:
        job = session.get(Job, job_id)
        config = job.config
        edit(session, config)
        job.config = config
        flag_modified(job, "config")


def set_policy_path(session, config):
    config["model"]["policy_path"] = "/etc"


def set_reward_code(session, config):
    config["reward"]["function"] = "os:system"


def set_reward_url(session, config):
    config["reward"] = {"server_url": "http://169.254.169.254/latest/meta-data"}


def set_critic_override(session, config):
    config["algorithm"] = "ppo"
    config["critic"] = {
        **config.get("critic", {}),
        "model": config["model"]["policy"],
        "server_overrides": ["host=0.0.0.0"],
    }


def use_another_users_dataset(session, config):
    other = User(name="someone-else")
    session.add(other)
    session.flush()
    mine = session.get(Dataset, config["data"]["train_dataset"])
    theirs = Dataset(user_id=other.id, name="private", path=mine.path, num_prompts=mine.num_prompts)
    session.add(theirs)
    session.flush()
    config["data"]["train_dataset"] = theirs.id


def swap_policy_for_a_symlink(session, config):
    entry = session.query(CatalogueModel).filter_by(name=config["model"]["policy"]).one()
    folder = entry.path
    os.rename(folder, folder + ".moved")
    os.symlink("/etc", folder)


def raise_a_limit(session, config):
    config["model"]["num_threads"] = 10_000


EDITS = {
    "model.policy_path": set_policy_path,
    "reward.function": set_reward_code,
    "reward.server_url": set_reward_url,
    "critic.server_overrides": set_critic_override,
    "data.train_dataset": use_another_users_dataset,
    "model.policy": swap_policy_for_a_symlink,
    "model.num_threads": raise_a_limit,
}


@pytest.mark.parametrize("field", list(EDITS))
def test_an_edited_job_row_is_refused_at_launch(factory, tmp_path, job_config, tiny_policy_dir, field):
    policy = shutil.copytree(tiny_policy_dir, tmp_path / "policy")  # a copy of its own: one test swaps it
    job_id = create_job(factory, job_config(model={"policy_path": str(policy)}), tmp_path / "run")
    edit_config(factory, job_id, EDITS[field])

    settings = Settings(database_url="unused", data_dir=tmp_path / "data")
    result = run_job(job_id, settings, factory)
    assert result["outcome"] == "failed"
    with session_scope(factory) as session:
        job = session.get(Job, job_id)
        assert job.status == "failed" and "refused at launch" in job.error and f"config.{field}" in job.error
    assert not (tmp_path / "run" / "train.log").exists()  # no trainer started


def test_a_dataset_symlinked_out_of_the_datasets_folder_is_refused_at_launch(factory, tmp_path, job_config):
    job_id = create_job(factory, job_config(), tmp_path / "run")
    with session_scope(factory) as session:
        config = session.get(Job, job_id).config
        stored = tmp_path / "data" / session.get(Dataset, config["data"]["val_dataset"]).path
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"prompt": "not yours"}\n')
    stored.unlink()
    stored.symlink_to(secret)
    assert run_job(job_id, Settings(database_url="unused", data_dir=tmp_path / "data"), factory)["outcome"] == "failed"
    with session_scope(factory) as session:
        assert "config.data.val_dataset" in session.get(Job, job_id).error


def test_an_owners_dataset_is_accepted_where_another_users_copy_is_not(factory, tmp_path, job_config, prompt_files):
    """The same file as the owner's own dataset passes the check (the refusals above are about ownership)."""
    from webapp.job_config import launch_config

    job_id = create_job(factory, job_config(), tmp_path / "run")
    with session_scope(factory) as session:
        job = session.get(Job, job_id)
        owner = session.get(User, job.user_id)
        job.config["data"]["val_dataset"] = add_dataset(session, owner, prompt_files[1], tmp_path / "data")
        config = launch_config(session, job, tmp_path / "data", tmp_path / "run")
        assert config.data.val_file.startswith(str((tmp_path / "data" / "datasets").resolve()))


def point_my_dataset_at_another_users_file(session, data_dir, dataset):
    """The owner's own dataset row, edited in SQL to name another user's private upload."""
    other = User(name="someone-else")
    session.add(other)
    session.flush()
    theirs = data_dir / "datasets" / f"user_{other.id}" / "private.jsonl"
    theirs.parent.mkdir(parents=True)
    theirs.write_text('{"prompt": "not yours"}\n')
    session.add(Dataset(user_id=other.id, name="private", path=str(theirs.relative_to(data_dir)), num_prompts=1))
    dataset.path = str(theirs.relative_to(data_dir))


def point_my_dataset_outside_the_datasets_folder(session, data_dir, dataset):
    outside = data_dir / "runs" / "job_9" / "samples.jsonl"  # inside DATA_DIR, outside DATA_DIR/datasets
    outside.parent.mkdir(parents=True)
    outside.write_text('{"prompt": "not a dataset"}\n')
    dataset.path = str(outside.relative_to(data_dir))


@pytest.mark.parametrize(
    "edit", [point_my_dataset_at_another_users_file, point_my_dataset_outside_the_datasets_folder]
)
def test_a_dataset_row_edited_to_name_a_file_not_the_owners_is_refused_at_launch(factory, tmp_path, job_config, edit):
    """The worker's dataset check is real: the file the trainer would read must be one of the owner's (or a shared)
    datasets inside DATA_DIR/datasets, and no other user's; the job row is untouched, its dataset row was edited."""
    job_id = create_job(factory, job_config(), tmp_path / "run")
    data_dir = tmp_path / "data"
    with session_scope(factory) as session:
        config = session.get(Job, job_id).config
        edit(session, data_dir, session.get(Dataset, config["data"]["train_dataset"]))
    result = run_job(job_id, Settings(database_url="unused", data_dir=data_dir), factory)
    assert result["outcome"] == "failed"
    with session_scope(factory) as session:
        error = session.get(Job, job_id).error
        assert "refused at launch" in error and "config.data.train_dataset" in error
    assert not (tmp_path / "run" / "train.log").exists()  # no trainer started
