"""The dashboard's Gradio layout: the sign-in header, then one builder per tab that lays it out and wires its events.

A token the API rejects (401: wrong, expired or revoked) is dropped at once, signing the tab out: asking again with it
would only count as failed sign-ins, and enough of those get the whole address throttled (429). The timer's first
event refreshes the Jobs table and drops such a token; every other refresh on the timer runs after it
(Session.every_tick), so a rejected token costs one request, not one per tab and tick.

No `from __future__ import annotations` here: Gradio reads a handler's `gr.SelectData` hint as a class, not a string.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr
import yaml

from webapp.ui import catalogue
from webapp.ui.api import REJECTED, Api, ApiError
from webapp.ui.form import (
    CHOICES,
    FORM_FIELDS,
    SOURCE_CHOICES,
    FormError,
    build_job,
    errors_markdown,
    field_errors,
    visible_fields,
)
from webapp.ui.frames import jobs_frame, prompt_history, samples_frame, validation_prompts

REFRESH_S = 2.0
SIGNED_OUT = f"Signed out ({REJECTED})."
# The New job form's rows; a field that does not apply (visible_fields) is hidden.
FORM_ROWS = [
    ["name", "algorithm"],
    ["policy", "tokenizer"],
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
           "critic_server"]  # fmt: skip


@dataclass
class Session:
    """What every tab shares: the API's URL, the signed-in token, the selected job, the refresh timer and the
    header's sign-in line."""

    api_url: str
    token: gr.State
    job_id: gr.Number
    timer: gr.Timer
    signed: gr.Markdown
    open_tab: gr.State | None = None  # the id of the tab on screen: only its refreshes run on the timer
    ticked: Any = None  # the timer's first event (jobs_tab): the other refreshes follow it

    def api(self, token: str | None) -> Api:
        if not token:
            raise ApiError(401, "sign in with your API token first")
        return Api(self.api_url, token)

    @property
    def auth_outputs(self) -> list:
        """What a handler returns `signed_out()` or `unchanged()` into, after its own outputs."""
        return [self.token, self.signed]

    @staticmethod
    def signed_out() -> list:
        return ["", SIGNED_OUT]

    @staticmethod
    def unchanged() -> list:
        return [gr.update(), gr.update()]

    def sign_in(self, token: str, selected=None) -> list:
        """[token, sign-in line, Jobs table]: the token kept when the API knows it (GET /me)."""
        token = (token or "").strip()
        try:
            me = Api(self.api_url, token).get("/me")
            table = jobs_frame(Api(self.api_url, token).get("/jobs", per_page=100), selected=job_id_of(selected))
        except ApiError as err:
            return ["", f"Sign-in failed: {err.message}", gr.update()]
        return [token, f"Signed in as **{me['name']}**{' (admin)' if me['is_admin'] else ''}.", table]

    def refresh_jobs(self, token: str, selected=None) -> list:
        """[Jobs table, token, sign-in line]: the table's new value (the `selected` job marked), no change when
        signed out or the API fails; a rejected token is dropped."""
        if not token:
            return [gr.update(), *self.unchanged()]
        try:
            page = self.api(token).get("/jobs", per_page=100)
            return [jobs_frame(page, selected=job_id_of(selected)), *self.unchanged()]
        except ApiError as err:
            return [gr.update(), *(self.signed_out() if err.rejected else self.unchanged())]

    def every_tick(self, fn: Callable, inputs: list, outputs: list, tab: str | None = None) -> None:
        """Run `fn` on every tick, after the Jobs table's refresh (by then a rejected token is gone); with `tab`, only
        while that tab is the open one (a hidden tab neither asks the API nor redraws: it catches up when opened, as
        `follow_tab` wires its refresh to the tab's selection)."""
        if tab is None:
            self.ticked.then(fn, inputs, outputs, show_progress="hidden")
            return

        def gated(open_tab: str, *values):
            return fn(*values) if open_tab == tab else [gr.skip()] * len(outputs)

        gated.__name__ = fn.__name__  # not functools.wraps: Gradio would read fn's signature through __wrapped__
        self.ticked.then(gated, [self.open_tab, *inputs], outputs, show_progress="hidden")

    def follow_tab(self, tab: gr.Tab, tab_id: str, refresh: Callable | None = None, inputs=None, outputs=None) -> None:
        """Selecting `tab` makes it the open one and, with `refresh`, brings its view up to date at once."""
        selected = tab.select(lambda: tab_id, None, self.open_tab, show_progress="hidden")
        if refresh is not None:
            selected.then(refresh, inputs, outputs, show_progress="hidden")


@dataclass
class SignIn:
    """The header's sign-in widgets, wired once the Jobs table they fill exists."""

    token_box: gr.Textbox
    button: gr.Button
    message: gr.Markdown


def job_id_of(value) -> int | None:
    try:
        number = int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and number >= 1 else None  # an empty gr.Number reads 0


def header(api_url: str) -> tuple[Session, SignIn]:
    """The title, the token box, the selected job id and the timer every tab refreshes on."""
    token_state = gr.State("")
    gr.Markdown(f"# Aligner\nREINFORCE / RLOO and PPO training jobs at `{api_url}`")
    with gr.Row():
        token_box = gr.Textbox(
            label="API token",
            type="password",
            elem_id="token",
            scale=4,
            placeholder="aligner token create --user NAME",
        )
        sign_in = gr.Button("Sign in", elem_id="sign-in", scale=1)
        job_id = gr.Number(label="Selected job id", precision=0, elem_id="job-id", scale=1)
    signed = gr.Markdown("Not signed in.", elem_id="signed-in")
    timer = gr.Timer(REFRESH_S)
    session = Session(api_url, token_state, job_id, timer, signed, open_tab=gr.State("jobs"))
    return session, SignIn(token_box, sign_in, signed)


def wire_sign_in(session: Session, sign_in: SignIn, jobs_table: gr.Dataframe) -> None:
    """Signing in checks the token against the API, keeps it in the session and fills the Jobs table (the tabs that
    depend on who is signed in follow the token's changes)."""
    outputs = [session.token, sign_in.message, jobs_table]
    sign_in.button.click(session.sign_in, [sign_in.token_box, session.job_id], outputs)
    sign_in.token_box.submit(session.sign_in, [sign_in.token_box, session.job_id], outputs)


def _form_input(key: str, value: Any):
    _path, label, kind = FORM_FIELDS[key]
    elem_id = f"f-{key}"
    if kind == "choice":
        return gr.Dropdown(CHOICES[key], label=label, value=value, elem_id=elem_id)
    if kind == "source":
        return gr.Radio(SOURCE_CHOICES[key], label=label, value=value, elem_id=elem_id)
    if kind in ("catalogue", "dataset"):
        # Filled from the API at sign-in; a name typed in is sent as it is (the API says whether it exists).
        return gr.Dropdown([], label=label, value=None, allow_custom_value=True, elem_id=elem_id)
    if kind == "json":
        return gr.Textbox(label=label, value=value or "", placeholder='{"tolerance": 0.01}', elem_id=elem_id)
    if kind == "text":
        return gr.Textbox(label=label, value=value if value is not None else "", elem_id=elem_id)
    return gr.Number(label=label, value=value, precision=0 if kind == "int" else None, elem_id=elem_id)


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


def submit_job(session: Session, token: str, advanced_yaml: str, values: dict[str, Any]) -> list:
    """[message, new job id, each field's error (FORM_FIELDS order), token, sign-in line]: the form's job POSTed."""
    clear = [""] * len(FORM_FIELDS)
    try:
        body = build_job(values, advanced_yaml)
    except FormError as err:
        per_field = [f"⚠ {err}" if key == err.field else "" for key in FORM_FIELDS]
        label = FORM_FIELDS[err.field][1]
        return [f"**Not submitted**: {label}: {err}", gr.update(), *per_field, *session.unchanged()]
    except (ValueError, yaml.YAMLError) as err:
        return [f"**Not submitted**: {err}", gr.update(), *clear, *session.unchanged()]
    try:
        job = session.api(token).post("/jobs", body)
    except ApiError as err:
        if err.rejected:
            dropped = session.signed_out() if token else session.unchanged()
            return [f"**Not submitted**: {err.message if not token else REJECTED}", gr.update(), *clear, *dropped]
        by_field, _other = field_errors(err.errors)
        per_field = ["⚠ " + "; ".join(by_field[k]) if k in by_field else "" for k in FORM_FIELDS]
        listed = errors_markdown(err.errors)
        message = f"**Not submitted** ({err.status}): {err.message}\n\n{listed}"
        return [message, gr.update(), *per_field, *session.unchanged()]
    return [f"Submitted **job {job['id']}** ({job['status']}).", job["id"], *clear, *session.unchanged()]


def new_job_tab(session: Session, preset_map: dict[str, dict[str, Any]]) -> None:
    """The form (a preset fills it; its drop-downs list the catalogue and your datasets, filled at sign-in and by
    Refresh lists), the advanced YAML under it, and Submit: a 422 shows under the fields it concerns; the new job
    becomes the selected one."""
    with gr.Tab("New job", id="new") as tab:
        with gr.Row():
            preset = gr.Dropdown(list(preset_map), value="defaults", label="Preset", elem_id="preset", scale=4)
            refresh = gr.Button("Refresh lists", elem_id="refresh-lists", scale=1)
        lists_msg = gr.Markdown("Sign in to fill the lists from the catalogue.", elem_id="lists-msg")
        lists = gr.State({})
        inputs: dict[str, Any] = {}
        errs: dict[str, Any] = {}
        columns: dict[str, Any] = {}
        defaults = preset_map["defaults"]["form"]
        shown = visible_fields(defaults)
        for row in FORM_ROWS:
            with gr.Row():
                for key in row:
                    with gr.Column(visible=shown[key]) as columns[key]:
                        inputs[key] = _form_input(key, defaults.get(key))
                        errs[key] = gr.Markdown(elem_id=f"err-{key}", elem_classes="field-error")
                        if key == "function_args":
                            function_help = gr.Markdown(elem_id="function-help")
        advanced = gr.Code(
            label="Advanced config (YAML, merged under the fields above)",
            language="yaml",
            value="",
            elem_id="advanced",
        )
        submit = gr.Button("Submit job", variant="primary", elem_id="submit")
        submit_msg = gr.Markdown(elem_id="submit-msg")

    def refresh_lists(token: str, *picked):
        return form_lists(session, token, dict(zip(PICKERS, picked, strict=True)))

    def do_submit(token: str, advanced_yaml: str, *values):
        return submit_job(session, token, advanced_yaml, dict(zip(inputs, values, strict=True)))

    def apply_preset(name: str, choices: dict, *picked):
        """The preset's values; a drop-down it names nothing in keeps its pick (the defaults name no entries)."""
        chosen = preset_map.get(name, preset_map["defaults"])
        current = dict(zip(PICKERS, picked, strict=True))
        values = []
        for key in inputs:
            kind = FORM_FIELDS[key][2]
            value = chosen["form"].get(key, "" if kind in ("text", "json") else None)
            if key in PICKERS:
                value = current[key] if value in (None, "") else catalogue.pick(choices.get(key, []), value)
            values.append(value)
        return [*values, chosen["yaml"]]

    def toggle(*values):
        shown = visible_fields(dict(zip(inputs, values, strict=True)))
        return [gr.update(visible=shown[key]) for key in TOGGLED]

    def describe_function(choices: dict, name: str | None):
        return catalogue.function_help(choices.get("functions", {}), name)

    session.follow_tab(tab, "new")
    pickers = [inputs[key] for key in PICKERS]
    list_outputs = [lists, lists_msg, *pickers, function_help, *session.auth_outputs]
    for trigger in (refresh.click, session.token.change):
        trigger(refresh_lists, [session.token, *pickers], list_outputs)
    preset.change(apply_preset, [preset, lists, *pickers], [*inputs.values(), advanced])
    for key in ("algorithm", "reward_source", "critic_source"):
        inputs[key].change(toggle, list(inputs.values()), [columns[key] for key in TOGGLED])
    inputs["reward_function"].change(describe_function, [lists, inputs["reward_function"]], [function_help])
    submit_outputs = [submit_msg, session.job_id, *[errs[key] for key in FORM_FIELDS], *session.auth_outputs]
    submit.click(do_submit, [session.token, advanced, *inputs.values()], submit_outputs)


def samples_tab(session: Session) -> None:
    """The selected job's generations filtered by step, split and reward, a page at a time; one validation prompt
    followed across steps."""
    with gr.Tab("Samples", id="samples") as tab:
        with gr.Row():
            s_step = gr.Textbox(label="Step (empty: all)", elem_id="s-step")
            s_split = gr.Radio(["all", "train", "validation"], value="all", label="Split", elem_id="s-split")
            s_min = gr.Number(label="Min reward", elem_id="s-min")
            s_max = gr.Number(label="Max reward", elem_id="s-max")
            s_page = gr.Number(label="Page", value=1, precision=0, minimum=1, elem_id="s-page")
        samples_info = gr.Markdown(elem_id="samples-info")
        samples_table = gr.Dataframe(value=samples_frame({}), interactive=False, wrap=True, elem_id="samples-table")
        gr.Markdown("**Follow one validation prompt across steps**")
        follow = gr.Dropdown([], label="Validation prompt", elem_id="follow-prompt")
        follow_table = gr.Dataframe(
            value=prompt_history([], None), interactive=False, wrap=True, elem_id="follow-table"
        )

    def refresh_samples(token: str, selected, step, split, min_reward, max_reward, page):
        jid = job_id_of(selected)
        if not token or jid is None:
            return gr.update(), gr.update()
        params: dict[str, Any] = {"per_page": 50, "page": job_id_of(page) or 1}
        if str(step or "").strip().isdigit():
            params["step"] = int(step)
        if split in ("train", "validation"):
            params["split"] = split
        if min_reward is not None:
            params["min_reward"] = min_reward
        if max_reward is not None:
            params["max_reward"] = max_reward
        try:
            result = session.api(token).get(f"/jobs/{jid}/samples", **params)
        except ApiError as err:
            return f"Samples of job {jid}: {err.message} {err.errors or ''}", gr.update()
        shown = len(result["items"])
        return f"Job {jid}: {result['total']} samples match; page {result['page']} shows {shown}.", samples_frame(
            result
        )

    def refresh_follow(token: str, selected, prompt: str | None):
        jid = job_id_of(selected)
        if not token or jid is None:
            return gr.update(), gr.update()
        items: list[dict] = []
        try:
            for page in range(1, 21):  # validation samples: a few per validation prompt and check
                result = session.api(token).get(f"/jobs/{jid}/samples", split="validation", per_page=100, page=page)
                items += result["items"]
                if len(items) >= result["total"]:
                    break
        except ApiError:
            return gr.update(), gr.update()
        choices = validation_prompts(items)
        prompt = prompt if prompt in choices else (choices[0] if choices else None)
        return gr.update(choices=choices, value=prompt), prompt_history(items, prompt)

    sample_inputs = [session.token, session.job_id, s_step, s_split, s_min, s_max, s_page]
    session.every_tick(refresh_samples, sample_inputs, [samples_info, samples_table], tab="samples")
    session.follow_tab(tab, "samples", refresh_samples, sample_inputs, [samples_info, samples_table])
    for trigger in (session.job_id.change, s_step.submit, s_split.change, s_page.change):
        trigger(refresh_samples, sample_inputs, [samples_info, samples_table], show_progress="hidden")
    follow_inputs = [session.token, session.job_id, follow]
    session.every_tick(refresh_follow, follow_inputs, [follow, follow_table], tab="samples")
    tab.select(refresh_follow, follow_inputs, [follow, follow_table], show_progress="hidden")
    for trigger in (session.job_id.change, follow.change):
        trigger(refresh_follow, follow_inputs, [follow, follow_table], show_progress="hidden")


def catalogue_action(session: Session, action: Callable[..., str], token: str, *args) -> list:
    """[message, the 4 tables (models, functions, servers, datasets), token, sign-in line]: `action` (one of
    webapp.ui.catalogue's register / remove / share, given the Api and `args`) done, or why the API refused it."""
    keep = [gr.update()] * 4
    if not token:
        return ["Sign in first.", *keep, *session.unchanged()]
    try:
        api = session.api(token)
        message = action(api, *args)
        tables = list(catalogue.tables(api).values())
    except ApiError as err:
        if err.rejected:
            return [f"**Refused**: {REJECTED}", *keep, *session.signed_out()]
        return [f"**Refused** ({err.status}): {err.describe()}", *keep, *session.unchanged()]
    return [message, *tables, *session.unchanged()]


def catalogue_view(session: Session, token: str) -> list:
    """[the tab's visibility, message, the 4 tables]: shown, and filled, for an admin only (GET /me)."""
    hidden = [gr.update(visible=False), "", *catalogue.empty_tables().values()]
    if not token:
        return hidden
    try:
        api = session.api(token)
        if not api.get("/me")["is_admin"]:
            return hidden
        tables = list(catalogue.tables(api).values())
    except ApiError as err:  # a rejected token: the Jobs table's refresh signs the tab out
        return [gr.update(), f"**The catalogue could not be loaded**: {err.message}", *[gr.update()] * 4]
    return [gr.update(visible=True), "", *tables]


def catalogue_tab(session: Session) -> None:
    """Admins only (hidden for others): the models, reward functions and servers jobs may use, and the datasets the
    admin sees; register or remove an entry, share or unshare a dataset. The API checks every change itself."""
    with gr.Tab("Catalogue", id="catalogue", visible=False) as tab:
        gr.Markdown(
            "What jobs may name: models (Hugging Face folders on the API's server), reward functions "
            "(`module:callable`, importable by the workers: register only code you trust), reward and critic "
            "servers, and datasets (uploads; shared ones every user may use)."
        )
        with gr.Row():
            refresh = gr.Button("Refresh", elem_id="cat-refresh", scale=1)
            message = gr.Markdown(elem_id="cat-msg")
        empty = catalogue.empty_tables()
        models = gr.Dataframe(empty["models"], interactive=False, wrap=True, label="Models", elem_id="cat-models")
        functions = gr.Dataframe(
            empty["functions"], interactive=False, wrap=True, label="Reward functions", elem_id="cat-functions"
        )
        servers = gr.Dataframe(empty["servers"], interactive=False, wrap=True, label="Servers", elem_id="cat-servers")
        datasets = gr.Dataframe(
            empty["datasets"], interactive=False, wrap=True, label="Datasets you see", elem_id="cat-datasets"
        )
        gr.Markdown("**Register a model** (a folder on the API's server: config.json and weights)")
        with gr.Row():
            m_name = gr.Textbox(label="Name", elem_id="cat-m-name")
            m_path = gr.Textbox(label="Folder on the server", elem_id="cat-m-path", scale=2)
            m_kind = gr.Dropdown(list(catalogue.MODEL_KINDS), value="policy", label="Kind", elem_id="cat-m-kind")
            m_desc = gr.Textbox(label="Description", elem_id="cat-m-desc", scale=2)
            m_add = gr.Button("Register model", elem_id="cat-m-add")
        gr.Markdown("**Register a reward function**")
        with gr.Row():
            f_name = gr.Textbox(label="Name", elem_id="cat-f-name")
            f_target = gr.Textbox(label="package.module:function", elem_id="cat-f-target", scale=2)
            f_desc = gr.Textbox(label="Description", elem_id="cat-f-desc", scale=2)
            f_add = gr.Button("Register function", elem_id="cat-f-add")
        gr.Markdown("**Register a server**")
        with gr.Row():
            s_name = gr.Textbox(label="Name", elem_id="cat-s-name")
            s_url = gr.Textbox(label="URL", elem_id="cat-s-url", scale=2)
            s_kind = gr.Dropdown(list(catalogue.SERVER_KINDS), value="reward", label="Kind", elem_id="cat-s-kind")
            s_model = gr.Textbox(value="reward_model", label="Model name (reward server)", elem_id="cat-s-model")
            s_desc = gr.Textbox(label="Description", elem_id="cat-s-desc")
            s_add = gr.Button("Register server", elem_id="cat-s-add")
        gr.Markdown("**Remove an entry** (jobs already queued that name it are refused when they start)")
        with gr.Row():
            r_what = gr.Radio(list(catalogue.ENTRY_LISTS), value="model", label="What", elem_id="cat-r-what")
            r_name = gr.Textbox(label="Name", elem_id="cat-r-name")
            r_remove = gr.Button("Remove", variant="stop", elem_id="cat-r-remove")
        gr.Markdown("**Share a dataset** with every user, or make it its owner's only again")
        with gr.Row():
            d_id = gr.Number(None, label="Dataset id", precision=0, elem_id="cat-d-id")
            d_share = gr.Button("Share", elem_id="cat-d-share")
            d_unshare = gr.Button("Unshare", elem_id="cat-d-unshare")

    tables = [models, functions, servers, datasets]
    outputs = [message, *tables, *session.auth_outputs]

    def wire(button: gr.Button, action: Callable[..., str], inputs: list) -> None:
        button.click(lambda token, *args: catalogue_action(session, action, token, *args), [session.token, *inputs],
                     outputs)  # fmt: skip

    wire(m_add, catalogue.register_model, [m_name, m_path, m_kind, m_desc])
    wire(f_add, catalogue.register_reward_function, [f_name, f_target, f_desc])
    wire(s_add, catalogue.register_server, [s_name, s_url, s_kind, s_model, s_desc])
    wire(r_remove, catalogue.remove_entry, [r_what, r_name])
    wire(d_share, lambda api, number: catalogue.share_dataset(api, number, True), [d_id])
    wire(d_unshare, lambda api, number: catalogue.share_dataset(api, number, False), [d_id])
    session.follow_tab(tab, "catalogue")
    for trigger in (session.token.change, refresh.click):
        trigger(lambda token: catalogue_view(session, token), [session.token], [tab, message, *tables])
