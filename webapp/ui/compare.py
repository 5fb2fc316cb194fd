"""The Compare tab: one metric of several of your jobs on one chart, whatever their algorithms (the same names mean
the same), the differences of their configs, a warning when their rewards are on different scales, and their answers
to one validation prompt at one step side by side.

The Jobs drop-down holds only ids among its choices (your jobs, as GET /jobs lists them): Gradio refuses every later
event that sends it a value outside them, the timer's refresh included, with an error toast each tick. So **Add the
selected job** asks the API first (GET /jobs/{id}) and says beside the button, once, when the job is not yours or does
not exist; a job that leaves your list (deleted) leaves the picked ones with it. An admin compares only their own
jobs: the API gives a job's metrics and samples to its owner only (GET /admin/jobs/{id} has neither)."""

from __future__ import annotations

import contextlib
from typing import Any

import gradio as gr

from aligner.metrics import COMPARE_METRICS, TRAIN_REWARD, VAL_REWARD
from webapp.ui.api import ApiError
from webapp.ui.charts import line_chart
from webapp.ui.frames import compare_frame
from webapp.ui.job_view import (
    answers_frame,
    common_prompts,
    config_diff,
    job_choice,
    scale_warning,
    validation_steps,
)
from webapp.ui.tabs import Session, job_id_of

NOT_YOURS = "Job {jid} does not exist or is not yours."


def not_found(jid: int, err: ApiError) -> str:
    return f"job {jid} does not exist or is not yours" if err.status == 404 else f"job {jid}: {err.message}"


def step_of(value) -> int | None:
    """A step picked in a drop-down (0 included), or None."""
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def add_job(api, ids: list, selected) -> dict[str, Any]:
    """What **Add the selected job** does with the picked `ids` and the `selected` job: {"choices": your jobs'
    [(label, id)] for the drop-down, or None to leave them; "value": the ids picked then; "message": why the job was
    not added ("" when it was)}. The value never holds an id outside the choices sent with it, nor one twice."""
    wanted = [i for i in (job_id_of(x) for x in ids or []) if i is not None]
    jid = job_id_of(selected)
    if jid is None:
        return {"choices": None, "value": wanted, "message": "Select a job first (a row of the Jobs tab)."}
    if jid in wanted:
        return {"choices": None, "value": wanted, "message": f"Job {jid} is already compared."}
    try:
        job = api.get(f"/jobs/{jid}")
        listed = api.get_all("/jobs")
    except ApiError as err:
        message = NOT_YOURS.format(jid=jid) if err.status == 404 else f"Job {jid} was not added: {err.message}"
        return {"choices": None, "value": wanted, "message": message}
    choices = [job_choice(item) for item in listed]
    if jid not in [value for _label, value in choices]:  # past the pages get_all reads
        choices.append(job_choice(job))
    values = {value for _label, value in choices}
    return {"choices": choices, "value": [i for i in wanted if i in values] + [jid], "message": ""}


def compare_view(api, ids: list[int], metric: str) -> dict[str, Any]:
    """What Compare shows for jobs `ids`: labels, jobs, their metric bodies (the metric and the train reward), and
    the problems met, in words."""
    jobs, bodies, problems = {}, {}, []
    for jid in ids:
        try:
            job = api.get(f"/jobs/{jid}")
            label = job_choice(job)[0]
            jobs[label] = job
            names = sorted({metric, TRAIN_REWARD, VAL_REWARD})
            bodies[label] = api.get(f"/jobs/{jid}/metrics", name=names)
        except ApiError as err:
            problems.append(not_found(jid, err))
    return {"jobs": jobs, "bodies": bodies, "problems": problems}


def answers(api, ids: list[int], step: int, prompt: str | None) -> list:
    """[prompt drop-down update, answers table]: the jobs' validation answers at `step` to `prompt` (else the first
    prompt they all answered) side by side (GET /jobs/{id}/samples?split=validation&step=N)."""
    samples: dict[str, list[dict]] = {}
    for jid in ids:
        label = job_choice(api.get(f"/jobs/{jid}"))[0]
        samples[label] = api.get(f"/jobs/{jid}/samples", split="validation", step=step, per_page=100)["items"]
    prompts = common_prompts(samples)
    prompt = prompt if prompt in prompts else (prompts[0] if prompts else None)
    return [gr.update(choices=prompts, value=prompt), answers_frame(samples, prompt) if prompt else None]


def compare_tab(session: Session) -> None:
    """Pick jobs from your list (or add the selected one), a metric; the overlay, config differences, scale warning
    and two jobs' answers side by side."""
    with gr.Tab("Compare", id="compare") as tab:
        with gr.Row():
            c_jobs = gr.Dropdown([], value=[], multiselect=True, label="Jobs", elem_id="c-jobs", scale=4)
            with gr.Column(scale=1, min_width=160):
                c_add = gr.Button("Add the selected job", elem_id="c-add")
                c_add_msg = gr.Markdown(elem_id="c-add-msg")
            c_metric = gr.Dropdown(
                list(COMPARE_METRICS),
                value=COMPARE_METRICS[0],
                label="Metric",
                allow_custom_value=True,
                elem_id="c-metric",
            )
        c_msg = gr.Markdown("Sign in to list your jobs.", elem_id="c-msg")
        with gr.Row():
            c_plot = gr.Plot(elem_id="plot-compare", show_label=False, min_width=480)
            with gr.Column():
                with gr.Row():
                    # allow_custom_value: an earlier pick sent against new choices falls back in the handler
                    c_step = gr.Dropdown([], label="Validation step", elem_id="c-step", allow_custom_value=True)
                    c_prompt = gr.Dropdown([], label="Validation prompt", elem_id="c-prompt", allow_custom_value=True)
                c_answers = gr.Dataframe(
                    interactive=False, wrap=True, label="Answers side by side", elem_id="c-answers"
                )
        c_diff = gr.Dataframe(interactive=False, wrap=True, label="Config differences", elem_id="c-diff")
        seen = gr.State(None)  # what the view was drawn from: nothing redraws while it is the same

    view_outputs = [c_jobs, c_plot, c_msg, c_diff, c_step, c_prompt, c_answers, seen]

    def refresh_compare(token: str, ids: list, metric: str, step, prompt: str | None, drawn):
        if not token:
            return [gr.skip()] * len(view_outputs)
        api = session.api(token)
        try:
            listed = api.get_all("/jobs")
        except ApiError as err:
            return [gr.skip(), gr.skip(), f"Your jobs cannot be listed: {err.message}", *[gr.skip()] * 5]
        choices = [job_choice(job) for job in listed]
        progress = {job["id"]: [job["status"], job.get("step")] for job in listed}
        wanted = [i for i in (job_id_of(x) for x in ids or []) if i is not None]
        key = [choices, wanted, metric, [progress.get(i) for i in wanted]]
        if key == drawn:
            return [gr.skip()] * len(view_outputs)
        # The list's choices only, and only when they changed: an update re-renders the drop-down, closing it under
        # the user's pointer, and a value sent back could undo a pick made meanwhile.
        jobs_update = gr.update(choices=choices) if not drawn or drawn[0] != choices else gr.skip()
        listed_ids = {value for _label, value in choices}
        if jobs_update != gr.skip() and any(i not in listed_ids for i in wanted):
            # A picked job left the list (deleted): kept, it would be refused on every later event.
            wanted = [i for i in wanted if i in listed_ids]
            jobs_update = gr.update(choices=choices, value=wanted)
            key[1], key[3] = wanted, [progress.get(i) for i in wanted]
        if not wanted or not metric:
            cleared = gr.update(choices=[], value=None)
            message = f"Pick two or more of your {len(choices)} jobs (or add the selected one)."
            return [jobs_update, None, message, None, cleared, cleared, None, key]
        view = compare_view(api, wanted, metric)
        frame = compare_frame(view["bodies"], metric)
        figure = line_chart(frame, metric, metric) if len(frame) else None
        notes = list(view["problems"])
        if not len(frame) and view["bodies"]:
            notes.append(f"no job logged `{metric}` yet")
        configs = {label: job.get("config") or {} for label, job in view["jobs"].items()}
        warning = scale_warning(view["bodies"], configs) if len(configs) > 1 else None
        notes += [warning] if warning else []
        diff = config_diff(configs) if len(configs) > 1 else None
        bodies = list(view["bodies"].values())
        steps = sorted(set.intersection(*(set(validation_steps(b)) for b in bodies))) if bodies else []
        step_value = step_of(step) if step_of(step) in steps else (steps[-1] if steps else None)
        message = "; ".join(notes) or f"{len(view['jobs'])} jobs."
        step_update = gr.update(choices=steps, value=step_value)
        found = [job["id"] for job in view["jobs"].values()]
        shown = [gr.update(choices=[], value=None), None]
        if step_value is not None:
            with contextlib.suppress(ApiError):  # a job gone meanwhile: the next refresh says which
                shown = answers(api, found, step_value, prompt)
        return [jobs_update, figure, message, diff, step_update, *shown, key]

    def refresh_answers(token: str, ids: list, step, prompt: str | None):
        wanted = [i for i in (job_id_of(x) for x in ids or []) if i is not None]
        if not token or not wanted or step_of(step) is None:
            return gr.update(choices=[], value=None), None
        try:
            return answers(session.api(token), wanted, step_of(step), prompt)
        except ApiError:
            return gr.update(), gr.update()

    def add_selected(token: str, ids: list, selected):
        """[the Jobs drop-down, the message beside the button]."""
        if not token:
            return gr.skip(), "Sign in first."
        added = add_job(session.api(token), ids, selected)
        if added["choices"] is None:
            return gr.skip(), added["message"]
        return gr.update(choices=added["choices"], value=added["value"]), added["message"]

    inputs = [session.token, c_jobs, c_metric, c_step, c_prompt, seen]
    session.every_tick(refresh_compare, inputs, view_outputs, tab="compare")
    session.follow_tab(tab, "compare", refresh_compare, inputs, view_outputs)
    for trigger in (c_jobs.change, c_metric.change):
        trigger(refresh_compare, inputs, view_outputs, show_progress="hidden")
    c_add.click(add_selected, [session.token, c_jobs, session.job_id], [c_jobs, c_add_msg])
    answer_inputs = [session.token, c_jobs, c_step, c_prompt]
    for trigger in (c_step.change, c_prompt.change):
        trigger(refresh_answers, answer_inputs, [c_prompt, c_answers], show_progress="hidden")
