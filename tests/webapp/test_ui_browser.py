"""The dashboard in a real browser: `aligner up` (embedded defaults) and headless Debian Chromium via Playwright: the
operator registers the tiny policy and the reward server in the Catalogue tab, the New job form picks them (and an
uploaded dataset) from its drop-downs, the job runs, its pages fill, and a longer job is cancelled.

Needs /usr/bin/chromium (`apt-get install -y chromium chromium-driver`; `make setup` installs it when root): the
test skips without it, and fails when CI=true. Screenshots go to test-artifacts/ (git-ignored);
ALIGNER_UPDATE_SCREENSHOTS=1 also writes docs/dashboard-job.png, the README's picture of the job page.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from tests.helpers.browser import ARTIFACTS, ROOT, choose, chromium, fill, text, upload_prompts, wait_text


@pytest.mark.slow(45)
def test_dashboard_signs_in_submits_follows_and_cancels(browser_stack, tmp_path, tiny_policy_dir):
    ARTIFACTS.mkdir(exist_ok=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the sea")))
    upload_prompts(browser_stack, prompts)
    form = {
        "f-name": "ui tiny",
        "f-num_prompts_per_step": 2,
        "f-num_rollouts_per_prompt": 2,
        "f-lr": 0.001,
        "f-max_steps": 4,
        "f-max_new_tokens": 6,
        "f-val_check_interval": 2,
        "f-save_interval": 2,
    }
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(browser_stack["ui_url"])
        fill(page, "token", "not-a-token")
        page.click("#sign-in")
        wait_text(page, "signed-in", "Sign-in failed", 30)
        fill(page, "token", browser_stack["token"])
        page.click("#sign-in")
        wait_text(page, "signed-in", "Signed in as admin (admin)", 30)

        # The operator puts the tiny policy and the stack's reward server in the catalogue (Catalogue tab).
        page.get_by_role("tab", name="Catalogue").click()
        wait_text(page, "cat-models", "name", 30)
        for elem_id, value in {"cat-m-name": "ui-tiny", "cat-m-path": tiny_policy_dir}.items():
            fill(page, elem_id, value)
        page.click("#cat-m-add")
        wait_text(page, "cat-msg", "Registered model ui-tiny", 30)
        for elem_id, value in {"cat-s-name": "ui-reward", "cat-s-url": browser_stack["reward_url"]}.items():
            fill(page, elem_id, value)
        page.click("#cat-s-add")
        wait_text(page, "cat-msg", "Registered reward server ui-reward", 30)
        assert "ui-tiny" in text(page, "cat-models") and "ui-reward" in text(page, "cat-servers")
        page.screenshot(path=ARTIFACTS / "ui-catalogue.png", full_page=True)

        # The form picks them from its drop-downs.
        page.get_by_role("tab", name="New job").click()
        page.click("#refresh-lists")
        wait_text(page, "lists-msg", "policies: 1 · datasets: 1", 30)
        choose(page, "f-policy", "ui-tiny — LlamaForCausalLM")
        choose(page, "f-train_dataset", "prompts.jsonl (3 prompts, yours)")
        choose(page, "f-val_dataset", "prompts.jsonl (3 prompts, yours)")
        page.locator("#f-reward_source").get_by_role("radio", name="reward server").check()
        page.locator("#f-reward_server").wait_for(state="visible", timeout=30_000)
        choose(page, "f-reward_server", "ui-reward")

        # A 422 is shown under the field it concerns, and listed.
        for elem_id, value in {**form, "f-max_steps": -1}.items():
            fill(page, elem_id, value)
        page.click("#submit")
        wait_text(page, "submit-msg", "Not submitted (422)", 30)
        assert "greater than or equal to 1" in text(page, "err-max_steps")
        assert "config.trainer.max_steps" in text(page, "submit-msg")
        page.screenshot(path=ARTIFACTS / "ui-form-errors.png", full_page=True)

        # The tiny job: submitted through the form, followed on its page until it succeeds.
        fill(page, "f-max_steps", form["f-max_steps"])
        page.click("#submit")
        first = int(wait_text(page, "submit-msg", "Submitted", 30).split("job ")[1].split()[0])
        assert text(page, "err-max_steps").strip() == ""
        page.get_by_role("tab", name="Job page").click()
        wait_text(page, "job-summary", f"Job {first}: ui tiny", 30)
        wait_text(page, "job-summary", "succeeded", 180)
        wait_text(page, "job-summary", "step 4/4", 30)
        wait_text(page, "event-log", "step 4: checkpoint saved", 30)
        page.locator("#plot-0 .scatterlayer .points path").first.wait_for(timeout=30_000)  # a chart with markers
        assert "step_000004" in text(page, "checkpoints")
        time.sleep(1.5)  # let the charts finish drawing
        page.screenshot(path=ARTIFACTS / "ui-job-page.png", full_page=True)
        if os.environ.get("ALIGNER_UPDATE_SCREENSHOTS") == "1":
            shutil.copy(ARTIFACTS / "ui-job-page.png", ROOT / "docs" / "dashboard-job.png")

        page.get_by_role("tab", name="Samples").click()
        wait_text(page, "samples-info", "samples match", 30)
        deadline = time.monotonic() + 30  # the info line may still be that of the job when it was submitted
        while not ("the cat" in text(page, "samples-table") or "the sea" in text(page, "samples-table")):
            assert time.monotonic() < deadline, text(page, "samples-table")
            time.sleep(0.5)
        page.locator("#s-split").get_by_role("radio", name="validation").check()
        wait_text(page, "samples-table", "validation", 30)
        # One validation prompt followed across steps: a row per validation (steps 0, 2 and 4).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cells = [c.strip() for c in text(page, "follow-table").splitlines() if c.strip()]
            if {"0", "2", "4"} <= set(cells):
                break
            time.sleep(0.5)
        assert {"0", "2", "4"} <= set(cells), cells
        page.screenshot(path=ARTIFACTS / "ui-samples.png", full_page=True)

        # A longer job, cancelled from the Jobs tab while it runs.
        page.get_by_role("tab", name="New job").click()
        fill(page, "f-name", "ui long")
        fill(page, "f-max_steps", 5000)
        page.click("#submit")
        second = first + 1  # a fresh database: ids follow each other
        wait_text(page, "submit-msg", f"Submitted job {second}", 30)
        page.get_by_role("tab", name="Jobs").click()
        wait_text(page, "jobs-table", "running", 120)
        page.click("#cancel")
        wait_text(page, "confirm-msg", f"Cancel job {second}", 30)
        page.click("#confirm-cancel")
        wait_text(page, "action-msg", f"Job {second}: cancel", 30)
        wait_text(page, "jobs-table", "cancelled", 120)
        page.screenshot(path=ARTIFACTS / "ui-jobs.png", full_page=True)

        page.get_by_role("tab", name="Compare").click()
        wait_text(page, "c-msg", "of your 2 jobs", 30)
        page.click("#c-add")  # the selected job (the second)
        choose(page, "c-jobs", f"{first}: ui tiny")
        page.locator("#plot-compare .scatterlayer .points path").first.wait_for(timeout=30_000)
        wait_text(page, "c-diff", "trainer.max_steps", 30)
        page.screenshot(path=ARTIFACTS / "ui-compare.png", full_page=True)
