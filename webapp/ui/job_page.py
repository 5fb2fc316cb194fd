"""The Job page: the run's summary, its charts (plotly), the event log in words and the checkpoints (a row selected:
its zip to download).

It follows the job's event stream: each tick asks for the events after the last one it saw (GET
/jobs/{id}/events?timeout=0&last_event_id=N) and fetches the job and its checkpoints again only when new ones came,
so nothing redraws while nothing happens. Metrics are fetched whole once (a fresh page, another job, or a status
change, after which a retry or resume may have deleted steps); after that a `metrics` event fetches only the points
after the last step the page holds (GET /jobs/{id}/metrics?since_step=N) and appends them, so a tick costs the
new steps, not the job's whole history.

No `from __future__ import annotations` here: Gradio reads a handler's `gr.SelectData` hint as a class, not a string.
"""

import atexit
import contextlib
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from aligner.metrics import CHARTS
from webapp.ui.api import ApiError
from webapp.ui.catalogue import human_bytes
from webapp.ui.charts import line_chart, x_extent
from webapp.ui.frames import checkpoints_frame
from webapp.ui.job_view import (
    ACTIVE,
    GOLD_AXIS_TITLE,
    append_metrics,
    chart_notes,
    chart_revision,
    event_log,
    gold_series,
    job_charts,
    last_step,
    run_summary,
    waiting_message,
)
from webapp.ui.tabs import Session, job_id_of

NUM_PLOTS = len(CHARTS)  # a plot for each chart
MODEL_STATUS = "succeeded"  # a job writes its final policy when it reaches its last step
PICK_A_JOB = "Select a job on the Jobs tab (or type its id above)."
KEPT_EVENTS = ("metrics", "samples")  # not kept in the page's state: the charts and Samples show them


# Checkpoint zips the dashboard fetched for a browser, in one folder of this process: each is handed to Gradio (which
# copies it into its own cache, swept by `build_app`'s delete_cache), kept DOWNLOAD_MAX_AGE_S for that, then swept
# at the next download; the folder goes when the process exits.
DOWNLOAD_MAX_AGE_S = 600.0
_download_lock = threading.Lock()
_download_folder: list[Path] = []


def download_dir(now: float | None = None) -> Path:
    """This process's download folder (made at the first call, removed at exit), with the zips older than
    DOWNLOAD_MAX_AGE_S removed."""
    with _download_lock:
        if not _download_folder:
            folder = Path(tempfile.mkdtemp(prefix="aligner-ui-"))
            atexit.register(shutil.rmtree, folder, True)
            _download_folder.append(folder)
        folder = _download_folder[0]
    cutoff = (time.time() if now is None else now) - DOWNLOAD_MAX_AGE_S
    for old in folder.glob("*/*.zip"):
        try:
            if old.stat().st_mtime < cutoff:
                old.unlink()
        except FileNotFoundError:  # another download swept it first
            continue
        with contextlib.suppress(OSError):  # its folder, once empty (another download may be writing into it)
            old.parent.rmdir()
    return folder


def chart_figure(job: dict, title: str, frame: pd.DataFrame, y_title: str, smoothing: float, log_y: bool,
                 x_range: tuple[float, float], note: str = ""):  # fmt: skip
    """One chart of the job's: its gold rewards on their own right axis, its zoom kept across redraws, its note
    (job_view.chart_notes) under its title."""
    return line_chart(frame, title, y_title, smoothing, log_y, x_range, right=gold_series(frame),
                      right_title=GOLD_AXIS_TITLE, uirevision=chart_revision(job.get("id"), title),
                      note=note)  # fmt: skip


def download_target(name: str) -> Path:
    """Where to write a download the browser will see as `name`: a folder of its own in `download_dir()`, so that
    two downloads of one file never collide and the browser's copy keeps the plain name."""
    folder = download_dir() / secrets.token_hex(8)
    folder.mkdir()
    return folder / name


def draw(view: dict, smoothing: float, log_y: bool) -> list:
    """[charts message, each plot's update]: the charts that have data, in order; the others hidden."""
    job, body = view.get("job"), view.get("metrics") or {}
    if not job:
        return [gr.update(), *[gr.update() for _ in range(NUM_PLOTS)]]
    charts = job_charts(body)
    notes = chart_notes(body, job.get("config"))
    x_range = x_extent(job.get("max_steps"), last_step(body), job["status"] in ACTIVE)
    updates = [
        gr.update(value=chart_figure(job, title, frame, y_title, smoothing, log_y and log, x_range,
                                     notes.get(title, "")), visible=True)
        for title, frame, y_title, log in charts
    ]  # fmt: skip
    updates += [gr.update(value=None, visible=False)] * (NUM_PLOTS - len(updates))
    return ["" if charts else waiting_message(job), *updates]


def load(api, jid: int, view: dict) -> dict:
    """The page's state brought up to date: the new events, and the job, metrics and checkpoints again when they
    may have changed. `changed` says whether anything did."""
    same = view.get("job_id") == jid
    after = view.get("last_event", 0) if same else 0
    new = api.events(jid, after=after)
    if same and not new:
        return {**view, "changed": False}
    kinds = {e["kind"] for e in new}
    fresh = not same or "status" in kinds
    kept = [e for e in new if e["kind"] not in KEPT_EVENTS]
    updated: dict[str, Any] = {
        "job_id": jid,
        "last_event": new[-1]["id"] if new else after,
        "events": (view.get("events", []) if same else []) + kept,
        "job": api.get(f"/jobs/{jid}"),
        "metrics": follow_metrics(api, jid, None if fresh else view.get("metrics"), "metrics" in kinds),
        "checkpoints": (
            api.get(f"/jobs/{jid}/checkpoints") if fresh or "checkpoint" in kinds else view.get("checkpoints")
        ),
        "changed": True,
    }
    return updated


def follow_metrics(api, jid: int, held: dict | None, new_steps: bool) -> dict:
    """The job's metrics: all of them when none are `held` (None: start over), `held` itself while no `new_steps`
    came, else `held` with the points after its last step appended (since_step: the request costs the new steps)."""
    if held is not None and not new_steps:
        return held
    last = last_step(held) if held else None
    if last is None:
        return api.get(f"/jobs/{jid}/metrics")
    return append_metrics(held, api.get(f"/jobs/{jid}/metrics", since_step=last))


def job_page_tab(session: Session) -> None:
    """The selected job: summary, charts (those with data), smoothing and log scale, event log, checkpoints."""
    with gr.Tab("Job page", id="job") as tab:
        summary = gr.Markdown(PICK_A_JOB, elem_id="job-summary")
        with gr.Row():
            model_button = gr.Button(
                "Download model", elem_id="download-model", interactive=False, size="sm", scale=0, min_width=160
            )
            best_button = gr.Button("Download best policy", elem_id="download-best-model", size="sm", scale=0,
                                    min_width=180)  # fmt: skip
            model_file = gr.File(label="Policy zip", elem_id="model-file", interactive=False, visible=False)
            model_msg = gr.Markdown(elem_id="model-msg")
        with gr.Row():
            smoothing = gr.Slider(0, 0.99, value=0.0, step=0.01, label="Smoothing (EMA)", elem_id="smoothing")
            log_y = gr.Checkbox(value=True, label="Log scale for KL and losses (when all values > 0)", elem_id="log-y")
        charts_msg = gr.Markdown(elem_id="charts-msg")
        with gr.Row(equal_height=True):
            plots = [
                gr.Plot(visible=False, elem_id=f"plot-{i}", min_width=420, show_label=False) for i in range(NUM_PLOTS)
            ]
        with gr.Row():
            events_box = gr.Textbox(label="Event log (newest first)", lines=12, max_lines=20, elem_id="event-log")
            with gr.Column():
                checkpoints = gr.Dataframe(
                    value=checkpoints_frame({}),
                    interactive=False,
                    label="Checkpoints (select a row to download it)",
                    elem_id="checkpoints",
                )
                download = gr.File(label="Checkpoint zip", elem_id="ckpt-file", interactive=False, visible=False)
                download_msg = gr.Markdown(elem_id="ckpt-msg")
        view = gr.State({})

    downloads = [model_file, model_msg, download, download_msg]
    outputs = [summary, charts_msg, *plots, events_box, checkpoints, view, model_button, *downloads]

    def refresh_job_page(token: str, selected, state: dict, smooth: float, log: bool):
        jid = job_id_of(selected)
        state = state or {}
        if not token or jid is None:
            return [gr.skip()] * len(outputs)
        try:
            updated = load(session.api(token), jid, state)
        except ApiError as err:
            if err.status != 404 and state.get("job_id") == jid:  # the API away a moment: the page stays
                return [f"Job {jid}: {err.message}", *[gr.skip()] * (len(outputs) - 1)]
            if state.get("missing") == jid:
                return [gr.skip()] * len(outputs)
            words = f"Job {jid} does not exist or is not yours." if err.status == 404 else f"Job {jid}: {err.message}"
            return cleared(words, {"missing": jid})
        if not updated.pop("changed"):
            return [gr.skip()] * len(outputs)
        # Another job's downloads must not stay offered under this one.
        other_job = state.get("job_id") != jid
        files = [gr.update(value=None, visible=False), ""] * 2 if other_job else [gr.skip()] * len(downloads)
        return [
            run_summary(updated["job"], updated["metrics"] or {}, updated["events"]),
            *draw(updated, smooth, log),
            event_log(updated["events"]),
            checkpoints_frame(updated["checkpoints"] or {}),
            updated,
            gr.update(interactive=updated["job"]["status"] == MODEL_STATUS),
            *files,
        ]

    def cleared(words: str, state: dict) -> list:
        """The page emptied under `words`: nothing of the job shown before stays (its charts, events, checkpoints
        and downloads would read as this one's)."""
        hidden = gr.update(value=None, visible=False)
        return [words, "", *[hidden] * NUM_PLOTS, "", checkpoints_frame({}), state, gr.update(interactive=False),
                *[hidden, ""] * 2]  # fmt: skip

    def fetch_zip(token: str, path: str, name: str, what: str) -> tuple:
        """[file, message]: the zip the API sends at `path`, handed to the browser as `name`; `what` names it."""
        target = download_target(name)
        try:
            session.api(token).download(path, target)
        except ApiError as err:
            target.unlink(missing_ok=True)
            return gr.update(value=None, visible=False), f"{what} cannot be downloaded: {err.message}"
        return gr.update(value=str(target), visible=True), f"{what}: {human_bytes(target.stat().st_size)}"

    def download_model(token: str, state: dict):
        """[model file, message]: the job's final policy (GET /jobs/{id}/model), a zip of its Hugging Face folder."""
        jid = (state or {}).get("job_id")
        if not token or jid is None:
            return gr.update(), "Sign in and select a job first."
        name = f"job_{jid}_final_policy.zip"
        return fetch_zip(token, f"/jobs/{jid}/model", name, f"Final policy of job {jid} (a Hugging Face folder)")

    def download_best_model(token: str, state: dict):
        """[model file, message]: the job's best policy so far (GET /jobs/{id}/best_model): the policy of its best
        validation by trainer.best_metric, while it runs too; the API says when there is none yet."""
        jid = (state or {}).get("job_id")
        if not token or jid is None:
            return gr.update(), "Sign in and select a job first."
        name = f"job_{jid}_best_policy.zip"
        return fetch_zip(token, f"/jobs/{jid}/best_model", name, f"Best policy of job {jid} (a Hugging Face folder)")

    def redraw(state: dict, smooth: float, log: bool):
        return draw(state or {}, smooth, log)

    def download_checkpoint(token: str, state: dict, table: pd.DataFrame, evt: gr.SelectData):
        jid = (state or {}).get("job_id")
        row = evt.index[0] if isinstance(evt.index, list | tuple) else evt.index
        try:
            step = int(table.iloc[row]["step"])
        except (IndexError, KeyError, ValueError, TypeError):
            return gr.update(), "Select a checkpoint's row."
        if not token or jid is None:
            return gr.update(), "Sign in and select a job first."
        path, name = f"/jobs/{jid}/checkpoints/{step}/download", f"job_{jid}_step_{step:06d}.zip"
        return fetch_zip(token, path, name, f"Checkpoint of step {step} (to resume from)")

    inputs = [session.token, session.job_id, view, smoothing, log_y]
    session.every_tick(refresh_job_page, inputs, outputs, tab="job")
    session.follow_tab(tab, "job", refresh_job_page, inputs, outputs)
    session.job_id.change(refresh_job_page, inputs, outputs, show_progress="hidden")
    for control in (smoothing, log_y):
        control.change(redraw, [view, smoothing, log_y], [charts_msg, *plots], show_progress="hidden")
    checkpoints.select(download_checkpoint, [session.token, view, checkpoints], [download, download_msg])
    model_button.click(download_model, [session.token, view], [model_file, model_msg])
    best_button.click(download_best_model, [session.token, view], [model_file, model_msg])
