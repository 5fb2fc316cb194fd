"""Issue 30's walk of the dashboard, replayed in a real browser (`aligner up` and headless Chromium, as
tests/webapp/test_ui_browser.py): each scenario is a function of its own, signed in as an admin of its own
(`browser_stack`), leaving nothing running behind it.

- An admin's All users view: another user's job, listed with its owner, is cancelled and retried from the Jobs tab
  (through the admin API); the retry asks first and says what it deletes, and the message after the cancel ends
  as "cancelled", not "cancelling".
"""

from __future__ import annotations

import json
from contextlib import suppress

import pytest

from aligner.generation.generator import AUTO_COMPILE_MIN_STEPS
from tests.helpers.browser import ARTIFACTS, fill, text, upload_prompts, wait_text
from webapp.db import FINAL_STATUSES, create_token, make_engine, make_session_factory, session_scope
from webapp.ui import catalogue, form
from webapp.ui.api import Api, ApiError


def user_token(data_dir, user: str) -> str:
    """A new API token of user `user`, not an admin, in the stack's SQLite database."""
    engine = make_engine(f"sqlite:///{data_dir.resolve() / 'aligner.db'}")
    try:
        with session_scope(make_session_factory(engine)) as session:
            return create_token(session, user, "browser test")
    finally:
        engine.dispose()


@pytest.mark.slow(57)
def test_an_admin_sees_and_acts_on_another_users_job_with_all_users(
    shared_browser_stack, browser_stack, browser_page, tmp_path, tiny_policy_dir
):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    stack, owner = browser_stack, f"{browser_stack['user']}-bob"
    admin = Api(stack["api_url"], stack["token"])
    catalogue.register_model(admin, "walk-tiny", str(tiny_policy_dir), "policy")
    catalogue.register_server(admin, "walk-reward", stack["reward_url"], "reward", "reward_model")
    bob = {**stack, "token": user_token(shared_browser_stack[0], owner)}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog")))
    dataset = upload_prompts(bob, prompts)
    values = {**form.DEFAULTS, "name": "bob's long", "policy": "walk-tiny", "train_dataset": dataset,
              "val_dataset": dataset, "reward_source": "server", "reward_server": "walk-reward",
              "num_prompts_per_step": 2, "num_rollouts_per_prompt": 2, "max_new_tokens": 4,
              "max_steps": AUTO_COMPILE_MIN_STEPS - 1}  # fmt: skip
    bob_api = Api(stack["api_url"], bob["token"])
    jid = bob_api.post("/jobs", form.build_job(values))["id"]
    try:
        page = browser_page
        page.goto(stack["ui_url"])
        fill(page, "token", stack["token"])
        page.click("#sign-in")
        wait_text(page, "signed-in", "(admin)", 30)
        wait_text(page, "jobs-table", "started (UTC)", 30)  # the zone stated in the header
        assert "bob's long" not in text(page, "jobs-table")  # the admin's own jobs first

        page.locator("#all-users input").check()
        wait_text(page, "jobs-table", owner, 30)
        # Its row selects it (the table's hidden sizing copy holds the same text).
        page.locator("#jobs-table").get_by_text("bob's long").filter(visible=True).first.click()
        expect(page.locator("#job-id input").first).to_have_value(str(jid), timeout=30_000)
        wait_text(page, "jobs-table", "▶", 30)
        expect(page.locator("#cancel")).to_be_enabled(timeout=30_000)
        page.click("#cancel")
        wait_text(page, "confirm-msg", f"Cancel {owner}'s job {jid} (bob's long)?", 30)
        page.click("#confirm-cancel")
        wait_text(page, "action-msg", f"{owner}'s job {jid}: cancelled.", 120)  # cancelling first, if it ran
        assert "cancelling" not in text(page, "action-msg")
        assert bob_api.get(f"/jobs/{jid}")["status"] == "cancelled"

        expect(page.locator("#retry")).to_be_enabled(timeout=30_000)
        page.click("#retry")
        question = wait_text(page, "confirm-retry-msg", f"Retry {owner}'s job {jid} (bob's long) from scratch?", 30)
        assert "metrics, samples and checkpoints" in question
        assert bob_api.get(f"/jobs/{jid}")["status"] == "cancelled"  # asked, not done
        page.click("#confirm-retry")
        wait_text(page, "action-msg", "retried from scratch", 30)
        assert bob_api.get(f"/jobs/{jid}")["status"] in ("queued", "running")
        page.screenshot(path=ARTIFACTS / "ui-walk-all-users.png", full_page=True)
    finally:  # the stack's one worker must not keep bob's job for the next scenario
        if bob_api.get(f"/jobs/{jid}")["status"] not in FINAL_STATUSES:
            with suppress(ApiError):
                bob_api.post(f"/jobs/{jid}/cancel")
