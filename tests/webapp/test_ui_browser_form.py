"""The New job form and the Samples tab in a real browser (`aligner up` on embedded defaults, headless Chromium):
a prompt file uploaded from the form is picked, the reward is tried on a few prompts, and a
finished tiny job's followed validation prompt shows a word diff of its first and latest answers.

Needs /usr/bin/chromium (see tests/helpers/browser.py) and the API's POST /rewards/try.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.browser import ARTIFACTS, choose, chromium, fill, text, wait_text
from webapp.ui.api import Api


def picked(page, elem_id: str) -> str:
    """What a drop-down shows as picked."""
    return page.locator(f"#{elem_id} input").first.input_value()


@pytest.mark.slow
def test_the_form_uploads_tries_the_reward_and_the_samples_diff_a_followed_prompt(
    browser_stack, tmp_path, tiny_policy_dir
):
    ARTIFACTS.mkdir(exist_ok=True)
    Api(browser_stack["api_url"], browser_stack["token"]).post(
        "/catalogue/models", {"name": "form-tiny", "path": str(tiny_policy_dir), "kind": "policy"}
    )
    prompts = tmp_path / "few.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the sea")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(browser_stack["ui_url"])
        fill(page, "token", browser_stack["token"])
        page.click("#sign-in")
        wait_text(page, "signed-in", "Signed in as", 30)
        page.get_by_role("tab", name="New job").click()
        wait_text(page, "lists-msg", "policies: 1", 30)

        # A bad file is refused plainly; a good one becomes the picked train and validation dataset.
        page.locator("#f-upload input[type=file]").set_input_files(str(bad))
        wait_text(page, "upload-msg", "bad.jsonl was not uploaded (422)", 30)
        page.locator("#f-upload button[aria-label='Clear']").first.click()
        page.locator("#f-upload input[type=file]").set_input_files(str(prompts))
        wait_text(page, "upload-msg", "Uploaded few.jsonl", 30)
        assert picked(page, "f-train_dataset") == picked(page, "f-val_dataset") == "few.jsonl (3 prompts, yours)"
        choose(page, "f-policy", "form-tiny")
        advanced = text(page, "advanced")
        assert "kl_estimator" in advanced and "ratio_eps" not in advanced  # REINFORCE: no PPO knobs

        form = {"f-name": "form tiny", "f-num_prompts_per_step": 2, "f-num_rollouts_per_prompt": 2,
                "f-max_steps": 2, "f-max_new_tokens": 6, "f-val_check_interval": 1, "f-save_interval": 2}  # fmt: skip
        for elem_id, value in form.items():
            fill(page, elem_id, value)
        page.click("#submit")  # the job runs while the reward is tried
        job_id = int(wait_text(page, "submit-msg", "Submitted", 30).split("job ")[1].split()[0])
        fill(page, "try-prompts", 2)
        fill(page, "try-samples", 2)
        page.click("#try-reward")
        wait_text(page, "try-msg", "4 samples of 2 prompts", 90)
        tried = text(page, "try-table")
        assert any(prompt in tried for prompt in ("the cat", "a dog", "the sea")), tried
        assert "spread" in text(page, "try-groups")
        page.screenshot(path=ARTIFACTS / "ui-form-try.png", full_page=True)

        api = Api(browser_stack["api_url"], browser_stack["token"])
        deadline = time.monotonic() + 120
        while (job := api.get(f"/jobs/{job_id}"))["status"] != "succeeded":
            assert job["status"] not in ("failed", "cancelled") and time.monotonic() < deadline, job
            time.sleep(1)

        page.get_by_role("tab", name="Samples").click()
        wait_text(page, "samples-info", "samples match", 30)
        assert "<|" not in text(page, "samples-table")
        wait_text(page, "follow-diff", "changes from step 0 to step 2", 30)
        assert "step 0: reward" in text(page, "follow-diff") and "step 2: reward" in text(page, "follow-diff")
        page.screenshot(path=ARTIFACTS / "ui-samples-diff.png", full_page=True)
