"""The Chromium checks of issue 30's dashboard defects: each scenario opens what a user opens and asserts what they
see, where the unit tests only check figures and tables. Headless Debian Chromium through Playwright
(tests/helpers/browser.py: skipped without it, failed when CI=true); each test is self-contained.

- A running job's Reward chart keeps the user's zoom when new steps redraw it (webapp/ui/charts.py KEEP_ZOOM_JS, by
  the figure's `uirevision`), draws its gold reward on a right axis of its own, and the Samples tab has a gold
  column and the "reward high, gold low" filter.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.browser import ARTIFACTS, fill, upload_prompts, wait_text
from webapp.ui import catalogue, form, samples
from webapp.ui.api import Api

# The Reward chart's plotly element, and what the page shows of it: its x range, the number of train points, and the
# y axis of its gold trace (None before the first validation with gold rewards).
REWARD_PLOT = "#plot-0 .js-plotly-plot"
ZOOM_TRIES = 5
CHART_STATE_JS = """(selector) => {
    const el = document.querySelector(selector);
    if (!el || !el._fullLayout || !el.data || !el.data.length) return null;
    const gold = el.data.find((trace) => trace.name.startsWith("gold: "));
    return {
        title: el._fullLayout.title.text,
        range: el._fullLayout.xaxis.range,
        points: el.data[0].x.length,
        gold_axis: gold ? (gold.yaxis || "y") : null,
        right_side: el._fullLayout.yaxis2 ? el._fullLayout.yaxis2.side : null,
    };
}"""


def chart_state(page) -> dict | None:
    return page.evaluate(CHART_STATE_JS, REWARD_PLOT)


def wait_chart(page, condition_js: str, timeout_s: float = 90) -> dict:
    """The Reward chart's state once `condition_js` (an expression of `s`, the state) holds."""
    page.wait_for_function(
        f"(selector) => {{ const s = ({CHART_STATE_JS})(selector); return s && ({condition_js}); }}",
        arg=REWARD_PLOT,
        polling=100,
        timeout=timeout_s * 1000,
    )
    return chart_state(page)


@pytest.mark.slow(25)
def test_a_zoomed_chart_keeps_its_zoom_as_steps_come_and_gold_rewards_have_their_own_axis_and_column(
    browser_stack, browser_page, tmp_path, tiny_policy_dir
):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    ARTIFACTS.mkdir(exist_ok=True)
    stack = browser_stack
    api = Api(stack["api_url"], stack["token"])
    catalogue.register_model(api, "walk-zoom-tiny", str(tiny_policy_dir), "policy")
    # paced: at least 0.1 s a step, so steps keep coming while the test zooms (tiny steps take milliseconds)
    catalogue.register_reward_function(api, "walk-zoom-paced", "tests.helpers.rewards:paced_letter_reward")
    catalogue.register_reward_function(api, "walk-zoom-chars", "tests.helpers.rewards:chars_reward")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the sea")))
    dataset = upload_prompts(stack, prompts)
    values = {**form.DEFAULTS, "name": "walk zoom", "policy": "walk-zoom-tiny", "train_dataset": dataset,
              "val_dataset": dataset, "reward_source": "function", "reward_function": "walk-zoom-paced",
              "num_prompts_per_step": 2, "num_rollouts_per_prompt": 2, "max_steps": 400, "max_new_tokens": 4,
              "val_check_interval": 5, "save_interval": 400}  # fmt: skip
    body = form.build_job(values)
    body["config"].setdefault("validation", {})["extra_rewards"] = {"chars": {"function": "walk-zoom-chars"}}
    job = api.post("/jobs", body)["id"]

    page = browser_page
    page.goto(stack["ui_url"])
    fill(page, "token", stack["token"])
    page.click("#sign-in")
    wait_text(page, "signed-in", "Signed in", 30)
    fill(page, "job-id", job)
    page.locator("#job-id input").first.press("Enter")
    page.get_by_role("tab", name="Job page").click()
    wait_text(page, "job-summary", f"Job {job}: walk zoom", 30)

    # The gold reward (characters, 0..~20) on a right axis of its own, not squeezed onto the reward's (0..1).
    state = wait_chart(page, "s.points >= 3 && s.gold_axis !== null")
    assert "Reward" in state["title"] and state["gold_axis"] == "y2" and state["right_side"] == "right", state
    full = state["range"]

    # Zoom as a user does: a horizontal drag over the plot area (x only). Gradio mounts a new plotly element for each
    # new figure: one landing mid-drag cuts the drag short, and then the user drags again.
    span = full[1] - full[0]
    for _try in range(ZOOM_TRIES):
        box = page.locator("#plot-0 .draglayer .xy .nsewdrag").first.bounding_box()
        if box is None:  # being redrawn
            page.wait_for_timeout(200)
            continue
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * 0.1, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.3, y, steps=5)
        page.mouse.up()
        try:
            zoomed = wait_chart(page, f"s.range[1] - s.range[0] < {span / 2}", 2)
            break
        except PlaywrightTimeout:
            continue
    else:
        raise AssertionError(f"{ZOOM_TRIES} drags did not zoom the chart: {chart_state(page)}")
    assert api.get(f"/jobs/{job}")["status"] == "running"
    redrawn = wait_chart(page, f"s.points > {zoomed['points']}", 60)
    assert redrawn["range"] == pytest.approx(zoomed["range"]), (full, zoomed, redrawn)
    page.screenshot(path=ARTIFACTS / "ui-walk-zoom-kept.png", full_page=True)
    # A double-click zooms back out, and the next redraw leaves it so.
    box = page.locator("#plot-0 .draglayer .xy .nsewdrag").first.bounding_box()
    page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    reset = wait_chart(page, f"s.range[1] - s.range[0] > {span * 0.99}", 10)
    after = wait_chart(page, f"s.points > {reset['points']}", 60)
    assert after["range"] == pytest.approx(full), (full, reset, after)

    # Samples: a gold column, and the filter that shows where the reward and the gold reward disagree.
    page.get_by_role("tab", name="Samples").click()
    wait_text(page, "samples-info", f"Job {job}:", 30)
    assert "gold" in page.locator("#samples-table").inner_text()
    page.locator("#s-gold-low input").first.check()
    wait_text(page, "samples-info", samples.GOLD_FILTER_INFO, 30)
