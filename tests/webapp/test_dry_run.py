"""POST /api/v1/jobs?dry_run=true (webapp/dry_run.py): the cheap checks, the reward tried, the step estimated."""

from __future__ import annotations

import pytest

from tests.helpers.api import bearer
from tests.helpers.catalogue import register_model
from webapp import dry_run, rewards_try

JOBS = "/api/v1/jobs"


def test_a_dry_run_checks_everything_creates_nothing_and_estimates_the_step(client, token, config, monkeypatch):
    timings = {"load_s": 1.0, "generate_s": 0.4, "score_s": 0.04, "max_length": 8, "batch_start_s": 0.05,
               "decode_step_s": 0.01}  # fmt: skip
    result = {"samples": [{"group": 0, "prompt": "p", "response": "r", "reward": 0.5, "length": 8}] * 4,
              "groups": [], "reward_length_corr": 0.0, "frac_zero_std_groups": 0.0, "seconds": 1.5,
              "warnings": ["reward correlates with length (0.93)"], "timings": timings}  # fmt: skip
    tried = []

    def fake_try(train, num_prompts, num_samples, timeout_s, step_batch):
        tried.append((num_prompts, num_samples, train.generation.max_new_tokens, step_batch))
        return rewards_try.TryOutcome(result, rewards_try._bounded(train))

    monkeypatch.setattr(dry_run, "run_try", fake_try)
    config["generation"] = {"max_new_tokens": 16}
    config["reinforce"] = {"num_prompts_per_step": 4, "num_rollouts_per_prompt": 4}
    config["generation"]["batch_size"] = 3  # prompts a generation batch: the step's 4 take two
    response = client.post(JOBS, query_string={"dry_run": "true"}, json={"name": "x", "config": config},
                           headers=bearer(token))  # fmt: skip
    assert response.status_code == 200, response.json
    body = response.json
    assert set(body) == {"ok", "checks", "warnings", "estimated_step_s", "memory", "config"} and body["ok"] is True
    assert body["memory"] is None  # the stand-in policy has no weights whose headers tell its size
    assert [c["name"] for c in body["checks"]] == ["policy", "tokenizer", "datasets", "reward", "step_time"]
    assert all(set(c) == {"name", "ok", "message", "seconds"} and c["ok"] for c in body["checks"])
    assert tried == [(2, 2, 16, (3, 4))]  # timed: a batch of 3 prompts x 4 samples
    # trainer.max_steps 5 ends within aligner's 10 warm-up steps: a warning, the job still ready.
    assert [w["field"] for w in body["warnings"]] == ["config.trainer.max_steps"]
    # Two batches of a first token (0.05 s) and 15 decode steps (0.01 s each): generation 0.4 s, training twice
    # that; scoring 0.04 s for the try's 4 samples, 0.16 for the step's 16.
    assert body["estimated_step_s"] == pytest.approx(2 * (0.05 + 15 * 0.01) * 3 + 0.16)
    assert "estimate" in body["checks"][-1]["message"] and "correlates with length" in body["checks"][3]["message"]
    assert body["config"]["model"]["policy"] == "tiny-sft" and "run_dir" not in body["config"]
    assert client.get(JOBS, headers=bearer(token)).json["total"] == 0


def test_a_dry_run_reports_failed_checks_and_keeps_422_for_bad_fields(client, token, config, db_session, data_dir):
    def fail_try(*args):
        raise rewards_try.TryFailed(422, "The reward does not work", {"reward": ["the reward function raised X"]})

    dry = {"dry_run": "true"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dry_run, "run_try", fail_try)
        response = client.post(JOBS, query_string=dry, json={"name": "x", "config": config}, headers=bearer(token))
    body = response.json
    assert response.status_code == 200 and body["ok"] is False and body["estimated_step_s"] is None
    checks = {c["name"]: c for c in body["checks"]}
    assert checks["reward"]["message"] == "the reward function raised X" and not checks["step_time"]["ok"]

    (data_dir / "models" / "empty").mkdir()
    with db_session() as session:
        register_model(session, data_dir / "models" / "empty", "policy", "empty")
    config["model"] = {"policy": "empty"}
    response = client.post(JOBS, query_string=dry, json={"name": "x", "config": config}, headers=bearer(token))
    checks = {c["name"]: c for c in response.json["checks"]}
    assert (
        response.status_code == 200 and not checks["policy"]["ok"] and "no config.json" in checks["policy"]["message"]
    )
    assert checks["reward"]["message"] == "not tried: the policy or tokenizer check failed"

    config["optim"] = {"lr": "fast"}
    response = client.post(JOBS, query_string=dry, json={"name": "x", "config": config}, headers=bearer(token))
    assert response.status_code == 422 and "config.optim.lr" in response.json["errors"]
    assert client.get(JOBS, headers=bearer(token)).json["total"] == 0


def test_a_dry_run_warns_of_settings_likely_to_train_nothing(client, token, config, db_session, monkeypatch):
    """Validation on the training prompts (named once by name, once by id), and a learning rate far under the
    policy's size (its catalogue entry's parameter count), come back as warnings beside the checks."""
    from sqlalchemy import select

    from webapp.db import CatalogueModel, Dataset

    def fake_try(train, num_prompts, num_samples, timeout_s, step_batch):
        raise rewards_try.TryFailed(422, "not tried here", {"reward": ["skipped"]})

    monkeypatch.setattr(dry_run, "run_try", fake_try)
    with db_session() as session:
        session.scalar(select(CatalogueModel).where(CatalogueModel.name == "tiny-sft")).num_parameters = 1_000_000
        train_id = session.scalar(select(Dataset.id).where(Dataset.name == "train.jsonl"))
    config["data"] = {"train_dataset": "train.jsonl", "val_dataset": train_id}
    config["trainer"] = {"max_steps": 40}
    body = client.post(JOBS, query_string={"dry_run": "true"}, json={"name": "x", "config": config},
                       headers=bearer(token)).json  # fmt: skip
    assert [w["field"] for w in body["warnings"]] == ["config.data.val_dataset", "config.optim.lr"]
    assert "1e-06 is 300x under" in body["warnings"][1]["message"]
    config["data"]["val_dataset"], config["optim"] = "val.jsonl", {"lr": 3e-4}
    body = client.post(JOBS, query_string={"dry_run": "true"}, json={"name": "x", "config": config},
                       headers=bearer(token)).json  # fmt: skip
    assert body["warnings"] == []


def test_a_wide_step_is_timed_narrowed_and_costed_by_its_rows(run_config):
    train = run_config(reinforce={"num_prompts_per_step": 64, "num_rollouts_per_prompt": 16},
                       generation={"max_new_tokens": 11, "batch_size": 32})  # fmt: skip
    assert dry_run.step_batch(train) == (4, 16)  # TIMED_ROWS (64) of a batch's 32 x 16
    timings = {"batch_start_s": 0.1, "decode_step_s": 0.01, "score_s": 0.0}
    # The timed batch: 0.1 + 10 x 0.01 = 0.2 s; a step's batch has 8x its rows, and the step two batches; training
    # twice the generation.
    assert dry_run.estimate_step_s(train, timings) == pytest.approx(0.2 * 8 * 2 * 3)
