"""The memory check of POST /api/v1/jobs (webapp/memory_plan.py): a job too big for the worker's device is refused
with 422 and the numbers, dry run or not; one that fits is queued; the dry run shows the estimate."""

from __future__ import annotations

import pytest

from aligner.modeling.memory import DeviceMemory, estimate_for_config, needed_bytes
from tests.helpers.api import bearer
from tests.helpers.catalogue import register_model
from webapp import dry_run, rewards_try
from webapp.memory_plan import size_text

JOBS = "/api/v1/jobs"


@pytest.fixture
def real_config(config, db_session, tiny_policy_dir) -> dict:
    """The conftest's job config on a real tiny Llama folder (its safetensors headers readable), with short
    sequences and micro-batches of 1: its weights and optimiser state, not its activations, set its memory. In
    bf16-mixed, where FSDP's shards save the most: the float32 state is sharded, generation's bfloat16 copy and the
    reference's are not (in float32 those whole copies take most of what 2 processes save)."""
    with db_session() as session:
        register_model(session, tiny_policy_dir, "policy", "tiny-real")
    config["model"] = {"policy": "tiny-real", "precision": "bf16-mixed"}
    config["data"]["max_prompt_length"] = 16
    config["generation"] = {"max_new_tokens": 8}
    config["optim"] = {"micro_batch_size": 1}
    return config


def _needs(app, tiny_policy_dir, config: dict, processes: int, **model) -> int:
    """What the check computes for `config` on `processes` processes (each with its own device)."""
    from aligner.config import config_from_dict

    settings = {key: value for key, value in config["model"].items() if key != "policy"}
    data = {"model": {"policy_path": str(tiny_policy_dir), **settings, **model},
            "data": {"train_file": "t", "val_file": "v", "max_prompt_length": 16},
            "generation": config["generation"], "optim": config["optim"], "reward": {"function": "x:y"}}  # fmt: skip
    train = config_from_dict(data, tiny_policy_dir)
    return needed_bytes(estimate_for_config(train, processes), DeviceMemory(1, "declared", shared=False))


def test_a_job_too_big_for_the_declared_device_is_refused_with_the_numbers_and_not_queued(
    app, client, token, real_config, queue, tiny_policy_dir
):
    one = _needs(app, tiny_policy_dir, real_config, 1)
    two = _needs(app, tiny_policy_dir, real_config, 2, backend="fsdp")
    assert two < one
    app.config["WORKER_DEVICE_MEMORY_GB"] = (one + two) / 2 / 1e9  # room for fsdp on 2, not hf on 1
    response = client.post(JOBS, json={"name": "big", "config": real_config}, headers=bearer(token))
    assert response.status_code == 422, response.json
    assert response.json["message"] == "The job does not fit the worker's device memory"
    reason = response.json["errors"]["config.model.backend"][0]
    device = size_text((one + two) / 2)
    assert reason == (
        f"needs {size_text(one)} per process with backend hf on 1 process; the worker's device has {device} "
        f"(declared): use model.backend fsdp with num_processes 2 ({size_text(two)} each)"
    )
    assert client.get(JOBS, headers=bearer(token)).json["total"] == 0 and queue.job_ids == []

    # The dry run refuses it the same way.
    response = client.post(JOBS, query_string={"dry_run": "true"}, json={"name": "big", "config": real_config},
                           headers=bearer(token))  # fmt: skip
    assert response.status_code == 422 and response.json["errors"]["config.model.backend"] == [reason]

    # What it advised fits: fsdp on 2 processes is queued.
    real_config["model"]["backend"] = "fsdp"
    body = {"name": "sharded", "config": real_config, "num_processes": 2}
    response = client.post(JOBS, json=body, headers=bearer(token))
    assert response.status_code == 201, response.json
    assert response.json["num_processes"] == 2 and response.json["config"]["model"]["backend"] == "fsdp"


def test_fsdp_that_more_processes_would_fit_is_refused_on_num_processes(app, client, token, real_config,
                                                                         tiny_policy_dir):  # fmt: skip
    two = _needs(app, tiny_policy_dir, real_config, 2, backend="fsdp")
    four = _needs(app, tiny_policy_dir, real_config, 4, backend="fsdp")
    three = _needs(app, tiny_policy_dir, real_config, 3, backend="fsdp")
    assert four < three < two
    app.config["WORKER_DEVICE_MEMORY_GB"] = (three + four) / 2 / 1e9
    real_config["model"]["backend"] = "fsdp"
    body = {"name": "x", "config": real_config, "num_processes": 2}
    response = client.post(JOBS, json=body, headers=bearer(token))
    assert response.status_code == 422
    (reason,) = response.json["errors"]["num_processes"]
    assert reason.startswith(f"needs {size_text(two)} per process with backend fsdp on 2 processes")
    assert reason.endswith(f"use num_processes 4 ({size_text(four)} each)")


def test_the_api_keeps_its_limits_on_num_processes(client, token, real_config):
    real_config["model"]["backend"] = "fsdp"
    for count in (0, 9):
        response = client.post(JOBS, json={"name": "x", "config": real_config, "num_processes": count},
                               headers=bearer(token))  # fmt: skip
        assert response.status_code == 422 and "num_processes" in response.json["errors"]


def test_the_dry_run_shows_the_estimate_of_a_job_that_fits(app, client, token, real_config, monkeypatch,
                                                          tiny_policy_dir):  # fmt: skip
    def no_try(*args):
        raise rewards_try.TryFailed(422, "not tried here", {"reward": ["skipped"]})

    monkeypatch.setattr(dry_run, "run_try", no_try)
    app.config["WORKER_DEVICE_MEMORY_GB"] = 24.0
    response = client.post(JOBS, query_string={"dry_run": "true"}, json={"name": "x", "config": real_config},
                           headers=bearer(token))  # fmt: skip
    assert response.status_code == 200, response.json
    memory = response.json["memory"]
    assert memory["fits"] is True and memory["device_source"] == "declared"
    assert memory["device_bytes"] == 24_000_000_000
    assert memory["backend"] == "hf" and memory["world_size"] == 1
    assert memory["needed_bytes"] == memory["per_rank_bytes"] == _needs(app, tiny_policy_dir, real_config, 1)
    assert {"weights", "gradients", "optimizer", "activations"} <= set(memory["device_parts"])


def test_unset_the_device_is_measured_and_a_folder_without_readable_weights_is_not_estimated(
    app, client, token, config, real_config, monkeypatch
):
    monkeypatch.setattr(dry_run, "run_try", lambda *a: (_ for _ in ()).throw(rewards_try.TryFailed(422, "no", {})))
    assert app.config["WORKER_DEVICE_MEMORY_GB"] is None  # no ALIGNER_WORKER_DEVICE_MEMORY_GB in the tests
    body = client.post(JOBS, query_string={"dry_run": "true"}, json={"name": "x", "config": real_config},
                       headers=bearer(token)).json  # fmt: skip
    assert body["memory"]["device_source"].startswith("measured") and body["memory"]["fits"]

    app.config["WORKER_DEVICE_MEMORY_GB"] = 1e-9  # one byte: nothing fits, but a stand-in folder is not estimated
    stand_in = {**real_config, "model": {"policy": "tiny-sft"}}
    body = client.post(JOBS, query_string={"dry_run": "true"}, json={"name": "x", "config": stand_in},
                       headers=bearer(token)).json  # fmt: skip
    assert body["memory"] is None
    assert client.post(JOBS, json={"name": "x", "config": stand_in}, headers=bearer(token)).status_code == 201
