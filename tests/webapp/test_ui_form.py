"""The New job form's pieces without a browser (webapp/ui/form.py, webapp/ui/new_job.py): one field per API error,
cleared when the field changes, the advanced YAML of the sections that apply, "Try the reward" and the dry run on
hand-made API JSON, refusals and uploads through a stand-in API."""

from __future__ import annotations

import pytest
import yaml

from aligner.config import ALGORITHM_PRESETS, ALGORITHM_SUMMARIES, TrainConfig
from aligner.demo.templates import CONFIG_TEMPLATE, ppo_config_text
from tests.helpers.api import bearer
from webapp import advice, ui
from webapp.ui import form, new_job
from webapp.ui.api import ApiError
from webapp.ui.tabs import Session, browser_values

VALUES = {**form.DEFAULTS, "name": "t", "policy": "tiny-sft", "train_dataset": 1, "val_dataset": 1,
          "reward_source": "function", "reward_function": "demo"}  # fmt: skip
TRY_RESULT = {
    "samples": [
        {"group": 1, "prompt": "<|user|>\nthe sea\n<|assistant|>\n", "response": "blue<|eos|>", "reward": 0.5,
         "length": 2},
        {"group": 0, "prompt": "<|user|>\nthe cat\n<|assistant|>\n", "response": "a cat", "reward": 0.12345,
         "length": 3},
        {"group": 1, "prompt": "<|user|>\nthe sea\n<|assistant|>\n", "response": "wet", "reward": 0.5, "length": 1},
        {"group": 0, "prompt": "<|user|>\nthe cat\n<|assistant|>\n", "response": "nice", "reward": 1.0, "length": 1},
    ],
    "groups": [
        {"group": 0, "prompt": "<|user|>\nthe cat\n<|assistant|>\n", "mean": 0.561725, "std": 0.438275,
         "zero_spread": False},
        {"group": 1, "prompt": "<|user|>\nthe sea\n<|assistant|>\n", "mean": 0.5, "std": 0.0, "zero_spread": True},
    ],
    "reward_length_corr": -0.7071, "frac_zero_std_groups": 0.5, "seconds": 3.21,
    "warnings": ["half the groups have zero spread"],
}  # fmt: skip


def test_each_error_shows_under_exactly_one_field():
    errors = {
        "config.reward.function": ["reward function 'x' not found in the catalogue"],
        "config.model.policy": ["catalogue model 'p' at /p is not a model folder: no config.json"],
        "config.trainer": ["save_interval must divide max_steps"],  # a section without a field of its own
        "config.model": ["give a policy"],
        "config.generation.top_p": ["Input should be less than or equal to 1"],  # not on the form
    }
    by_field, other = form.field_errors(errors)
    assert by_field == {
        "reward_function": errors["config.reward.function"],
        "policy": errors["config.model.policy"] + errors["config.model"],
    }
    assert other == {
        "config.trainer": errors["config.trainer"],
        "config.generation.top_p": errors["config.generation.top_p"],
    }
    per_field = form.per_field_errors(errors)
    assert sum(bool(line) for line in per_field) == 2 and len(per_field) == len(form.FORM_FIELDS)
    # The try's own `reward` error goes under the picker of the chosen source.
    assert form.error_field("reward", {"reward_source": "server"}) == "reward_server"
    assert form.error_field("reward") == "reward_function"
    assert form.per_field_errors({}) == [""] * len(form.FORM_FIELDS)  # the next submit clears every field


def test_a_fields_error_is_cleared_when_that_field_changes(tmp_path):
    app = ui.build_app("http://127.0.0.1:5000", tmp_path)
    by_id = {block._id: block for block in app.blocks.values()}
    clears = {}
    for fn in app.fns.values():
        for target, event in fn.targets:
            elem_id = getattr(by_id.get(target), "elem_id", None) or ""
            outputs = [getattr(out, "elem_id", None) for out in fn.outputs]
            if event == "change" and elem_id.startswith("f-") and len(outputs) == 1 and outputs[0].startswith("err-"):
                clears[elem_id.removeprefix("f-")] = (outputs[0].removeprefix("err-"), fn.fn, *browser_values(fn))
    # In the browser itself: a server round trip could land after the submit's answer and wipe the error it shows.
    assert clears == {key: (key, None, "") for key in form.FORM_FIELDS}


def test_the_advanced_yaml_holds_the_sections_that_apply_and_is_sent_as_shown():
    reinforce, ppo = form.advanced_yaml("reinforce"), form.advanced_yaml("ppo")
    assert len(reinforce.splitlines()) < 25 and len(ppo.splitlines()) < 25
    sent = yaml.safe_load(reinforce)
    assert "ppo" not in sent and "critic" not in sent and sent["reinforce"]["kl_estimator"] == "abs"
    assert "ppo" in yaml.safe_load(ppo) and "reinforce" not in yaml.safe_load(ppo)
    assert "extra_rewards" in reinforce and "validation" not in sent  # an example, commented out
    form_paths = {path for path, _label, _kind in form.FORM_FIELDS.values()}
    for section, knobs in sent.items():  # aligner's own fields at their defaults, none that the form has
        for leaf, value in knobs.items():
            assert f"config.{section}.{leaf}" not in form_paths
            assert value == form.config_default(f"config.{section}.{leaf}")
    body = form.build_job({**VALUES, "algorithm": "ppo", "critic_model": "rm"}, ppo)
    assert body["config"]["ppo"] == yaml.safe_load(ppo)["ppo"]
    paths = {
        "model": {"policy_path": "/p"},
        "data": {"train_file": "t", "val_file": "v"},
        "reward": {"function": "m:f"},
    }
    for template in (reinforce, ppo):  # every knob sent is one of aligner.config's
        TrainConfig.model_validate({**paths, **yaml.safe_load(template)})
    # Switching the algorithm: a template becomes the other's; the user's YAML loses only what no longer applies.
    assert form.advanced_for("ppo", reinforce) == ppo and form.advanced_for("reinforce", "") == reinforce
    assert yaml.safe_load(form.advanced_for("reinforce", "ppo: {ratio_eps: 0.1}\noptim: {lr: 1}\n")) == {
        "optim": {"lr": 1}
    }
    mine = "# mine\noptim: {warmup_steps: 0}\n"
    assert form.advanced_for("reinforce", mine) == mine


def test_a_tried_reward_shows_its_groups_samples_and_numbers():
    groups, table = form.try_tables(TRY_RESULT)
    assert groups.values.tolist() == [
        [0, "user: the cat", 0.562, 0.438, 2, ""],
        [1, "user: the sea", 0.5, 0.0, 2, "zero spread: no learning signal"],
    ]
    assert table.values.tolist() == [
        [0, "user: the cat", "a cat", 0.123, 3],
        [0, "", "nice", 1.0, 1],
        [1, "user: the sea", "blue", 0.5, 2],
        [1, "", "wet", 0.5, 1],
    ]
    summary = form.try_summary(TRY_RESULT)
    assert "**4 samples** of 2 prompts in 3.2 s" in summary and "correlation **-0.71**" in summary
    assert "zero-spread groups **50%** (1 of 2)" in summary and "- ⚠ half the groups have zero spread" in summary
    assert "Every group" not in summary
    flat = {**TRY_RESULT, "groups": [{**g, "zero_spread": True} for g in TRY_RESULT["groups"]],
            "reward_length_corr": None, "frac_zero_std_groups": 1.0, "warnings": []}  # fmt: skip
    assert "Every group has zero spread" in form.try_summary(flat) and "correlation **n/a**" in form.try_summary(flat)
    said = form.try_summary({**flat, "warnings": ["every group has zero spread: RLOO gets no learning signal"]})
    assert "Every group" not in said  # the API's warning says it already
    body = form.try_body(VALUES, "optim: {warmup_steps: 0}", 12, "3")
    assert (body["num_prompts"], body["num_samples"]) == (8, 3)  # held to the API's bounds
    assert body["config"] == form.build_job(VALUES, "optim: {warmup_steps: 0}")["config"]


def test_a_dry_run_lists_its_checks_and_the_step_time():
    boom = "the reward function raised ValueError: boom"
    result = {"ok": False, "estimated_step_s": 2.345, "config": {}, "checks": [
        {"name": "policy", "ok": True, "message": "LlamaForCausalLM", "seconds": 0.012},
        {"name": "reward", "ok": False, "message": boom, "seconds": 1.5}]}  # fmt: skip
    shown = form.dry_run_markdown(result)
    assert shown.startswith("**Dry run: not ready**")
    assert "- ✓ **policy**: LlamaForCausalLM (0.01 s)" in shown
    assert "- ✗ **reward**: the reward function raised ValueError: boom (1.50 s)" in shown
    assert "Estimated step time: **2.3 s**" in shown
    assert "Estimated" not in form.dry_run_markdown({"ok": True, "checks": [], "estimated_step_s": None})


class StandIn:
    """A Session whose API answers with `answer` (a result, or an ApiError raised) and records what was sent."""

    unchanged, signed_out = staticmethod(Session.unchanged), staticmethod(Session.signed_out)

    def __init__(self, answer):
        self.answer, self.sent = answer, []

    def api(self, token):
        stand_in = self

        class Api:
            def post(self, path, body=None, **params):
                return stand_in.reply(("POST", path, body, params))

            def upload(self, path, file_path, name):
                return stand_in.reply(("UPLOAD", path, name))

            def get(self, path, **params):
                return {"items": [], "total": 0}

        return Api()

    def reply(self, request):
        self.sent.append(request)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_refusals_show_plainly_under_the_field_they_name_and_the_panel():
    bad_reward = ApiError(422, "the reward failed", {"reward": ["the reward function raised ValueError: boom"]})
    session = StandIn(bad_reward)
    message, _groups, _table, *errors, token, line = new_job.try_reward(session, "tok", "", VALUES, 2, 2)
    assert message == "**The reward could not be tried** (422): the reward failed\n\n- **Reward** (`reward`): " \
                      "the reward function raised ValueError: boom"  # fmt: skip
    per_field = dict(zip(form.FORM_FIELDS, errors, strict=True))
    assert per_field["reward_function"] == "⚠ the reward function raised ValueError: boom"
    assert sum(bool(e) for e in errors) == 1 and token == line == {"__type__": "update"}
    assert session.sent == [("POST", "/rewards/try", form.try_body(VALUES, "", 2, 2), {"timeout": new_job.TRY_WAIT_S})]

    not_a_model = ApiError(422, "Validation error", {"config.model.policy": ["'p' at /p is not a model folder"]})
    message, _job, *errors, _token, _line = new_job.submit_job(StandIn(not_a_model), "tok", "", VALUES)
    per_field = dict(zip(form.FORM_FIELDS, errors, strict=True))
    assert per_field["policy"] == "⚠ 'p' at /p is not a model folder" and sum(bool(e) for e in errors) == 1
    assert message.startswith("**Not submitted** (422): Validation error\n\n- **Policy** (`config.model.policy`)")

    checked = {"ok": True, "checks": [{"name": "policy", "ok": True, "message": "ok", "seconds": 0.1}],
               "estimated_step_s": 1.0, "config": {}}  # fmt: skip
    dry = StandIn(checked)
    message, *errors, _token, _line = new_job.dry_run(dry, "tok", "", VALUES)
    assert message == form.dry_run_markdown(checked) and not any(errors)
    assert dry.sent[0][1] == "/jobs" and dry.sent[0][3] == {"timeout": new_job.TRY_WAIT_S, "dry_run": "true"}
    gone = new_job.dry_run(StandIn(ApiError(401, "Unauthorized")), "tok", "", VALUES)
    assert gone[-2:] == Session.signed_out()


def test_an_uploaded_file_becomes_the_picked_dataset_or_says_why_not(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "a"}\n')
    refused = ApiError(422, "Invalid prompt file mine.jsonl", {"file": ["line 1: no 'prompt' key"]})
    message, *rest = new_job.upload_dataset(StandIn(refused), "tok", str(path), {})
    assert message == "**mine.jsonl was not uploaded** (422): Invalid prompt file mine.jsonl\n\n" \
                      "- `file`: line 1: no 'prompt' key"  # fmt: skip
    assert all(out == {"__type__": "update"} for out in rest)
    assert new_job.upload_dataset(StandIn(refused), "", str(path), {})[0] == "Sign in before uploading a dataset."


def test_an_alias_bomb_in_the_advanced_yaml_is_refused_with_a_message():
    """The advanced box is read by aligner.config.load_yaml: a YAML alias bomb (9^9 strings once expanded, when the
    body is serialised) is refused before anything is sent, and the user reads why."""
    bomb = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
    )
    body, message, _ = new_job._form_body(VALUES, bomb, "Not submitted")
    assert body is None
    assert message.startswith("**Not submitted**: advanced YAML:") and "aliases (*a) are not accepted" in message
    assert form.advanced_for("ppo", bomb) == bomb  # left as typed; the submit says what is wrong


# ----------------------------------------------------------------------------------------- issue 30: presets, warnings
DEMO_PARAMETERS = 1_100_000  # about the demo policy's size (aligner/demo/assets.py: ~1M parameters)


def demo_presets(tmp_path):
    demo = tmp_path / "demo_assets"
    demo.mkdir()
    (demo / "reinforce.yaml").write_text(CONFIG_TEMPLATE)
    (demo / "ppo.yaml").write_text(ppo_config_text())
    return form.presets(tmp_path)


def test_every_preset_names_its_algorithm_and_the_demo_defaults_train_on_the_train_prompts(tmp_path):
    assert all(preset["form"]["algorithm"] in form.CHOICES["algorithm"] for preset in form.presets(None).values())
    found = demo_presets(tmp_path)
    assert {name: preset["form"]["algorithm"] for name, preset in found.items()} == {
        "defaults": "reinforce", "demo tiny model": "reinforce", "demo tiny model, reward server": "reinforce",
        "demo tiny model, PPO": "ppo",
    }  # fmt: skip
    demo = yaml.safe_load(CONFIG_TEMPLATE)
    defaults = found[form.DEFAULT_PRESET]
    body = form.build_job(defaults["form"], defaults["yaml"])["config"]
    assert body["data"] == {"train_dataset": "demo-prompts-train.jsonl", "val_dataset": "demo-prompts-val.jsonl",
                            "max_prompt_length": demo["data"]["max_prompt_length"]}  # fmt: skip
    assert body["model"]["policy"] == "demo-policy" and body["reward"] == {"function": "demo"}
    assert body["optim"]["lr"] == demo["optim"]["lr"] and body["trainer"]["max_steps"] == demo["trainer"]["max_steps"]
    assert advice.training_warnings(body, DEMO_PARAMETERS) == []
    # Without the demo: aligner's defaults, which name no entries.
    assert form.presets(None)[form.DEFAULT_PRESET]["form"] == form.DEFAULTS


def test_the_rules_say_why_a_job_would_train_nothing():
    config = {"data": {"train_dataset": 7, "val_dataset": 7}, "optim": {"lr": 1e-6}, "trainer": {"max_steps": 40}}
    warned = advice.training_warnings(config, DEMO_PARAMETERS)
    assert [w["field"] for w in warned] == ["config.data.val_dataset", "config.optim.lr"]
    assert "validation prompts are the training prompts" in warned[0]["message"]
    assert "300x under the ~0.0003 a policy of 1.1M parameters" in warned[1]["message"]
    # The same rate suits a model of billions; another dataset for validation; the API compares resolved files.
    assert advice.training_warnings({**config, "data": {"train_dataset": 7, "val_dataset": 8}}, 2 * 10**9) == []
    assert advice.training_warnings(config, None, same_prompts=False) == []
    short = advice.training_warnings({"trainer": {"max_steps": 5}})  # aligner's warm-up: 10 steps
    assert [w["field"] for w in short] == ["config.trainer.max_steps"] and "warm-up" in short[0]["message"]
    tiny = advice.training_warnings({"trainer": {"max_steps": 3}, "optim": {"warmup_steps": 0}})
    assert "too few" in tiny[0]["message"]
    assert advice.training_warnings({"optim": {"lr": "fast"}, "trainer": {"max_steps": None}}, 10) == []


def test_the_form_and_its_dry_run_show_the_warnings():
    values = {**VALUES, "policy": "demo-policy", "lr": 1e-6, "max_steps": 40}  # train and validation: dataset 1
    lists = {"parameters": {"demo-policy": DEMO_PARAMETERS}}
    shown = form.form_warnings(values, "", lists)
    assert shown.startswith("**This job is likely to train nothing:**")
    assert "- ⚠ **Validation prompts**: the validation prompts are the training prompts" in shown
    assert "- ⚠ **Learning rate**: learning rate 1e-06 is 300x under" in shown
    assert "Learning rate" not in form.form_warnings(values, "", {})  # the policy's size unknown: no lr rule
    assert form.form_warnings({**values, "val_dataset": 2, "lr": 3e-4}, "", lists) == ""
    assert form.form_warnings(values, "[not, a, mapping]", lists) == ""  # the submit says why

    warnings = [{"field": "config.optim.lr", "message": "too low"}, {"field": "config.x", "message": "odd"}]
    result = {"ok": True, "checks": [], "warnings": warnings, "estimated_step_s": None}
    shown = form.dry_run_markdown(result)
    assert shown.startswith("**Dry run: ready to submit** (with 2 warnings)")
    assert "- ⚠ **Learning rate**: too low" in shown and "- ⚠ **`config.x`**: odd" in shown


def test_stale_results_go_when_the_form_changes_and_a_cleared_upload_takes_its_line(tmp_path):
    """Without a browser: the event graph. A change of the preset, a user's edit of any field or of the advanced YAML
    empties the dry run's result and the try's panel (not a value the dashboard sets itself, such as the lists
    refilled while a try runs); clearing the upload empties its line; the warnings follow the fields."""
    app = ui.build_app("http://127.0.0.1:5000", tmp_path)
    by_id = {block._id: block for block in app.blocks.values()}

    def wiring(trigger_event: str, outputs: set[str]) -> set[str]:
        """The elements whose `trigger_event` runs a handler writing exactly `outputs`."""
        found = set()
        for fn in app.fns.values():
            if {getattr(out, "elem_id", None) for out in fn.outputs} == outputs:
                found |= {getattr(by_id.get(t), "elem_id", None) for t, event in fn.targets if event == trigger_event}
        return found

    stale = {"dry-msg", "try-msg", "try-groups", "try-table"}
    fields = {f"f-{key}" for key in form.FORM_FIELDS}
    pickers = {f"f-{key}" for key in new_job.PICKERS}
    assert {"preset", "advanced", *(fields - pickers)} <= wiring("change", stale) and pickers <= wiring("input", stale)
    assert not pickers & wiring("change", stale)
    clear = next(fn for fn in app.fns.values() if {getattr(out, "elem_id", None) for out in fn.outputs} == stale)
    assert clear.fn is None  # done in the browser: a round trip could wipe a try's answer that came meanwhile
    message, result, groups, samples = browser_values(clear)
    assert message == result == "" and groups["data"] == samples["data"] == []
    assert groups["headers"] == form.TRY_GROUP_COLUMNS and samples["headers"] == form.TRY_SAMPLE_COLUMNS
    assert wiring("clear", {"upload-msg"}) == {"f-upload"}
    upload = next(block._id for block in app.blocks.values() if getattr(block, "elem_id", None) == "f-upload")
    cleared = next(fn for fn in app.fns.values() if (upload, "clear") in fn.targets)
    assert cleared.fn is None and browser_values(cleared) == [""]
    assert {"advanced", *fields} <= wiring("change", {"form-warnings"})


def test_the_backend_and_processes_are_offered_sent_and_explained():
    assert form.CHOICES["backend"] == ["hf", "fsdp", "megatron"]  # aligner.config's Literal, as the API takes it
    assert ["backend", "num_processes"] in new_job.FORM_ROWS
    assert all(word in form.BACKEND_HELP for word in ("**hf**", "**fsdp**", "**megatron**", "megatron extra"))
    body = form.build_job({**VALUES, "backend": "fsdp", "num_processes": 4.0})
    assert body["config"]["model"]["backend"] == "fsdp"
    assert body["num_processes"] == 4 and isinstance(body["num_processes"], int)  # the body's own, not the config's
    assert "num_processes" not in body["config"] and "num_processes" not in form.try_body(VALUES, "", 2, 2)
    assert form.build_job({**VALUES, "num_processes": None}).keys() == {"name", "config"}  # the API's default: 1
    # A preset without them starts from hf on one process; the YAML does not repeat the form's backend.
    preset = form._preset({"model": {"policy": "p", "backend": "fsdp"}}, "x")
    assert (preset["form"]["backend"], preset["form"]["num_processes"]) == ("fsdp", 1)
    assert "backend" not in preset["yaml"]
    assert form._preset({"model": {"policy": "p"}}, "x")["form"]["backend"] == "hf"


def test_a_job_too_big_shows_its_numbers_under_the_backend_or_processes_field():
    reason = ("needs 37.2 GB per process with backend hf on 1 process; the worker's device has 24.0 GB (declared): "
              "use model.backend fsdp with num_processes 2 (18.6 GB each)")  # fmt: skip
    too_big = ApiError(422, "The job does not fit the worker's device memory", {"config.model.backend": [reason]})
    message, _job, *errors, _token, _line = new_job.submit_job(StandIn(too_big), "tok", "", VALUES)
    per_field = dict(zip(form.FORM_FIELDS, errors, strict=True))
    assert per_field["backend"] == f"⚠ {reason}" and sum(bool(e) for e in errors) == 1
    assert "**Backend** (`config.model.backend`)" in message
    more = ApiError(422, "The job does not fit the worker's device memory", {"num_processes": ["use num_processes 4"]})
    _message, *errors, _token, _line = new_job.dry_run(StandIn(more), "tok", "", {**VALUES, "backend": "fsdp"})
    assert dict(zip(form.FORM_FIELDS, errors, strict=True))["num_processes"] == "⚠ use num_processes 4"


def test_a_dry_run_shows_the_memory_estimate():
    memory = {
        "backend": "fsdp",
        "world_size": 2,
        "per_rank_bytes": 18_600_000_000,
        "needed_bytes": 18_600_000_000,
        "device_bytes": 24_000_000_000,
        "device_source": "declared",
        "device_shared": False,
        "fits": True,
    }
    shown = form.dry_run_markdown({"ok": True, "checks": [], "estimated_step_s": None, "memory": memory})
    assert ("Estimated memory: **18.60 GB per process** with backend fsdp on 2 processes, of the worker's 24.0 GB "
            "(declared)") in shown  # fmt: skip
    shared = {**memory, "world_size": 1, "needed_bytes": 5e8, "device_shared": True, "device_source": "measured"}
    assert "**0.50 GB all processes together** with backend fsdp on 1 process," in form.memory_markdown(shared)
    assert form.memory_markdown(None) == "" and "memory" not in form.dry_run_markdown({"checks": [], "memory": None})


# ----------------------------------------------------------------------------------------- issue 32: REINFORCE presets
def test_the_form_offers_every_reinforce_preset_with_its_line(tmp_path):
    labels = dict((value, label) for label, value in form.CHOICE_LABELS["reinforce_algorithm"])
    assert list(labels) == list(ALGORITHM_PRESETS) == form.CHOICES["reinforce_algorithm"]
    assert all(ALGORITHM_SUMMARIES[name] in label for name, label in labels.items())
    assert form.visible_fields({"algorithm": "reinforce"})["reinforce_algorithm"]
    assert not form.visible_fields({"algorithm": "ppo"})["reinforce_algorithm"]  # PPO has no use for it
    app = ui.build_app("http://127.0.0.1:5000", tmp_path)
    pick = next(fn for fn in app.fns.values() if fn.name == "pick_preset")
    by_id = {block._id: block for block in app.blocks.values()}
    assert [getattr(by_id[target], "elem_id", None) for target, event in pick.targets] == ["f-reinforce_algorithm"]
    assert [out.elem_id for out in pick.outputs] == ["f-kl_penalty", "advanced"]
    kl, advanced = pick.fn("grpo", form.advanced_yaml("reinforce"))
    assert kl == ALGORITHM_PRESETS["grpo"]["initial_policy_kl_penalty"]
    assert advanced == form.advanced_yaml("reinforce", "grpo")  # the template, at the preset's values
    assert yaml.safe_load(advanced)["reinforce"] == {
        k: ALGORITHM_PRESETS["grpo"][k] for k in ("kl_estimator", "baseline")
    }


def test_a_box_the_user_edited_keeps_its_other_keys_when_a_preset_is_chosen():
    mine = "# mine\noptim: {warmup_steps: 0}\nreinforce: {kl_estimator: abs, num_prompts_per_step: 2}\n"
    _fields, advanced = form.choose_preset("dapo", mine)
    dapo = form.preset_knobs("dapo")
    assert yaml.safe_load(advanced) == {
        "optim": {"warmup_steps": 0},
        "reinforce": {"kl_estimator": dapo["kl_estimator"], "num_prompts_per_step": 2},
    }
    untouched = "# mine\noptim: {warmup_steps: 0}\n"
    assert form.choose_preset("dapo", untouched)[1] == untouched  # no knob of a preset in it: as typed
    assert form.choose_preset("dapo", "reinforce: [unclosed")[1] == "reinforce: [unclosed"


@pytest.mark.parametrize(
    "preset, knobs",
    [
        ("dapo", {"initial_policy_kl_penalty": 0.0, "policy_loss": "clip", "epsilon_high": 0.28}),
        ("grpo", {"initial_policy_kl_penalty": 0.04, "baseline": "group_mean", "kl_estimator": "k3"}),
    ],
)
def test_a_job_the_form_submits_with_a_preset_runs_the_presets_knobs(client, token, preset, knobs):
    values = {**VALUES, "train_dataset": "train.jsonl", "val_dataset": "val.jsonl", "reinforce_algorithm": preset}
    fields, advanced = form.choose_preset(preset, form.advanced_yaml("reinforce"))  # what choosing it does
    body = form.build_job({**values, **fields}, advanced)
    response = client.post("/api/v1/jobs", json=body, headers=bearer(token))
    assert response.status_code == 201, response.json
    resolved = response.json["config"]["reinforce"]
    assert resolved["algorithm"] == preset
    assert {key: resolved[key] for key in knobs} == knobs
    # The form's KL field as it was (aligner's default) would have overridden the preset's: the choice replaced it.
    assert values["kl_penalty"] != fields["kl_penalty"] or preset == "rloo"


def test_the_api_takes_a_preset_and_names_the_field_of_a_wrong_one(client, token, config):
    config["reinforce"] = {"algorithm": "gspo"}
    response = client.post("/api/v1/jobs", json={"name": "p", "config": config}, headers=bearer(token))
    assert response.status_code == 201 and response.json["config"]["reinforce"]["importance_level"] == "sequence"
    config["reinforce"] = {"algorithm": "grpo-ish"}
    response = client.post("/api/v1/jobs", json={"name": "p", "config": config}, headers=bearer(token))
    assert response.status_code == 422
    assert list(response.json["errors"]) == ["config.reinforce.algorithm"]
    spec = client.get("/api/v1/openapi.json").json
    described = spec["components"]["schemas"]["JobIn"]["properties"]["config"]["description"]
    assert all(name in described for name in ALGORITHM_PRESETS)
