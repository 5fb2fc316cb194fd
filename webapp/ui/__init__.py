"""The dashboard: a Gradio app that is purely a client of the REST API (it reads no database and no run folder).

    aligner ui --api-url http://127.0.0.1:5000 [--port 7860] [--host 127.0.0.1] [--data-dir aligner_data]

What each tab shows and does is docs/service.md "Dashboard". The contract: everything shown is fetched from the API
with the signed-in token (kept in the browser session's state only, dropped at the first 401), so a reload loses
nothing but the token; buttons follow what the API says applies (a job's `actions`); an API error shows under the
field it names. Modules: `api` (the REST client), `frames` (API JSON -> DataFrames and text), `form` (the New job
form), `catalogue`, `job_view` (the Job page's summary and event log, Compare's differences) and `charts`, all
tested without a browser; `tabs`, `jobs_tab`, `job_page`, `compare`, `new_job` and `samples` lay out the Gradio tabs
and wire their handlers.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from webapp.private import private_files

CSS = ".field-error p { color: #c0392b; margin: 0; font-size: 0.9em; }"


def build_app(api_url: str, data_dir: Path | None = None):
    """The dashboard (a gr.Blocks) for the API at `api_url`, with the presets found in `data_dir`."""
    # Gradio loads here, not at import: the helper modules and their tests do without it.
    import gradio as gr

    from webapp.ui import compare, job_page, jobs_tab, new_job, samples, tabs
    from webapp.ui.form import presets

    # Gradio keeps every upload and every file it serves (checkpoint zips) in its cache: files an hour old go,
    # hourly, and the rest when the dashboard stops (a dataset is posted to the API at once).
    with gr.Blocks(title="Aligner", delete_cache=(3600, 3600)) as app:
        session, sign_in = tabs.header(api_url)
        with gr.Tabs():
            jobs_table = jobs_tab.jobs_tab(session)
            new_job.new_job_tab(session, presets(data_dir))
            job_page.job_page_tab(session)
            samples.samples_tab(session)
            compare.compare_tab(session)
            tabs.catalogue_tab(session)
        session.wire_ticks()
        tabs.wire_sign_in(session, sign_in, jobs_table)
    return app


def launch(app, host: str, port: int, **kwargs):
    """Serve the dashboard `app` (build_app's) on `host`:`port`; `kwargs` go to Gradio's launch.

    Gradio's `/gradio_api/upload` takes files from anyone who reaches the dashboard, signed in or not (its only
    sign-in is its own `auth`, which the dashboard does not use: it signs in with API tokens): each file is capped
    at ALIGNER_MAX_UPLOAD_BYTES (413 past it), the API's own cap on a dataset. Idle, the page and the server cost
    next to nothing (webapp/ui/page_head.py).
    """
    from starlette.middleware import Middleware

    from webapp.settings import service_settings
    from webapp.ui.charts import KEEP_ZOOM_JS
    from webapp.ui.page_head import IDLE_FRAMES_JS, HeadScript, quiet_queue

    app.queue(default_concurrency_limit=8)
    quiet_queue(app)
    head_first = [Middleware(HeadScript, script=IDLE_FRAMES_JS)]
    return app.launch(server_name=host, server_port=port, ssr_mode=False, css=CSS, js=KEEP_ZOOM_JS, footer_links=[],
                      show_error=True, max_file_size=service_settings().max_upload_bytes,
                      app_kwargs={"middleware": head_first}, **kwargs)  # fmt: skip


def run(args: argparse.Namespace) -> None:
    """The `aligner ui` command: serve the dashboard until Ctrl-C."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home (and none possible offline)
    private_files()  # the downloads it keeps for the browser are its user's only (webapp/private.py)
    data_dir = Path(args.data_dir).expanduser().resolve() if args.data_dir else None
    launch(build_app(args.api_url, data_dir), args.host, args.port)
