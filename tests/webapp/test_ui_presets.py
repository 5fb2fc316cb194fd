"""The New job form's "defaults" preset on a demo stack trains: the job it builds, resolved by the API's own code
against a catalogue holding what `aligner up --demo` registers, run by the real trainer, raises the demo reward,
and the form's rules (webapp/advice.py) find nothing to warn about in it (issue 30: the defaults trained nothing)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from aligner.trainers.run_log import read_jsonl
from tests.helpers.catalogue import add_dataset, register_model
from tests.helpers.learning import assert_reward_rises
from tests.helpers.training import train
from webapp import advice
from webapp.catalogue import inspect_model_folder
from webapp.db import User
from webapp.job_config import validate_job_config
from webapp.ui import form

# Steps of the run: the preset's own 80 take twice as long and the learning tests' 40 already rise well clear of
# their noise (tests/helpers/learning.py); the first and last FIRST_STEPS are compared too.
STEPS, FIRST_STEPS = 40, 10


@pytest.mark.slow(70)
def test_the_demo_stacks_default_preset_raises_the_demo_reward(demo_assets_dir, data_dir, app, db_session):
    (data_dir / "demo_assets").symlink_to(demo_assets_dir)
    preset = form.presets(data_dir)[form.DEFAULT_PRESET]
    config = form.build_job(preset["form"], preset["yaml"])["config"]
    with db_session() as session:  # what `aligner up --demo` registers (webapp/stack.py register_demo_assets)
        operator = session.scalar(select(User).where(User.name == "operator"))
        register_model(session, demo_assets_dir / "policy", "policy", form.DEMO_NAMES["policy"])
        for file_name in ("prompts_train.jsonl", "prompts_val.jsonl"):
            add_dataset(session, operator, demo_assets_dir / file_name, data_dir, shared=True,
                        name=form.DEMO_NAMES[file_name])  # fmt: skip
        job = validate_job_config(config, session, operator, data_dir, data_dir / "runs" / "defaults")
    assert not isinstance(job, dict), job
    parameters = inspect_model_folder(demo_assets_dir / "policy", "policy").num_parameters
    assert advice.training_warnings(config, parameters) == []
    assert job.train.data.train_file != job.train.data.val_file

    run = job.train.model_copy(deep=True)
    run.trainer.max_steps, run.trainer.progress_bar, run.model.num_threads = STEPS, False, 1
    trainer = train(run)
    rows = read_jsonl(trainer.run_dir / "metrics.jsonl")
    rewards = [row["train_rollouts/rewards"] for row in rows if row["step"] > 0]
    assert len(rewards) == STEPS
    assert_reward_rises(rewards)
    first, last = rewards[:FIRST_STEPS], rewards[-FIRST_STEPS:]
    assert sum(last) / FIRST_STEPS > sum(first) / FIRST_STEPS, rewards
