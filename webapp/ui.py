"""The dashboard: a Gradio app that is purely a client of the REST API (it reads no database and no run folder).

    aligner ui --api-url http://127.0.0.1:5000 [--port 7860] [--host 127.0.0.1] [--data-dir aligner_data]

`aligner up` starts it too and prints its URL. Sign in with an API token (`aligner token create --user NAME`); the
token lives in the browser session's state (a reload asks for it again) and goes with every request as
`Authorization: Bearer TOKEN`. Tabs:

- Jobs: your jobs (id, name, algorithm, status, step / max_steps, latest reward, age), refreshed every few seconds;
  cancel, resume or retry the selected job (click a row, or type its id).
- New job: the main knobs of a config (the algorithm, REINFORCE or PPO, and PPO's critic model), an advanced YAML
  editor merged under them, presets (the demo tiny model when DATA_DIR/demo_assets holds one); a 422 from the API is
  shown under the field it concerns.
- Job page: live line charts of GET /jobs/{id}/metrics (a PPO job's critic loss, value estimates, clip fraction and
  entropy too), status, the event log (a PPO job's critic server starting and stopping) and the checkpoints.
- Samples: the generations of a step (train / validation), filtered by step and reward range; one validation
  prompt followed across steps.
- Compare: one metric of several jobs on one chart, whatever their algorithms (the same names mean the same).

Everything shown is fetched from the API, so a reload loses nothing but the token. The pure helpers at the top
(API JSON -> pandas DataFrames, 422 errors -> form fields, form -> config) are tested without a browser.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import requests
import yaml

from aligner.errors import AlignerError

REFRESH_S = 2.0
TIMEOUT_S = 10
FINAL = ("succeeded", "failed", "cancelled")

# Form field -> (dotted path in the job body, label, kind). Kinds: text, int, float, choice (one of CHOICES).
FORM_FIELDS: dict[str, tuple[str, str, str]] = {
    "name": ("name", "Job name", "text"),
    "algorithm": ("config.algorithm", "Algorithm", "choice"),
    "critic_model_path": ("config.critic.model_path", "PPO: critic model (reward-model folder on the server)", "text"),
    "policy_path": ("config.model.policy_path", "Policy (Hugging Face folder on the server)", "text"),
    "train_file": ("config.data.train_file", "Train prompts (JSONL)", "text"),
    "val_file": ("config.data.val_file", "Validation prompts (JSONL)", "text"),
    "reward_server_url": ("config.reward.server_url", "Reward server URL", "text"),
    "reward_function": ("config.reward.function", "or reward function (module:callable)", "text"),
    "num_prompts_per_step": ("config.reinforce.num_prompts_per_step", "Prompts per step", "int"),
    "num_rollouts_per_prompt": ("config.reinforce.num_rollouts_per_prompt", "Rollouts per prompt", "int"),
    "kl_penalty": ("config.reinforce.initial_policy_kl_penalty", "KL penalty", "float"),
    "lr": ("config.optim.lr", "Learning rate", "float"),
    "max_steps": ("config.trainer.max_steps", "Max steps", "int"),
    "max_new_tokens": ("config.generation.max_new_tokens", "Max new tokens", "int"),
    "temperature": ("config.generation.temperature", "Temperature", "float"),
    "val_check_interval": ("config.trainer.val_check_interval", "Validation interval (steps)", "int"),
    "save_interval": ("config.trainer.save_interval", "Checkpoint interval (steps)", "int"),
}
ALGORITHMS = ["reinforce", "ppo"]
CHOICES: dict[str, list[str]] = {"algorithm": ALGORITHMS}
DEFAULTS: dict[str, Any] = {  # aligner/config.py's defaults
    "algorithm": "reinforce",
    "num_prompts_per_step": 8,
    "num_rollouts_per_prompt": 4,
    "kl_penalty": 0.01,
    "lr": 1e-6,
    "max_steps": 100,
    "max_new_tokens": 64,
    "temperature": 1.0,
    "val_check_interval": 10,
    "save_interval": 10,
}

# Charts of the job page: (title, metric names, y title). Several names share a chart, one colour each.
CHARTS: list[tuple[str, list[str], str]] = [
    ("Reward", ["train_rollouts/rewards", "val/rewards"], "reward"),
    ("Reward with KL penalty", ["train_rollouts/rewards_with_kl"], "reward - beta KL"),
    ("KL to the initial policy", ["train_rollouts/init_policy_kl"], "KL"),
    ("Loss", ["train_optim/loss"], "loss"),
    ("Grad norm", ["train_optim/grad_norm"], "grad norm"),
    ("Response length", ["train_rollouts/response_lengths", "val/response_lengths"], "tokens"),
    (
        "Fraction properly ended",
        ["train_rollouts/fraction_of_samples_properly_ended", "val/fraction_of_samples_properly_ended"],
        "fraction",
    ),
]
# A PPO job's charts, beside the ones above (aligner/ppo_trainer.py logs the shared metrics under the same names).
PPO_CHARTS: list[tuple[str, list[str], str]] = [
    ("Critic loss", ["train_optim/critic_loss"], "loss"),
    ("Value estimates", ["train_rollouts/values"], "value"),
    ("Clip fraction", ["train_optim/clip_fraction"], "fraction"),
    ("Entropy", ["train_optim/entropy"], "nats per token"),
]
TIMERS_PREFIX = "timers/"
TIMER_PHASES = ["generate", "logprobs", "init_logprobs", "reward", "critic_infer", "train", "critic_train", "validate"]
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def color_map(names: list[str]) -> dict[str, str]:
    """Fixed colours for a chart's series: Gradio 6.31 keeps the series of a plot's first data, so name them all."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


COMPARE_METRICS = [
    "train_rollouts/rewards",
    "train_rollouts/rewards_with_kl",
    "train_rollouts/init_policy_kl",
    "train_rollouts/response_lengths",
    "train_rollouts/fraction_of_samples_properly_ended",
    "train_optim/loss",
    "train_optim/grad_norm",
    "train_optim/lr",
    "val/rewards",
    "train_rollouts/values",
    "train_optim/critic_loss",
    "train_optim/clip_fraction",
    "train_optim/entropy",
]
JOB_COLUMNS = ["id", "name", "algorithm", "status", "step", "latest reward", "age"]
SAMPLE_COLUMNS = ["step", "split", "index", "prompt", "response", "reward", "kl", "advantage", "is_end"]
EVENT_KINDS_SHOWN = ("status", "checkpoint", "log")  # metrics and samples events are what the charts show


# ------------------------------------------------------------------------------------------------ the API
class ApiError(AlignerError, RuntimeError):
    """A refused or failed request: `status` (0: unreachable), the API's message and its per-field errors."""

    def __init__(self, status: int, message: str, errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors or {}


class Api:
    """The REST API at `base_url` (e.g. http://127.0.0.1:5000) as one user (`token`)."""

    def __init__(self, base_url: str, token: str):
        self.base = base_url.rstrip("/") + "/api/v1"
        self.headers = {"Authorization": f"Bearer {token}"}

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        try:
            response = requests.request(method, self.base + path, headers=self.headers, timeout=TIMEOUT_S, **kwargs)
        except requests.RequestException as err:
            raise ApiError(0, f"the API at {self.base} cannot be reached: {err}") from None
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {}
            message = body.get("message") if isinstance(body, dict) else None
            errors = body.get("errors") if isinstance(body, dict) else None
            raise ApiError(response.status_code, message or response.text[:300] or response.reason, errors)
        return response

    def get(self, path: str, **params) -> Any:
        return self.request("GET", path, params=params).json()

    def post(self, path: str, body: dict | None = None) -> Any:
        return self.request("POST", path, json=body).json()

    def events(self, job_id: int, batches: int = 20) -> list[dict]:
        """The job's events so far (the SSE stream read with timeout=0, 500 events a batch)."""
        events: list[dict] = []
        last = 0
        for _ in range(batches):
            text = self.request("GET", f"/jobs/{job_id}/events", params={"timeout": 0, "last_event_id": last}).text
            batch = parse_sse(text)
            events += batch
            if len(batch) < 500:
                break
            last = batch[-1]["id"]
        return events


def parse_sse(text: str) -> list[dict]:
    """Server-Sent Events text -> [{"id", "kind", "data"}] (comments and the retry field skipped)."""
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                key, _, value = line.partition(":")
                fields[key] = value.removeprefix(" ")
        if "data" in fields:
            try:
                data = json.loads(fields["data"])
            except ValueError:
                data = fields["data"]
            events.append({"id": int(fields.get("id", 0)), "kind": fields.get("event", "message"), "data": data})
    return events


# --------------------------------------------------------------------------------- JSON -> DataFrames, text
def age(created_at: str | None, now: dt.datetime | None = None) -> str:
    """`2026-11-22T19:00:00+00:00` -> "12 s", "5 min", "3 h", "2 d"."""
    if not created_at:
        return ""
    then = dt.datetime.fromisoformat(created_at)
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.UTC)
    seconds = max(0, int(((now or dt.datetime.now(dt.UTC)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def jobs_frame(page: dict, now: dt.datetime | None = None) -> pd.DataFrame:
    """GET /jobs -> one row per job: id, name, algorithm, status, step (as step/max_steps), latest reward, age."""
    rows = []
    for job in page.get("items", []):
        reward = job.get("latest_reward")
        rows.append(
            [
                job["id"],
                job["name"],
                job.get("algorithm") or job.get("kind") or "reinforce",
                job["status"],
                f"{job.get('step', 0)}/{job.get('max_steps', '?')}",
                "" if reward is None else f"{reward:+.4f}",
                age(job.get("created_at"), now),
            ]
        )
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def metrics_frame(body: dict, names: list[str] | None = None, strip_prefix: str = "") -> pd.DataFrame:
    """GET /jobs/{id}/metrics -> long format: step, value, series (the metric's name less `strip_prefix`)."""
    metrics = body.get("metrics", body) if isinstance(body, dict) else {}
    rows = []
    for name, points in metrics.items():
        if names is not None and name not in names:
            continue
        series = name.removeprefix(strip_prefix)
        rows += [(int(step), float(value), series) for step, value in points if value is not None]
    return series_frame(rows).sort_values(["series", "step"], ignore_index=True)


def series_frame(rows: list[tuple[int, float, str]] | None = None) -> pd.DataFrame:
    """step (int), value (float), series (str): typed even when empty, as the plots take their axis types from it."""
    frame = pd.DataFrame(rows or [], columns=["step", "value", "series"])
    return frame.astype({"step": "int64", "value": "float64", "series": "object"})


def timers_frame(body: dict) -> pd.DataFrame:
    """The timers/* metrics (seconds per step by phase: generate, logprobs, reward, train, ...)."""
    metrics = body.get("metrics", {})
    names = [name for name in metrics if name.startswith(TIMERS_PREFIX)]
    return metrics_frame(body, names, strip_prefix=TIMERS_PREFIX)


def job_charts(job: dict, body: dict) -> list[tuple[str, pd.DataFrame, bool]]:
    """(title, data, shown) of every chart of the job page, CHARTS then PPO_CHARTS: the PPO ones are shown for a PPO
    job (or any job that logged their metrics)."""
    metrics = body.get("metrics", {}) if isinstance(body, dict) else {}
    ppo_metrics = {name for _title, names, _y in PPO_CHARTS for name in names}
    is_ppo = job.get("algorithm") == "ppo" or bool(ppo_metrics & set(metrics))
    charts = [(title, metrics_frame(body, names), True) for title, names, _y in CHARTS]
    return charts + [(title, metrics_frame(body, names), is_ppo) for title, names, _y in PPO_CHARTS]


def plot_value(frame: pd.DataFrame) -> pd.DataFrame | None:
    """What a gr.LinePlot gets: None rather than an empty frame (one that drew nothing stays blank in Gradio 6.31)."""
    return frame if len(frame) else None


def compare_frame(bodies: dict[str, dict], metric: str) -> pd.DataFrame:
    """{label: GET /jobs/{id}/metrics body} -> one metric of each job: step, value, series (= the label)."""
    frames = []
    for label, body in bodies.items():
        frame = metrics_frame(body, [metric])
        frame["series"] = label
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else series_frame()


def samples_frame(page: dict) -> pd.DataFrame:
    """GET /jobs/{id}/samples -> one row per generation."""
    return pd.DataFrame(
        [[item.get(c) for c in SAMPLE_COLUMNS] for item in page.get("items", [])], columns=SAMPLE_COLUMNS
    )


def validation_prompts(items: list[dict]) -> list[str]:
    """The distinct prompts of validation samples, in order of first appearance."""
    return list(dict.fromkeys(i["prompt"] for i in items if i.get("split") == "validation"))


def prompt_history(items: list[dict], prompt: str | None) -> pd.DataFrame:
    """How the answer to one validation prompt changed: one row per step (step, response, reward, KL)."""
    rows = sorted(
        ([i["step"], i["response"], i["reward"], i.get("kl")] for i in items
         if i.get("split") == "validation" and i["prompt"] == prompt),
        key=lambda r: r[0],
    )  # fmt: skip
    return pd.DataFrame(rows, columns=["step", "response", "reward", "kl"])


def checkpoints_frame(body: dict) -> pd.DataFrame:
    return pd.DataFrame(
        [[c["step"], c["path"], c["created_at"]] for c in body.get("items", [])],
        columns=["step", "path", "created_at"],
    )


def job_summary(job: dict, num_steps_logged: int = 0) -> str:
    reward = job.get("latest_reward")
    algorithm = job.get("algorithm") or "reinforce"
    lines = [
        f"### Job {job['id']}: {job['name']} ({'PPO' if algorithm == 'ppo' else 'REINFORCE'})",
        f"**status** `{job['status']}` · **step** {job['step']}/{job['max_steps']}"
        + ("" if reward is None else f" · **latest reward** {reward:+.4f}")
        + f" · **attempts** {job.get('attempts', 0)} · **metrics logged for** {num_steps_logged} steps",
    ]
    if job.get("error"):
        lines.append(f"**error**\n```\n{job['error']}\n```")
    return "\n\n".join(lines)


def event_log(events: list[dict], last: int = 100) -> str:
    lines = []
    for event in [e for e in events if e["kind"] in EVENT_KINDS_SHOWN][-last:]:
        data = event["data"]
        text = json.dumps(data, separators=(", ", ": ")) if not isinstance(data, str) else data
        lines.append(f"#{event['id']} {event['kind']}: {text}")
    return "\n".join(lines) or "(no events yet)"


# ------------------------------------------------------------------------------ the form, and 422 errors
def _set(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def deep_merge(base: dict, over: dict) -> dict:
    """`over` merged into a copy of `base` (nested dicts merged, anything else replaced)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def build_job(values: dict[str, Any], advanced_yaml: str = "") -> dict:
    """The POST /jobs body: the advanced YAML (a config mapping) with the form's non-empty fields over it.

    A reward server URL in the form replaces any reward source of the YAML, and so does a reward function.
    Raises ValueError (naming the problem) when the YAML is not a mapping.
    """
    extra = yaml.safe_load(advanced_yaml or "") or {}
    if not isinstance(extra, dict):
        raise ValueError("the advanced YAML must be a mapping (e.g. `optim: {warmup_steps: 0}`)")
    extra.pop("run_dir", None)  # the server sets it
    form: dict[str, Any] = {}
    for key, (path, _label, kind) in FORM_FIELDS.items():
        value = values.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if kind == "int":
            value = int(value) if float(value).is_integer() else value
        elif kind == "float":
            value = float(value)
        else:
            value = str(value).strip()
        _set(form, path, value)
    config = form.get("config", {})
    if "reward" in config:  # one source only: the form's replaces the YAML's
        extra["reward"] = {
            k: v for k, v in extra.get("reward", {}).items() if k not in ("function", "model_path", "server_url")
        }
    return {"name": form.get("name", "job"), "config": deep_merge(extra, config)}


def field_errors(errors: dict[str, list[str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """A 422's `errors` -> (reasons by form field, reasons for the rest by dotted path).

    An error belongs to a field when its path is the field's, inside it, or a section holding it (e.g.
    `config.reward`, "give exactly one of ...", goes to both reward fields); the root `config` is not a section here.
    """
    by_field: dict[str, list[str]] = {}
    other: dict[str, list[str]] = {}
    for path, reasons in errors.items():
        reasons = reasons if isinstance(reasons, list) else [str(reasons)]
        owners = [
            key
            for key, (field_path, _label, _kind) in FORM_FIELDS.items()
            if path == field_path
            or path.startswith(field_path + ".")
            or (path != "config" and field_path.startswith(path + "."))
        ]
        for key in owners:
            by_field.setdefault(key, []).extend(reasons)
        if not owners:
            other.setdefault(path, []).extend(reasons)
    return by_field, other


def errors_markdown(errors: dict[str, list[str]]) -> str:
    """Every error listed with its field: `- **Learning rate** (config.optim.lr): reason`."""
    labels = {path: label for path, label, _kind in FORM_FIELDS.values()}
    lines = []
    for path, reasons in errors.items():
        label = labels.get(path)
        where = f"**{label}** (`{path}`)" if label else f"`{path}`"
        lines += [f"- {where}: {reason}" for reason in (reasons if isinstance(reasons, list) else [reasons])]
    return "\n".join(lines)


def form_from_config(config: dict) -> dict[str, Any]:
    """Form values from a config mapping (a preset): the inverse of build_job for the form's fields."""
    values: dict[str, Any] = {}
    for key, (path, _label, _kind) in FORM_FIELDS.items():
        node: Any = {"config": config}
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            values[key] = node
    return values


def presets(data_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Name -> {"form": values, "yaml": advanced YAML}. The demo tiny model when DATA_DIR/demo_assets has it."""
    found: dict[str, dict[str, Any]] = {"defaults": {"form": dict(DEFAULTS), "yaml": ""}}
    demo = data_dir / "demo_assets" / "reinforce.yaml" if data_dir else None
    if demo is not None and demo.is_file():
        from aligner.config import load_config

        try:
            config = load_config(demo).model_dump(mode="json")  # paths made absolute against the YAML's folder
        except Exception:  # a half-built or old demo folder: no preset rather than no dashboard
            config = None
        if config is not None:
            config.pop("run_dir", None)
            form = {**form_from_config(config), "name": "demo: tiny policy"}
            rest = copy.deepcopy(config)
            for path, _label, _kind in FORM_FIELDS.values():
                section, _, leaf = path.removeprefix("config.").partition(".")
                if leaf and isinstance(rest.get(section), dict):
                    rest[section].pop(leaf, None)
            found["demo tiny model"] = {"form": form, "yaml": yaml.safe_dump(rest, sort_keys=False)}
    return found


# ------------------------------------------------------------------------------------------------- the app
def build_app(api_url: str, data_dir: Path | None = None):
    import gradio as gr

    preset_map = presets(data_dir)
    empty = None  # an empty frame as a plot's first value keeps its later data from drawing (Gradio 6.31)

    def api_for(token: str | None) -> Api:
        if not token:
            raise ApiError(401, "sign in with your API token first")
        return Api(api_url, token)

    def job_id_of(value) -> int | None:
        try:
            number = int(value) if value not in (None, "") else None
        except (TypeError, ValueError):
            return None
        return number if number is not None and number >= 1 else None  # an empty gr.Number reads 0

    with gr.Blocks(title="Aligner") as app:
        token_state = gr.State("")
        gr.Markdown(f"# Aligner\nREINFORCE / RLOO and PPO training jobs at `{api_url}`")
        with gr.Row():
            token_box = gr.Textbox(
                label="API token",
                type="password",
                elem_id="token",
                scale=4,
                placeholder="aligner token create --user NAME",
            )
            sign_in = gr.Button("Sign in", elem_id="sign-in", scale=1)
            job_id = gr.Number(label="Selected job id", precision=0, elem_id="job-id", scale=1)
        signed = gr.Markdown("Not signed in.", elem_id="signed-in")
        timer = gr.Timer(REFRESH_S)

        with gr.Tabs():
            # ----------------------------------------------------------------------------------- Jobs
            with gr.Tab("Jobs", id="jobs"):
                jobs_table = gr.Dataframe(
                    value=pd.DataFrame(columns=JOB_COLUMNS),
                    interactive=False,
                    elem_id="jobs-table",
                    label="Your jobs (click a row to select it)",
                )
                with gr.Row():
                    cancel_btn = gr.Button("Cancel", elem_id="cancel", variant="stop")
                    resume_btn = gr.Button("Resume", elem_id="resume")
                    retry_btn = gr.Button("Retry", elem_id="retry")
                action_msg = gr.Markdown(elem_id="action-msg")

            # -------------------------------------------------------------------------------- New job
            with gr.Tab("New job", id="new"):
                preset = gr.Dropdown(list(preset_map), value="defaults", label="Preset", elem_id="preset")
                inputs: dict[str, Any] = {}
                errs: dict[str, Any] = {}
                defaults = preset_map["defaults"]["form"]
                groups = [
                    ["name", "policy_path"],
                    ["algorithm", "critic_model_path"],
                    ["train_file", "val_file"],
                    ["reward_server_url", "reward_function"],
                    ["num_prompts_per_step", "num_rollouts_per_prompt", "kl_penalty", "lr"],
                    ["max_steps", "max_new_tokens", "temperature"],
                    ["val_check_interval", "save_interval"],
                ]
                for group in groups:
                    with gr.Row():
                        for key in group:
                            _path, label, kind = FORM_FIELDS[key]
                            with gr.Column():
                                if kind == "choice":
                                    inputs[key] = gr.Dropdown(
                                        CHOICES[key], label=label, value=defaults.get(key), elem_id=f"f-{key}"
                                    )
                                elif kind == "text":
                                    inputs[key] = gr.Textbox(
                                        label=label, value=defaults.get(key, ""), elem_id=f"f-{key}"
                                    )
                                else:
                                    inputs[key] = gr.Number(
                                        label=label,
                                        value=defaults.get(key),
                                        precision=0 if kind == "int" else None,
                                        elem_id=f"f-{key}",
                                    )
                                errs[key] = gr.Markdown(elem_id=f"err-{key}", elem_classes="field-error")
                advanced = gr.Code(
                    label="Advanced config (YAML, merged under the fields above)",
                    language="yaml",
                    value="",
                    elem_id="advanced",
                )
                submit = gr.Button("Submit job", variant="primary", elem_id="submit")
                submit_msg = gr.Markdown(elem_id="submit-msg")

            # ------------------------------------------------------------------------------- Job page
            with gr.Tab("Job page", id="job"):
                summary = gr.Markdown("Select a job.", elem_id="job-summary")
                plots = []
                with gr.Row():
                    for i, (title, names, y_title) in enumerate(CHARTS + PPO_CHARTS):
                        plots.append(
                            gr.LinePlot(
                                empty,
                                x="step",
                                y="value",
                                color="series",
                                title=title,
                                y_title=y_title,
                                elem_id=f"plot-{i}",
                                color_map=color_map(names),
                                height=260,
                                min_width=360,
                                visible=i < len(CHARTS),  # PPO's charts appear for a PPO job
                            )
                        )
                    timers_plot = gr.LinePlot(
                        empty,
                        x="step",
                        y="value",
                        color="series",
                        title="Time per step",
                        y_title="seconds",
                        elem_id="plot-timers",
                        color_map=color_map(TIMER_PHASES),
                        height=260,
                        min_width=360,
                    )
                with gr.Row():
                    events_box = gr.Textbox(label="Event log", lines=10, max_lines=20, elem_id="event-log")
                    checkpoints = gr.Dataframe(
                        value=checkpoints_frame({}), interactive=False, label="Checkpoints", elem_id="checkpoints"
                    )

            # -------------------------------------------------------------------------------- Samples
            with gr.Tab("Samples", id="samples"):
                with gr.Row():
                    s_step = gr.Textbox(label="Step (empty: all)", elem_id="s-step")
                    s_split = gr.Radio(["all", "train", "validation"], value="all", label="Split", elem_id="s-split")
                    s_min = gr.Number(label="Min reward", elem_id="s-min")
                    s_max = gr.Number(label="Max reward", elem_id="s-max")
                    s_page = gr.Number(label="Page", value=1, precision=0, minimum=1, elem_id="s-page")
                samples_info = gr.Markdown(elem_id="samples-info")
                samples_table = gr.Dataframe(
                    value=samples_frame({}), interactive=False, wrap=True, elem_id="samples-table"
                )
                gr.Markdown("**Follow one validation prompt across steps**")
                follow = gr.Dropdown([], label="Validation prompt", elem_id="follow-prompt")
                follow_table = gr.Dataframe(
                    value=prompt_history([], None), interactive=False, wrap=True, elem_id="follow-table"
                )

            # -------------------------------------------------------------------------------- Compare
            with gr.Tab("Compare", id="compare"):
                with gr.Row():
                    c_jobs = gr.Textbox(label="Job ids (comma-separated)", elem_id="c-jobs")
                    c_metric = gr.Dropdown(
                        COMPARE_METRICS,
                        value=COMPARE_METRICS[0],
                        label="Metric",
                        allow_custom_value=True,
                        elem_id="c-metric",
                    )
                c_plot = gr.LinePlot(
                    empty, x="step", y="value", color="series", title="Compare", elem_id="plot-compare", height=360
                )
                c_msg = gr.Markdown(elem_id="c-msg")

        # ------------------------------------------------------------------------------------- handlers
        def do_sign_in(token: str):
            token = (token or "").strip()
            try:
                page = Api(api_url, token).get("/jobs", per_page=1)
            except ApiError as err:
                return "", f"Sign-in failed: {err.message}", gr.update()
            return token, f"Signed in ({page['total']} job(s) then).", refresh_jobs(token)

        def refresh_jobs(token: str):
            if not token:
                return gr.update()
            try:
                return jobs_frame(api_for(token).get("/jobs", per_page=100))
            except ApiError:
                return gr.update()

        def select_row(table: pd.DataFrame, evt: gr.SelectData):
            row = evt.index[0] if isinstance(evt.index, list | tuple) else evt.index
            try:
                return int(table.iloc[row]["id"])
            except (IndexError, KeyError, ValueError, TypeError):
                return gr.update()

        select_row.__annotations__["evt"] = gr.SelectData  # a real class: Gradio does not resolve string hints

        def action(kind: str):
            def run(token: str, selected):
                jid = job_id_of(selected)
                if jid is None:
                    return "Select a job first.", gr.update()
                try:
                    job = api_for(token).post(f"/jobs/{jid}/{kind}")
                except ApiError as err:
                    return f"{kind} job {jid}: {err.message}", gr.update()
                return f"Job {jid}: {kind} -> **{job['status']}**", refresh_jobs(token)

            return run

        def do_submit(token: str, advanced_yaml: str, *values):
            values_by_key = dict(zip(inputs, values, strict=True))
            clear = [""] * len(errs)
            try:
                body = build_job(values_by_key, advanced_yaml)
            except (ValueError, yaml.YAMLError) as err:
                return [f"**Not submitted**: {err}", gr.update(), *clear]
            try:
                job = api_for(token).post("/jobs", body)
            except ApiError as err:
                by_field, _other = field_errors(err.errors)
                per_field = ["⚠ " + "; ".join(by_field[k]) if k in by_field else "" for k in errs]
                listed = errors_markdown(err.errors)
                return [f"**Not submitted** ({err.status}): {err.message}\n\n{listed}", gr.update(), *per_field]
            return [f"Submitted **job {job['id']}** ({job['status']}).", job["id"], *clear]

        def apply_preset(name: str):
            chosen = preset_map.get(name, preset_map["defaults"])
            return [chosen["form"].get(k, "" if FORM_FIELDS[k][2] == "text" else None) for k in inputs] + [
                chosen["yaml"]
            ]

        def refresh_job_page(token: str, selected):
            jid = job_id_of(selected)
            nothing = [gr.update()] * (len(plots) + 4)
            if not token or jid is None:
                return nothing
            try:
                api = api_for(token)
                job = api.get(f"/jobs/{jid}")
                body = api.get(f"/jobs/{jid}/metrics")
                events = api.events(jid)
                ckpts = api.get(f"/jobs/{jid}/checkpoints")
            except ApiError as err:
                return [f"Job {jid}: {err.message}", *([gr.update()] * (len(plots) + 3))]
            steps = {s for name, points in body["metrics"].items() if name.startswith("train_") for s, _ in points}
            frames = [gr.update(value=plot_value(frame), visible=shown) for _t, frame, shown in job_charts(job, body)]
            return [
                job_summary(job, len(steps)),
                *frames,
                plot_value(timers_frame(body)),
                event_log(events),
                checkpoints_frame(ckpts),
            ]

        def refresh_samples(token: str, selected, step, split, min_reward, max_reward, page):
            jid = job_id_of(selected)
            if not token or jid is None:
                return gr.update(), gr.update()
            params: dict[str, Any] = {"per_page": 50, "page": job_id_of(page) or 1}
            if str(step or "").strip().isdigit():
                params["step"] = int(step)
            if split in ("train", "validation"):
                params["split"] = split
            if min_reward is not None:
                params["min_reward"] = min_reward
            if max_reward is not None:
                params["max_reward"] = max_reward
            try:
                result = api_for(token).get(f"/jobs/{jid}/samples", **params)
            except ApiError as err:
                return f"Samples of job {jid}: {err.message} {err.errors or ''}", gr.update()
            shown = len(result["items"])
            return f"Job {jid}: {result['total']} samples match; page {result['page']} shows {shown}.", samples_frame(
                result
            )

        def refresh_follow(token: str, selected, prompt: str | None):
            jid = job_id_of(selected)
            if not token or jid is None:
                return gr.update(), gr.update()
            items: list[dict] = []
            try:
                for page in range(1, 21):  # validation samples: a few per validation prompt and check
                    result = api_for(token).get(f"/jobs/{jid}/samples", split="validation", per_page=100, page=page)
                    items += result["items"]
                    if len(items) >= result["total"]:
                        break
            except ApiError:
                return gr.update(), gr.update()
            choices = validation_prompts(items)
            prompt = prompt if prompt in choices else (choices[0] if choices else None)
            return gr.update(choices=choices, value=prompt), prompt_history(items, prompt)

        def refresh_compare(token: str, ids: str, metric: str):
            wanted = [int(x) for x in (ids or "").replace(" ", ",").split(",") if x.strip().isdigit()]
            if not token or not wanted or not metric:
                return gr.update(), gr.update()
            bodies, problems = {}, []
            api = api_for(token)
            for jid in wanted:
                try:
                    job = api.get(f"/jobs/{jid}")
                    label = f"{jid}: {job['name']} ({job.get('algorithm', 'reinforce')})"
                    bodies[label] = api.get(f"/jobs/{jid}/metrics", name=metric)
                except ApiError as err:
                    problems.append(f"job {jid}: {err.message}")
            return plot_value(compare_frame(bodies, metric)), "; ".join(problems)

        sign_in.click(do_sign_in, [token_box], [token_state, signed, jobs_table])
        token_box.submit(do_sign_in, [token_box], [token_state, signed, jobs_table])
        timer.tick(refresh_jobs, [token_state], [jobs_table], show_progress="hidden")
        jobs_table.select(select_row, [jobs_table], [job_id])
        for button, kind in ((cancel_btn, "cancel"), (resume_btn, "resume"), (retry_btn, "retry")):
            button.click(action(kind), [token_state, job_id], [action_msg, jobs_table])
        preset.change(apply_preset, [preset], [*inputs.values(), advanced])
        submit.click(do_submit, [token_state, advanced, *inputs.values()], [submit_msg, job_id, *errs.values()])
        page_outputs = [summary, *plots, timers_plot, events_box, checkpoints]
        for trigger in (timer.tick, job_id.change):
            trigger(refresh_job_page, [token_state, job_id], page_outputs, show_progress="hidden")
        sample_inputs = [token_state, job_id, s_step, s_split, s_min, s_max, s_page]
        for trigger in (timer.tick, job_id.change, s_step.submit, s_split.change, s_page.change):
            trigger(refresh_samples, sample_inputs, [samples_info, samples_table], show_progress="hidden")
        for trigger in (timer.tick, job_id.change, follow.change):
            trigger(refresh_follow, [token_state, job_id, follow], [follow, follow_table], show_progress="hidden")
        for trigger in (timer.tick, c_jobs.submit, c_metric.change):
            trigger(refresh_compare, [token_state, c_jobs, c_metric], [c_plot, c_msg], show_progress="hidden")
    return app


CSS = ".field-error p { color: #c0392b; margin: 0; font-size: 0.9em; }"


def run(args: argparse.Namespace) -> None:
    """The `aligner ui` command: serve the dashboard until Ctrl-C."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home (and none possible offline)
    data_dir = Path(args.data_dir).expanduser().resolve() if args.data_dir else None
    app = build_app(args.api_url, data_dir)
    app.queue(default_concurrency_limit=8)
    app.launch(server_name=args.host, server_port=args.port, ssr_mode=False, css=CSS, footer_links=[], show_error=True)
