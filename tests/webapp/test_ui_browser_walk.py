"""The Chromium checks of issue 30's dashboard defects: each scenario opens what a user opens and asserts what they
see, where the unit tests only check status codes and URLs. Headless Debian Chromium through Playwright
(tests/helpers/browser.py: skipped without it, failed when CI=true); each test is self-contained.

- The API docs page (/api/v1/docs) renders the OpenAPI 3.1 document: it lists every operation of the document (POST
  /api/v1/jobs among them) and no "Unable to render this definition", loading nothing from outside the API.
- The New job form warns when validation would run on the training prompts; a dry run's answer goes when a field
  changes; clearing the upload clears its "Uploaded" line.
- An admin's All users view: another user's job, listed with its owner, is cancelled and retried from the Jobs tab
  (through the admin API); the retry asks first and says what it deletes, and the message after the cancel ends
  as "cancelled", not "cancelling".
- A running job's Reward chart keeps the user's zoom when new steps redraw it (webapp/ui/charts.py KEEP_ZOOM_JS, by
  the figure's `uirevision`), draws its gold reward on a right axis of its own, and the Samples tab has a gold
  column and the "reward high, gold low" filter.
- A finished job's Job page: "Download model" hands over its final policy; open and untouched it idles (under
  IDLE_CPU_SHARE of a core in Chromium and in the dashboard, no component redrawn); an unknown job id then empties
  the page (no chart, event or checkpoint of the job shown before).
"""

from __future__ import annotations

import json
import time
from contextlib import suppress
from urllib.parse import urlsplit

import pytest
import requests

from aligner.generation.generator import AUTO_COMPILE_MIN_STEPS
from tests.helpers.browser import (
    ARTIFACTS,
    changes_since_watch,
    cpu_seconds,
    fill,
    text,
    upload_prompts,
    wait_charts_drawn,
    wait_empty,
    wait_text,
    watch_changes,
)
from webapp.db import FINAL_STATUSES, create_token, make_engine, make_session_factory, session_scope
from webapp.ui import catalogue, form, samples
from webapp.ui.api import Api, ApiError
from webapp.ui.job_page import NUM_PLOTS
from webapp.ui.tabs import REFRESH_S

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


@pytest.mark.slow(5)
def test_api_docs_page_lists_every_operation_offline(api_url, browser_page):
    page, url = browser_page, api_url
    spec = requests.get(f"{url}/api/v1/openapi.json", timeout=10).json()
    operations = {(path, method) for path, item in spec["paths"].items() for method in item if method in HTTP_METHODS}
    assert ("/api/v1/jobs", "post") in operations
    # A user's browser may have no internet access: anything the page asks of another origin fails here too.
    outside = []

    def only_the_api(route):
        if urlsplit(route.request.url)[:2] == urlsplit(url)[:2]:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_api)
    page.goto(f"{url}/api/v1/docs")
    # Swagger UI either lists the operations or says it cannot render the document: wait for whichever comes.
    page.wait_for_function(
        """() => document.querySelector(".opblock") || document.body.innerText.includes("Unable to render")""",
        timeout=30_000,
    )
    shown = page.locator("body").inner_text()
    assert "Unable to render" not in shown, shown[:1000]
    blocks = page.locator(".opblock")
    listed = {
        (blocks.nth(i).locator(".opblock-summary-path").get_attribute("data-path"),
         blocks.nth(i).locator(".opblock-summary-method").inner_text().lower())
        for i in range(blocks.count())
    }  # fmt: skip
    assert listed == operations
    assert page.locator(".opblock-post [data-path='/api/v1/jobs']").is_visible()
    assert not outside, outside


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
    wait_empty(page, "dry-msg")

    page.locator("#f-upload").get_by_role("button", name="Clear").first.click()
    wait_empty(page, "upload-msg")
    assert "validation prompts" in text(page, "form-warnings")  # the dataset stays picked: only the line goes


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
            zoomed = wait_chart(page, f"s.range[1] - s.range[0] < {span / 2}", 5)
            break
        except PlaywrightTimeout:
            continue
    else:
        raise AssertionError(f"{ZOOM_TRIES} drags did not zoom the chart: {chart_state(page)}")
    assert api.get(f"/jobs/{job}")["status"] == "running"
    redrawn = wait_chart(page, f"s.points > {zoomed['points']}", 60)
    assert redrawn["range"] == pytest.approx(zoomed["range"]), (full, zoomed, redrawn)
    page.screenshot(path=ARTIFACTS / "ui-walk-zoom-kept.png", full_page=True)
    # A double-click zooms back out (again when a redraw lands on it), and the next redraw leaves it so.
    for _try in range(ZOOM_TRIES):
        box = page.locator("#plot-0 .draglayer .xy .nsewdrag").first.bounding_box()
        if box is None:  # being redrawn
            page.wait_for_timeout(200)
            continue
        page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        try:
            reset = wait_chart(page, f"s.range[1] - s.range[0] > {span * 0.99}", 5)
            break
        except PlaywrightTimeout:
            continue
    else:
        raise AssertionError(f"{ZOOM_TRIES} double-clicks did not reset the zoom: {chart_state(page)}")
    after = wait_chart(page, f"s.points > {reset['points']}", 60)
    assert after["range"] == pytest.approx(full), (full, reset, after)

    # Samples: a gold column, and the filter that shows where the reward and the gold reward disagree.
    page.get_by_role("tab", name="Samples").click()
    wait_text(page, "samples-info", f"Job {job}:", 30)
    assert "gold" in page.locator("#samples-table").inner_text()
    page.locator("#s-gold-low input").first.check()
    wait_text(page, "samples-info", samples.GOLD_FILTER_INFO, 30)


VIEWPORT = {"width": 1440, "height": 900}
UNKNOWN_JOB = 99_999
TICKS = 3  # timer ticks watched for a repeating toast

# The header cells of table #ID that reach past its box or the window's right edge (a column cut off, or scrolled out
# of sight), as "name: left-right".
_CUT_OFF_JS = """(id) => {
    const box = document.getElementById(id).getBoundingClientRect();
    const right = Math.min(box.right, window.innerWidth);
    return [...document.getElementById(id).querySelectorAll("th")]
        .filter((th) => th.offsetParent)
        .map((th) => [th.innerText.trim(), th.getBoundingClientRect()])
        .filter(([_name, cell]) => cell.left < box.left - 1 || cell.right > right + 1)
        .map(([name, cell]) => `${name}: ${cell.left | 0}-${cell.right | 0} past ${right | 0}`);
}"""


@pytest.fixture
def page(shared_chromium):
    context = shared_chromium.new_context(viewport=VIEWPORT)
    try:
        yield context.new_page()
    finally:
        context.close()


def sign_in(page, stack: dict) -> None:
    page.goto(stack["ui_url"])
    fill(page, "token", stack["token"])
    page.click("#sign-in")
    wait_text(page, "signed-in", f"Signed in as {stack['user']}", 30)


def in_viewport(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]


@pytest.mark.slow(15)
def test_compare_names_a_job_that_is_not_yours_once_without_an_error_toast(browser_stack, page):
    sign_in(page, browser_stack)
    fill(page, "job-id", UNKNOWN_JOB)
    page.locator("#job-id input").first.press("Enter")
    page.get_by_role("tab", name="Compare").click()
    wait_text(page, "c-msg", "of your 0 jobs", 30)
    page.click("#c-add")
    time.sleep(TICKS * REFRESH_S + 0.5)  # the ticks that each raised (and toasted) with the id in the drop-down
    toasts = page.locator(".toast-body")
    assert toasts.count() == 0, [toasts.nth(i).inner_text() for i in range(toasts.count())]
    wait_text(page, "c-add-msg", f"Job {UNKNOWN_JOB} does not exist or is not yours.", 30)
    assert text(page, "c-add-msg").count("does not exist") == 1
    assert str(UNKNOWN_JOB) not in text(page, "c-jobs")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "walk-compare-unknown-job.png")


@pytest.mark.slow(12)
def test_a_refused_registration_is_said_where_the_button_was_clicked(browser_stack, page):
    sign_in(page, browser_stack)
    page.get_by_role("tab", name="Catalogue").click()
    wait_text(page, "cat-functions", "exact_match", 30)
    fill(page, "cat-m-name", "bad name!")
    fill(page, "cat-m-path", "/nowhere")
    page.click("#cat-m-add")
    refused = page.locator("[id^=cat-]", has_text="Refused").last  # wherever the tab says it
    refused.wait_for(timeout=30_000)
    assert "name 'bad name!' is not valid" in refused.inner_text()
    assert in_viewport(page, f"#{refused.get_attribute('id')}"), refused.bounding_box()
    assert page.evaluate(_CUT_OFF_JS, "cat-functions") == []  # the reward functions' target column too
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "walk-catalogue-refused.png")


@pytest.mark.slow(20)
def test_removing_a_catalogue_entry_asks_first_and_says_what_it_does(browser_stack, page):
    api = Api(browser_stack["api_url"], browser_stack["token"])
    name = f"{browser_stack['user']}-fn"
    catalogue.register_reward_function(api, name, "tests.helpers.rewards:chars_reward")

    def registered() -> bool:
        return name in [f["name"] for f in api.get("/catalogue/reward-functions")["items"]]

    sign_in(page, browser_stack)
    page.get_by_role("tab", name="Catalogue").click()
    wait_text(page, "cat-functions", name, 30)
    page.locator("#cat-r-what").get_by_role("radio", name="reward function").check()
    fill(page, "cat-r-name", name)
    page.click("#cat-r-remove")
    time.sleep(REFRESH_S)
    assert registered()  # asked, not done
    question = wait_text(page, "cat-r-question", f"Remove reward function {name} from the catalogue?", 30)
    assert "refused when they next start" in question and in_viewport(page, "#cat-r-question")
    page.click("#cat-r-confirm")
    wait_text(page, "cat-r-msg", f"Removed reward function {name}", 30)
    assert not registered() and not page.locator("#cat-r-question").is_visible()


# Of one core, each of Chromium's processes and the dashboard's, with a finished job open. Measured on a quiet Intel
# Xeon with AMX: Chromium 4.7%, the dashboard 1.6% (up to 7.8% and 2.7% while the machine ran other tests); the
# defects of issue 30 cost 55% and 17%, and the status tracker's unslowed frame loop alone 5.7% of a bare page.
IDLE_CPU_SHARE = 0.10
IDLE_WINDOW_S = 15.0


def finished_tiny_job(stack: dict, tmp_path, policy_dir, name: str) -> int:
    """A 2-step job of the tiny policy, scored by the stack's reward server, submitted through the API and run to
    its end: its id."""
    api = Api(stack["api_url"], stack["token"])
    catalogue.register_model(api, f"{name}-tiny", str(policy_dir), "policy")
    catalogue.register_server(api, f"{name}-reward", stack["reward_url"], "reward", "reward_model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog")))
    dataset = upload_prompts(stack, prompts)
    values = {**form.DEFAULTS, "name": name, "policy": f"{name}-tiny", "train_dataset": dataset,
              "val_dataset": dataset, "reward_source": "server", "reward_server": f"{name}-reward", "lr": 0.001,
              "num_prompts_per_step": 2, "num_rollouts_per_prompt": 2, "max_steps": 2, "max_new_tokens": 4,
              "val_check_interval": 2, "save_interval": 2}  # fmt: skip
    job_id = api.post("/jobs", form.build_job(values))["id"]
    deadline = time.monotonic() + 180
    while (job := api.get(f"/jobs/{job_id}"))["status"] != "succeeded":
        assert job["status"] in ("queued", "running") and time.monotonic() < deadline, job
        time.sleep(0.3)
    return job_id


def sign_in_and_open_job(page, stack: dict, job_id: int) -> None:
    page.goto(stack["ui_url"])
    fill(page, "token", stack["token"])
    page.click("#sign-in")
    wait_text(page, "signed-in", "Signed in", 30)
    fill(page, "job-id", job_id)
    page.locator("#job-id input").first.press("Enter")
    page.get_by_role("tab", name="Job page").click()


@pytest.mark.slow(45)
def test_a_finished_jobs_page_offers_its_model_idles_and_forgets_it_for_an_unknown_id(
    browser_stack, browser_page, tmp_path, tiny_policy_dir
):
    import psutil

    stack, page = browser_stack, browser_page
    job_id = finished_tiny_job(stack, tmp_path, tiny_policy_dir, "idle")
    sign_in_and_open_job(page, stack, job_id)
    wait_text(page, "job-summary", "succeeded", 60)
    wait_text(page, "event-log", "checkpoint saved", 30)
    wait_charts_drawn(page)

    page.click("#download-model")
    wait_text(page, "model-msg", f"Final policy of job {job_id}", 60)
    link = page.locator("#model-file a").first
    assert link.get_attribute("href").endswith(f"/job_{job_id}_final_policy.zip")

    # Idle: nothing changes on the server, so nothing may be redrawn and next to no CPU spent.
    time.sleep(2 * REFRESH_S)  # let the ticks after the last click settle
    watched = ["job-summary", "event-log", "checkpoints", "jobs-table",
               *(f"plot-{i}" for i in range(NUM_PLOTS))]  # fmt: skip
    watch_changes(page, watched)
    # Chromium's processes alone: this process's children also hold the whole stack (`aligner up` and its servers,
    # whose idle polling is theirs, not the page's) and Playwright's driver.
    browser = [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name().lower()]
    ui = psutil.Process(stack["pids"]["ui"])
    dashboard = [ui, *ui.children(recursive=True)]
    others = [p for p in psutil.Process().children(recursive=True) if p not in browser and p not in dashboard]
    before, start = [cpu_seconds(group) for group in (browser, dashboard, others)], time.monotonic()
    time.sleep(IDLE_WINDOW_S)
    wall = time.monotonic() - start
    used = [cpu_seconds(group) - b for group, b in zip((browser, dashboard, others), before, strict=True)]
    shares = {"chromium": used[0] / wall, "dashboard": used[1] / wall}
    print(f"idle with a finished job open: {shares}; the rest of the stack and the driver: {used[2] / wall:.3f}")
    assert browser, "no Chromium process found"
    assert {name: n for name, n in changes_since_watch(page).items() if n} == {}
    assert all(share < IDLE_CPU_SHARE for share in shares.values()), shares

    # An unknown id: the page says so and shows nothing of the job before.
    fill(page, "job-id", 2**31 - 1)
    page.locator("#job-id input").first.press("Enter")
    wait_text(page, "job-summary", f"Job {2**31 - 1} does not exist or is not yours", 30)
    page.wait_for_function("() => ![...document.querySelectorAll('[id^=plot-]')].some((p) => p.offsetParent)",
                           timeout=10_000)  # fmt: skip
    assert page.locator("#event-log textarea").input_value() == ""
    assert page.locator("#checkpoints tbody tr").filter(has_text="KB").count() == 0
    assert page.locator("#checkpoints tbody tr").filter(has_text="MB").count() == 0
    assert page.locator("#download-model").is_disabled()
    assert not page.locator("#model-file").is_visible()
