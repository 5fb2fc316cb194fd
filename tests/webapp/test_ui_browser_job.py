"""The Job page and Compare in a real browser (`aligner up` on embedded defaults, headless Chromium): two tiny jobs,
submitted through the API, run to the end; the Job page's Reward chart (plotly) has integer step ticks only and
markers; Compare shows both jobs' answers to one validation prompt at one step side by side. A third job, the demo
policy scored by its response's length with `health.pause_on: [length_hacking]`, raises the length-hacking alarm
within its first steps and is paused: the Jobs table and the Job page show it.

Needs /usr/bin/chromium: skips without it, fails when CI=true (tests/helpers/browser.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest

from tests.helpers.browser import ARTIFACTS, ROOT, choose, chromium, fill, up_stack, upload_prompts, wait_text
from webapp.ui import catalogue, form
from webapp.ui.api import Api


@pytest.mark.slow(60)
def test_job_page_charts_compare_answers_side_by_side_and_a_length_hacking_alarm(
    tmp_path, tiny_policy_dir, demo_assets_dir
):
    ARTIFACTS.mkdir(exist_ok=True)
    with up_stack(tmp_path / "data") as stack, chromium() as browser:
        api = Api(stack["api_url"], stack["token"])
        catalogue.register_model(api, "ui-tiny", str(tiny_policy_dir), "policy")
        catalogue.register_server(api, "ui-reward", stack["reward_url"], "reward", "reward_model")
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog")))
        dataset = upload_prompts(stack, prompts)
        values = {**form.DEFAULTS, "policy": "ui-tiny", "train_dataset": dataset, "val_dataset": dataset,
                  "reward_source": "server", "reward_server": "ui-reward", "num_prompts_per_step": 2,
                  "num_rollouts_per_prompt": 2, "max_steps": 2, "max_new_tokens": 4, "val_check_interval": 2,
                  "save_interval": 2}  # fmt: skip
        first = api.post("/jobs", form.build_job({**values, "name": "ui a", "lr": 0.001}))["id"]
        second = api.post("/jobs", form.build_job({**values, "name": "ui b", "lr": 0.0001}))["id"]
        # The demo policy ends its answers at varied lengths; a reward paying for characters correlates with them.
        catalogue.register_model(api, "ui-demo", str(demo_assets_dir / "policy"), "policy")
        catalogue.register_reward_function(api, "ui-chars", "tests.helpers.rewards:chars_reward")
        demo_prompts = upload_prompts(stack, demo_assets_dir / "prompts_val.jsonl")
        gamed = form.build_job({**values, "name": "ui length", "policy": "ui-demo", "train_dataset": demo_prompts,
                                "val_dataset": demo_prompts, "reward_source": "function",
                                "reward_function": "ui-chars", "num_prompts_per_step": 4,
                                "num_rollouts_per_prompt": 4, "max_steps": 40, "max_new_tokens": 24,
                                "val_check_interval": 10, "save_interval": 40})  # fmt: skip
        gamed["config"]["health"] = {"pause_on": ["length_hacking"]}
        third = api.post("/jobs", gamed)["id"]

        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(stack["ui_url"])
        fill(page, "token", stack["token"])
        page.click("#sign-in")
        wait_text(page, "signed-in", "Signed in", 30)
        fill(page, "job-id", first)
        page.locator("#job-id input").first.press("Enter")
        page.get_by_role("tab", name="Job page").click()
        wait_text(page, "job-summary", f"Job {first}: ui a", 30)
        wait_text(page, "job-summary", "succeeded", 120)
        wait_text(page, "event-log", "step 2: checkpoint saved", 30)
        ticks = page.locator("#plot-0 .xtick text")
        ticks.first.wait_for(timeout=30_000)
        labels = [ticks.nth(i).text_content() for i in range(ticks.count())]
        assert len(labels) >= 2 and all(re.fullmatch(r"\d+", label) for label in labels), labels
        assert page.locator("#plot-0 .scatterlayer .points path").count() >= 3  # train steps 1, 2; validation 0, 2
        assert "Reward" in page.locator("#plot-0 .gtitle").first.text_content()
        page.screenshot(path=ARTIFACTS / "ui-job-page-charts.png", full_page=True)

        deadline = time.monotonic() + 120
        while api.get(f"/jobs/{second}")["status"] != "succeeded":
            assert time.monotonic() < deadline, "the second job did not finish"
            time.sleep(1)
        page.get_by_role("tab", name="Compare").click()
        wait_text(page, "c-msg", "of your 3 jobs", 30)
        choose(page, "c-jobs", f"{first}: ui a")
        fill(page, "job-id", second)  # the other one added as the selected job
        page.locator("#job-id input").first.press("Enter")
        page.click("#c-add")
        page.locator("#plot-compare .scatterlayer .points path").first.wait_for(timeout=30_000)
        wait_text(page, "c-diff", "optim.lr", 30)
        answers = wait_text(page, "c-answers", f"{second}: ui b", 30)
        assert f"{first}: ui a" in answers and "response" in answers and "reward" in answers
        assert page.locator("#c-step input").first.input_value() == "2"  # the last validation step both jobs have
        page.screenshot(path=ARTIFACTS / "ui-compare-answers.png", full_page=True)

        # The length-paying job: the alarm fires once the rule has its 10 values, and pauses the job.
        deadline = time.monotonic() + 120
        while (job := api.get(f"/jobs/{third}"))["status"] not in ("paused", "succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, job
            time.sleep(1)
        assert job["status"] == "paused" and job["alarms"] == ["length_hacking"] and job["step"] < 40, job
        page.get_by_role("tab", name="Jobs").click()
        wait_text(page, "jobs-table", "length hacking", 30)
        fill(page, "job-id", third)
        page.locator("#job-id input").first.press("Enter")
        page.get_by_role("tab", name="Job page").click()
        wait_text(page, "job-summary", "paused", 30)
        wait_text(page, "job-summary", "length hacking", 30)
        wait_text(page, "event-log", "length hacking", 30)
        time.sleep(1.5)  # let the charts finish drawing
        # switching jobs sends the earlier job's picks against the new job's choices: no error toast for it
        assert page.get_by_text("not in the list of choices").count() == 0
        page.screenshot(path=ARTIFACTS / "ui-health-alarm.png", full_page=True)
        if os.environ.get("ALIGNER_UPDATE_SCREENSHOTS") == "1":
            shutil.copy(ARTIFACTS / "ui-health-alarm.png", ROOT / "docs" / "dashboard-health.png")
