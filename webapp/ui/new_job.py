"""The New job tab: the form (a preset fills it), a prompt file uploaded from it (and the picked training dataset
deleted, after a confirmation), "Try the reward" on a few prompts, the dry run and Submit. An API refusal shows under
the one field it names (webapp/ui/form.py error_field) and in the message; a field's error goes when the field
changes, and all of them on the next try, dry run or submit. The form's warnings (settings likely to train nothing,
webapp/advice.py) follow its fields; a dry run's result and a try's tables go when the preset, a field or the
advanced YAML changes (they were about the form as it was), and the upload's line when the upload is cleared.

No `from __future__ import annotations` here: Gradio reads handlers' hints (gr.Progress) as classes.
"""

from pathlib import Path
from typing import Any

import gradio as gr
import yaml

from webapp.ui import catalogue
from webapp.ui.api import REJECTED, ApiError
from webapp.ui.form import (
    BACKEND_HELP,
    CHOICE_LABELS,
    CHOICES,
    DEFAULT_PRESET,
    FORM_FIELDS,
    PRESET_FIELDS,
    SOURCE_CHOICES,
    TRY_GROUP_COLUMNS,
    TRY_PROMPTS,
    TRY_SAMPLE_COLUMNS,
    TRY_SAMPLES,
    FormError,
    advanced_for,
    build_job,
    choose_preset,
    dry_run_markdown,
    form_warnings,
    per_field_errors,
    refusal_markdown,
    try_body,
    try_summary,
    try_tables,
    visible_fields,
)
from webapp.ui.tabs import Session, set_in_browser

# The New job form's rows; a field that does not apply (visible_fields) is hidden.
FORM_ROWS = [
    ["name", "algorithm", "reinforce_algorithm"],
    ["policy", "tokenizer"],
    ["backend", "num_processes"],
    ["train_dataset", "val_dataset"],
    ["reward_source", "reward_function", "reward_model", "reward_server"],
    ["function_args"],
    ["critic_source", "critic_model", "critic_server"],
    ["num_prompts_per_step", "num_rollouts_per_prompt", "kl_penalty", "lr"],
    ["max_steps", "max_new_tokens", "temperature"],
    ["val_check_interval", "save_interval"],
]
PICKERS = [key for key, (_path, _label, kind) in FORM_FIELDS.items() if kind in ("catalogue", "dataset")]
# The fields whose visibility depends on others (the sources, the algorithm).
TOGGLED = ["reward_function", "reward_model", "reward_server", "function_args", "critic_source", "critic_model",
           "critic_server", "reinforce_algorithm"]  # fmt: skip
# A try generates and scores in a subprocess on the API's machine, bounded there (TRY_TIMEOUT_S, 120 s by default);
# the dry run includes a short try.
TRY_WAIT_S = 150
NO_ERRORS = [""] * len(FORM_FIELDS)


def empty_frame(columns: list[str]):
    """An empty table with `columns`: what a try's table shows once its result no longer applies."""
    import pandas as pd

    return pd.DataFrame([], columns=columns)


# What a user's edit leaves of the dry run's result and the try's panel, which were about the form as it was.
STALE = ["", "", empty_frame(TRY_GROUP_COLUMNS), empty_frame(TRY_SAMPLE_COLUMNS)]


def _form_input(key: str, value: Any):
    _path, label, kind = FORM_FIELDS[key]
    elem_id = f"f-{key}"
    if kind == "choice":
        return gr.Dropdown(CHOICE_LABELS.get(key, CHOICES[key]), label=label, value=value, elem_id=elem_id)
    if kind == "source":
        return gr.Radio(SOURCE_CHOICES[key], label=label, value=value, elem_id=elem_id)
    if kind in ("catalogue", "dataset"):
        # Filled from the API at sign-in, where a preset's name becomes its entry (form_lists); a name typed in is
        # sent as it is (the API says whether it exists).
        return gr.Dropdown([], label=label, value=value, allow_custom_value=True, elem_id=elem_id)
    if kind == "json":
        return gr.Textbox(label=label, value=value or "", placeholder='{"tolerance": 0.01}', elem_id=elem_id)
    if kind == "text":
        return gr.Textbox(label=label, value=value if value is not None else "", elem_id=elem_id)
    return gr.Number(label=label, value=value, precision=0 if kind in ("int", "count") else None, elem_id=elem_id)


def form_lists(session: Session, token: str, picked: dict[str, Any]) -> list:
    """[lists (the choices), lists message, each picker's update (PICKERS order), function help, token, sign-in
    line]: the drop-downs filled from the catalogue, each keeping its value when still offered (a dataset named
    by a preset becomes its id), else taking the first choice."""
    if not token:
        cleared = [gr.update(choices=[], value=None) for _ in PICKERS]
        return [{}, "Sign in to fill the lists from the catalogue.", *cleared, "", *session.unchanged()]
    try:
        lists = catalogue.form_choices(session.api(token))
    except ApiError as err:
        message = f"The lists could not be loaded: {err.message}"
        dropped = session.signed_out() if err.rejected else session.unchanged()
        return [gr.update(), message, *[gr.update() for _ in PICKERS], gr.update(), *dropped]
    updates = []
    for key in PICKERS:
        choices = lists.get(key, [])
        value = catalogue.pick(choices, picked.get(key))
        if value in (None, "") and choices:
            value = choices[0][1]
        updates.append(gr.update(choices=choices, value=value))
        picked[key] = value
    help_text = catalogue.function_help(lists["functions"], picked.get("reward_function"))
    return [lists, catalogue.choices_summary(lists), *updates, help_text, *session.unchanged()]


def _refused(session: Session, token: str, err: ApiError, what: str, values: dict[str, Any]) -> tuple[str, list, list]:
    """(message, each field's error, token and sign-in line) of an API refusal: a rejected token signs the tab
    out; a 422's errors go under the fields they name."""
    if err.rejected:
        dropped = session.signed_out() if token else session.unchanged()
        return f"**{what}**: {err.message if not token else REJECTED}", NO_ERRORS, dropped
    message = refusal_markdown(what, err.status, err.message, err.errors)
    return message, per_field_errors(err.errors, values), session.unchanged()


def _form_body(values: dict[str, Any], advanced_yaml: str, what: str) -> tuple[dict | None, str, list]:
    """(the POST /jobs body, "", no errors), or (None, why, each field's error) for what the dashboard refuses
    itself."""
    try:
        return build_job(values, advanced_yaml), "", NO_ERRORS
    except FormError as err:
        per_field = [f"⚠ {err}" if key == err.field else "" for key in FORM_FIELDS]
        return None, f"**{what}**: {FORM_FIELDS[err.field][1]}: {err}", per_field
    except (ValueError, yaml.YAMLError) as err:
        return None, f"**{what}**: advanced YAML: {err}", NO_ERRORS


def submit_job(session: Session, token: str, advanced_yaml: str, values: dict[str, Any]) -> list:
    """[message, new job id, each field's error (FORM_FIELDS order), token, sign-in line]: the form's job POSTed."""
    what = "Not submitted"
    body, message, per_field = _form_body(values, advanced_yaml, what)
    if body is None:
        return [message, gr.update(), *per_field, *session.unchanged()]
    try:
        job = session.api(token).post("/jobs", body)
    except ApiError as err:
        message, per_field, auth = _refused(session, token, err, what, values)
        return [message, gr.update(), *per_field, *auth]
    return [f"Submitted **job {job['id']}** ({job['status']}).", job["id"], *NO_ERRORS, *session.unchanged()]


def dry_run(session: Session, token: str, advanced_yaml: str, values: dict[str, Any]) -> list:
    """[message, each field's error, token, sign-in line]: the form's job checked by POST /jobs?dry_run=true (no job
    is created): each check and the estimated step time."""
    what = "Dry run refused"
    body, message, per_field = _form_body(values, advanced_yaml, what)
    if body is None:
        return [message, *per_field, *session.unchanged()]
    try:
        result = session.api(token).post("/jobs", body, timeout=TRY_WAIT_S, dry_run="true")
    except ApiError as err:
        message, per_field, auth = _refused(session, token, err, what, values)
        return [message, *per_field, *auth]
    return [dry_run_markdown(result), *NO_ERRORS, *session.unchanged()]


def try_reward(session: Session, token: str, advanced_yaml: str, values: dict[str, Any], num_prompts: Any,
               num_samples: Any) -> list:  # fmt: skip
    """[summary, groups table, samples table, each field's error, token, sign-in line]: the reward tried on a few of
    the train prompts (POST /rewards/try with the config the form would submit)."""
    what = "The reward could not be tried"
    keep = [gr.update(), gr.update()]
    try:
        body = try_body(values, advanced_yaml, num_prompts, num_samples)
    except FormError as err:
        per_field = [f"⚠ {err}" if key == err.field else "" for key in FORM_FIELDS]
        return [f"**{what}**: {FORM_FIELDS[err.field][1]}: {err}", *keep, *per_field, *session.unchanged()]
    except (ValueError, yaml.YAMLError) as err:
        return [f"**{what}**: advanced YAML: {err}", *keep, *NO_ERRORS, *session.unchanged()]
    try:
        result = session.api(token).post("/rewards/try", body, timeout=TRY_WAIT_S)
    except ApiError as err:
        message, per_field, auth = _refused(session, token, err, what, values)
        return [message, *keep, *per_field, *auth]
    return [try_summary(result), *try_tables(result), *NO_ERRORS, *session.unchanged()]


def upload_dataset(session: Session, token: str, file_path: str | None, picked: dict[str, Any]) -> list:
    """[message, then form_lists' outputs]: the file uploaded as a dataset (POST /datasets), the lists refreshed
    and the new dataset picked for training (and for validation when none is picked)."""
    keep = [gr.update(), gr.update(), *[gr.update() for _ in PICKERS], gr.update(), *session.unchanged()]
    if not file_path:
        return ["", *keep]
    if not token:
        return ["Sign in before uploading a dataset.", *keep]
    name = Path(file_path).name
    try:
        dataset = session.api(token).upload("/datasets", file_path, name)
    except ApiError as err:
        if err.rejected:
            return [f"**Not uploaded**: {REJECTED}", *keep[:-2], *session.signed_out()]
        return [refusal_markdown(f"{name} was not uploaded", err.status, err.message, err.errors), *keep]
    picked = {**picked, "train_dataset": dataset["id"]}
    if picked.get("val_dataset") in (None, ""):
        picked["val_dataset"] = dataset["id"]
    message = f"Uploaded **{dataset['name']}** (dataset {dataset['id']}, {dataset.get('num_prompts', '?')} prompts)."
    return [message, *form_lists(session, token, picked)]


def ask_to_delete_dataset(lists: dict[str, Any], dataset_id: Any) -> list:
    """[the confirmation row, its question, message, the dataset asked about]: what deleting the picked training
    dataset would do; the confirmation deletes that one, whatever is picked by then."""
    if dataset_id in (None, ""):
        return [gr.update(visible=False), "", "Pick the dataset to delete as the training dataset first.", None]
    label = next((label for label, value in lists.get("train_dataset", []) if value == dataset_id), dataset_id)
    question = (
        f"**Delete dataset {label}?** Its file is deleted for good. Jobs that finished with it keep their results; "
        "it cannot be deleted while a queued or running job uses it."
    )
    return [gr.update(visible=True), question, "", dataset_id]


def delete_dataset(session: Session, token: str, dataset_id: Any, picked: dict[str, Any]) -> list:
    """[message, the confirmation row, then form_lists' outputs]: DELETE /datasets/{id} once confirmed, the lists
    refreshed without it (a picker that held it takes the first choice)."""
    hide = gr.update(visible=False)
    keep = [gr.update(), gr.update(), *[gr.update() for _ in PICKERS], gr.update(), *session.unchanged()]
    if not token:
        return ["Sign in before deleting a dataset.", hide, *keep]
    if isinstance(dataset_id, str) and dataset_id.strip().isdecimal():
        dataset_id = int(dataset_id)
    if isinstance(dataset_id, bool) or not isinstance(dataset_id, int):
        return ["Pick one of the listed datasets (by its id) to delete.", hide, *keep]
    try:
        session.api(token).delete(f"/datasets/{dataset_id}")
    except ApiError as err:
        if err.rejected:
            return [f"**Not deleted**: {REJECTED}", hide, *keep[:-2], *session.signed_out()]
        return [refusal_markdown(f"Dataset {dataset_id} was not deleted", err.status, err.message, err.errors), hide,
                *keep]  # fmt: skip
    picked = {key: (None if value == dataset_id else value) for key, value in picked.items()}
    return [f"Deleted dataset {dataset_id}.", hide, *form_lists(session, token, picked)]


def new_job_tab(session: Session, preset_map: dict[str, dict[str, Any]]) -> None:
    """The form (a preset fills it; its drop-downs list the catalogue and your datasets, filled at sign-in and by
    Refresh lists; a prompt file uploaded here is picked at once), the advanced YAML under it (the sections that
    apply), "Try the reward", the dry run and Submit; the new job becomes the selected one."""
    with gr.Tab("New job", id="new") as tab:
        with gr.Row():
            preset = gr.Dropdown(list(preset_map), value=DEFAULT_PRESET, label="Preset", elem_id="preset", scale=4)
            refresh = gr.Button("Refresh lists", elem_id="refresh-lists", scale=1)
        lists_msg = gr.Markdown("Sign in to fill the lists from the catalogue.", elem_id="lists-msg")
        lists = gr.State({})
        asked = gr.State(None)  # the dataset the delete question is about
        inputs: dict[str, Any] = {}
        errs: dict[str, Any] = {}
        columns: dict[str, Any] = {}
        defaults = preset_map[DEFAULT_PRESET]["form"]
        shown = visible_fields(defaults)
        for row in FORM_ROWS:
            with gr.Row():
                for key in row:
                    with gr.Column(visible=shown[key]) as columns[key]:
                        inputs[key] = _form_input(key, defaults.get(key))
                        errs[key] = gr.Markdown(elem_id=f"err-{key}", elem_classes="field-error")
                        if key == "function_args":
                            function_help = gr.Markdown(elem_id="function-help")
                        if key == "backend":
                            gr.Markdown(BACKEND_HELP, elem_id="backend-help")
            if row == ["train_dataset", "val_dataset"]:
                with gr.Row():
                    upload = gr.File(label='Upload prompts (JSONL, one {"prompt": ...} a line)', file_types=[".jsonl"],
                                     type="filepath", elem_id="f-upload", height=90, scale=2)  # fmt: skip
                    upload_msg = gr.Markdown(elem_id="upload-msg")
                    delete_ds = gr.Button("Delete the training dataset…", elem_id="delete-dataset", scale=1)
                with gr.Row(visible=False, elem_id="delete-dataset-row") as delete_ds_row:
                    delete_ds_msg = gr.Markdown(elem_id="confirm-delete-dataset-msg")
                    confirm_ds = gr.Button("Confirm: delete it", elem_id="confirm-delete-dataset", variant="stop")
                    keep_ds = gr.Button("Keep it", elem_id="keep-dataset")
        with gr.Accordion("Try the reward on a few prompts", open=True, elem_id="try-panel"):
            with gr.Row():
                try_prompts = gr.Slider(*TRY_PROMPTS[:2], value=TRY_PROMPTS[2], step=1, label="Prompts",
                                        elem_id="try-prompts")  # fmt: skip
                try_samples = gr.Slider(*TRY_SAMPLES[:2], value=TRY_SAMPLES[2], step=1, label="Samples per prompt",
                                        elem_id="try-samples")  # fmt: skip
                try_btn = gr.Button("Try the reward", elem_id="try-reward")
            try_msg = gr.Markdown(elem_id="try-msg")
            try_groups = gr.Dataframe(headers=TRY_GROUP_COLUMNS, interactive=False, wrap=True, elem_id="try-groups",
                                      label="Groups (one per prompt)")  # fmt: skip
            try_table = gr.Dataframe(headers=TRY_SAMPLE_COLUMNS, interactive=False, wrap=True, elem_id="try-table",
                                     label="Samples", column_widths=["7%", "25%", "50%", "9%", "9%"])  # fmt: skip
        advanced = gr.Code(
            label="Advanced config (YAML, merged under the fields above; sent as shown)",
            language="yaml",
            value=preset_map[DEFAULT_PRESET]["yaml"],
            elem_id="advanced",
        )
        warnings_msg = gr.Markdown(form_warnings(defaults, preset_map[DEFAULT_PRESET]["yaml"], {}),
                                   elem_id="form-warnings")  # fmt: skip
        with gr.Row():
            dry_btn = gr.Button("Check (dry run)", elem_id="dry-run")
            submit = gr.Button("Submit job", variant="primary", elem_id="submit")
        dry_msg = gr.Markdown(elem_id="dry-msg")
        submit_msg = gr.Markdown(elem_id="submit-msg")

    def refresh_lists(token: str, *picked):
        return form_lists(session, token, dict(zip(PICKERS, picked, strict=True)))

    def do_submit(token: str, advanced_yaml: str, *values):
        return submit_job(session, token, advanced_yaml, dict(zip(inputs, values, strict=True)))

    def do_dry_run(token: str, advanced_yaml: str, *values):
        return dry_run(session, token, advanced_yaml, dict(zip(inputs, values, strict=True)))

    def do_try(progress=gr.Progress(), *args):  # noqa: B008 (Gradio finds its progress bar by this default)
        # progress first: Gradio looks for it among the arguments before *args only
        token, advanced_yaml, num_prompts, num_samples, *values = args
        progress(0, desc=f"trying the reward: generating {int(num_prompts)} x {int(num_samples)} samples...")
        values = dict(zip(inputs, values, strict=True))
        return try_reward(session, token, advanced_yaml, values, num_prompts, num_samples)

    def do_upload(token: str, file_path, *picked):
        return upload_dataset(session, token, file_path, dict(zip(PICKERS, picked, strict=True)))

    def do_delete_dataset(token: str, dataset_id, *picked):
        return delete_dataset(session, token, dataset_id, dict(zip(PICKERS, picked, strict=True)))

    def apply_preset(name: str, choices: dict, *picked):
        """The preset's values; a drop-down it names nothing in keeps its pick (aligner's defaults name no
        entries)."""
        chosen = preset_map.get(name, preset_map[DEFAULT_PRESET])
        current = dict(zip(PICKERS, picked, strict=True))
        values = []
        for key in inputs:
            kind = FORM_FIELDS[key][2]
            value = chosen["form"].get(key, "" if kind in ("text", "json") else None)
            if key in PICKERS:
                value = current[key] if value in (None, "") else catalogue.pick(choices.get(key, []), value)
            values.append(value)
        return [*values, chosen["yaml"]]

    def pick_preset(preset: str, advanced_yaml: str):
        """The knobs the chosen REINFORCE preset sets, in the form and the advanced box (form.choose_preset)."""
        fields, text = choose_preset(preset, advanced_yaml)
        return [*(fields[key] for key in PRESET_FIELDS), text]

    def toggle(*values):
        shown = visible_fields(dict(zip(inputs, values, strict=True)))
        return [gr.update(visible=shown[key]) for key in TOGGLED]

    def show_warnings(choices: dict, advanced_yaml: str, *values):
        return form_warnings(dict(zip(inputs, values, strict=True)), advanced_yaml, choices)

    def describe_function(choices: dict, name: str | None):
        return catalogue.function_help(choices.get("functions", {}), name)

    session.follow_tab(tab, "new")
    pickers = [inputs[key] for key in PICKERS]
    list_outputs = [lists, lists_msg, *pickers, function_help, *session.auth_outputs]
    for trigger in (refresh.click, session.token.change):
        trigger(refresh_lists, [session.token, *pickers], list_outputs)
    upload.upload(do_upload, [session.token, upload, *pickers], [upload_msg, *list_outputs])
    set_in_browser([upload.clear], [upload_msg], [""])  # its "Uploaded ..." line went with it
    delete_ds.click(ask_to_delete_dataset, [lists, inputs["train_dataset"]],
                    [delete_ds_row, delete_ds_msg, upload_msg, asked])  # fmt: skip
    confirm_ds.click(do_delete_dataset, [session.token, asked, *pickers], [upload_msg, delete_ds_row, *list_outputs])
    keep_ds.click(lambda: (gr.update(visible=False), "Kept."), None, [delete_ds_row, upload_msg])
    preset.change(apply_preset, [preset, lists, *pickers], [*inputs.values(), advanced])
    for key in ("algorithm", "reward_source", "critic_source"):
        inputs[key].change(toggle, list(inputs.values()), [columns[key] for key in TOGGLED])
    inputs["algorithm"].input(advanced_for, [inputs["algorithm"], advanced, inputs["reinforce_algorithm"]], [advanced])
    # The user's choice only: a form preset sets the field too, with its own knobs, which must stay.
    inputs["reinforce_algorithm"].input(pick_preset, [inputs["reinforce_algorithm"], advanced],
                                        [*(inputs[key] for key in PRESET_FIELDS), advanced])  # fmt: skip
    inputs["reward_function"].change(describe_function, [lists, inputs["reward_function"]], [function_help])
    for key, box in inputs.items():  # a fixed field's error goes at once
        set_in_browser([box.change], [errs[key]], [""])
    # A user's edit makes a dry run's or try's answer stale; a pick the dashboard sets itself (the lists refilled, a
    # new upload picked) does not: it lands while a try runs and would wipe its answer once it comes. So the pickers
    # count their user's input only (a text box's typing is its input too, but not a value pasted in by a script).
    edits = [
        preset.change,
        advanced.change,
        *(box.input if key in PICKERS else box.change for key, box in inputs.items()),
    ]
    set_in_browser(edits, [dry_msg, try_msg, try_groups, try_table], STALE)
    changes = [advanced.change, *(box.change for box in inputs.values())]
    gr.on([lists.change, *changes], show_warnings, [lists, advanced, *inputs.values()], warnings_msg,
          show_progress="hidden")  # fmt: skip
    field_errs = [errs[key] for key in FORM_FIELDS]
    form_inputs = [session.token, advanced, *inputs.values()]
    # The progress shows on the button's message only, not on each field's error line.
    submit.click(do_submit, form_inputs, [submit_msg, session.job_id, *field_errs, *session.auth_outputs],
                 show_progress_on=[submit_msg])  # fmt: skip
    dry_btn.click(do_dry_run, form_inputs, [dry_msg, *field_errs, *session.auth_outputs], show_progress_on=[dry_msg])
    try_inputs = [session.token, advanced, try_prompts, try_samples, *inputs.values()]
    try_btn.click(do_try, try_inputs, [try_msg, try_groups, try_table, *field_errs, *session.auth_outputs],
                  show_progress_on=[try_msg, try_table])  # fmt: skip
