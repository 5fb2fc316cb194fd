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
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# Flags for a headless Chromium run as root in a container without a GPU or network access (no sandbox, no GPU, no
# QUIC, no background fetches, updates or sync); Playwright adds --user-data-dir.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _require_chromium() -> None:
    missing = None
    if not Path(CHROMIUM).is_file():
        missing = f"{CHROMIUM} not found (apt-get install -y chromium chromium-driver)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "the playwright package is not installed (pip install -e '.[dev]')"
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(missing)
        pytest.skip(missing)


@pytest.fixture
def stack(tmp_path):
    """`aligner up` on embedded defaults with a reward server (a rule-based reward function); its stack.json."""
    _require_chromium()
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k not in ("ALIGNER_DATABASE_URL", "ALIGNER_BROKER_URL")}
    cmd = [sys.executable, "-m", "aligner.cli", "up", "--data-dir", str(data_dir),
           "--reward-function", "tests.helpers.rewards:letter_reward"]  # fmt: skip
    up = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (data_dir / "stack.json").is_file():
            assert up.poll() is None, f"aligner up exited with {up.returncode}: {up.stdout.read()}"
            assert time.monotonic() < deadline, "aligner up did not write stack.json"
            time.sleep(0.3)
        yield json.loads((data_dir / "stack.json").read_text())
    finally:
        up.send_signal(signal.SIGTERM)
        output, _ = up.communicate(timeout=90)
        assert up.returncode == 0, output


def _fill(page, elem_id: str, value) -> None:
    page.locator(f"#{elem_id} input, #{elem_id} textarea").first.fill(str(value))


def _text(page, elem_id: str) -> str:
    """What the component shows: its text, plus the value of a text box (not part of inner_text)."""
    element = page.locator(f"#{elem_id}")
    boxes = element.locator("textarea, input[type=text]")
    values = [boxes.nth(i).input_value() for i in range(boxes.count())]
    return "\n".join([element.inner_text(), *values])


def _choose(page, elem_id: str, label: str) -> None:
    """Pick the option of drop-down `elem_id` whose label starts with `label`."""
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=label).first.click()
    page.keyboard.press("Escape")


def _upload_prompts(stack: dict, path: Path) -> int:
    """A dataset of the operator's (the stack's token), uploaded through the API as any user would."""
    with path.open("rb") as f:
        response = requests.post(f"{stack['api_url']}/api/v1/datasets", files={"file": (path.name, f)},
                                 headers={"Authorization": f"Bearer {stack['token']}"}, timeout=30)  # fmt: skip
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _wait_text(page, elem_id: str, pattern: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = _text(page, elem_id)
        if pattern in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"#{elem_id} never showed {pattern!r}; it shows: {_text(page, elem_id)[:1000]}")


@pytest.mark.slow
def test_dashboard_signs_in_submits_follows_and_cancels(stack, tmp_path, tiny_policy_dir):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the sea")))
    _upload_prompts(stack, prompts)
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
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(stack["ui_url"])
            _fill(page, "token", "not-a-token")
            page.click("#sign-in")
            _wait_text(page, "signed-in", "Sign-in failed", 30)
            _fill(page, "token", stack["token"])
            page.click("#sign-in")
            _wait_text(page, "signed-in", "Signed in as admin (admin)", 30)

            # The operator puts the tiny policy and the stack's reward server in the catalogue (Catalogue tab).
            page.get_by_role("tab", name="Catalogue").click()
            _wait_text(page, "cat-models", "name", 30)
            for elem_id, value in {"cat-m-name": "ui-tiny", "cat-m-path": tiny_policy_dir}.items():
                _fill(page, elem_id, value)
            page.click("#cat-m-add")
            _wait_text(page, "cat-msg", "Registered model ui-tiny", 30)
            for elem_id, value in {"cat-s-name": "ui-reward", "cat-s-url": stack["reward_url"]}.items():
                _fill(page, elem_id, value)
            page.click("#cat-s-add")
            _wait_text(page, "cat-msg", "Registered reward server ui-reward", 30)
            assert "ui-tiny" in _text(page, "cat-models") and "ui-reward" in _text(page, "cat-servers")
            page.screenshot(path=ARTIFACTS / "ui-catalogue.png", full_page=True)

            # The form picks them from its drop-downs.
            page.get_by_role("tab", name="New job").click()
            page.click("#refresh-lists")
            _wait_text(page, "lists-msg", "policies: 1 · datasets: 1", 30)
            _choose(page, "f-policy", "ui-tiny — LlamaForCausalLM")
            _choose(page, "f-train_dataset", "prompts.jsonl (3 prompts, yours)")
            _choose(page, "f-val_dataset", "prompts.jsonl (3 prompts, yours)")
            page.locator("#f-reward_source").get_by_role("radio", name="reward server").check()
            page.locator("#f-reward_server").wait_for(state="visible", timeout=30_000)
            _choose(page, "f-reward_server", "ui-reward")

            # A 422 is shown under the field it concerns, and listed.
            for elem_id, value in {**form, "f-max_steps": -1}.items():
                _fill(page, elem_id, value)
            page.click("#submit")
            _wait_text(page, "submit-msg", "Not submitted (422)", 30)
            assert "greater than or equal to 1" in _text(page, "err-max_steps")
            assert "config.trainer.max_steps" in _text(page, "submit-msg")
            page.screenshot(path=ARTIFACTS / "ui-form-errors.png", full_page=True)

            # The tiny job: submitted through the form, followed on its page until it succeeds.
            _fill(page, "f-max_steps", form["f-max_steps"])
            page.click("#submit")
            first = int(_wait_text(page, "submit-msg", "Submitted", 30).split("job ")[1].split()[0])
            assert _text(page, "err-max_steps").strip() == ""
            page.get_by_role("tab", name="Job page").click()
            _wait_text(page, "job-summary", f"Job {first}: ui tiny", 30)
            _wait_text(page, "job-summary", "succeeded", 180)
            _wait_text(page, "job-summary", "metrics logged for 4 steps", 30)
            _wait_text(page, "event-log", "checkpoint", 30)
            reward_plot = page.locator("#plot-0")
            reward_plot.locator("canvas, svg").first.wait_for(timeout=30_000)  # a chart, not the empty icon
            assert "step_000004" in _text(page, "checkpoints")
            time.sleep(1.5)  # let the charts finish drawing
            page.screenshot(path=ARTIFACTS / "ui-job-page.png", full_page=True)
            if os.environ.get("ALIGNER_UPDATE_SCREENSHOTS") == "1":
                shutil.copy(ARTIFACTS / "ui-job-page.png", ROOT / "docs" / "dashboard-job.png")

            page.get_by_role("tab", name="Samples").click()
            _wait_text(page, "samples-info", "samples match", 30)
            assert "the cat" in _text(page, "samples-table") or "the sea" in _text(page, "samples-table")
            page.locator("#s-split").get_by_role("radio", name="validation").check()
            _wait_text(page, "samples-table", "validation", 30)
            # One validation prompt followed across steps: a row per validation (steps 0, 2 and 4).
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                cells = [c.strip() for c in _text(page, "follow-table").splitlines() if c.strip()]
                if {"0", "2", "4"} <= set(cells):
                    break
                time.sleep(0.5)
            assert {"0", "2", "4"} <= set(cells), cells
            page.screenshot(path=ARTIFACTS / "ui-samples.png", full_page=True)

            # A longer job, cancelled from the Jobs tab while it runs.
            page.get_by_role("tab", name="New job").click()
            _fill(page, "f-name", "ui long")
            _fill(page, "f-max_steps", 5000)
            page.click("#submit")
            second = first + 1  # a fresh database: ids follow each other
            _wait_text(page, "submit-msg", f"Submitted job {second}", 30)
            page.get_by_role("tab", name="Jobs").click()
            _wait_text(page, "jobs-table", "running", 120)
            page.click("#cancel")
            _wait_text(page, "action-msg", f"Job {second}: cancel", 30)
            _wait_text(page, "jobs-table", "cancelled", 120)
            page.screenshot(path=ARTIFACTS / "ui-jobs.png", full_page=True)

            page.get_by_role("tab", name="Compare").click()
            _fill(page, "c-jobs", f"{first}, {second}")
            page.locator("#c-jobs input, #c-jobs textarea").first.press("Enter")
            page.locator("#plot-compare").locator("canvas, svg").first.wait_for(timeout=30_000)
            page.screenshot(path=ARTIFACTS / "ui-compare.png", full_page=True)
        finally:
            browser.close()
