"""The Compare tab's Add button and the Catalogue tab's forms without a browser, against the API served on a free
port (the `app` fixture): a job that is not yours never enters Compare's drop-down (Gradio would refuse every later
event with it, the timer's included) and is named once beside the button; a job that leaves your list leaves the
picked ones; each catalogue action answers under its own form; Remove asks first, saying what it does.
tests/webapp/test_ui_browser.py drives the same in Chromium."""

from __future__ import annotations

import gradio as gr
import pytest

from tests.helpers.api import bearer, create_job, put_in_state
from webapp import ui
from webapp.ui import api, catalogue, compare, tabs

METRIC = "train_rollouts/rewards"


@pytest.fixture
def dashboard(api_url, tmp_path):
    return ui.build_app(api_url, tmp_path)


def handler(app, name: str, inputs: int | None = None):
    """The function of the app's event named `name` (with that many inputs, where several share the name)."""
    return next(fn.fn for fn in app.fns.values() if fn.name == name and (inputs is None or len(fn.inputs) == inputs))


def test_adding_a_job_that_is_not_yours_says_so_once_and_leaves_the_drop_down_alone(
    dashboard, api_url, client, token, other_token, admin_token, config
):
    mine = create_job(client, token, config, name="mine")["id"]
    theirs = create_job(client, other_token, config, name="theirs")["id"]
    alice = api.Api(api_url, token)
    for jid in (theirs, 99):
        assert compare.add_job(alice, [], jid) == {
            "choices": None,
            "value": [],
            "message": f"Job {jid} does not exist or is not yours.",
        }
    # An admin reads any job (GET /admin/jobs/{id}) but not another user's metrics: not theirs to compare either.
    assert compare.add_job(api.Api(api_url, admin_token), [], mine)["message"] == compare.NOT_YOURS.format(jid=mine)

    added = compare.add_job(alice, [], mine)
    assert added == {"choices": [(f"{mine}: mine (reinforce, queued)", mine)], "value": [mine], "message": ""}
    assert compare.add_job(alice, [mine], mine)["message"] == f"Job {mine} is already compared."
    assert compare.add_job(alice, [mine], None)["choices"] is None

    add_selected = handler(dashboard, "add_selected")
    assert add_selected(token, [mine], theirs) == (gr.skip(), f"Job {theirs} does not exist or is not yours.")
    update, message = add_selected(token, [], mine)
    assert update["value"] == [mine] and [v for _l, v in update["choices"]] == [mine] and message == ""
    assert add_selected("", [], mine) == (gr.skip(), "Sign in first.")


def test_a_job_that_leaves_your_list_leaves_the_picked_ones(dashboard, client, token, config, db_session):
    """Kept in the drop-down, a deleted job would be refused with every later event: the refresh drops it."""
    kept, gone = (create_job(client, token, config, name=name)["id"] for name in ("kept", "gone"))
    put_in_state(db_session, gone, "failed", 0, False)
    refresh = handler(dashboard, "refresh_compare", inputs=6)
    drawn = refresh(token, [kept, gone], METRIC, None, None, None)[-1]
    assert client.delete(f"/api/v1/jobs/{gone}", headers=bearer(token)).status_code == 204

    jobs, *_view, key = refresh(token, [kept, gone], METRIC, None, None, drawn)
    assert jobs["value"] == [kept] and [v for _l, v in jobs["choices"]] == [kept]
    assert key[1] == [kept]


def test_each_catalogue_action_answers_under_its_own_form(dashboard):
    shown_in = {}
    blocks = dashboard.blocks
    for fn in dashboard.fns.values():
        for block_id, event in fn.targets:
            elem_id = getattr(blocks.get(block_id), "elem_id", None) or ""
            if event == "click" and elem_id.startswith("cat-") and fn.outputs:
                shown_in[elem_id] = [getattr(out, "elem_id", None) for out in fn.outputs][:2]
    assert shown_in["cat-m-add"][0] == "cat-m-msg" and shown_in["cat-f-add"][0] == "cat-f-msg"
    assert shown_in["cat-s-add"][0] == "cat-s-msg"
    assert shown_in["cat-d-share"][0] == shown_in["cat-d-unshare"][0] == "cat-d-msg"
    # Remove only asks (the confirmation row, its question); the confirmation answers under the form.
    assert shown_in["cat-r-remove"] == ["cat-r-confirm-row", "cat-r-question"]
    assert shown_in["cat-r-confirm"] == ["cat-r-confirm-row", "cat-r-msg"]


def test_removing_a_catalogue_entry_asks_first_saying_what_it_does(dashboard, api_url, admin_token):
    admin = api.Api(api_url, admin_token)
    row, question, message, asked = tabs.ask_to_remove("model", " tiny-rm ")
    assert row == gr.update(visible=True) and message == "" and asked == ["model", "tiny-rm"]
    assert question.startswith("**Remove model tiny-rm from the catalogue?** New jobs can no longer name it")
    assert "refused when they next start" in question and question.endswith(catalogue.LEFT_ALONE["model"])
    assert "tiny-rm" in [m["name"] for m in admin.get("/catalogue/models")["items"]]  # asked, not done
    assert tabs.ask_to_remove("server", "")[:3] == [
        gr.update(visible=False),
        "",
        "Give the name of the entry to remove.",
    ]

    remove_asked = handler(dashboard, "remove_asked")
    row, message, models, *_tables, token_out, signed = remove_asked(admin_token, asked)
    assert row == gr.update(visible=False) and message == "Removed model **tiny-rm** from the catalogue."
    assert "tiny-rm" not in models["name"].tolist()
    assert remove_asked(admin_token, None)[:2] == [gr.update(visible=False), "Nothing to remove."]
    assert set(catalogue.LEFT_ALONE) == set(catalogue.ENTRY_LISTS)
