"""The Jobs tab: your jobs (the selected one marked) with when each started (UTC) and how long it ran (so far, while
it runs); cancel (after a confirmation), resume, retry or delete (both after a confirmation that says what goes) the
selected job, each button enabled only when the API lists it among the job's `actions` (the server decides what
applies). The message after an action follows the job's status as the table refreshes (a cancel says "cancelling"
only until the job is cancelled).

An admin (GET /me `is_admin`) also sees "All users": on, the table lists every user's jobs with their owner (GET
/admin/jobs) and the buttons act through the admin API (/admin/jobs/{id}/...), under the same state machine.

No `from __future__ import annotations` here: Gradio reads a handler's `gr.SelectData` hint as a class, not a string.
"""

import contextlib
from collections.abc import Callable

import gradio as gr
import pandas as pd

from webapp.ui.api import ApiError
from webapp.ui.frames import OWNER, action_message, job_columns
from webapp.ui.tabs import ADMIN_JOBS, JOBS, Session, job_id_of

ACTIONS = ("cancel", "resume", "retry", "delete")  # the API's job actions (webapp.db.ACTIONS), a button each
# What a retry deletes (webapp/jobs.py retry: _delete_results); a delete takes the same and the job itself.
RETRY_DELETES = "its metrics, samples and checkpoints, and its run folder (logs, the final policy)"


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
        all_users = gr.Checkbox(
            False, label="All users: every user's jobs, with their owner (admin)", visible=False, elem_id="all-users"
        )
        session.all_users = all_users
        jobs_table = gr.Dataframe(
            value=pd.DataFrame(columns=job_columns()),
            interactive=False,
            elem_id="jobs-table",
            label=table_label(False),
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
        with gr.Row(visible=False, elem_id="retry-row") as retry_row:
            retry_msg = gr.Markdown(elem_id="confirm-retry-msg")
            confirm_retry = gr.Button("Confirm: retry it", elem_id="confirm-retry", variant="stop")
            keep_results = gr.Button("Keep its results", elem_id="keep-results")
        with gr.Row(visible=False, elem_id="delete-row") as delete_row:
            delete_msg = gr.Markdown(elem_id="confirm-delete-msg")
            confirm_delete = gr.Button("Confirm: delete it", elem_id="confirm-delete", variant="stop")
            keep_job = gr.Button("Keep it", elem_id="keep-job")
        action_msg = gr.Markdown(elem_id="action-msg")
        shown_for = gr.State(None)  # (job id, status) the buttons were last set for
        asked = gr.State(None)  # the job the delete question is about
        asked_retry = gr.State(None)  # the job the retry question is about
        last_action = gr.State(None)  # [action, job id, owner, the message shown]: redrawn as the job's status moves

    def select_row(table: pd.DataFrame, evt: gr.SelectData):
        row = evt.index[0] if isinstance(evt.index, list | tuple) else evt.index
        try:
            return int(table.iloc[row]["id"])
        except (IndexError, KeyError, ValueError, TypeError):
            return gr.update()

    def update_actions(token: str, selected, table: pd.DataFrame, known, every_user: bool = False):
        """[cancel, resume, retry, delete buttons, known]: each enabled when the selected job's `actions` (GET
        /jobs/{id}; /admin/jobs/{id} with `every_user`) list it; nothing asked or redrawn while the job and its status
        are those the buttons were set for."""
        jid = job_id_of(selected)
        status = selected_status(table, jid)
        key = [jid, status]
        if key == known:
            return [gr.skip()] * (len(ACTIONS) + 1)
        allowed: list[str] = []
        if token and jid is not None:
            with contextlib.suppress(ApiError):  # no such job, or the API is away: no button applies
                allowed = session.api(token).get(f"{_jobs(every_user)}/{jid}").get("actions") or []
        return [*(gr.update(interactive=kind in allowed) for kind in ACTIONS), key]

    def action(kind: str):
        def run(token: str, jid_value, every_user: bool = False):
            """[message, Jobs table, the confirmation row (hidden), last action, token, sign-in line]: POST
            /jobs/{id}/<kind> (/admin/jobs/... with `every_user`) of job `jid_value`."""
            hide = gr.update(visible=False)
            jid = job_id_of(jid_value)
            if jid is None:
                return ["Select a job first.", gr.update(), hide, None, *session.unchanged()]
            try:
                job = session.api(token).post(f"{_jobs(every_user)}/{jid}/{kind}")
            except ApiError as err:
                dropped = session.signed_out() if err.rejected and token else session.unchanged()
                return [f"{kind} job {jid}: {err.message}", gr.update(), hide, None, *dropped]
            table = session.refresh_jobs(token, jid, every_user)[0]
            owner = job.get("user") if every_user else None
            message = action_message(kind, jid, job["status"], owner)
            return [message, table, hide, [kind, jid, owner, message], *session.unchanged()]

        run.__name__ = f"{kind}_job"
        return run

    def follow_action(table: pd.DataFrame, last, shown: str):
        """[message, last action]: the last action's message redrawn for the status its job shows now, while that
        message is still the one on screen; nothing redrawn otherwise."""
        if not last or shown != last[3]:
            return gr.skip(), gr.skip()
        kind, jid, owner, _message = last
        status = selected_status(table, jid)
        message = action_message(kind, jid, status, owner) if status else shown
        if message == shown:
            return gr.skip(), gr.skip()
        return message, [kind, jid, owner, message]

    def ask_to_cancel(table: pd.DataFrame, selected):
        jid = job_id_of(selected)
        if jid is None:
            return gr.update(visible=False), "", "Select a job first."
        question = f"**Cancel {_label(table, jid)}?** Its run stops; a checkpoint lets it resume."
        return gr.update(visible=True), question, ""

    def asking(selected, question: Callable[[int], str]):
        """[the confirmation row, its question, message, the job asked about]: the confirmation acts on that job,
        whatever is selected by then."""
        jid = job_id_of(selected)
        if jid is None:
            return gr.update(visible=False), "", "Select a job first.", None
        return gr.update(visible=True), question(jid), "", jid

    def ask_to_retry(table: pd.DataFrame, selected):
        return asking(selected, lambda jid: (
            f"**Retry {_label(table, jid)} from scratch?** It runs again from step 0: {RETRY_DELETES} are deleted "
            "for good (its events are kept). To continue from its last checkpoint instead, Resume it."
        ))  # fmt: skip

    def ask_to_delete(table: pd.DataFrame, selected):
        return asking(selected, lambda jid: (
            f"**Delete {_label(table, jid)}?** Its checkpoints, final policy, metrics and samples are "
            "deleted for good and it leaves this list. This cannot be undone."
        ))  # fmt: skip

    def delete_job(token: str, asked, selected, every_user: bool = False):
        """[message, Jobs table, the confirmation row, the selected job, token, sign-in line]: DELETE /jobs/{id}
        (/admin/jobs/{id} with `every_user`) of the job asked about, once confirmed; it leaves the table (and the
        selection, when selected)."""
        hide = gr.update(visible=False)
        jid = job_id_of(asked)
        if jid is None:
            return ["Select a job first.", gr.update(), hide, gr.update(), *session.unchanged()]
        try:
            session.api(token).delete(f"{_jobs(every_user)}/{jid}")
        except ApiError as err:
            dropped = session.signed_out() if err.rejected and token else session.unchanged()
            return [f"delete job {jid}: {err.message}", gr.update(), hide, gr.update(), *dropped]
        still = None if job_id_of(selected) == jid else job_id_of(selected)
        table = session.refresh_jobs(token, still, every_user)[0]
        return [f"Job {jid} deleted.", table, hide, still, *session.unchanged()]

    refresh_inputs = [session.token, session.job_id, all_users]
    watched = [session.token, session.job_id, all_users, session.seen, session.timer]
    session.timer.tick(session.watch, watched, [session.seen, session.token, session.timer], show_progress="hidden")
    session.ticked = session.seen.change(
        session.refresh_jobs, refresh_inputs, [jobs_table, *session.auth_outputs], show_progress="hidden"
    )
    session.follow_tab(tab, "jobs")
    jobs_table.select(select_row, [jobs_table], [session.job_id])
    selected = session.job_id.change(
        session.refresh_jobs, refresh_inputs, [jobs_table, *session.auth_outputs], show_progress="hidden"
    )
    all_users.change(lambda on: gr.update(label=table_label(on)), [all_users], [jobs_table]).then(
        session.refresh_jobs, refresh_inputs, [jobs_table, *session.auth_outputs], show_progress="hidden"
    )
    action_inputs = [session.token, session.job_id, jobs_table, shown_for, all_users]
    jobs_table.change(update_actions, action_inputs, [*buttons.values(), shown_for], show_progress="hidden")
    jobs_table.change(follow_action, [jobs_table, last_action, action_msg], [action_msg, last_action],
                      show_progress="hidden")  # fmt: skip

    def outputs(row: gr.Row) -> list:
        return [action_msg, jobs_table, row, last_action, *session.auth_outputs]

    buttons["cancel"].click(ask_to_cancel, [jobs_table, session.job_id], [confirm_row, confirm_msg, action_msg])
    confirm.click(action("cancel"), [session.token, session.job_id, all_users], outputs(confirm_row))
    keep.click(lambda: (gr.update(visible=False), "Kept running."), None, [confirm_row, action_msg])
    resume_inputs = [session.token, session.job_id, all_users]
    resumed = buttons["resume"].click(action("resume"), resume_inputs, outputs(confirm_row))
    buttons["retry"].click(ask_to_retry, [jobs_table, session.job_id], [retry_row, retry_msg, action_msg, asked_retry])
    retried = confirm_retry.click(action("retry"), [session.token, asked_retry, all_users], outputs(retry_row))
    session.quicken(selected, resumed, retried)
    keep_results.click(lambda: (gr.update(visible=False), "Kept."), None, [retry_row, action_msg])
    buttons["delete"].click(ask_to_delete, [jobs_table, session.job_id], [delete_row, delete_msg, action_msg, asked])
    delete_outputs = [action_msg, jobs_table, delete_row, session.job_id, *session.auth_outputs]
    confirm_delete.click(delete_job, [session.token, asked, session.job_id, all_users], delete_outputs)
    keep_job.click(lambda: (gr.update(visible=False), "Kept."), None, [delete_row, action_msg])
    return jobs_table


def table_label(every_user: bool) -> str:
    """The Jobs table's label: whose jobs it lists."""
    whose = "Every user's jobs" if every_user else "Your jobs"
    return f"{whose} (click a row to select it: ▶; times in UTC)"


def _jobs(every_user: bool) -> str:
    """The API's jobs for the view: the user's own, or every user's through the admin API."""
    return ADMIN_JOBS if every_user else JOBS


def _label(table: pd.DataFrame | None, jid: int) -> str:
    """`job 7 (name)` as the Jobs table shows it (`alice's job 7 (name)` with an owner column), or `job 7` when it
    is not there."""
    if table is None or not len(table) or "id" not in table:
        return f"job {jid}"
    rows = table[pd.to_numeric(table["id"], errors="coerce") == jid]
    if not len(rows):
        return f"job {jid}"
    row = rows.iloc[0]
    whose = f"{row[OWNER]}'s job" if OWNER in table and row[OWNER] else "job"
    return f"{whose} {jid} ({row['name']})"
