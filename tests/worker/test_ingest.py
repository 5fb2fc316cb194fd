"""Ingestion of a run directory into SQL (worker/ingest.py), without Celery, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math

from sqlalchemy import func, select

from aligner.run_layout import checkpoint_steps
from aligner.trainers.run_log import truncate_after
from tests.helpers.service import create_job
from webapp.db import Checkpoint, Event, Job, Metric, Sample, session_scope
from worker.ingest import JsonlTail, RunIngestor, prune_after


def metric_line(step, reward):
    return json.dumps({"step": step, "train_rollouts/rewards": reward, "train_optim/loss": -reward}) + "\n"


def sample_lines(step, split, n):
    return "".join(
        json.dumps({"step": step, "split": split, "prompt": f"p{i}", "response": f"r{i}", "reward": i / 10,
                    "kl": 0.0, "advantage": None, "is_end": True}) + "\n"
        for i in range(n)
    )  # fmt: skip


def poll(factory, ingestor, final=False):
    with session_scope(factory) as session:
        return ingestor.poll(session, final=final)


def new_ingestor(factory, job_id, run_dir):
    with session_scope(factory) as session:
        return RunIngestor(session, job_id, run_dir)


def rows(factory, *columns, where=None):
    with session_scope(factory) as session:
        stmt = select(*columns).order_by(*columns)
        return [tuple(row) for row in session.execute(stmt if where is None else stmt.where(where))]


def events(factory, job_id, kind=None):
    with session_scope(factory) as session:
        stmt = select(Event).where(Event.job_id == job_id).order_by(Event.id)
        if kind:
            stmt = stmt.where(Event.kind == kind)
        return [e.payload for e in session.scalars(stmt)]


def test_tail_leaves_a_partial_last_line_for_the_next_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == ([], False)  # no file yet
    path.write_text(metric_line(0, 0.1) + '{"step": 1, "train_rol')
    assert [r["step"] for r in tail.read()[0]] == [0]
    with path.open("a") as f:
        f.write('louts/rewards": 0.2}\n{"step": 2}')
    assert [r["step"] for r in tail.read()[0]] == [1]
    assert tail.read()[0] == []  # step 2 has no newline yet
    assert [r["step"] for r in tail.read(final=True)[0]] == [2]  # the writer has exited: take it


def test_tail_skips_bad_lines_and_restarts_when_the_file_shrinks(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(metric_line(0, 0.1) + "not json\n" + '["a list"]\n' + metric_line(1, 0.2))
    tail = JsonlTail(path)
    assert [r["step"] for r in tail.read()[0]] == [0, 1]
    assert tail.bad_lines == 2
    path.write_text(metric_line(0, 0.1))
    lines, restarted = tail.read()
    assert restarted and [r["step"] for r in lines] == [0]


def test_metrics_samples_checkpoints_and_events(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    (tmp_path / "metrics.jsonl").write_text(metric_line(0, 0.0) + metric_line(1, 0.5))
    gold = json.dumps({"step": 0, "split": "validation", "prompt": "p", "response": "r", "reward": 1.5,
                       "extra_rewards": {"rule": 0.25, "rm": float("nan"), "bad": "x"}})  # fmt: skip
    (tmp_path / "samples.jsonl").write_text(
        sample_lines(0, "validation", 3) + gold + "\n" + sample_lines(1, "train", 2)
    )
    ingestor = new_ingestor(factory, job_id, tmp_path)
    got = poll(factory, ingestor)
    assert got["steps"] == [0, 1] and got["samples"] == 6 and got["checkpoints"] == []
    # a validation sample's gold rewards are kept as JSON can hold them (NaN as null, a non-number dropped)
    with session_scope(factory) as session:
        stored = session.scalar(select(Sample.extra_rewards).where(Sample.split == "validation", Sample.index == 3))
    assert stored == {"rule": 0.25, "rm": None}
    assert rows(factory, Metric.step, Metric.name, Metric.value) == [
        (0, "train_optim/loss", -0.0), (0, "train_rollouts/rewards", 0.0),
        (1, "train_optim/loss", -0.5), (1, "train_rollouts/rewards", 0.5),
    ]  # fmt: skip
    assert rows(factory, Sample.step, Sample.split, Sample.index) == [
        (0, "validation", 0),
        (0, "validation", 1),
        (0, "validation", 2),
        (0, "validation", 3),
        (1, "train", 0),
        (1, "train", 1),
    ]
    job = rows(factory, Job.step, Job.latest_reward, where=Job.id == job_id)
    assert job == [(1, 0.5)]
    assert [e["step"] for e in events(factory, job_id, "metrics")] == [0, 1]
    assert events(factory, job_id, "metrics")[1]["metrics"] == {
        "train_rollouts/rewards": 0.5,
        "train_optim/loss": -0.5,
    }
    summary = events(factory, job_id, "samples")
    assert [(e["step"], e["split"], e["count"]) for e in summary] == [(0, "validation", 4), (1, "train", 2)]
    assert summary[0]["example"] == {"prompt": "p0", "response": "r0", "reward": 0.0}

    # A checkpoint counts once it has its final name (the trainer writes step_N.tmp, then renames it).
    tmp = tmp_path / "checkpoints" / "step_000002.tmp"
    tmp.mkdir(parents=True)
    (tmp / "trainer_state.pt").write_bytes(b"x")
    assert poll(factory, ingestor)["checkpoints"] == []
    tmp.rename(tmp.with_name("step_000002"))
    assert list(checkpoint_steps(tmp_path)) == [2]
    assert poll(factory, ingestor)["checkpoints"] == [2]
    assert poll(factory, ingestor)["checkpoints"] == []
    assert rows(factory, Checkpoint.step) == [(2,)]
    assert [e["step"] for e in events(factory, job_id, "checkpoint")] == [2]


def test_reingesting_after_a_restart_duplicates_nothing(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    (tmp_path / "metrics.jsonl").write_text(metric_line(0, 0.0) + metric_line(1, 0.5))
    (tmp_path / "samples.jsonl").write_text(sample_lines(1, "train", 4))
    poll(factory, new_ingestor(factory, job_id, tmp_path))
    before = rows(factory, Metric.step, Metric.name, Metric.value), rows(factory, Sample.step, Sample.index)
    n_events = len(events(factory, job_id))

    # A new worker reads the same files from the start, then the trainer goes on.
    ingestor = new_ingestor(factory, job_id, tmp_path)
    assert poll(factory, ingestor) == {"steps": [], "samples": 4, "checkpoints": [], "events": 0, "pause": []}
    assert (rows(factory, Metric.step, Metric.name, Metric.value), rows(factory, Sample.step, Sample.index)) == before
    assert len(events(factory, job_id)) == n_events
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(metric_line(2, 0.7))
    assert poll(factory, ingestor)["steps"] == [2]
    with session_scope(factory) as session:
        counts = session.execute(
            select(Metric.step, Metric.name, func.count()).group_by(Metric.step, Metric.name)
        ).all()
    assert len(counts) == 6 and all(c == 1 for *_, c in counts)


def test_a_failed_transaction_is_read_again(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "train_optim/grad_norm": math.inf}) + "\n")
    ingestor = new_ingestor(factory, job_id, tmp_path)
    snapshot = ingestor.snapshot()
    with factory() as session:
        ingestor.poll(session)
        session.rollback()  # e.g. the database went away before the commit
    ingestor.restore(snapshot)
    assert poll(factory, ingestor)["steps"] == [0]
    assert rows(factory, Metric.step) == [(0,)]
    assert [(e["alarm"], e["state"]) for e in events(factory, job_id, "health")] == [("nonfinite", "firing")]


def test_non_finite_values(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "train_optim/loss": float("nan"), "train_optim/grad_norm": float("inf"), "note": "x"})
        + "\n"
    )
    poll(factory, new_ingestor(factory, job_id, tmp_path))
    stored = dict(rows(factory, Metric.name, Metric.value))
    assert stored["train_optim/grad_norm"] == math.inf and "note" not in stored
    with session_scope(factory) as session:
        if session.get_bind().dialect.name == "postgresql":
            assert math.isnan(stored["train_optim/loss"])
    # JSON has no NaN or infinity: the event carries null.
    assert events(factory, job_id, "metrics")[0]["metrics"] == {
        "train_optim/loss": None,
        "train_optim/grad_norm": None,
    }


def test_prune_and_truncate_before_a_resume(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(metric_line(s, s / 10) for s in range(5)) + '{"step": 5, "tr')
    (tmp_path / "samples.jsonl").write_text(sample_lines(2, "train", 2) + sample_lines(3, "train", 2))
    poll(factory, new_ingestor(factory, job_id, tmp_path))
    with session_scope(factory) as session:
        session.add(Checkpoint(job_id=job_id, step=4, path="x"))
        prune_after(session, job_id, 2)
    assert {s for (s,) in rows(factory, Metric.step)} == {0, 1, 2}
    assert rows(factory, Sample.step, Sample.index) == [(2, 0), (2, 1)]
    assert rows(factory, Checkpoint.step) == []
    assert rows(factory, Job.step, Job.latest_reward, where=Job.id == job_id) == [(2, 0.2)]
    truncate_after(metrics, 2)  # what the worker does to the files before the trainer resumes
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1, 2]
    with session_scope(factory) as session:
        prune_after(session, job_id, None)
    assert rows(factory, Metric.step) == [] and rows(factory, Job.step, where=Job.id == job_id) == [(0,)]


def test_nul_characters_in_generated_text(factory, tmp_path):
    """A tiny random policy generates any byte, NUL included, which PostgreSQL's text type refuses."""
    job_id = create_job(factory, {}, tmp_path)
    row = {"step": 1, "split": "train", "prompt": "p", "response": "a\x00b", "reward": 0.0}
    (tmp_path / "samples.jsonl").write_text(json.dumps(row) + "\n")
    poll(factory, new_ingestor(factory, job_id, tmp_path))
    assert rows(factory, Sample.response) == [("a\ufffdb",)]
    assert events(factory, job_id, "samples")[0]["example"]["response"] == "a\ufffdb"


def test_trainer_events_are_relayed_as_job_events(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    from aligner.trainers.run_log import RunLog

    RunLog(tmp_path).log_event(3, "waiting for reward server http://x", level="warning", waited_s=2.5)
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "level": "shout", "message": "m" * 5000, "nested": {"a": 1}}) + "\n")
    ingestor = new_ingestor(factory, job_id, tmp_path)
    assert poll(factory, ingestor)["events"] == 2
    relayed = events(factory, job_id, "log")
    assert relayed[0] == {
        "step": 3, "message": "waiting for reward server http://x", "level": "warning", "waited_s": 2.5
    }  # fmt: skip
    assert relayed[1]["level"] == "info" and len(relayed[1]["message"]) == 2000 and "nested" not in relayed[1]
    assert poll(factory, ingestor)["events"] == 0  # each line once


def test_skipped_lines_are_counted_in_a_job_event(factory, tmp_path):
    job_id = create_job(factory, {}, tmp_path)
    (tmp_path / "metrics.jsonl").write_text(metric_line(0, 0.1) + "not json\n" + '{"no": "step"}\n')
    ingestor = new_ingestor(factory, job_id, tmp_path)
    poll(factory, ingestor)
    warnings = [e for e in events(factory, job_id, "log") if e.get("level") == "warning"]
    assert len(warnings) == 1 and "skipped 2 line(s) of metrics.jsonl" in warnings[0]["message"]
    poll(factory, ingestor)  # nothing new: no second report
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write("{broken\n" + metric_line(1, 0.2))
    poll(factory, ingestor)
    warnings = [e for e in events(factory, job_id, "log") if e.get("level") == "warning"]
    assert len(warnings) == 2 and "skipped 1 line(s)" in warnings[1]["message"]
    assert "(3 in this run" in warnings[1]["message"]
