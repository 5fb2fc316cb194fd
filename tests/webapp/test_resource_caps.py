"""What one job config may cost: each field bounded, and the products of bounded fields (tokens a step generates,
holds, decodes at once) bounded by one rule each (webapp.job_config.PRODUCT_LIMITS), over the API."""

from __future__ import annotations

import pytest

from tests.helpers.api import bearer
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
