"""The dashboard without a browser: API JSON -> DataFrames, 422 errors -> form fields, form -> job body, and the
handlers of the New job form and the Catalogue tab run against the API served on a free port (the `app` fixture:
policy tiny-sft, reward model tiny-rm, shared datasets train.jsonl and val.jsonl). The app itself is only built
here; tests/webapp/test_ui_browser.py drives it."""

from __future__ import annotations

import datetime as dt
import functools
import json

import gradio as gr
import pytest
import requests
import torch
import yaml
from safetensors.torch import save_file
from sqlalchemy import select

from aligner import metrics
from aligner.config import ALGORITHM_PRESETS, TrainConfig
from aligner.demo.templates import CONFIG_TEMPLATE, ppo_config_text
from tests.helpers.api import ACTIONS_BY_STATE, bearer, create_job, put_in_state
from webapp import ui
from webapp.db import ACTIONS, MODEL_KINDS, SERVER_KINDS, ApiToken, revoke_token
from webapp.ui import api, catalogue, form, frames, job_view, jobs_tab, new_job, tabs

NOW = dt.datetime(2026, 11, 22, 19, 0, 0, tzinfo=dt.UTC)


def test_jobs_frame_has_one_row_per_job_with_progress_reward_start_and_duration():
    page = {
        "items": [
            {"id": 2, "name": "b", "algorithm": "ppo", "status": "running", "step": 3, "max_steps": 10,
             "latest_reward": 0.5, "created_at": "2026-11-22T18:55:00+00:00", "started_at": "2026-11-22T18:56:30"},
            {"id": 1, "name": "a", "status": "queued", "step": 0, "max_steps": 4, "latest_reward": None,
             "created_at": "2026-11-20T18:00:00+00:00"},
        ],
        "total": 2,
    }  # fmt: skip
    page["items"][0]["alarms"] = ["length_hacking", "kl_growth"]
    frame = frames.jobs_frame(page, NOW, selected=1)
    columns = ["sel", "id", "name", "algorithm", "status", "health", "step", "latest reward", "started (UTC)",
               "duration"]  # fmt: skip
    assert list(frame.columns) == columns
    assert frame.values.tolist() == [
        ["", 2, "b", "ppo", "running", "⚠ length hacking, KL growth", "3/10", "+0.5000", "11-22 18:56", "3 min 30 s"],
        ["▶", 1, "a", "reinforce", "queued", "", "0/4", "", "", ""],  # a job without the field is REINFORCE
    ]  # fmt: skip
    assert frames.jobs_frame({"items": []}).empty


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


def test_compare_works_across_algorithms():
    rloo = {"metrics": {"train_rollouts/rewards": [[1, 0.2]], "train_optim/loss": [[1, 0.3]]}}
    for metric in ("train_rollouts/rewards", "train_optim/loss"):  # the same names in both trainers
        frame = frames.compare_frame({"1: a (reinforce)": rloo, "3: p (ppo)": PPO_BODY}, metric)
        assert frame["series"].tolist() == ["1: a (reinforce)", "3: p (ppo)", "3: p (ppo)"], metric
    assert {metrics.CRITIC_LOSS, metrics.VALUES} <= set(metrics.COMPARE_METRICS)
    only_ppo = frames.compare_frame({"1: a (reinforce)": rloo, "3: p (ppo)": PPO_BODY}, "train_optim/critic_loss")
    assert only_ppo["series"].tolist() == ["3: p (ppo)", "3: p (ppo)"]


def test_the_form_picks_the_algorithm_and_the_critic():
    values = {"name": "p", "algorithm": "ppo", "critic_source": "model", "critic_model": " tiny-rm ",
              "critic_server": "left-out", "reward_source": "server", "reward_server": "rm-1"}  # fmt: skip
    body = form.build_job(values, "ppo: {ratio_eps: 0.1}\ncritic: {model_path: /x, server_overrides: [lr=0.1]}")
    assert body["config"] == {
        "algorithm": "ppo",
        "critic": {"model": "tiny-rm", "server_overrides": ["lr=0.1"]},  # the form's critic replaces the YAML's
        "reward": {"server": "rm-1"},
        "ppo": {"ratio_eps": 0.1},
    }
    reinforce = form.build_job({**values, "algorithm": "reinforce"})
    assert "critic" not in reinforce["config"]  # a critic is PPO's only
    by_field, _other = form.field_errors({"config.critic": ["needs a critic"], "config.algorithm": ["bad"]})
    assert by_field == {"critic_source": ["needs a critic"], "algorithm": ["bad"]}
    shown = form.visible_fields(values)
    assert shown["critic_model"] and not shown["critic_server"] and shown["reward_server"]
    assert not shown["reward_function"] and not shown["function_args"]
    assert not form.visible_fields({**values, "algorithm": "reinforce"})["critic_source"]


def test_checkpoints_frame():
    saved = "2026-11-28T03:50:12.345678+00:00"
    ckpts = {"items": [{"step": 2, "size_bytes": 4_800_000, "path": "checkpoints/step_000002", "created_at": saved}]}
    frame = frames.checkpoints_frame(ckpts)
    assert frame.columns.tolist() == ["step", "size", "saved (UTC)"]  # no path: the server's folders are its own
    assert frame.values.tolist() == [[2, "4.8 MB", "2026-11-28 03:50:12"]]  # whole seconds: the cell is not cut


def test_clock_time_is_utc_to_the_second():
    assert frames.clock_time("2026-11-28T05:50:12.9+02:00") == "2026-11-28 03:50:12"
    assert frames.clock_time("2026-11-28T03:50:12") == "2026-11-28 03:50:12"  # naive: the API's UTC
    assert frames.clock_time(None) == ""


def test_parse_sse_and_event_log_keep_status_checkpoint_and_log_events():
    text = (
        "retry: 2000\n\n"
        'id: 1\nevent: status\ndata: {"status":"queued","error":null,"step":0}\n\n'
        ": heartbeat\n\n"
        'id: 2\nevent: metrics\ndata: {"step":1}\n\n'
        'id: 3\nevent: checkpoint\ncreated_at: 2026-11-22T19:00:00+00:00\ndata: {"step":2,"path":"x"}\n\n'
    )
    events = api.parse_sse(text)
    assert [(e["id"], e["kind"]) for e in events] == [(1, "status"), (2, "metrics"), (3, "checkpoint")]
    assert events[2]["created_at"] == "2026-11-22T19:00:00+00:00" and "created_at" not in events[0]
    # newest first; an event without a time (an older API's) shows none
    assert job_view.event_log(events).splitlines() == ["19:00:00 UTC · step 2: checkpoint saved", "queued"]
    assert job_view.event_log([]) == "(no events yet)"


def test_trainer_events_show_their_level_and_a_server_wait_shows_under_the_status():
    url = "http://rm:8000"
    message = f"waiting for reward server {url}: connection refused; retrying for up to 600 s"
    waiting = {"step": 3, "level": "warning", "server": "reward", "wait": "waiting", "url": url, "message": message}
    back = {"step": 3, "level": "info", "server": "reward", "wait": "back", "message": f"reward server {url} is back"}
    events = [
        {"id": 1, "kind": "status", "data": {"status": "running"}},
        {"id": 2, "kind": "log", "data": waiting},
    ]
    assert job_view.event_log(events).splitlines()[0] == f"step 3: warning: {waiting['message']}"
    job = {"id": 4, "name": "j", "status": "running", "step": 3, "max_steps": 9}
    assert f"**waiting** `{waiting['message']}`" in job_view.run_summary(job, {}, events)
    assert "waiting" not in job_view.run_summary({**job, "status": "failed"}, {}, events)
    for later in ({"id": 3, "kind": "log", "data": back}, {"id": 3, "kind": "status", "data": {"status": "failed"}}):
        assert frames.server_waiting([*events, later]) is None
    critic = {"id": 3, "kind": "log", "data": {**waiting, "server": "critic", "message": "waiting for critic x"}}
    assert frames.server_waiting([*events, critic]) == "waiting for critic x"  # the newest
    assert frames.server_waiting([*events, critic, {"id": 4, "kind": "log", "data": back}]) == "waiting for critic x"


def test_field_errors_map_422_paths_to_form_fields():
    errors = {
        "config.optim.lr": ["Input should be greater than 0 (got -1)"],
        "config.reward": ["give exactly one of reward.function, reward.model or reward.server"],
        "config.reward.function_args.tolerance": ["Input should be greater than or equal to 0"],
        "config.trainer.max_stepz": ["unknown field"],
        "config.data.train_dataset": ["dataset 'x' not found"],
        "config.model": ["bad"],
        "name": ["Shorter than minimum length 1."],
        "config": ["bad"],
    }
    by_field, other = form.field_errors(errors)
    assert by_field["lr"] == ["Input should be greater than 0 (got -1)"]
    assert by_field["reward_source"] == errors["config.reward"]  # the section's own field, not every picker in it
    assert by_field["function_args"] == ["Input should be greater than or equal to 0"]
    assert "reward_function" not in by_field
    assert by_field["train_dataset"] == ["dataset 'x' not found"]
    assert by_field["policy"] == ["bad"] and "tokenizer" not in by_field  # a section: the one field standing for it
    assert by_field["name"] == ["Shorter than minimum length 1."]
    assert other == {"config.trainer.max_stepz": ["unknown field"], "config": ["bad"]}
    listed = form.errors_markdown(errors)
    assert "**Learning rate** (`config.optim.lr`): Input should be greater than 0" in listed
    assert "`config.trainer.max_stepz`: unknown field" in listed


def test_build_job_puts_form_fields_over_the_advanced_yaml():
    values = {"name": " run ", "policy": "tiny-sft", "tokenizer": "", "train_dataset": 3, "val_dataset": "4",
              "reward_source": "function", "reward_function": "numeric_match",
              "function_args": '{"tolerance": 0.01}', "reward_server": "not-this-one", "max_steps": 4.0,
              "lr": 0.001, "num_prompts_per_step": None}  # fmt: skip
    advanced = "optim: {warmup_steps: 0, lr: 1.0}\nreward: {server: s, timeout_s: 5}\nrun_dir: /elsewhere\n"
    body = form.build_job(values, advanced)
    assert body["name"] == "run"
    config = body["config"]
    assert config["model"] == {"policy": "tiny-sft"}  # an empty tokenizer: the policy's own
    assert config["data"] == {"train_dataset": 3, "val_dataset": 4}  # ids, as the API takes them
    assert config["optim"] == {"warmup_steps": 0, "lr": 0.001}
    assert config["reward"] == {"timeout_s": 5, "function": "numeric_match", "function_args": {"tolerance": 0.01}}
    assert config["trainer"] == {"max_steps": 4} and isinstance(config["trainer"]["max_steps"], int)
    assert "run_dir" not in config and "reinforce" not in config  # empty fields are left to the server's defaults
    assert form.build_job({**values, "train_dataset": "mine.jsonl"})["config"]["data"]["train_dataset"] == "mine.jsonl"
    no_paths = json.dumps(config)
    assert "_path" not in no_paths and "_file" not in no_paths and "_url" not in no_paths

    with pytest.raises(ValueError, match="mapping"):
        form.build_job(values, "- a list")
    for bad, reason in [("[1, 2]", "must be a JSON object"), ("{tolerance: 1}", "not JSON"), ("3", "JSON object")]:
        with pytest.raises(form.FormError, match=reason) as caught:
            form.build_job({**values, "function_args": bad})
        assert caught.value.field == "function_args"
    # Arguments belong to a reward function: with another source they are not sent (nor checked).
    other = form.build_job({**values, "reward_source": "model", "reward_model": "tiny-rm", "function_args": "[1]"},
                           advanced)  # fmt: skip
    assert other["config"]["reward"] == {"timeout_s": 5, "model": "tiny-rm"}


def test_presets_name_the_demo_catalogue_entries_when_the_demo_configs_exist(tmp_path):
    assert list(form.presets(tmp_path)) == ["defaults"]
    demo = tmp_path / "demo_assets"
    demo.mkdir()
    (demo / "reinforce.yaml").write_text(CONFIG_TEMPLATE)
    (demo / "ppo.yaml").write_text(ppo_config_text())
    found = form.presets(tmp_path)
    assert list(found) == ["defaults", "demo tiny model", "demo tiny model, reward server", "demo tiny model, PPO"]

    preset = found["demo tiny model"]
    assert preset["form"]["policy"] == "demo-policy"
    assert preset["form"]["train_dataset"] == "demo-prompts-train.jsonl"
    assert preset["form"]["val_dataset"] == "demo-prompts-val.jsonl"
    assert preset["form"]["reward_source"] == "function" and preset["form"]["reward_function"] == "demo"
    assert preset["form"]["lr"] == 3.0e-4 and preset["form"]["max_steps"] == 80
    rest = yaml.safe_load(preset["yaml"])
    assert rest["optim"]["warmup_steps"] == 5 and "lr" not in rest["optim"]
    assert "run_dir" not in rest and "policy_path" not in rest["model"] and "reward" not in rest
    body = form.build_job(preset["form"], preset["yaml"])
    assert body["config"]["model"]["policy"] == "demo-policy" and body["config"]["reward"] == {"function": "demo"}
    assert "_path" not in json.dumps(body) and "_file" not in json.dumps(body)

    served = found["demo tiny model, reward server"]["form"]
    assert served["reward_source"] == "server" and served["reward_server"] == "demo-reward-server"
    ppo = form.build_job(found["demo tiny model, PPO"]["form"], found["demo tiny model, PPO"]["yaml"])
    assert ppo["config"]["algorithm"] == "ppo"
    assert ppo["config"]["critic"] == {"model": "demo-reward-model", "server_overrides": ["lr=1.0e-3"]}

    (demo / "ppo.yaml").write_text("model: [unclosed")  # a half-built demo folder: that preset is left out
    assert "demo tiny model, PPO" not in form.presets(tmp_path)


def test_the_app_builds(tmp_path):
    app = ui.build_app("http://127.0.0.1:5000", tmp_path)
    assert app.title == "Aligner"


def test_the_form_starts_from_the_configs_defaults():
    assert {"algorithm", "num_prompts_per_step", "kl_penalty", "lr", "max_steps", "temperature"} <= set(form.DEFAULTS)
    assert form.DEFAULTS["lr"] == TrainConfig.model_fields["optim"].default_factory().lr
    assert form.DEFAULTS["reward_source"] == "function" and form.DEFAULTS["critic_source"] == "model"
    offered = {"algorithm": ["reinforce", "ppo"], "reinforce_algorithm": list(ALGORITHM_PRESETS),
               "backend": ["hf", "fsdp", "megatron"]}  # fmt: skip
    assert offered == form.CHOICES
    assert form.DEFAULTS["backend"] == "hf" and form.DEFAULTS["num_processes"] == 1
    assert form.config_default("config.reward.server_url") is None  # inside an optional section
    shown = form.form_from_config({"model": {"policy": "p"}, "reward": {"model": "rm"}, "optim": {"lr": 0.1}})
    assert shown == {"policy": "p", "reward_model": "rm", "lr": 0.1, "reward_source": "model"}


# ------------------------------------------------------------------------------------------ against a live API
@pytest.fixture
def model_folder(tmp_path):
    """A Hugging Face-shaped folder on the API's server: config.json and a safetensors file of 10 parameters."""
    folder = tmp_path / "server-models" / "small"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(4)}, str(folder / "model.safetensors"))
    return folder


def upload(api_url: str, token: str, name: str) -> int:
    lines = "".join(json.dumps({"prompt": p}) + "\n" for p in ("one", "two", "three"))
    response = requests.post(f"{api_url}/api/v1/datasets", files={"file": (name, lines.encode())},
                             headers={"Authorization": f"Bearer {token}"}, timeout=10)  # fmt: skip
    assert response.status_code == 201, response.text
    return response.json()["id"]


def values_of(choices: list) -> list:
    return [value for _label, value in choices]


def unchanged(outputs: list) -> bool:
    """The handler left the token and the sign-in line alone (its last two outputs)."""
    return all(out == {"__type__": "update"} for out in outputs[-2:])


def test_the_drop_downs_list_the_catalogue_and_the_users_datasets(session, api_url, token, admin_token):
    mine = upload(api_url, token, "mine.jsonl")
    admin = api.Api(api_url, admin_token)
    admin.post("/catalogue/servers", {"name": "rm-1", "url": "http://127.0.0.1:9", "kind": "reward"})
    admin.post("/catalogue/servers", {"name": "critic-1", "url": "http://127.0.0.1:9", "kind": "critic"})
    admin.post("/catalogue/reward-functions", {"name": "letters", "target": "tests.helpers.rewards:letter_reward"})

    lists, summary, *updates, function_help, new_token, line = new_job.form_lists(session, token, {})
    assert new_token == line == {"__type__": "update"}
    assert summary.startswith("From the catalogue: policies: 1 · datasets: 3 · reward functions: 6 · reward models: 1")
    by_key = dict(zip(new_job.PICKERS, updates, strict=True))
    assert by_key["policy"]["choices"] == [("tiny-sft — test, 0 B", "tiny-sft")]
    assert by_key["policy"]["value"] == "tiny-sft"  # the first choice, as nothing was picked
    assert by_key["tokenizer"]["choices"] == [("(the policy's own)", ""), ("tiny-sft — test, 0 B, policy", "tiny-sft")]
    assert values_of(by_key["reward_model"]["choices"]) == values_of(by_key["critic_model"]["choices"]) == ["tiny-rm"]
    assert values_of(by_key["reward_server"]["choices"]) == ["rm-1"]
    assert values_of(by_key["critic_server"]["choices"]) == ["critic-1"]
    assert values_of(by_key["reward_function"]["choices"]) == [
        "demo", "exact_match", "numeric_match", "regex_match", "length_penalty", "letters"]  # fmt: skip
    assert ("letters — registered", "letters") in by_key["reward_function"]["choices"]
    datasets = by_key["train_dataset"]["choices"]
    assert datasets[0] == ("mine.jsonl (3 prompts, yours)", mine)  # the newest first, valued by id
    shared = [label for label, _id in datasets[1:]]
    assert shared == ["val.jsonl (2 prompts, shared)", "train.jsonl (2 prompts, shared)"]
    assert function_help.startswith("**demo**: The demo task's reward")

    numeric = catalogue.function_help(lists["functions"], "numeric_match")
    assert "- `tolerance` (number; default 1e-06): Absolute tolerance." in numeric
    assert "`pattern` (string; required)" in catalogue.function_help(lists["functions"], "regex_match")
    assert "unchecked" in catalogue.function_help(lists["functions"], "letters")
    assert "Arguments" not in catalogue.function_help(lists["functions"], "demo")

    # A preset names datasets; the drop-downs hold ids: the name becomes the newest dataset's id of that name.
    assert catalogue.pick(datasets, "train.jsonl") == datasets[2][1]
    assert catalogue.pick(datasets, "gone.jsonl") == "gone.jsonl"
    again = new_job.form_lists(session, token, {"policy": "tiny-sft", "val_dataset": "val.jsonl"})
    by_key = dict(zip(new_job.PICKERS, again[2:-3], strict=True))
    assert by_key["val_dataset"]["value"] == datasets[1][1]

    cleared = new_job.form_lists(session, "", {})  # signed out: emptied, nothing asked
    assert cleared[0] == {} and all(update["choices"] == [] for update in cleared[2:-3])


def test_the_forms_job_names_catalogue_entries_and_the_api_accepts_it(session, api_url, token):
    user = api.Api(api_url, token)
    lists = catalogue.form_choices(user)
    train_id, val_id = (dataset_id for _label, dataset_id in lists["train_dataset"][:2])
    values = {**form.DEFAULTS, "name": "from the form", "policy": "tiny-sft", "tokenizer": "",
              "train_dataset": train_id, "val_dataset": val_id, "reward_source": "function",
              "reward_function": "numeric_match", "function_args": '{"tolerance": 0.01}', "max_steps": 3}  # fmt: skip

    message, job_id, *errors, new_token, line = new_job.submit_job(session, token, "optim: {warmup_steps: 0}", values)
    assert message == f"Submitted **job {job_id}** (queued)." and not any(errors)
    config = user.get(f"/jobs/{job_id}")["config"]
    assert config["model"]["policy"] == "tiny-sft"
    assert (config["data"]["train_dataset"], config["data"]["val_dataset"]) == (train_id, val_id)
    assert config["reward"]["function"] == "numeric_match" and config["reward"]["function_args"]["tolerance"] == 0.01
    assert config["optim"]["warmup_steps"] == 0 and config["trainer"]["max_steps"] == 3

    ppo = {**values, "algorithm": "ppo", "critic_source": "model", "critic_model": "tiny-rm",
           "reward_source": "model", "reward_model": "tiny-rm"}  # fmt: skip
    message, job_id, *_rest = new_job.submit_job(session, token, "", ppo)
    assert message.startswith("Submitted"), message
    config = user.get(f"/jobs/{job_id}")["config"]
    assert config["critic"]["model"] == "tiny-rm" and config["reward"]["model"] == "tiny-rm"

    # The API's reasons land under the fields they concern; the dashboard's own check comes first.
    message, job_id, *errors, new_token, line = new_job.submit_job(
        session, token, "", {**values, "function_args": '{"tolerance": -1}', "policy": "nope"}
    )
    per_field = dict(zip(form.FORM_FIELDS, errors, strict=True))
    assert message.startswith("**Not submitted** (422)") and job_id == {"__type__": "update"}
    assert "greater than or equal to 0" in per_field["function_args"]
    assert "model 'nope' not found in the catalogue" in per_field["policy"]
    assert unchanged([new_token, line])
    message, _id, *errors, _token, _line = new_job.submit_job(session, token, "", {**values, "function_args": "[1]"})
    per_field = dict(zip(form.FORM_FIELDS, errors, strict=True))
    assert message.startswith("**Not submitted**: Reward function arguments (JSON object): must be a JSON object")
    assert per_field["function_args"].startswith("⚠ must be a JSON object") and not per_field["policy"]


def test_an_admin_registers_and_removes_catalogue_entries_from_the_catalogue_tab(
    session, api_url, admin_token, token, model_folder
):
    shown, message, models, functions, servers, datasets = tabs.catalogue_view(session, admin_token)
    assert shown["visible"] is True and models["name"].tolist() == ["tiny-rm", "tiny-sft"]
    assert "numeric_match" in functions["name"].tolist() and datasets["shared"].tolist() == [True, True]
    assert tabs.catalogue_view(session, token)[0]["visible"] is False  # a user: no Catalogue tab
    assert tabs.catalogue_view(session, "")[0]["visible"] is False

    act = functools.partial(tabs.catalogue_action, session)
    out = act(catalogue.register_model, admin_token, " small-sft ", str(model_folder), "policy", "a small one")
    assert out[0].startswith("Registered model **small-sft**: small-sft — LlamaForCausalLM, 10 params, ")
    assert out[0].endswith(", policy.") and unchanged(out)
    row = out[1].set_index("name").loc["small-sft"]
    assert row["path"] == str(model_folder.resolve()) and row["parameters"] == "10"
    out = act(catalogue.register_reward_function, admin_token, "letters", "tests.helpers.rewards:letter_reward", "")
    assert out[0] == "Registered reward function **letters** (`tests.helpers.rewards:letter_reward`)."
    out = act(catalogue.register_server, admin_token, "rm-1", "http://127.0.0.1:9", "reward", "reward_model", "")
    assert out[0] == "Registered reward server **rm-1** at http://127.0.0.1:9."
    assert out[3]["name"].tolist() == ["rm-1"]

    lists = catalogue.form_choices(api.Api(api_url, token))  # a user's New job form offers them at once
    assert "small-sft" in values_of(lists["policy"]) and "letters" in values_of(lists["reward_function"])
    assert values_of(lists["reward_server"]) == ["rm-1"]

    # Refusals: the API's message, and each field's reason.
    out = act(catalogue.register_model, admin_token, "small-sft", str(model_folder), "policy", "")
    assert out[0] == "**Refused** (409): 'small-sft' is already in the catalogue: remove it first"
    out = act(catalogue.register_model, admin_token, "bad name!", str(model_folder / "nowhere"), "policy", "")
    assert out[0].startswith("**Refused** (422): name 'bad name!' is not valid") and unchanged(out)
    out = act(catalogue.register_server, admin_token, "rm-2", "ftp://x", "reward", "", "")
    assert out[0].startswith("**Refused** (422)") and "\n- `url`: " in out[0]

    for what, name in [("model", "small-sft"), ("reward function", "letters"), ("server", "rm-1")]:
        out = act(catalogue.remove_entry, admin_token, what, name)
        assert out[0] == f"Removed {what} **{name}** from the catalogue.", out[0]
    assert "small-sft" not in out[1]["name"].tolist() and out[3].empty
    out = act(catalogue.remove_entry, admin_token, "model", "small-sft")
    assert out[0] == "**Refused** (404): model 'small-sft' not found in the catalogue"

    # Sharing a user's upload: then every user may pick it.
    theirs = upload(api_url, token, "theirs.jsonl")
    out = act(catalogue.share_dataset, admin_token, theirs, True)
    assert out[0] == f"Dataset {theirs} (**theirs.jsonl**) is now shared with every user."
    [newest, *_older] = catalogue.form_choices(api.Api(api_url, token))["train_dataset"]
    assert newest == ("theirs.jsonl (3 prompts, yours, shared)", theirs)
    out = act(catalogue.share_dataset, admin_token, theirs, False)
    assert out[0].endswith("is now its owner's only.")
    assert act(catalogue.share_dataset, admin_token, None, True)[0].startswith("**Refused** (422): give the id")


def test_a_user_is_refused_catalogue_changes_with_the_apis_message(session, token, model_folder):
    act = functools.partial(tabs.catalogue_action, session)
    refused = "**Refused** (403): only an admin may do this (aligner token create --admin)"
    for action, args in [
        (catalogue.register_model, ("x", str(model_folder), "policy", "")),
        (catalogue.register_reward_function, ("x", "os:system", "")),
        (catalogue.register_server, ("x", "http://169.254.169.254", "reward", "", "")),
        (catalogue.remove_entry, ("model", "tiny-sft")),
        (catalogue.share_dataset, (1, True)),
    ]:
        out = act(action, token, *args)
        assert out[0] == refused and unchanged(out), action  # refused, still signed in
        assert all(table == {"__type__": "update"} for table in out[1:5])
    assert act(catalogue.register_model, "", "x", "/x", "policy", "")[0] == "Sign in first."


def test_the_jobs_tabs_buttons_follow_the_actions_the_api_lists(api_url, client, token, config, db_session, tmp_path):
    """The buttons are enabled exactly as GET /jobs/{id} lists `actions`, whatever the status; no job, none."""
    app = ui.build_app(api_url, tmp_path)
    update_actions = next(fn.fn for fn in app.fns.values() if fn.name == "update_actions")
    job_id = create_job(client, token, config)["id"]
    for status, step, checkpoint, actions in ACTIONS_BY_STATE:
        put_in_state(db_session, job_id, status, step, checkpoint)
        table = frames.jobs_frame(client.get("/api/v1/jobs", headers=bearer(token)).json)
        *buttons, known = update_actions(token, job_id, table, None)
        assert [b["interactive"] for b in buttons] == [a in actions for a in jobs_tab.ACTIONS], status
        assert known == [job_id, status]
        assert update_actions(token, job_id, table, known) == [gr.skip()] * 5  # the same job and status: unasked
    assert [b["interactive"] for b in update_actions(token, 999, table, None)[:4]] == [False] * 4  # no such job
    assert [b["interactive"] for b in update_actions("", job_id, table, None)[:4]] == [False] * 4  # signed out
    assert jobs_tab.ACTIONS == ACTIONS


def test_deleting_a_job_from_the_jobs_tab_asks_first(api_url, client, token, config, db_session, tmp_path):
    """Delete only shows a question saying what goes; the job asked about is deleted on the confirmation and leaves
    the table; a job still running is refused with the API's reason."""
    app = ui.build_app(api_url, tmp_path)
    handlers = {fn.name: fn.fn for fn in app.fns.values()}
    ask, delete = handlers["ask_to_delete"], handlers["delete_job"]
    job_id = create_job(client, token, config, name="old run")["id"]
    put_in_state(db_session, job_id, "failed", 2, True)
    table = frames.jobs_frame(client.get("/api/v1/jobs", headers=bearer(token)).json)

    row, question, message, asked = ask(table, job_id)
    assert row == gr.update(visible=True) and message == "" and asked == job_id
    assert question.startswith(f"**Delete job {job_id} (old run)?** Its checkpoints, final policy, metrics and")
    assert client.get(f"/api/v1/jobs/{job_id}", headers=bearer(token)).status_code == 200  # asked, not done
    assert ask(table, None) == (gr.update(visible=False), "", "Select a job first.", None)

    running = create_job(client, token, config)["id"]
    put_in_state(db_session, running, "running", 1, False)
    # Confirmed after another job was selected: the job asked about is deleted, the selection stays.
    message, table, row, selected, *auth = delete(token, asked, running)
    assert message == f"Job {job_id} deleted." and row == gr.update(visible=False) and selected == running
    assert table["id"].tolist() == [running] and unchanged(auth)
    assert client.get(f"/api/v1/jobs/{job_id}", headers=bearer(token)).status_code == 404

    message, table, *_rest = delete(token, running, running)
    assert message == f"delete job {running}: job {running} is running: cancel it first; only a finished job can be " \
                      "deleted" and table == gr.update()  # fmt: skip


def test_deleting_a_dataset_from_the_new_job_tab_asks_first(session, api_url, token):
    """The picked training dataset: a question naming it first, deleted on the confirmation, the lists refreshed
    without it; a shared one is refused with the API's reason."""
    mine = upload(api_url, token, "mine.jsonl")
    lists = catalogue.form_choices(api.Api(api_url, token))
    row, question, message, asked = new_job.ask_to_delete_dataset(lists, mine)
    assert row == gr.update(visible=True) and message == "" and asked == mine
    assert question.startswith("**Delete dataset mine.jsonl (3 prompts, yours)?** Its file is deleted for good.")
    assert new_job.ask_to_delete_dataset(lists, None)[0] == gr.update(visible=False)

    message, row, choices, *_rest = new_job.delete_dataset(session, token, mine, {"train_dataset": mine})
    assert message == f"Deleted dataset {mine}." and row == gr.update(visible=False)
    assert mine not in [value for _label, value in choices["train_dataset"]]

    shared = choices["train_dataset"][0][1]
    message, row, *rest = new_job.delete_dataset(session, token, shared, {})
    assert message.startswith(f"**Dataset {shared} was not deleted** (403)") and unchanged(rest)
    assert new_job.delete_dataset(session, "", shared, {})[0] == "Sign in before deleting a dataset."


def test_a_rejected_token_signs_the_tab_out_instead_of_being_sent_again(session, app, api_url, token, db_session):
    assert session.sign_in(token)[:2] == [token, "Signed in as **alice**."]
    assert session.sign_in("alg_wrong")[:2] == ["", "Sign-in failed: Unauthorized"]
    assert unchanged(session.refresh_jobs(token))
    with db_session() as s:
        revoke_token(s, s.scalar(select(ApiToken.id).order_by(ApiToken.id.desc())))

    sent: list[int] = []
    original = api.Api.request

    def counting(self, method, path, **kwargs):
        try:
            return original(self, method, path, **kwargs)
        except api.ApiError as err:
            sent.append(err.status)
            raise

    api.Api.request = counting
    try:
        table, new_token, line = session.refresh_jobs(token)
        assert new_token == "" and line == "Signed out (token rejected: sign in again)."
        assert sent == [401]
        # Signed out, the tick's refreshes ask nothing.
        assert session.refresh_jobs("") == [{"__type__": "update"}] * 3 and sent == [401]
        signed_out = new_job.form_lists(session, "", {})
        assert signed_out[1] == "Sign in to fill the lists from the catalogue." and sent == [401]
        # Anything else that meets the rejected token signs the tab out too.
        for out in (
            new_job.submit_job(session, token, "", {**form.DEFAULTS, "policy": "tiny-sft"}),
            tabs.catalogue_action(session, catalogue.remove_entry, token, "model", "tiny-sft"),
            new_job.form_lists(session, token, {}),
        ):
            assert out[-2:] == ["", "Signed out (token rejected: sign in again)."]
        assert sent == [401] * 4
    finally:
        api.Api.request = original


def test_the_timer_only_watches_and_a_change_refreshes_the_jobs_table_then_the_open_tab(tmp_path):
    app = ui.build_app("http://127.0.0.1:5000", tmp_path)
    fns = list(app.fns.values())
    on_tick = [fn for fn in fns if any(event == "tick" for _id, event in fn.targets)]
    assert [fn.name for fn in on_tick] == ["watch"]
    # the watch shows nothing (states, and its own timer's pace): a visible output is redrawn by every event
    assert all(isinstance(block, gr.State | gr.Timer) for block in on_tick[0].outputs)
    seen, timer = on_tick[0].outputs[0], on_tick[0].outputs[2]
    # a job selected (a submit selects its job), resumed or retried sets a slowed timer back to its quick pace
    quickened = [fn for fn in fns if [block._id for block in fn.outputs] == [timer._id]]
    after = {app.fns[fn.trigger_after].name for fn in quickened}
    assert len(quickened) == 3 and all(fn.fn().value == tabs.REFRESH_S for fn in quickened)
    assert after == {"refresh_jobs", "resume_job", "retry_job"}, after
    on_change = [fn for fn in fns if (seen._id, "change") in fn.targets]
    assert [fn.name for fn in on_change] == ["refresh_jobs"]
    # then one event, whatever the number of tabs: each event is a round trip of the browser's
    followers = [fn for fn in fns if fn.trigger_after == on_change[0]._id]
    assert [fn.name for fn in followers] == ["refresh_open_tab"]
    dispatch = followers[0]
    assert len({block._id for block in dispatch.outputs}) == len(dispatch.outputs)
    # a tab that is not open asks nothing of the API (an unreachable one here) and redraws nothing
    values = [None] * (len(dispatch.inputs) - 1)
    for closed in ("jobs", "new", "catalogue"):
        assert dispatch.fn(closed, *values) == [gr.skip()] * len(dispatch.outputs)


def test_the_watch_changes_its_value_only_when_the_jobs_or_the_selected_jobs_events_do(
    session, client, token, config, db_session
):
    from webapp.db import add_event

    assert session.watch("", 1, False, None, tabs.REFRESH_S) == [gr.skip()] * 3  # signed out: nothing asked
    job_id = create_job(client, token, config)["id"]
    seen, kept, pace = session.watch(token, job_id, False, None, tabs.REFRESH_S)
    assert kept == gr.skip() and seen[1][0] == job_id and pace == gr.skip()  # a queued job: the timer stays quick
    nothing_new = session.watch(token, job_id, False, seen, tabs.REFRESH_S)
    assert nothing_new[:2] == [gr.skip(), gr.skip()]  # no change event
    with db_session() as s:
        add_event(s, job_id, "log", {"message": "waiting for the reward server"})
    newer, _, _ = session.watch(token, job_id, False, seen, tabs.REFRESH_S)
    assert newer[0] == seen[0] and newer[1][1] > seen[1][1]  # the jobs list is the same, the job has news
    assert session.watch(token, job_id, False, newer, tabs.REFRESH_S)[:2] == [gr.skip(), gr.skip()]
    create_job(client, token, config, name="another")
    assert session.watch(token, job_id, False, newer, tabs.REFRESH_S)[0][0] != newer[0]  # a new job in the list
    missing = session.watch(token, 2**31 - 1, False, newer, tabs.REFRESH_S)[0]
    assert missing[1] == [2**31 - 1, None]  # not the user's: its page says so, the watch goes on

    for job in client.get("/api/v1/jobs", headers=bearer(token)).json["items"]:  # nothing runs any more
        put_in_state(db_session, job["id"], "succeeded", 2, False)
    *_, pace = session.watch(token, job_id, False, newer, tabs.REFRESH_S)
    assert isinstance(pace, gr.Timer) and pace.value == tabs.IDLE_REFRESH_S  # then the timer slows down
    assert session.watch(token, job_id, False, newer, tabs.IDLE_REFRESH_S)[2] == gr.skip()  # and stays so


def test_the_open_tabs_refreshes_run_and_only_theirs():
    with gr.Blocks() as blocks:
        session, _sign_in = tabs.header("http://127.0.0.1:9")
        shared_in, a_out, b_out, both_out = gr.Textbox(), gr.Textbox(), gr.Textbox(), gr.Textbox()
        session.ticked = session.timer.tick(lambda: None, None, None)
        calls = []

        def refresh_a(value):
            calls.append(("a", value))
            return [f"a {value}", gr.skip()]

        def refresh_b(value):
            calls.append(("b", value))
            return [f"b {value}", "b wrote"]

        session.every_tick(refresh_a, [shared_in], [a_out, both_out], tab="a")
        session.every_tick(refresh_b, [shared_in], [b_out, both_out], tab="b")
        session.wire_ticks()
    dispatch = next(fn for fn in blocks.fns.values() if fn.name == "refresh_open_tab")
    assert [block._id for block in dispatch.inputs] == [session.open_tab._id, shared_in._id]
    assert [block._id for block in dispatch.outputs] == [a_out._id, both_out._id, b_out._id]
    assert dispatch.fn("a", "x") == ["a x", gr.skip(), gr.skip()] and calls == [("a", "x")]
    assert dispatch.fn("b", "y") == [gr.skip(), "b wrote", "b y"] and calls[1:] == [("b", "y")]
    assert dispatch.fn("c", "z") == [gr.skip()] * 3 and len(calls) == 2


def test_a_preset_fills_the_form_naming_datasets_by_their_ids(tmp_path):
    demo = tmp_path / "demo_assets"
    demo.mkdir()
    (demo / "reinforce.yaml").write_text(CONFIG_TEMPLATE)
    app = ui.build_app("http://127.0.0.1:5000", tmp_path)
    laid_out = [key for row in new_job.FORM_ROWS for key in row]  # the order of the form's inputs
    assert sorted(laid_out) == sorted(form.FORM_FIELDS)  # each field once
    apply = next(fn.fn for fn in app.fns.values() if fn.name == "apply_preset")
    lists = {"train_dataset": [("demo-prompts-train.jsonl (40 prompts, shared)", 7)],
             "val_dataset": [("other.jsonl (3 prompts, yours)", 2)]}  # fmt: skip
    picked = {key: None for key in new_job.PICKERS}
    *values, advanced = apply("demo tiny model", lists, *picked.values())
    shown = dict(zip(laid_out, values, strict=True))
    assert shown["policy"] == "demo-policy" and shown["reward_function"] == "demo" and shown["lr"] == 3.0e-4
    assert shown["train_dataset"] == 7  # the id of the dataset of that name
    assert shown["val_dataset"] == "demo-prompts-val.jsonl"  # not listed: the name, for the API to look up
    assert "warmup_steps: 5" in advanced
    *values, _advanced = apply("defaults", lists, *picked.values())  # on a demo stack: the demo's run
    assert values == apply("demo tiny model", lists, *picked.values())[:-1]
    app = ui.build_app("http://127.0.0.1:5000", tmp_path / "no demo")
    apply = next(fn.fn for fn in app.fns.values() if fn.name == "apply_preset")
    *values, advanced = apply("defaults", lists, *{**picked, "policy": "mine", "train_dataset": 2}.values())
    shown = dict(zip(laid_out, values, strict=True))
    assert (shown["policy"], shown["train_dataset"]) == ("mine", 2)  # aligner's defaults keep the picks
    assert advanced == form.advanced_yaml("reinforce")


def test_the_ui_knows_the_apis_kinds():
    assert catalogue.MODEL_KINDS == MODEL_KINDS and catalogue.SERVER_KINDS == SERVER_KINDS
    assert catalogue.human_count(1_234_567) == "1.2M" and catalogue.human_count(950) == "950"
    assert catalogue.human_bytes(4_812_345) == "4.8 MB" and catalogue.human_bytes(12) == "12 B"
    model = {"name": "tiny-sft", "architecture": "LlamaForCausalLM", "num_parameters": 1_200_000,
             "size_bytes": 4_800_000, "kind": "policy"}  # fmt: skip
    assert catalogue.model_label(model) == "tiny-sft — LlamaForCausalLM, 1.2M params, 4.8 MB"


def test_the_dashboard_forwards_each_browsers_address_so_one_browsers_failures_spare_the_others(app, api_url, token):
    """The API trusts one proxy (the dashboard, ALIGNER_TRUSTED_PROXIES=1): each browser's failed sign-ins count
    against its own address, a valid token is served anyway, and what a browser writes into X-Forwarded-For itself
    changes nothing. Events run through Gradio's own processing (process_api), which is what makes the browser's
    request visible to the handler."""
    import asyncio

    from starlette.requests import Request
    from werkzeug.middleware.proxy_fix import ProxyFix

    app.config["SIGNIN_FAILURE_LIMIT"] = "10 per minute"
    app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1)  # what create_app does with TRUSTED_PROXIES=1
    with gr.Blocks() as blocks:
        session, _sign_in = tabs.header(api_url)
        typed, answer, chain = gr.Textbox(), gr.Textbox(), gr.Textbox()
        gr.Button().click(lambda t: session.sign_in(t)[1], [typed], [answer])
        gr.Button().click(lambda: tabs.forwarded_for() or "", None, [chain])

    def event(fn_index: int, inputs: list, host: str, forwarded: str | None = None) -> str:
        headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
        scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "client": (host, 50000)}
        request = gr.Request(Request(scope))
        body = asyncio.run(blocks.process_api(block_fn=fn_index, inputs=inputs, state=None, request=request))
        return body["data"][0]

    sign_in, show_chain = (fn._id for fn in blocks.fns.values())
    assert event(show_chain, [], "198.51.100.1") == "198.51.100.1"
    assert event(show_chain, [], "198.51.100.1", "203.0.113.9") == "203.0.113.9, 198.51.100.1"
    assert tabs.forwarded_for() is None  # outside an event

    for i in range(10):  # the first browser mistypes, claiming a fresh address each time: it counts as itself
        assert event(sign_in, ["alg_typo"], "198.51.100.1", f"203.0.113.{i}") == "Sign-in failed: Unauthorized"
    assert event(sign_in, ["alg_typo"], "198.51.100.1") == "Sign-in failed: Too many failed sign-ins from this address"
    assert event(sign_in, [token], "198.51.100.1") == "Signed in as **alice**."  # a valid token is served
    assert event(sign_in, ["alg_typo"], "198.51.100.2") == "Sign-in failed: Unauthorized"  # another browser
    assert event(sign_in, [token], "198.51.100.2") == "Signed in as **alice**."


def test_the_dashboard_refuses_an_upload_over_the_cap(tmp_path, monkeypatch):
    """Gradio's /gradio_api/upload answers anyone who reaches the dashboard: each file is capped at
    ALIGNER_MAX_UPLOAD_BYTES (413 past it), and the cached uploads are deleted after an hour."""
    from aligner.processes import free_port
    from webapp.settings import service_settings

    monkeypatch.setenv("ALIGNER_MAX_UPLOAD_BYTES", "1000")
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    service_settings.cache_clear()
    app = ui.build_app("http://127.0.0.1:9", tmp_path)
    assert app.delete_cache == (3600, 3600)
    port = free_port()
    ui.launch(app, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        url = f"http://127.0.0.1:{port}/gradio_api/upload"
        small = requests.post(url, files={"files": ("p.jsonl", b"x" * 900)}, timeout=30)
        assert small.status_code == 200 and len(small.json()) == 1
        large = requests.post(url, files={"files": ("p.jsonl", b"x" * 5000)}, timeout=30)
        assert large.status_code == 413 and "maximum allowed size" in large.text
    finally:
        app.close()
