"""The Jobs tab without a browser: its table's start and duration columns, an admin's All users view (every user's
jobs with their owner, acted on through the admin API), the retry's confirmation, and the message after an action
following the job's status. The handlers run against the API served on a free port (test_ui.py's `api_url`)."""

from __future__ import annotations

import datetime as dt

import gradio as gr
import pytest

from tests.helpers.api import bearer, create_job, put_in_state
from tests.webapp.test_ui import unchanged
from webapp import ui
from webapp.ui import frames

NOW = dt.datetime(2026, 11, 22, 19, 0, 0, tzinfo=dt.UTC)


def job(job_id: int, status: str, started: str | None = None, finished: str | None = None, **more) -> dict:
    times = {"created_at": "2026-11-22T18:00:00+00:00", "started_at": started, "finished_at": finished}
    return {"id": job_id, "name": f"j{job_id}", "status": status, "step": 1, "max_steps": 5, **times, **more}


def test_the_jobs_table_says_when_each_job_started_in_utc_and_how_long_it_ran():
    page = {
        "items": [
            job(6, "running", "2026-11-22T18:59:18+00:00"),  # so far
            job(5, "cancelling", "2026-11-22T16:58:00+00:00"),  # still stopping: so far
            job(4, "succeeded", "2026-11-22T20:30:00+02:00", "2026-11-22T18:35:05+00:00"),  # another zone: in UTC
            job(3, "failed", "2026-11-20T10:00:00", "2026-11-21T13:20:00"),  # naive: UTC
            job(2, "queued", "2026-11-22T18:00:00+00:00"),  # resumed, waiting: no run goes on
            job(1, "queued"),  # never started
        ]
    }
    frame = frames.jobs_frame(page, NOW)
    assert "started (UTC)" in frame.columns  # the header states the zone
    assert frame[["id", "started (UTC)", "duration"]].values.tolist() == [
        [6, "11-22 18:59", "42 s"],
        [5, "11-22 16:58", "2 h 02 min"],
        [4, "11-22 18:30", "5 min 05 s"],
        [3, "11-20 10:00", "1 d 03 h"],
        [2, "11-22 18:00", ""],
        [1, "", ""],
    ]


def test_the_all_users_view_shows_each_jobs_owner_and_leaves_deleted_jobs_out():
    page = {"items": [job(3, "failed", user="bob"), job(2, "failed", user="bob", deleted_at="2026-11-22T18:10:00"),
                      job(1, "queued", user="alice")]}  # fmt: skip
    frame = frames.jobs_frame(page, NOW, selected=3, owners=True)
    assert list(frame.columns[:4]) == ["sel", "id", "owner", "name"]
    assert frame[["sel", "id", "owner"]].values.tolist() == [["▶", 3, "bob"], ["", 1, "alice"]]
    assert "owner" not in frames.jobs_frame(page, NOW).columns


def test_only_an_admin_gets_the_all_users_box_and_every_users_jobs(session, client, token, admin_token, config):  # noqa: F811 (the fixture)
    alices = create_job(client, token, config, name="alice's")["id"]
    box = session.sign_in(admin_token)[3]
    assert box == gr.update(visible=True, value=False)
    assert session.sign_in(token)[3] == gr.update(visible=False, value=False)

    table, *auth = session.refresh_jobs(admin_token, alices, True)
    assert table[["sel", "id", "owner", "name"]].values.tolist() == [["▶", alices, "alice", "alice's"]]
    assert unchanged(auth)
    assert session.refresh_jobs(admin_token, None, False)[0].empty  # the admin's own jobs: none
    # A user who is not an admin gets their own jobs, without owners, whatever the box says.
    own = session.refresh_jobs(token, None, True)[0]
    assert own["id"].tolist() == [alices] and "owner" not in own


@pytest.fixture
def handlers(api_url, tmp_path):  # noqa: F811 (the fixture)
    """The Jobs tab's handlers by name (the app is only built)."""
    return {fn.name: fn.fn for fn in ui.build_app(api_url, tmp_path).fns.values()}


def test_an_admin_cancels_retries_and_deletes_another_users_job(handlers, client, token, admin_token, config,
                                                                  db_session):  # fmt: skip
    jid = create_job(client, token, config, name="alice's")["id"]
    put_in_state(db_session, jid, "running", 2, True)
    table = handlers["refresh_jobs"](admin_token, jid, True)[0]
    *buttons, _known = handlers["update_actions"](admin_token, jid, table, None, True)
    assert [b["interactive"] for b in buttons] == [True, False, False, False]  # as GET /admin/jobs/{id} lists
    own_view = handlers["update_actions"](admin_token, jid, handlers["refresh_jobs"](admin_token, jid)[0], None)
    assert [b["interactive"] for b in own_view[:4]] == [False] * 4  # not the admin's own: /jobs/{id} is 404

    row, question, _message = handlers["ask_to_cancel"](table, jid)
    assert question.startswith(f"**Cancel alice's job {jid} (alice's)?**")
    message, table, row, last, *auth = handlers["cancel_job"](admin_token, jid, True)
    assert message == f"alice's job {jid}: **cancelling**: its run stops at the next step, with a checkpoint."
    assert table["owner"].tolist() == ["alice"] and unchanged(auth)
    assert client.get(f"/api/v1/jobs/{jid}", headers=bearer(token)).json["status"] == "cancelling"

    put_in_state(db_session, jid, "cancelled", 2, True)
    message, *_rest = handlers["retry_job"](admin_token, jid, True)
    assert message == f"alice's job {jid}: retried from scratch (its metrics, samples and checkpoints deleted): " \
                      "**queued**."  # fmt: skip
    assert client.get(f"/api/v1/jobs/{jid}/checkpoints", headers=bearer(token)).json["items"] == []

    put_in_state(db_session, jid, "failed", 0, False)
    message, table, *_rest = handlers["delete_job"](admin_token, jid, jid, True)
    assert message == f"Job {jid} deleted." and table.empty
    assert client.get(f"/api/v1/jobs/{jid}", headers=bearer(token)).status_code == 404


def test_retry_asks_first_and_says_what_it_deletes(api_url, tmp_path, client, token, config, db_session):  # noqa: F811 (the fixture)
    app = ui.build_app(api_url, tmp_path)
    by_id = {fn._id: fn for fn in app.fns.values()}
    retry_button = next(block for block in app.blocks.values() if getattr(block, "elem_id", None) == "retry")
    on_click = [fn.name for fn in by_id.values() if (retry_button._id, "click") in fn.targets]
    assert on_click == ["ask_to_retry"]  # the button only asks

    handlers = {fn.name: fn.fn for fn in by_id.values()}
    jid = create_job(client, token, config, name="old run")["id"]
    put_in_state(db_session, jid, "failed", 2, True)
    table = handlers["refresh_jobs"](token, jid)[0]
    row, question, message, asked = handlers["ask_to_retry"](table, jid)
    assert row == gr.update(visible=True) and message == "" and asked == jid
    assert question.startswith(f"**Retry job {jid} (old run) from scratch?** It runs again from step 0: its "
                                "metrics, samples and checkpoints, and its run folder (logs, the final policy) are "
                                "deleted for good")  # fmt: skip
    assert client.get(f"/api/v1/jobs/{jid}", headers=bearer(token)).json["status"] == "failed"  # asked, not done
    assert handlers["ask_to_retry"](table, None) == (gr.update(visible=False), "", "Select a job first.", None)


def test_the_message_after_a_cancel_follows_the_jobs_status(handlers, client, token, config, db_session):
    jid = create_job(client, token, config)["id"]
    put_in_state(db_session, jid, "running", 2, True)
    message, table, _row, last, *_auth = handlers["cancel_job"](token, jid)
    assert "**cancelling**" in message
    follow = handlers["follow_action"]
    assert follow(table, last, message) == (gr.skip(), gr.skip())  # still cancelling: nothing redrawn

    put_in_state(db_session, jid, "cancelled", 2, True)
    table = handlers["refresh_jobs"](token, jid)[0]
    shown, last = follow(table, last, message)
    assert shown == f"Job {jid}: **cancelled**." and "cancelling" not in shown and last[3] == shown
    assert follow(table, last, shown) == (gr.skip(), gr.skip())
    assert follow(table, last, "Kept running.") == (gr.skip(), gr.skip())  # another message since: left alone
