"""Dashboard browser tests' shared pieces: `aligner up` on embedded defaults (`up_stack`, for a fixture) and
headless Debian Chromium through Playwright (`chromium`, `fill`, `text`, `choose`, `wait_text`).

Needs /usr/bin/chromium (`apt-get install -y chromium chromium-driver`; `make setup` installs it when root): a test
skips without it, and fails when CI=true. Screenshots go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


def require_chromium() -> None:
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


@contextmanager
def up_stack(data_dir: Path) -> Iterator[dict]:
    """`aligner up` on embedded defaults with a reward server (a rule-based reward function), in `data_dir`: its
    stack.json while it runs; stopped with SIGTERM, which must end it cleanly."""
    require_chromium()
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


def admin_token(data_dir: Path, user: str) -> str:
    """A new API token of admin `user` (created if new) in the database of `up_stack(data_dir)` (its SQLite file), as
    `aligner token create --user USER --admin` would make it."""
    from webapp.db import create_token, make_engine, make_session_factory, session_scope

    engine = make_engine(f"sqlite:///{data_dir.resolve() / 'aligner.db'}")
    try:
        with session_scope(make_session_factory(engine)) as session:
            return create_token(session, user, "browser test", admin=True)
    finally:
        engine.dispose()


def fill(page, elem_id: str, value) -> None:
    page.locator(f"#{elem_id} input, #{elem_id} textarea").first.fill(str(value))


def text(page, elem_id: str) -> str:
    """What the component shows: its text, plus the value of a text box (not part of inner_text)."""
    element = page.locator(f"#{elem_id}")
    boxes = element.locator("textarea, input[type=text]")
    values = [boxes.nth(i).input_value() for i in range(boxes.count())]
    return "\n".join([element.inner_text(), *values])


def choose(page, elem_id: str, label: str) -> None:
    """Pick the option of drop-down `elem_id` whose label starts with `label`."""
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=label).first.click()
    page.keyboard.press("Escape")


def upload_prompts(stack: dict, path: Path) -> int:
    """A dataset of the user whose token `stack` holds, uploaded through the API as any user would."""
    with path.open("rb") as f:
        response = requests.post(f"{stack['api_url']}/api/v1/datasets", files={"file": (path.name, f)},
                                 headers={"Authorization": f"Bearer {stack['token']}"}, timeout=30)  # fmt: skip
    assert response.status_code == 201, response.text
    return response.json()["id"]


# What `text` reads, computed in the page: `wait_text` polls it there (every POLL_MS) instead of over Playwright's
# connection, so a change is seen within POLL_MS without a round trip a poll.
_SHOWN_JS = """([id, patterns]) => {
    const element = document.getElementById(id);
    if (!element) return false;
    const boxes = element.querySelectorAll("textarea, input[type=text]");
    const shown = [element.innerText, ...Array.from(boxes, (box) => box.value)].join("\\n");
    return patterns.some((pattern) => shown.includes(pattern)) ? shown : false;
}"""
POLL_MS = 100


def wait_text(page, elem_id: str, pattern: str | tuple[str, ...], timeout_s: float = 120) -> str:
    """What `text(page, elem_id)` shows once it contains `pattern` (or one of several); AssertionError after
    `timeout_s`."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    try:
        shown = page.wait_for_function(_SHOWN_JS, arg=[elem_id, patterns], polling=POLL_MS, timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        ARTIFACTS.mkdir(exist_ok=True)  # what the page showed instead, for whoever reads the failure
        page.screenshot(path=ARTIFACTS / f"never-{elem_id}.png", full_page=True)
        raise AssertionError(f"#{elem_id} never showed {pattern!r}; it shows: {text(page, elem_id)[:1000]}") from None
    return shown.json_value()


def wait_empty(page, elem_id: str, timeout_s: float = 30) -> None:
    """Until component `elem_id` shows no text; AssertionError, with what it shows, after `timeout_s`."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "(id) => { const e = document.getElementById(id); return e !== null && e.innerText.trim() === ''; }",
            arg=elem_id,
            timeout=timeout_s * 1000,
        )
    except PlaywrightTimeout:
        raise AssertionError(f"#{elem_id} still shows: {text(page, elem_id)[:500]}") from None


def wait_charts_drawn(page, timeout_s: float = 30) -> None:
    """Until every chart on screen (the visible `plot-*` elements) has been drawn by plotly, and the page painted."""
    page.wait_for_function(
        """() => {
            const charts = [...document.querySelectorAll("[id^=plot-]")].filter((chart) => chart.offsetParent);
            return charts.length > 0 && charts.every((chart) => chart.querySelector(".js-plotly-plot .main-svg"));
        }""",
        polling=POLL_MS,
        timeout=timeout_s * 1000,
    )
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


@contextmanager
def chromium() -> Iterator:
    """A headless Chromium (Playwright's sync API): yields the browser, closed at the end."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def cpu_seconds(processes) -> float:
    """The CPU time (user + system) `processes` (psutil.Process) have used so far; those gone count 0."""
    import psutil

    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


# Counts the DOM changes under each element whose id is given, from now on (read with `changes_since_watch`).
_WATCH_JS = """(ids) => {
    window.__changes = Object.fromEntries(ids.map((id) => [id, 0]));
    for (const id of ids) {
        const element = document.getElementById(id);
        if (!element) continue;
        new MutationObserver((records) => { window.__changes[id] += records.length; })
            .observe(element, {subtree: true, childList: true, characterData: true, attributes: true});
    }
}"""


def watch_changes(page, elem_ids: list[str]) -> None:
    """Start counting the DOM changes under each of `elem_ids` (a redraw changes its element's subtree)."""
    page.evaluate(_WATCH_JS, elem_ids)


def changes_since_watch(page) -> dict[str, int]:
    """{element id: DOM changes under it since `watch_changes`}."""
    return page.evaluate("() => window.__changes")
