"""A picture of one job's page in the dashboard of a running stack, for the README and the docs.

    aligner up --data-dir aligner_data --demo            # in another terminal: the stack, the demo job (job 1)
    .venv/bin/python scripts/dashboard_screenshot.py --data-dir aligner_data --job 1 --out docs/dashboard-job.png

Signs in with the token of DATA_DIR/stack.json, selects the job, opens its page (or --tab), waits for the charts and
saves a full-page PNG. Needs Playwright and /usr/bin/chromium (headless; the dashboard's browser tests use the same).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="aligner_data", help="the stack's data folder (its stack.json)")
    parser.add_argument("--job", type=int, required=True, help="the job to show")
    parser.add_argument("--tab", default="Job page", help="the tab to picture (Jobs, Job page, Samples, Compare)")
    parser.add_argument("--out", required=True, help="the PNG file to write")
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args()
    stack = json.loads((Path(args.data_dir) / "stack.json").read_text())

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": args.width, "height": 1000})
            page.goto(stack["ui_url"])
            page.locator("#token input").first.fill(stack["token"])
            page.click("#sign-in")
            page.get_by_text("Signed in as").wait_for(timeout=30_000)
            page.locator("#job-id input").first.fill(str(args.job))
            page.locator("#job-id input").first.press("Enter")
            page.get_by_role("tab", name=args.tab).click()
            if args.tab == "Job page":
                page.locator("#job-summary").get_by_text(f"Job {args.job}:").wait_for(timeout=60_000)
                page.locator("#plot-0 .scatterlayer .points path").first.wait_for(timeout=60_000)
            time.sleep(3)  # the other charts and tables finish drawing
            page.screenshot(path=args.out, full_page=True)
        finally:
            browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
