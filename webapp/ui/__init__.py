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

CSS = ".field-error p { color: #c0392b; margin: 0; font-size: 0.9em; }"


def build_app(api_url: str, data_dir: Path | None = None):
    """The dashboard (a gr.Blocks) for the API at `api_url`, with the presets found in `data_dir`."""
    # Gradio loads here, not at import: the helper modules and their tests do without it.
    import gradio as gr

    from webapp.ui import compare, job_page, jobs_tab, new_job, samples, tabs
    from webapp.ui.form import presets

    # Gradio keeps a copy of every file it serves (checkpoint zips): swept hourly of those older than an hour, and
    # removed when the dashboard stops.
    with gr.Blocks(title="Aligner", delete_cache=(3600, 3600)) as app:
        session, sign_in = tabs.header(api_url)
        with gr.Tabs():
            jobs_table = jobs_tab.jobs_tab(session)
            new_job.new_job_tab(session, presets(data_dir))
            job_page.job_page_tab(session)
            samples.samples_tab(session)
            compare.compare_tab(session)
            tabs.catalogue_tab(session)
        tabs.wire_sign_in(session, sign_in, jobs_table)
    return app


def run(args: argparse.Namespace) -> None:
    """The `aligner ui` command: serve the dashboard until Ctrl-C."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home (and none possible offline)
    data_dir = Path(args.data_dir).expanduser().resolve() if args.data_dir else None
    app = build_app(args.api_url, data_dir)
    app.queue(default_concurrency_limit=8)
    app.launch(server_name=args.host, server_port=args.port, ssr_mode=False, css=CSS, footer_links=[], show_error=True)
