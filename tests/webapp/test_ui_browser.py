"""The dashboard in a real browser: `aligner up` (embedded defaults) and headless Debian Chromium via Playwright. The
scenarios share one stack and one browser (module-scoped: `--dist loadfile` keeps them on one worker) and each signs
in as an admin of its own (`browser_stack`), so jobs and datasets are its own and its catalogue names are distinct:
none depends on another's leftovers, whichever runs first.

- Sign in, register, submit, follow, cancel: the operator registers the tiny policy and the reward server in the
  Catalogue tab, the New job form picks them (and an uploaded dataset) from its drop-downs, the job runs, its pages
  fill, and a longer job is cancelled.
- The New job form and the Samples tab: a prompt file uploaded from the form is picked, the reward is tried on a few
  prompts (the API's POST /rewards/try), and a finished tiny job's followed validation prompt shows a word diff of
  its first and latest answers.
- The Job page and Compare: two tiny jobs, submitted through the API, run to the end; the Job page's Reward chart
  (plotly) has integer step ticks only and markers; Compare shows both jobs' answers to one validation prompt at one
  step side by side. A third job, the demo policy scored by its response's length with
  `health.pause_on: [length_hacking]`, raises the length-hacking alarm within its first steps and is paused: the Jobs
  table and the Job page show it.

Needs /usr/bin/chromium (`apt-get install -y chromium chromium-driver`; `make setup` installs it when root): the
tests skip without it, and fail when CI=true (tests/helpers/browser.py). Screenshots go to test-artifacts/
(git-ignored); ALIGNER_UPDATE_SCREENSHOTS=1 also writes docs/dashboard-job.png, the README's picture of the job page
(and docs/dashboard-health.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest

from aligner.generation.generator import AUTO_COMPILE_MIN_STEPS
from tests.helpers.browser import (
    ARTIFACTS,
    ROOT,
    choose,
    fill,
    text,
    upload_prompts,
    wait_charts_drawn,
    wait_empty,
    wait_text,
)
from webapp.ui import catalogue, form
from webapp.ui.api import Api


def picked(page, elem_id: str) -> str:
    """What a drop-down shows as picked."""
    return page.locator(f"#{elem_id} input").first.input_value()


def policies(api: Api) -> int:
    """How many policies the catalogue holds (every scenario's: the catalogue is the stack's)."""
    return sum(model["kind"] == "policy" for model in api.get("/catalogue/models")["items"])


@pytest.mark.slow(34)
def test_dashboard_signs_in_submits_follows_and_cancels(browser_stack, browser_page, tmp_path, tiny_policy_dir):
    ARTIFACTS.mkdir(exist_ok=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the sea")))
    upload_prompts(browser_stack, prompts)
    form_values = {
        "f-name": "ui tiny",
        "f-num_prompts_per_step": 2,
        "f-num_rollouts_per_prompt": 2,
        "f-lr": 0.001,
        "f-max_steps": 4,
        "f-max_new_tokens": 6,
        "f-val_check_interval": 2,
        "f-save_interval": 2,
    }
    policies_before = policies(Api(browser_stack["api_url"], browser_stack["token"]))
    page = browser_page
    page.goto(browser_stack["ui_url"])
    fill(page, "token", "not-a-token")
    page.click("#sign-in")
    wait_text(page, "signed-in", "Sign-in failed", 30)
    fill(page, "token", browser_stack["token"])
    page.click("#sign-in")
    wait_text(page, "signed-in", f"Signed in as {browser_stack['user']} (admin)", 30)

    # The operator puts the tiny policy and the stack's reward server in the catalogue (Catalogue tab).
    page.get_by_role("tab", name="Catalogue").click()
    wait_text(page, "cat-models", "name", 30)
    for elem_id, value in {"cat-m-name": "ui-tiny", "cat-m-path": tiny_policy_dir}.items():
        fill(page, elem_id, value)
    page.click("#cat-m-add")
    wait_text(page, "cat-m-msg", "Registered model ui-tiny", 30)
    for elem_id, value in {"cat-s-name": "ui-reward", "cat-s-url": browser_stack["reward_url"]}.items():
        fill(page, elem_id, value)
    page.click("#cat-s-add")
    wait_text(page, "cat-s-msg", "Registered reward server ui-reward", 30)
    assert "ui-tiny" in text(page, "cat-models") and "ui-reward" in text(page, "cat-servers")
    page.screenshot(path=ARTIFACTS / "ui-catalogue.png", full_page=True)

    # The form picks them from its drop-downs.
    page.get_by_role("tab", name="New job").click()
    page.click("#refresh-lists")
    wait_text(page, "lists-msg", f"policies: {policies_before + 1} · datasets: 1", 30)
    choose(page, "f-policy", "ui-tiny — LlamaForCausalLM")
    choose(page, "f-train_dataset", "prompts.jsonl (3 prompts, yours)")
    choose(page, "f-val_dataset", "prompts.jsonl (3 prompts, yours)")
    page.locator("#f-reward_source").get_by_role("radio", name="reward server").check()
    page.locator("#f-reward_server").wait_for(state="visible", timeout=30_000)
    choose(page, "f-reward_server", "ui-reward")

    # A 422 is shown under the field it concerns, and listed.
    for elem_id, value in {**form_values, "f-max_steps": -1}.items():
        fill(page, elem_id, value)
    page.click("#submit")
    wait_text(page, "submit-msg", "Not submitted (422)", 30)
    assert "greater than or equal to 1" in text(page, "err-max_steps")
    assert "config.trainer.max_steps" in text(page, "submit-msg")
    page.screenshot(path=ARTIFACTS / "ui-form-errors.png", full_page=True)

    # The tiny job: submitted through the form, followed on its page until it succeeds.
    fill(page, "f-max_steps", form_values["f-max_steps"])
    page.click("#submit")
    first = int(wait_text(page, "submit-msg", "Submitted", 30).split("job ")[1].split()[0])
    wait_empty(page, "err-max_steps", 10)  # the field's error goes with the submit that passed
    page.get_by_role("tab", name="Job page").click()
    wait_text(page, "job-summary", f"Job {first}: ui tiny", 30)
    wait_text(page, "job-summary", "succeeded", 180)
    wait_text(page, "job-summary", "step 4/4", 30)
    wait_text(page, "event-log", "step 4: checkpoint saved", 30)
    page.locator("#plot-0 .scatterlayer .points path").first.wait_for(timeout=30_000)  # a chart with markers
    checkpoints = text(page, "checkpoints")  # step and size, never the server's path
    assert "size" in checkpoints and "B" in checkpoints and "step_000004" not in checkpoints
    wait_charts_drawn(page)
    page.screenshot(path=ARTIFACTS / "ui-job-page.png", full_page=True)
    if os.environ.get("ALIGNER_UPDATE_SCREENSHOTS") == "1":
        shutil.copy(ARTIFACTS / "ui-job-page.png", ROOT / "docs" / "dashboard-job.png")

    page.get_by_role("tab", name="Samples").click()
    wait_text(page, "samples-info", "samples match", 30)
    deadline = time.monotonic() + 30  # the info line may still be that of the job when it was submitted
    while not ("the cat" in text(page, "samples-table") or "the sea" in text(page, "samples-table")):
        assert time.monotonic() < deadline, text(page, "samples-table")
        time.sleep(0.1)
    page.locator("#s-split").get_by_role("radio", name="validation").check()
    wait_text(page, "samples-table", "validation", 30)
    # One validation prompt followed across steps: a row per validation (steps 0, 2 and 4).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        cells = [c.strip() for c in text(page, "follow-table").splitlines() if c.strip()]
        if {"0", "2", "4"} <= set(cells):
            break
        time.sleep(0.1)
    assert {"0", "2", "4"} <= set(cells), cells
    page.screenshot(path=ARTIFACTS / "ui-samples.png", full_page=True)

    # A longer job, cancelled from the Jobs tab while it runs.
    page.get_by_role("tab", name="New job").click()
    fill(page, "f-name", "ui long")
    # Long enough to be cancelled while it runs, short of the runs that generation.compile=auto compiles for: a
    # compilation (10-30 s of CPU when cold) would run to the end of its step before the cancel could stop it.
    fill(page, "f-max_steps", AUTO_COMPILE_MIN_STEPS - 1)
    page.click("#submit")
    second = first + 1  # no other scenario submits meanwhile: ids follow each other
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


@pytest.mark.slow(16)
def test_the_form_uploads_tries_the_reward_and_the_samples_diff_a_followed_prompt(
    browser_stack, browser_page, tmp_path, tiny_policy_dir
):
    ARTIFACTS.mkdir(exist_ok=True)
    api = Api(browser_stack["api_url"], browser_stack["token"])
    api.post("/catalogue/models", {"name": "form-tiny", "path": str(tiny_policy_dir), "kind": "policy"})
    prompts = tmp_path / "few.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the sea")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    page = browser_page
    page.goto(browser_stack["ui_url"])
    fill(page, "token", browser_stack["token"])
    page.click("#sign-in")
    wait_text(page, "signed-in", "Signed in as", 30)
    page.get_by_role("tab", name="New job").click()
    wait_text(page, "lists-msg", f"policies: {policies(api)} · datasets: 0", 30)

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

    values = {"f-name": "form tiny", "f-num_prompts_per_step": 2, "f-num_rollouts_per_prompt": 2,
              "f-max_steps": 2, "f-max_new_tokens": 6, "f-val_check_interval": 1, "f-save_interval": 2}  # fmt: skip
    for elem_id, value in values.items():
        fill(page, elem_id, value)
    page.click("#submit")  # the job runs while the reward is tried
    job_id = int(wait_text(page, "submit-msg", "Submitted", 30).split("job ")[1].split()[0])
    fill(page, "try-prompts", 2)
    fill(page, "try-samples", 2)
    page.click("#try-reward")
    wait_text(page, "try-msg", "4 samples of 2 prompts", 90)
    wait_text(page, "try-table", ("the cat", "a dog", "the sea"), 30)  # the table draws its rows a moment later
    assert "spread" in text(page, "try-groups")
    page.screenshot(path=ARTIFACTS / "ui-form-try.png", full_page=True)
    fill(page, "f-max_new_tokens", 7)  # the try was about the form as it was: its panel empties, in the browser
    wait_empty(page, "try-msg", 10)
    page.wait_for_function("() => !document.getElementById('try-table').innerText.includes('the cat')", timeout=10_000)
    assert "spread" in text(page, "try-groups") and "the sea" not in text(page, "try-table")  # headers stay

    deadline = time.monotonic() + 120
    while (job := api.get(f"/jobs/{job_id}"))["status"] != "succeeded":
        assert job["status"] not in ("failed", "cancelled") and time.monotonic() < deadline, job
        time.sleep(0.2)

    page.get_by_role("tab", name="Samples").click()
    wait_text(page, "samples-info", "samples match", 30)
    assert "<|" not in text(page, "samples-table")
    wait_text(page, "follow-diff", "changes from step 0 to step 2", 30)
    assert "step 0: reward" in text(page, "follow-diff") and "step 2: reward" in text(page, "follow-diff")
    page.screenshot(path=ARTIFACTS / "ui-samples-diff.png", full_page=True)


@pytest.mark.slow(52)
def test_job_page_charts_compare_answers_side_by_side_and_a_length_hacking_alarm(
    browser_stack, browser_page, tmp_path, tiny_policy_dir, demo_assets_dir
):
    ARTIFACTS.mkdir(exist_ok=True)
    stack = browser_stack
    api = Api(stack["api_url"], stack["token"])
    catalogue.register_model(api, "charts-tiny", str(tiny_policy_dir), "policy")
    catalogue.register_server(api, "charts-reward", stack["reward_url"], "reward", "reward_model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog")))
    dataset = upload_prompts(stack, prompts)
    values = {**form.DEFAULTS, "policy": "charts-tiny", "train_dataset": dataset, "val_dataset": dataset,
              "reward_source": "server", "reward_server": "charts-reward", "num_prompts_per_step": 2,
              "num_rollouts_per_prompt": 2, "max_steps": 2, "max_new_tokens": 4, "val_check_interval": 2,
              "save_interval": 2}  # fmt: skip
    first = api.post("/jobs", form.build_job({**values, "name": "ui a", "lr": 0.001}))["id"]
    second = api.post("/jobs", form.build_job({**values, "name": "ui b", "lr": 0.0001}))["id"]
    # The demo policy ends its answers at varied lengths; a reward paying for characters correlates with them.
    catalogue.register_model(api, "charts-demo", str(demo_assets_dir / "policy"), "policy")
    catalogue.register_reward_function(api, "charts-chars", "tests.helpers.rewards:chars_reward")
    demo_prompts = upload_prompts(stack, demo_assets_dir / "prompts_val.jsonl")
    gamed = form.build_job({**values, "name": "ui length", "policy": "charts-demo", "train_dataset": demo_prompts,
                            "val_dataset": demo_prompts, "reward_source": "function",
                            "reward_function": "charts-chars", "num_prompts_per_step": 4,
                            "num_rollouts_per_prompt": 4, "max_steps": 40, "max_new_tokens": 24,
                            "val_check_interval": 10, "save_interval": 40})  # fmt: skip
    # The rule judges over 4 steps, not its default 10: the same alarm, raised sooner.
    gamed["config"]["health"] = {"pause_on": ["length_hacking"], "window": 4, "min_points": 4}
    third = api.post("/jobs", gamed)["id"]

    page = browser_page
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
        time.sleep(0.2)
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

    # The length-paying job: the alarm fires once the rule has its 4 values, and pauses the job.
    deadline = time.monotonic() + 120
    while (job := api.get(f"/jobs/{third}"))["status"] not in ("paused", "succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    assert job["status"] == "paused" and job["alarms"] == ["length_hacking"] and job["step"] < 40, job
    page.get_by_role("tab", name="Jobs").click()
    wait_text(page, "jobs-table", "length hacking", 30)
    fill(page, "job-id", third)
    page.locator("#job-id input").first.press("Enter")
    page.get_by_role("tab", name="Job page").click()
    wait_text(page, "job-summary", "paused", 30)
    wait_text(page, "job-summary", "length hacking", 30)
    wait_text(page, "event-log", "length hacking", 30)
    time.sleep(1.5)  # let the charts finish drawing, and any error toast of the job switch show
    # switching jobs sends the earlier job's picks against the new job's choices: no error toast for it
    assert page.get_by_text("not in the list of choices").count() == 0
    page.screenshot(path=ARTIFACTS / "ui-health-alarm.png", full_page=True)
    if os.environ.get("ALIGNER_UPDATE_SCREENSHOTS") == "1":
        shutil.copy(ARTIFACTS / "ui-health-alarm.png", ROOT / "docs" / "dashboard-health.png")
