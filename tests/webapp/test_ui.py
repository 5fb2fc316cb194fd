"""The dashboard's helpers without a browser: API JSON -> DataFrames, 422 errors -> form fields, form -> job body.
The app itself is only built here; tests/webapp/test_ui_browser.py drives it."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from aligner.config import TrainConfig
from webapp import ui
from webapp.ui import api, form, frames

NOW = dt.datetime(2026, 11, 22, 19, 0, 0, tzinfo=dt.UTC)


def test_jobs_frame_has_one_row_per_job_with_progress_reward_and_age():
    page = {
        "items": [
            {"id": 2, "name": "b", "algorithm": "ppo", "status": "running", "step": 3, "max_steps": 10,
             "latest_reward": 0.5, "created_at": "2026-11-22T18:55:00+00:00"},
            {"id": 1, "name": "a", "status": "queued", "step": 0, "max_steps": 4, "latest_reward": None,
             "created_at": "2026-11-20T18:00:00+00:00"},
        ],
        "total": 2,
    }  # fmt: skip
    frame = frames.jobs_frame(page, NOW)
    assert list(frame.columns) == ["id", "name", "algorithm", "status", "step", "latest reward", "age"]
    assert frame.values.tolist() == [
        [2, "b", "ppo", "running", "3/10", "+0.5000", "5 min"],
        [1, "a", "reinforce", "queued", "0/4", "", "2 d"],  # a job without the field is REINFORCE
    ]
    assert frames.jobs_frame({"items": []}).empty
    assert frames.age("2026-11-22T18:59:58", NOW) == "2 s"  # naive times are UTC


def test_metrics_frame_is_long_format_sorted_and_typed():
    body = {
        "job_id": 1,
        "metrics": {
            "train_rollouts/rewards": [[2, 0.2], [1, 0.1]],
            "val/rewards": [[0, 0.05], [2, 0.3]],
            "timers/generate": [[1, 0.5]],
            "timers/train": [[1, 0.25]],
        },
    }
    frame = frames.metrics_frame(body, ["train_rollouts/rewards", "val/rewards"])
    assert frame.values.tolist() == [
        [1, 0.1, "train_rollouts/rewards"],
        [2, 0.2, "train_rollouts/rewards"],
        [0, 0.05, "val/rewards"],
        [2, 0.3, "val/rewards"],
    ]
    assert str(frame["step"].dtype) == "int64" and str(frame["value"].dtype) == "float64"
    timers = frames.timers_frame(body)
    assert sorted(set(timers["series"])) == ["generate", "train"]
    empty = frames.metrics_frame({"metrics": {}}, ["train_rollouts/rewards"])
    assert empty.empty and str(empty["value"].dtype) == "float64"
    assert frames.plot_value(empty) is None and frames.plot_value(frame) is frame


def test_compare_frame_labels_each_job():
    bodies = {"1: a": {"metrics": {"train_rollouts/rewards": [[1, 0.1]]}},
              "2: b": {"metrics": {"train_rollouts/rewards": [[1, 0.3], [2, 0.4]]}}}  # fmt: skip
    frame = frames.compare_frame(bodies, "train_rollouts/rewards")
    assert frame["series"].tolist() == ["1: a", "2: b", "2: b"]
    assert frames.compare_frame({}, "x").empty


PPO_BODY = {
    "job_id": 3,
    "metrics": {
        "train_rollouts/rewards": [[1, 0.1], [2, 0.3]],
        "train_rollouts/init_policy_kl": [[1, 0.0], [2, 0.01]],
        "train_optim/loss": [[1, 0.5], [2, 0.4]],
        "train_rollouts/values": [[1, -0.2], [2, 0.05]],
        "train_optim/critic_loss": [[1, 0.9], [2, 0.6]],
        "train_optim/clip_fraction": [[1, 0.0], [2, 0.125]],
        "train_optim/entropy": [[1, 5.5], [2, 5.4]],
        "timers/critic_infer": [[1, 0.02]],
        "timers/critic_train": [[1, 0.08]],
    },
}


def test_a_ppo_job_page_shows_the_critic_charts_beside_reward_kl_and_loss():
    charts = {title: (frame, shown) for title, frame, shown in frames.job_charts({"algorithm": "ppo"}, PPO_BODY)}
    assert list(charts) == [t for t, _n, _y in frames.CHARTS] + ["Critic loss", "Value estimates", "Clip fraction",
                                                             "Entropy"]  # fmt: skip
    assert all(shown for _frame, shown in charts.values())
    for title, name, values in [
        ("Critic loss", "train_optim/critic_loss", [0.9, 0.6]),
        ("Value estimates", "train_rollouts/values", [-0.2, 0.05]),
        ("Clip fraction", "train_optim/clip_fraction", [0.0, 0.125]),
        ("Entropy", "train_optim/entropy", [5.5, 5.4]),
        ("Reward", "train_rollouts/rewards", [0.1, 0.3]),
        ("KL to the initial policy", "train_rollouts/init_policy_kl", [0.0, 0.01]),
        ("Loss", "train_optim/loss", [0.5, 0.4]),
    ]:
        frame = charts[title][0]
        assert frame["series"].unique().tolist() == [name] and frame["value"].tolist() == values, title
    assert set(frames.timers_frame(PPO_BODY)["series"]) == {"critic_infer", "critic_train"} <= set(frames.TIMER_PHASES)

    reinforce = frames.job_charts({"algorithm": "reinforce"}, {"metrics": {"train_rollouts/rewards": [[1, 0.1]]}})
    assert [shown for _t, _f, shown in reinforce] == [True] * len(frames.CHARTS) + [False] * len(frames.PPO_CHARTS)
    assert "(PPO)" in frames.job_summary({"id": 3, "name": "p", "status": "running", "step": 2, "max_steps": 9,
                                      "algorithm": "ppo"})  # fmt: skip


def test_compare_works_across_algorithms():
    rloo = {"metrics": {"train_rollouts/rewards": [[1, 0.2]], "train_optim/loss": [[1, 0.3]]}}
    for metric in ("train_rollouts/rewards", "train_optim/loss"):  # the same names in both trainers
        frame = frames.compare_frame({"1: a (reinforce)": rloo, "3: p (ppo)": PPO_BODY}, metric)
        assert frame["series"].tolist() == ["1: a (reinforce)", "3: p (ppo)", "3: p (ppo)"], metric
    assert {"train_optim/critic_loss", "train_rollouts/values"} <= set(frames.COMPARE_METRICS)
    only_ppo = frames.compare_frame({"1: a (reinforce)": rloo, "3: p (ppo)": PPO_BODY}, "train_optim/critic_loss")
    assert only_ppo["series"].tolist() == ["3: p (ppo)", "3: p (ppo)"]


def test_the_form_picks_the_algorithm_and_the_critic_model():
    body = form.build_job(
        {"name": "p", "algorithm": "ppo", "critic_model_path": " models/rm "}, "ppo: {ratio_eps: 0.1}"
    )
    assert body["config"] == {"algorithm": "ppo", "critic": {"model_path": "models/rm"}, "ppo": {"ratio_eps": 0.1}}
    by_field, _other = form.field_errors({"config.critic": ["needs a critic"], "config.algorithm": ["bad"]})
    assert by_field == {"critic_model_path": ["needs a critic"], "algorithm": ["bad"]}


def test_samples_and_checkpoints_frames():
    page = {"items": [{"step": 1, "split": "train", "index": 0, "prompt": "p", "response": "r", "reward": 1.0,
                       "kl": 0.1, "advantage": -0.5, "is_end": True}], "total": 1}  # fmt: skip
    assert frames.samples_frame(page).values.tolist() == [[1, "train", 0, "p", "r", 1.0, 0.1, -0.5, True]]
    ckpts = {"items": [{"step": 2, "path": "/runs/job_1/checkpoints/step_000002", "created_at": "t"}]}
    assert frames.checkpoints_frame(ckpts)["step"].tolist() == [2]


def test_parse_sse_and_event_log_keep_status_checkpoint_and_log_events():
    text = (
        "retry: 2000\n\n"
        'id: 1\nevent: status\ndata: {"status":"queued","error":null,"step":0}\n\n'
        ": heartbeat\n\n"
        'id: 2\nevent: metrics\ndata: {"step":1}\n\n'
        'id: 3\nevent: checkpoint\ndata: {"step":2,"path":"x"}\n\n'
    )
    events = api.parse_sse(text)
    assert [(e["id"], e["kind"]) for e in events] == [(1, "status"), (2, "metrics"), (3, "checkpoint")]
    log = frames.event_log(events)
    assert "#1 status" in log and "#3 checkpoint" in log and "metrics" not in log
    assert frames.event_log([]) == "(no events yet)"


def test_field_errors_map_422_paths_to_form_fields():
    errors = {
        "config.optim.lr": ["Input should be greater than 0 (got -1)"],
        "config.reward": ["give exactly one of reward.function, reward.model_path or reward.server_url"],
        "config.trainer.max_stepz": ["unknown field"],
        "config.data.train_file": ["file not found: x.jsonl"],
        "name": ["Shorter than minimum length 1."],
        "config": ["bad"],
    }
    by_field, other = form.field_errors(errors)
    assert by_field["lr"] == ["Input should be greater than 0 (got -1)"]
    assert by_field["reward_function"] == by_field["reward_server_url"] == errors["config.reward"]
    assert by_field["train_file"] == ["file not found: x.jsonl"]
    assert by_field["name"] == ["Shorter than minimum length 1."]
    assert other == {"config.trainer.max_stepz": ["unknown field"], "config": ["bad"]}
    listed = form.errors_markdown(errors)
    assert "**Learning rate** (`config.optim.lr`): Input should be greater than 0" in listed
    assert "`config.trainer.max_stepz`: unknown field" in listed


def test_build_job_puts_form_fields_over_the_advanced_yaml():
    values = {"name": " run ", "policy_path": "models/p", "train_file": "t.jsonl", "val_file": "v.jsonl",
              "reward_server_url": "http://127.0.0.1:8000", "reward_function": "", "max_steps": 4.0, "lr": 0.001,
              "num_prompts_per_step": None}  # fmt: skip
    advanced = "optim: {warmup_steps: 0, lr: 1.0}\nreward: {function: m:f, timeout_s: 5}\nrun_dir: /elsewhere\n"
    body = form.build_job(values, advanced)
    assert body["name"] == "run"
    config = body["config"]
    assert config["optim"] == {"warmup_steps": 0, "lr": 0.001}
    assert config["reward"] == {"timeout_s": 5, "server_url": "http://127.0.0.1:8000"}  # one reward source
    assert config["trainer"] == {"max_steps": 4} and isinstance(config["trainer"]["max_steps"], int)
    assert "run_dir" not in config and "reinforce" not in config  # empty fields are left to the server's defaults
    with pytest.raises(ValueError, match="mapping"):
        form.build_job(values, "- a list")


def test_presets_offer_the_demo_model_when_its_assets_exist(tmp_path):
    assert list(form.presets(tmp_path)) == ["defaults"]
    demo = tmp_path / "demo_assets"
    demo.mkdir()
    (demo / "train.jsonl").write_text('{"prompt": "x"}\n')
    config = {"model": {"policy_path": "policy"}, "data": {"train_file": "train.jsonl", "val_file": "train.jsonl"},
              "reward": {"function": "aligner.demo:reward"}, "optim": {"lr": 0.002, "warmup_steps": 0},
              "trainer": {"max_steps": 60}}  # fmt: skip
    (demo / "reinforce.yaml").write_text(yaml.safe_dump(config))
    preset = form.presets(tmp_path)["demo tiny model"]
    assert preset["form"]["policy_path"] == str(demo / "policy")  # absolute: the server's data folder may differ
    assert preset["form"]["lr"] == 0.002 and preset["form"]["max_steps"] == 60
    rest = yaml.safe_load(preset["yaml"])
    assert rest["optim"]["warmup_steps"] == 0 and "lr" not in rest["optim"]
    body = form.build_job(preset["form"], preset["yaml"])
    reward_rest = {k: v for k, v in rest["reward"].items() if k != "model_path"}  # one source: the form's
    assert body["config"]["reward"] == {**reward_rest, "function": "aligner.demo:reward"}


def test_the_app_builds(tmp_path):
    app = ui.build_app("http://127.0.0.1:5000", tmp_path)
    assert app.title == "Aligner"


def test_one_validation_prompt_followed_across_steps():
    items = [
        {"step": 2, "split": "validation", "prompt": "p1", "response": "b", "reward": 0.5, "kl": 0.1},
        {"step": 0, "split": "validation", "prompt": "p1", "response": "a", "reward": 0.1, "kl": 0.0},
        {"step": 0, "split": "validation", "prompt": "p2", "response": "c", "reward": 0.2, "kl": 0.0},
        {"step": 1, "split": "train", "prompt": "p1", "response": "t", "reward": 9.0, "kl": 0.0},
    ]
    assert frames.validation_prompts(items) == ["p1", "p2"]
    history = frames.prompt_history(items, "p1")
    assert history["step"].tolist() == [0, 2] and history["response"].tolist() == ["a", "b"]
    assert frames.prompt_history(items, None).empty


def test_the_form_starts_from_the_configs_defaults():
    given = {"policy_path": "p", "train_file": "t", "val_file": "v", "reward_function": "m:f"}
    minimal = TrainConfig(
        model={"policy_path": "p"}, data={"train_file": "t", "val_file": "v"}, reward={"function": "m:f"}
    )
    shown = form.form_from_config(minimal.model_dump(mode="json"))
    assert {key: value for key, value in shown.items() if key not in given} == form.DEFAULTS
    assert {"algorithm", "num_prompts_per_step", "kl_penalty", "lr", "max_steps", "temperature"} <= set(form.DEFAULTS)
    assert form.CHOICES == {"algorithm": ["reinforce", "ppo"]}
    assert form.config_default("config.reward.server_url") is None  # inside an optional section
