"""Issue 30's walk of the dashboard, scenario by scenario, in a real browser (`aligner up` on embedded defaults and
headless Chromium: the `browser_stack` and `browser_page` fixtures, as tests/webapp/test_ui_browser.py). Each test is
self-contained: it signs in as its own admin and leaves nothing another depends on."""

from __future__ import annotations

import json

import pytest

from tests.helpers.browser import fill, text, wait_text


def _wait_empty(page, elem_id: str, timeout_s: float = 30) -> None:
    """Wait until component `elem_id` shows no text; AssertionError, with what it shows, after `timeout_s`."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "(id) => { const e = document.getElementById(id); return e !== null && e.innerText.trim() === ''; }",
            arg=elem_id,
            timeout=timeout_s * 1000,
        )
    except PlaywrightTimeout:
        raise AssertionError(f"#{elem_id} still shows: {text(page, elem_id)[:500]}") from None


@pytest.mark.slow(40)
def test_the_form_warns_and_drops_what_no_longer_applies(browser_stack, browser_page, tmp_path):
    """A prompt file uploaded from the form is picked for training and validation: the form warns that validation
    then runs on the training prompts. A dry run's answer goes when a field changes; clearing the upload clears its
    "Uploaded" line."""
    page = browser_page
    page.goto(browser_stack["ui_url"])
    fill(page, "token", browser_stack["token"])
    page.click("#sign-in")
    wait_text(page, "signed-in", f"Signed in as {browser_stack['user']}", 30)
    page.get_by_role("tab", name="New job").click()
    prompts = tmp_path / "walk.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the sea")))
    page.locator("#f-upload input[type=file]").set_input_files(str(prompts))
    wait_text(page, "upload-msg", "Uploaded walk.jsonl", 30)
    wait_text(page, "form-warnings", "the validation prompts are the training prompts", 30)

    page.click("#dry-run")
    wait_text(page, "dry-msg", "Dry run", 60)
    fill(page, "f-name", "walk")  # any field: the answer was about the form as it was
    _wait_empty(page, "dry-msg")

    page.locator("#f-upload").get_by_role("button", name="Clear").first.click()
    _wait_empty(page, "upload-msg")
    assert "validation prompts" in text(page, "form-warnings")  # the dataset stays picked: only the line goes
