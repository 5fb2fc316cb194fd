"""The worker's run health monitor (worker/health_monitor.py) as the ingestor feeds it, on SQLite and PostgreSQL:
one event per episode, `jobs.alarms`, nothing twice after a restart, and which alarms pause the job."""

from __future__ import annotations

import json

from sqlalchemy import select

from tests.helpers.service import create_job, job_row
from webapp.db import Event, Job, session_scope
from worker.ingest import RunIngestor, prune_after


def append_metrics(run_dir, steps, **values):
    """One metrics.jsonl line per step with the given values (a callable of the step, or a constant)."""
    with (run_dir / "metrics.jsonl").open("a") as f:
        for step in steps:
            row = {"step": step, "train_optim/loss": 0.1}
            row.update({name.replace("__", "/"): v(step) if callable(v) else v for name, v in values.items()})
            f.write(json.dumps(row) + "\n")


def poll(factory, ingestor, pausable=True):
    with session_scope(factory) as session:
        return ingestor.poll(session, pausable=pausable)


def new_ingestor(factory, job_id, run_dir):
    with session_scope(factory) as session:
        return RunIngestor(session, job_id, run_dir)


def health_events(factory, job_id):
    with session_scope(factory) as session:
        stmt = select(Event.payload).where(Event.job_id == job_id, Event.kind == "health").order_by(Event.id)
        return list(session.scalars(stmt))


def set_config(factory, job_id, config):
    with session_scope(factory) as session:
        session.get(Job, job_id).config = config


def corr(value):
    return {"train_rollouts__reward_length_corr": value}


def test_length_hacking_fires_once_clears_once_and_is_not_repeated_after_a_restart(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    ingestor = new_ingestor(factory, job_id, tmp_path)
    append_metrics(tmp_path, range(1, 21), **corr(0.0))
    assert poll(factory, ingestor)["pause"] == []
    for step in range(21, 31):  # the trainer writes a step at a time
        append_metrics(tmp_path, [step], **corr(0.9))
        poll(factory, ingestor)
    [firing] = health_events(factory, job_id)
    assert firing["alarm"] == "length_hacking" and firing["state"] == "firing" and firing["paused"] is False
    assert firing["step"] == 26 and "correlation 0.54" in firing["message"]  # 6 of the last 10 steps at 0.9
    assert set(firing) == {"alarm", "state", "step", "message", "paused"}
    assert job_row(factory, job_id).alarms == ["length_hacking"]

    restarted = new_ingestor(factory, job_id, tmp_path)  # a new worker reads the same file from the start
    poll(factory, restarted)
    append_metrics(tmp_path, [31], **corr(0.9))  # and the episode goes on
    poll(factory, restarted)
    assert len(health_events(factory, job_id)) == 1

    append_metrics(tmp_path, range(32, 41), **corr(0.0))
    poll(factory, restarted)
    cleared = health_events(factory, job_id)[1:]
    assert cleared == [
        {"alarm": "length_hacking", "state": "cleared", "step": 36, "message": "length_hacking no longer fires"}
    ]
    assert job_row(factory, job_id).alarms == []
    poll(factory, new_ingestor(factory, job_id, tmp_path))
    assert len(health_events(factory, job_id)) == 2


def test_a_non_finite_loss_fires_even_where_sql_cannot_keep_it(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    ingestor = new_ingestor(factory, job_id, tmp_path)
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "train_optim/loss": 0.5}\n{"step": 2, "train_optim/loss": null, "train_optim/grad_norm": NaN}\n'
    )
    poll(factory, ingestor)
    [firing] = health_events(factory, job_id)
    assert (firing["alarm"], firing["step"]) == ("nonfinite", 2)
    assert "train_optim/grad_norm is nan at step 2; train_optim/loss is nan at step 2" in firing["message"]
    assert job_row(factory, job_id).alarms == ["nonfinite"]


def test_pause_on_alarms_pause_once_per_episode_across_a_resume(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    set_config(factory, job_id, {"health": {"pause_on": ["kl_growth"], "window": 2, "min_points": 2, "kl_max": 1}})
    ingestor = new_ingestor(factory, job_id, tmp_path)
    append_metrics(tmp_path, [1, 2], train_rollouts__init_policy_kl=2.0)
    [alarm] = poll(factory, ingestor)["pause"]
    assert (alarm.name, alarm.step) == ("kl_growth", 2)
    assert health_events(factory, job_id)[0]["paused"] is True

    resumed = new_ingestor(factory, job_id, tmp_path)  # the job resumes: the alarm is still firing
    append_metrics(tmp_path, [3], train_rollouts__init_policy_kl=2.0)
    assert poll(factory, resumed)["pause"] == []
    append_metrics(tmp_path, [4, 5], train_rollouts__init_policy_kl=0.1)  # it clears ...
    assert poll(factory, resumed)["pause"] == []
    append_metrics(tmp_path, [6], train_rollouts__init_policy_kl=3.0)  # ... and a new episode pauses again
    assert [(a.name, a.step) for a in poll(factory, resumed)["pause"]] == [("kl_growth", 6)]
    states = [(e["state"], e["step"], e.get("paused")) for e in health_events(factory, job_id)]
    assert states == [("firing", 2, True), ("cleared", 5, None), ("firing", 6, True)]

    with session_scope(factory) as session:  # a start from scratch forgets the alarms with the metrics
        prune_after(session, job_id, None)
    assert job_row(factory, job_id).alarms == []
