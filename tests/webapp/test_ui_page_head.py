"""webapp/ui/page_head.py: the dashboard's page runs IDLE_FRAMES_JS before any of Gradio's scripts (the idle CPU it
saves is measured in tests/webapp/test_ui_browser.py)."""

from __future__ import annotations

import requests

from webapp import ui
from webapp.ui.page_head import IDLE_FRAMES_JS, PROGRESS_POLL_S, QUEUE_POLL_S


def test_the_dashboards_page_runs_the_idle_script_first_and_its_queue_polls_slowly(tmp_path, monkeypatch):
    from aligner.processes import free_port

    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    app = ui.build_app("http://127.0.0.1:9", tmp_path)
    port = free_port()
    ui.launch(app, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        page = requests.get(f"http://127.0.0.1:{port}/", timeout=30)
        assert page.status_code == 200 and int(page.headers["content-length"]) == len(page.content)
        html = page.text
        head = html[html.index("<head>") : html.index("</head>")]
        first_script = head.index("<script")
        assert head[first_script:].startswith(f"<script>{IDLE_FRAMES_JS}</script>")
        assert head.count(IDLE_FRAMES_JS) == 1 and "gradio_config" in head[first_script + len(IDLE_FRAMES_JS) :]
        config = requests.get(f"http://127.0.0.1:{port}/config", timeout=30)
        assert config.status_code == 200 and IDLE_FRAMES_JS not in config.text  # only the page
        polls = (app._queue.sleep_when_free, app._queue.progress_update_sleep_when_free)
        assert polls == (QUEUE_POLL_S, PROGRESS_POLL_S)
    finally:
        app.close()
