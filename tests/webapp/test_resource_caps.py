"""What one job config may cost: each field bounded, and the products of bounded fields (tokens a step generates,
holds, decodes at once) bounded by one rule each (webapp.job_config.PRODUCT_LIMITS), over the API; and what the
reward tries of all users may take of the API's host together (webapp.rewards_try's thread budget)."""

from __future__ import annotations

import pytest

from tests.helpers.api import bearer
from webapp import rewards_try
from webapp.job_config import JOB_LIMIT_DEFAULTS, PRODUCT_LIMITS

JOBS = "/api/v1/jobs"


def post_job(client, token, config):
    return client.post(JOBS, json={"name": "j", "config": config}, headers=bearer(token))


def with_fields(config: dict, values: dict[str, object]) -> dict:
    for dotted, value in values.items():
        *sections, name = dotted.split(".")
        node = config
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return config


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("generation.kv_cache_memory_mb", 2**40, "less than or equal to 16777216"),  # aligner's own bound
        ("generation.kv_cache_memory_mb", 65_537, "at most 65536 on this server"),
        ("model.lora.r", 2**31, "less than or equal to 65536"),
        ("model.lora.r", 1025, "at most 1024 on this server"),
    ],
)
def test_each_field_has_a_cap(client, token, config, field, value, reason):
    response = post_job(client, token, with_fields(config, {field: value}))
    assert response.status_code == 422
    assert reason in response.json["errors"][f"config.{field}"][0]


@pytest.mark.parametrize(
    ("values", "rule"),
    [
        (  # each within its own limit, 2^36 tokens a step in all
            {
                "reinforce.num_prompts_per_step": 4096,
                "reinforce.num_rollouts_per_prompt": 256,
                "generation.max_new_tokens": 65_536,
            },
            "per_step.generated_tokens",
        ),
        (
            {"reinforce.num_prompts_per_step": 64, "data.max_prompt_length": 1_048_576},
            "per_step.sequence_tokens",
        ),
        (
            {"generation.batch_size": 64, "reinforce.num_prompts_per_step": 64, "data.max_prompt_length": 32_768},
            "generation.tokens_in_flight",
        ),
    ],
)
def test_a_product_of_bounded_fields_is_capped(client, token, config, values, rule):
    response = post_job(client, token, with_fields(config, values))
    assert response.status_code == 422, response.json
    first = PRODUCT_LIMITS[rule].fields()[0]
    reason = response.json["errors"][f"config.{first}"][0]
    assert rule in reason and f"{JOB_LIMIT_DEFAULTS[rule]:,}" in reason
    assert all(field in reason for field in PRODUCT_LIMITS[rule].fields())


def test_the_operator_sets_a_product_cap(app, client, token, config):
    values = {"reinforce.num_prompts_per_step": 16, "reinforce.num_rollouts_per_prompt": 8}  # 16 x 8 x 64 tokens
    app.config["JOB_LIMITS"] = {"per_step.generated_tokens": 8191}
    reason = post_job(client, token, with_fields(config, dict(values))).json["errors"]
    assert "= 8,192 new tokens generated per step: at most 8,191" in reason["config.reinforce.num_prompts_per_step"][0]
    app.config["JOB_LIMITS"] = {"per_step.generated_tokens": 8192}
    assert post_job(client, token, with_fields(config, dict(values))).status_code == 201


def test_the_smaller_of_batch_and_prompts_is_what_decodes_at_once(client, token, config):
    """generation.batch_size past the step's prompts costs nothing more: not refused for it."""
    values = {"generation.batch_size": 1024, "reinforce.num_prompts_per_step": 8, "data.max_prompt_length": 65_536}
    assert post_job(client, token, with_fields(config, values)).status_code == 201


# ------------------------------------------------------------------------------------------------- reward tries
TRY_RESULT = {"samples": [], "groups": [], "reward_length_corr": None, "frac_zero_std_groups": 0.0, "warnings": [],
              "timings": {"load_s": 0.1, "generate_s": 0.1, "score_s": 0.1, "max_length": 1, "batch_start_s": 0.1,
                          "decode_step_s": 0.1}}  # fmt: skip


@pytest.fixture
def tried(monkeypatch, app):
    """The threads each try ran with (the subprocess stood in for), and the budget's threads in use meanwhile."""
    runs = []

    def fake(train, num_prompts, num_samples, timeout_s, step_batch=None):
        runs.append((train.model.num_threads, app.extensions[rewards_try.TRY_THREADS_EXTENSION].used))
        return rewards_try.TryOutcome(TRY_RESULT, train)

    monkeypatch.setattr(rewards_try, "_run_try", fake)
    return runs


def test_all_users_tries_share_one_thread_budget(app, client, token, other_token, config, tried):
    """A try past TRY_THREADS (every user's tries of this API process together) gets 503, a dry run too; the threads
    come back when a try ends."""
    app.config["TRY_THREADS"] = 3
    with app.app_context():
        budget = rewards_try._thread_budget()
    release = budget.acquire(2, 3)  # bob's try of 2 threads is running
    try:
        for response in (
            client.post("/api/v1/rewards/try", json={"config": config}, headers=bearer(token)),
            client.post(
                JOBS, query_string={"dry_run": "true"}, json={"name": "x", "config": config}, headers=bearer(token)
            ),  # fmt: skip
        ):
            assert response.status_code == 503, response.json
            assert "all users' tries share 3 threads" in response.json["message"]
    finally:
        release()
    assert client.post("/api/v1/rewards/try", json={"config": config}, headers=bearer(token)).status_code == 200
    assert tried == [(2, 2)] and budget.used == 0


@pytest.mark.parametrize(("asked", "budget", "ran"), [(None, 16, 2), (64, 16, 4), (64, 3, 3), (1, 16, 1)])
def test_a_trys_threads_are_bounded(app, client, token, config, tried, asked, budget, ran):
    """A try runs TRY_NUM_THREADS torch threads unless its config asks fewer, never more than TRY_MAX_THREADS nor the
    whole budget (model.num_threads up to 64 is a job's, not a try's)."""
    app.config["TRY_THREADS"] = budget
    if asked:
        config["model"] = {**config["model"], "num_threads": asked}
    assert client.post("/api/v1/rewards/try", json={"config": config}, headers=bearer(token)).status_code == 200
    assert tried == [(ran, ran)]
