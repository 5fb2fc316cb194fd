"""The dashboard's Gradio layout: the sign-in header, then one builder per tab that lays it out and wires its events.

No `from __future__ import annotations` here: Gradio reads a handler's `gr.SelectData` hint as a class, not a string.
"""

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd
import yaml

from webapp.ui.api import Api, ApiError
from webapp.ui.form import CHOICES, FORM_FIELDS, build_job, errors_markdown, field_errors
from webapp.ui.frames import (
    CHARTS,
    COMPARE_METRICS,
    JOB_COLUMNS,
    PPO_CHARTS,
    TIMER_PHASES,
    checkpoints_frame,
    color_map,
    compare_frame,
    event_log,
    job_charts,
    job_summary,
    jobs_frame,
    plot_value,
    prompt_history,
    samples_frame,
    timers_frame,
    validation_prompts,
)

REFRESH_S = 2.0
EMPTY_PLOT = None  # an empty frame as a plot's first value keeps its later data from drawing (Gradio 6.31)
# The New job form's rows.
FORM_ROWS = [
    ["name", "policy_path"],
    ["algorithm", "critic_model_path"],
    ["train_file", "val_file"],
    ["reward_server_url", "reward_function"],
    ["num_prompts_per_step", "num_rollouts_per_prompt", "kl_penalty", "lr"],
    ["max_steps", "max_new_tokens", "temperature"],
    ["val_check_interval", "save_interval"],
]


@dataclass
class Session:
    """What every tab shares: the API's URL, the signed-in token, the selected job and the refresh timer."""

    api_url: str
    token: gr.State
    job_id: gr.Number
    timer: gr.Timer

    def api(self, token: str | None) -> Api:
        if not token:
            raise ApiError(401, "sign in with your API token first")
        return Api(self.api_url, token)

    def refresh_jobs(self, token: str):
        """The Jobs table's new value (no change when signed out or the API refuses)."""
        if not token:
            return gr.update()
        try:
            return jobs_frame(self.api(token).get("/jobs", per_page=100))
        except ApiError:
            return gr.update()


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
    return Session(api_url, token_state, job_id, timer), SignIn(token_box, sign_in, signed)


def wire_sign_in(session: Session, sign_in: SignIn, jobs_table: gr.Dataframe) -> None:
    """Signing in checks the token against the API, keeps it in the session and fills the Jobs table."""

    def do_sign_in(token: str):
        token = (token or "").strip()
        try:
            page = Api(session.api_url, token).get("/jobs", per_page=1)
        except ApiError as err:
            return "", f"Sign-in failed: {err.message}", gr.update()
        return token, f"Signed in ({page['total']} job(s) then).", session.refresh_jobs(token)

    outputs = [session.token, sign_in.message, jobs_table]
    sign_in.button.click(do_sign_in, [sign_in.token_box], outputs)
    sign_in.token_box.submit(do_sign_in, [sign_in.token_box], outputs)


def jobs_tab(session: Session) -> gr.Dataframe:
    """Your jobs, refreshed on the timer; a click on a row selects the job; cancel, resume or retry it. Returns the
    table (signing in fills it)."""
    with gr.Tab("Jobs", id="jobs"):
        jobs_table = gr.Dataframe(
            value=pd.DataFrame(columns=JOB_COLUMNS),
            interactive=False,
            elem_id="jobs-table",
            label="Your jobs (click a row to select it)",
        )
        with gr.Row():
            cancel_btn = gr.Button("Cancel", elem_id="cancel", variant="stop")
            resume_btn = gr.Button("Resume", elem_id="resume")
            retry_btn = gr.Button("Retry", elem_id="retry")
        action_msg = gr.Markdown(elem_id="action-msg")

    def select_row(table: pd.DataFrame, evt: gr.SelectData):
        row = evt.index[0] if isinstance(evt.index, list | tuple) else evt.index
        try:
            return int(table.iloc[row]["id"])
        except (IndexError, KeyError, ValueError, TypeError):
            return gr.update()

    def action(kind: str):
        def run(token: str, selected):
            jid = job_id_of(selected)
            if jid is None:
                return "Select a job first.", gr.update()
            try:
                job = session.api(token).post(f"/jobs/{jid}/{kind}")
            except ApiError as err:
                return f"{kind} job {jid}: {err.message}", gr.update()
            return f"Job {jid}: {kind} -> **{job['status']}**", session.refresh_jobs(token)

        return run

    session.timer.tick(session.refresh_jobs, [session.token], [jobs_table], show_progress="hidden")
    jobs_table.select(select_row, [jobs_table], [session.job_id])
    for button, kind in ((cancel_btn, "cancel"), (resume_btn, "resume"), (retry_btn, "retry")):
        button.click(action(kind), [session.token, session.job_id], [action_msg, jobs_table])
    return jobs_table


def _form_input(key: str, value: Any):
    _path, label, kind = FORM_FIELDS[key]
    if kind == "choice":
        return gr.Dropdown(CHOICES[key], label=label, value=value, elem_id=f"f-{key}")
    if kind == "text":
        return gr.Textbox(label=label, value=value if value is not None else "", elem_id=f"f-{key}")
    return gr.Number(label=label, value=value, precision=0 if kind == "int" else None, elem_id=f"f-{key}")


def new_job_tab(session: Session, preset_map: dict[str, dict[str, Any]]) -> None:
    """The form (a preset fills it), the advanced YAML under it, and Submit: a 422 shows under the fields it concerns;
    the new job becomes the selected one."""
    with gr.Tab("New job", id="new"):
        preset = gr.Dropdown(list(preset_map), value="defaults", label="Preset", elem_id="preset")
        inputs: dict[str, Any] = {}
        errs: dict[str, Any] = {}
        defaults = preset_map["defaults"]["form"]
        for row in FORM_ROWS:
            with gr.Row():
                for key in row:
                    with gr.Column():
                        inputs[key] = _form_input(key, defaults.get(key))
                        errs[key] = gr.Markdown(elem_id=f"err-{key}", elem_classes="field-error")
        advanced = gr.Code(
            label="Advanced config (YAML, merged under the fields above)",
            language="yaml",
            value="",
            elem_id="advanced",
        )
        submit = gr.Button("Submit job", variant="primary", elem_id="submit")
        submit_msg = gr.Markdown(elem_id="submit-msg")

    def do_submit(token: str, advanced_yaml: str, *values):
        values_by_key = dict(zip(inputs, values, strict=True))
        clear = [""] * len(errs)
        try:
            body = build_job(values_by_key, advanced_yaml)
        except (ValueError, yaml.YAMLError) as err:
            return [f"**Not submitted**: {err}", gr.update(), *clear]
        try:
            job = session.api(token).post("/jobs", body)
        except ApiError as err:
            by_field, _other = field_errors(err.errors)
            per_field = ["⚠ " + "; ".join(by_field[k]) if k in by_field else "" for k in errs]
            listed = errors_markdown(err.errors)
            return [f"**Not submitted** ({err.status}): {err.message}\n\n{listed}", gr.update(), *per_field]
        return [f"Submitted **job {job['id']}** ({job['status']}).", job["id"], *clear]

    def apply_preset(name: str):
        chosen = preset_map.get(name, preset_map["defaults"])
        return [chosen["form"].get(k, "" if FORM_FIELDS[k][2] == "text" else None) for k in inputs] + [chosen["yaml"]]

    preset.change(apply_preset, [preset], [*inputs.values(), advanced])
    submit.click(do_submit, [session.token, advanced, *inputs.values()], [submit_msg, session.job_id, *errs.values()])


def _line_plot(title: str, y_title: str, elem_id: str, names: list[str], visible: bool = True) -> gr.LinePlot:
    return gr.LinePlot(
        EMPTY_PLOT,
        x="step",
        y="value",
        color="series",
        title=title,
        y_title=y_title,
        elem_id=elem_id,
        color_map=color_map(names),
        height=260,
        min_width=360,
        visible=visible,
    )


def job_page_tab(session: Session) -> None:
    """The selected job: summary, metric charts (PPO's too for a PPO job), time per step, event log, checkpoints."""
    with gr.Tab("Job page", id="job"):
        summary = gr.Markdown("Select a job.", elem_id="job-summary")
        with gr.Row():
            # PPO's charts appear for a PPO job
            plots = [
                _line_plot(title, y_title, f"plot-{i}", names, visible=i < len(CHARTS))
                for i, (title, names, y_title) in enumerate(CHARTS + PPO_CHARTS)
            ]
            timers_plot = _line_plot("Time per step", "seconds", "plot-timers", TIMER_PHASES)
        with gr.Row():
            events_box = gr.Textbox(label="Event log", lines=10, max_lines=20, elem_id="event-log")
            checkpoints = gr.Dataframe(
                value=checkpoints_frame({}), interactive=False, label="Checkpoints", elem_id="checkpoints"
            )

    def refresh_job_page(token: str, selected):
        jid = job_id_of(selected)
        nothing = [gr.update()] * (len(plots) + 4)
        if not token or jid is None:
            return nothing
        try:
            api = session.api(token)
            job = api.get(f"/jobs/{jid}")
            body = api.get(f"/jobs/{jid}/metrics")
            events = api.events(jid)
            ckpts = api.get(f"/jobs/{jid}/checkpoints")
        except ApiError as err:
            return [f"Job {jid}: {err.message}", *([gr.update()] * (len(plots) + 3))]
        steps = {s for name, points in body["metrics"].items() if name.startswith("train_") for s, _ in points}
        frames = [gr.update(value=plot_value(frame), visible=shown) for _t, frame, shown in job_charts(job, body)]
        return [
            job_summary(job, len(steps)),
            *frames,
            plot_value(timers_frame(body)),
            event_log(events),
            checkpoints_frame(ckpts),
        ]

    page_outputs = [summary, *plots, timers_plot, events_box, checkpoints]
    for trigger in (session.timer.tick, session.job_id.change):
        trigger(refresh_job_page, [session.token, session.job_id], page_outputs, show_progress="hidden")


def samples_tab(session: Session) -> None:
    """The selected job's generations filtered by step, split and reward, a page at a time; one validation prompt
    followed across steps."""
    with gr.Tab("Samples", id="samples"):
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
    for trigger in (session.timer.tick, session.job_id.change, s_step.submit, s_split.change, s_page.change):
        trigger(refresh_samples, sample_inputs, [samples_info, samples_table], show_progress="hidden")
    follow_inputs = [session.token, session.job_id, follow]
    for trigger in (session.timer.tick, session.job_id.change, follow.change):
        trigger(refresh_follow, follow_inputs, [follow, follow_table], show_progress="hidden")


def compare_tab(session: Session) -> None:
    """One metric of several jobs (ids typed in) on one chart."""
    with gr.Tab("Compare", id="compare"):
        with gr.Row():
            c_jobs = gr.Textbox(label="Job ids (comma-separated)", elem_id="c-jobs")
            c_metric = gr.Dropdown(
                COMPARE_METRICS,
                value=COMPARE_METRICS[0],
                label="Metric",
                allow_custom_value=True,
                elem_id="c-metric",
            )
        c_plot = gr.LinePlot(
            EMPTY_PLOT, x="step", y="value", color="series", title="Compare", elem_id="plot-compare", height=360
        )
        c_msg = gr.Markdown(elem_id="c-msg")

    def refresh_compare(token: str, ids: str, metric: str):
        wanted = [int(x) for x in (ids or "").replace(" ", ",").split(",") if x.strip().isdigit()]
        if not token or not wanted or not metric:
            return gr.update(), gr.update()
        bodies, problems = {}, []
        api = session.api(token)
        for jid in wanted:
            try:
                job = api.get(f"/jobs/{jid}")
                label = f"{jid}: {job['name']} ({job.get('algorithm', 'reinforce')})"
                bodies[label] = api.get(f"/jobs/{jid}/metrics", name=metric)
            except ApiError as err:
                problems.append(f"job {jid}: {err.message}")
        return plot_value(compare_frame(bodies, metric)), "; ".join(problems)

    for trigger in (session.timer.tick, c_jobs.submit, c_metric.change):
        trigger(refresh_compare, [session.token, c_jobs, c_metric], [c_plot, c_msg], show_progress="hidden")
