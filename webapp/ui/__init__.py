"""The dashboard: a Gradio app that is purely a client of the REST API (it reads no database and no run folder).

    aligner ui --api-url http://127.0.0.1:5000 [--port 7860] [--host 127.0.0.1] [--data-dir aligner_data]

`aligner up` starts it too and prints its URL. Sign in with an API token (`aligner token create --user NAME`); the
token lives in the browser session's state (a reload asks for it again) and goes with every request as
`Authorization: Bearer TOKEN`. A token the API rejects (401) is dropped at once ("token rejected: sign in again")
rather than sent again on every refresh: failed sign-ins from one address are throttled (429). Tabs:

- Jobs: your jobs (the selected one marked, status, health alarms, step / max_steps, latest reward, age), refreshed
  every few seconds; cancel (after a confirmation), resume or retry the selected job (click a row, or type its id),
  each enabled only when the API lists it among the job's `actions`.
- New job: drop-downs filled from the catalogue at sign-in (and by Refresh lists): the policy (and a tokenizer), the
  train and validation datasets (yours and the shared ones; a JSONL file uploaded from the form is picked at once),
  the reward (a reward function with its JSON arguments and the help of a built-in's parameters, a reward model or a
  reward server) and, for PPO, the critic (a model or a server); the main knobs of a config, a short advanced YAML
  of the sections that apply (sent as shown, merged under them), presets (aligner.config's defaults, and the demo's
  runs naming the entries `aligner up --demo` registers when DATA_DIR/demo_assets holds its configs). "Try the
  reward" scores a few prompts' samples with the form's config (POST /rewards/try: groups, spread, length
  correlation, warnings); "Check (dry run)" lists the API's preflight checks and the estimated step time. The job
  names catalogue entries, never paths; an API error shows under the one field it names, until that field changes.
- Job page: the run's summary (best validation, change in reward, speed, time left, alarms), plotly charts of
  GET /jobs/{id}/metrics (those with data; integer steps, one x range, smoothing, log scale for KL and losses), the
  event log in words and the checkpoints (a row selected: its zip). It follows the job's event stream and redraws
  only when new events came.
- Samples: the generations filtered by step, split and reward range (blank: no bound), readable (chat markup
  stripped, numbers rounded) with a prompt's rollouts together and their group's mean reward, or one row per group;
  one validation prompt followed across steps, two steps' answers shown with a word diff.
- Compare: jobs picked from your list; one metric of each on one chart, whatever their algorithms, their config
  differences, a warning when their rewards are on different scales, and their answers to one validation prompt at
  one step side by side.
- Catalogue (admins only, GET /me): the models, reward functions and servers jobs may use, and the datasets the
  admin sees; register or remove an entry, share or unshare a dataset. The API's refusals are shown as it gives
  them (message and each field's reason).

Everything shown is fetched from the API, so a reload loses nothing but the token. Modules: `api` (the REST client),
`frames` (API JSON -> pandas DataFrames and text), `form` (the New job form: defaults, presets, form -> job body,
422 errors -> fields), `catalogue` (drop-down choices and labels, the Catalogue tab's tables and actions), `job_view`
(the Job page's summary and event log, the actions that apply, Compare's differences), `charts` (plotly figures),
all tested without a browser; `tabs` (the session, the sign-in header and the Catalogue tab), `jobs_tab`,
`job_page`, `compare`, `new_job` and `samples` (the Gradio layout of those tabs and the handlers they wire; the
Samples tab's tables and diff are tested without a browser).
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

    with gr.Blocks(title="Aligner") as app:
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
