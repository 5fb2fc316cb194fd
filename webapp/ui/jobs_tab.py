"""The Jobs tab: your jobs (the selected one marked), cancel (after a confirmation), resume, retry or delete (after a
confirmation that says what goes) the selected job, each button enabled only when the API lists it among the job's
`actions` (the server decides what applies).

No `from __future__ import annotations` here: Gradio reads a handler's `gr.SelectData` hint as a class, not a string.
"""

import contextlib

import gradio as gr
import pandas as pd

from webapp.ui.api import ApiError
from webapp.ui.frames import JOB_COLUMNS
from webapp.ui.tabs import Session, job_id_of

ACTIONS = ("cancel", "resume", "retry", "delete")  # the API's job actions (webapp.db.ACTIONS), a button each


def selected_status(table: pd.DataFrame | None, jid: int | None) -> str | None:
    """The status the Jobs table shows for job `jid`."""
    if table is None or jid is None or not len(table) or "id" not in table:
        return None
    rows = table[pd.to_numeric(table["id"], errors="coerce") == jid]
    return str(rows.iloc[0]["status"]) if len(rows) else None


def jobs_tab(session: Session) -> gr.Dataframe:
    """Your jobs, refreshed on the timer; a click on a row selects the job (▶); cancel, resume or retry it. Returns
    the table (signing in fills it)."""
    with gr.Tab("Jobs", id="jobs") as tab:
        jobs_table = gr.Dataframe(
            value=pd.DataFrame(columns=JOB_COLUMNS),
            interactive=False,
            elem_id="jobs-table",
            label="Your jobs (click a row to select it: ▶)",
        )
        with gr.Row():
            buttons = {
                "cancel": gr.Button("Cancel", elem_id="cancel", variant="stop", interactive=False),
                "resume": gr.Button("Resume", elem_id="resume", interactive=False),
                "retry": gr.Button("Retry", elem_id="retry", interactive=False),
                "delete": gr.Button("Delete", elem_id="delete", variant="stop", interactive=False),
            }
        with gr.Row(visible=False) as confirm_row:
            confirm_msg = gr.Markdown(elem_id="confirm-msg")
            confirm = gr.Button("Confirm: cancel it", elem_id="confirm-cancel", variant="stop")
            keep = gr.Button("Keep running", elem_id="keep-running")
        with gr.Row(visible=False, elem_id="delete-row") as delete_row:
            delete_msg = gr.Markdown(elem_id="confirm-delete-msg")
            confirm_delete = gr.Button("Confirm: delete it", elem_id="confirm-delete", variant="stop")
            keep_job = gr.Button("Keep it", elem_id="keep-job")
        action_msg = gr.Markdown(elem_id="action-msg")
        shown_for = gr.State(None)  # (job id, status) the buttons were last set for
        asked = gr.State(None)  # the job the delete question is about

    def select_row(table: pd.DataFrame, evt: gr.SelectData):
        row = evt.index[0] if isinstance(evt.index, list | tuple) else evt.index
        try:
            return int(table.iloc[row]["id"])
        except (IndexError, KeyError, ValueError, TypeError):
            return gr.update()

    def update_actions(token: str, selected, table: pd.DataFrame, known):
        """[cancel, resume, retry, delete buttons, known]: each enabled when the selected job's `actions` (GET
        /jobs/{id}) list it; nothing asked or redrawn while the job and its status are those the buttons were set
        for."""
        jid = job_id_of(selected)
        status = selected_status(table, jid)
        key = [jid, status]
        if key == known:
            return [gr.skip()] * (len(ACTIONS) + 1)
        allowed: list[str] = []
        if token and jid is not None:
            with contextlib.suppress(ApiError):  # no such job, or the API is away: no button applies
                allowed = session.api(token).get(f"/jobs/{jid}").get("actions") or []
        return [*(gr.update(interactive=kind in allowed) for kind in ACTIONS), key]

    def action(kind: str):
        def run(token: str, selected):
            jid = job_id_of(selected)
            if jid is None:
                return ["Select a job first.", gr.update(), gr.update(visible=False), *session.unchanged()]
            try:
                job = session.api(token).post(f"/jobs/{jid}/{kind}")
            except ApiError as err:
                dropped = session.signed_out() if err.rejected and token else session.unchanged()
                return [f"{kind} job {jid}: {err.message}", gr.update(), gr.update(visible=False), *dropped]
            table = session.refresh_jobs(token, jid)[0]
            return [f"Job {jid}: {kind} -> **{job['status']}**", table, gr.update(visible=False), *session.unchanged()]

        run.__name__ = f"{kind}_job"
        return run

    def ask_to_cancel(table: pd.DataFrame, selected):
        jid = job_id_of(selected)
        if jid is None:
            return gr.update(visible=False), "", "Select a job first."
        name = _name_of(table, jid)
        return gr.update(visible=True), f"**Cancel job {jid}{name}?** Its run stops; a checkpoint lets it resume.", ""

    def ask_to_delete(table: pd.DataFrame, selected):
        """[the confirmation row, its question, message, the job asked about]: the confirmation deletes that job,
        whatever is selected by then."""
        jid = job_id_of(selected)
        if jid is None:
            return gr.update(visible=False), "", "Select a job first.", None
        question = (
            f"**Delete job {jid}{_name_of(table, jid)}?** Its checkpoints, final policy, metrics and samples are "
            "deleted for good and it leaves this list. This cannot be undone."
        )
        return gr.update(visible=True), question, "", jid

    def delete_job(token: str, asked, selected):
        """[message, Jobs table, the confirmation row, the selected job, token, sign-in line]: DELETE /jobs/{id} of
        the job asked about, once confirmed; it leaves the table (and the selection, when selected)."""
        hide = gr.update(visible=False)
        jid = job_id_of(asked)
        if jid is None:
            return ["Select a job first.", gr.update(), hide, gr.update(), *session.unchanged()]
        try:
            session.api(token).delete(f"/jobs/{jid}")
        except ApiError as err:
            dropped = session.signed_out() if err.rejected and token else session.unchanged()
            return [f"delete job {jid}: {err.message}", gr.update(), hide, gr.update(), *dropped]
        still = None if job_id_of(selected) == jid else job_id_of(selected)
        table = session.refresh_jobs(token, still)[0]
        return [f"Job {jid} deleted.", table, hide, still, *session.unchanged()]

    session.ticked = session.timer.tick(
        session.refresh_jobs,
        [session.token, session.job_id],
        [jobs_table, *session.auth_outputs],
        show_progress="hidden",
    )
    session.follow_tab(tab, "jobs")
    jobs_table.select(select_row, [jobs_table], [session.job_id])
    session.job_id.change(
        session.refresh_jobs,
        [session.token, session.job_id],
        [jobs_table, *session.auth_outputs],
        show_progress="hidden",
    )
    action_inputs = [session.token, session.job_id, jobs_table, shown_for]
    jobs_table.change(update_actions, action_inputs, [*buttons.values(), shown_for], show_progress="hidden")
    outputs = [action_msg, jobs_table, confirm_row, *session.auth_outputs]
    buttons["cancel"].click(ask_to_cancel, [jobs_table, session.job_id], [confirm_row, confirm_msg, action_msg])
    confirm.click(action("cancel"), [session.token, session.job_id], outputs)
    keep.click(lambda: (gr.update(visible=False), "Kept running."), None, [confirm_row, action_msg])
    for kind in ("resume", "retry"):
        buttons[kind].click(action(kind), [session.token, session.job_id], outputs)
    buttons["delete"].click(ask_to_delete, [jobs_table, session.job_id], [delete_row, delete_msg, action_msg, asked])
    delete_outputs = [action_msg, jobs_table, delete_row, session.job_id, *session.auth_outputs]
    confirm_delete.click(delete_job, [session.token, asked, session.job_id], delete_outputs)
    keep_job.click(lambda: (gr.update(visible=False), "Kept."), None, [delete_row, action_msg])
    return jobs_table


def _name_of(table: pd.DataFrame | None, jid: int) -> str:
    """` (name)` of job `jid` as the Jobs table shows it, or "" when it is not there."""
    if table is None or not len(table) or "id" not in table:
        return ""
    rows = table[pd.to_numeric(table["id"], errors="coerce") == jid]
    return f" ({rows.iloc[0]['name']})" if len(rows) else ""
