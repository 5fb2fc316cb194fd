"""The run's metrics in TensorBoard and MLflow too, beside metrics.jsonl (`logging` section; the `tracking` extra:
pip install 'aligner[tracking]'). `RunLog` (run_log.py) hands every `log_metrics` call to the sinks opened here, on
rank 0 only, under the same names (`train_rollouts/rewards`: the slash groups the charts in both UIs).

- `logging.tensorboard`: event files in <run_dir>/tensorboard/, the flattened config as a text table at the step a
  launch starts from. Open with `tensorboard --logdir <run_dir>/tensorboard`.
- `logging.mlflow`: one MLflow run per run folder, its id kept in <run_dir>/mlflow_run_id; the flattened config as
  its params, the metrics with their step. The store is `logging.mlflow_tracking_uri`, by default an SQLite file in
  the run folder, sqlite:///<run_dir>/mlflow.db: MLflow 3 keeps the plain file store (./mlruns) in maintenance mode
  and refuses it unless MLFLOW_ALLOW_FILE_STORE=true is set, and recommends SQLite for local use.

Resume (from the checkpoint of step N): TensorBoard purges what an earlier launch wrote for steps after N (a start
event at N + 1, SummaryWriter's `purge_step`), so each step is shown once, as metrics.jsonl keeps it. MLflow continues
the same run; its metric history is append-only, so a step after N that an earlier launch logged is logged again and
MLflow keeps both points (the charts show the later one at that step, the history both). Params are logged when the
run is created; on resume new keys are added and a changed value is recorded as the tag `changed/<key>`.

tensorboard and mlflow are imported only when switched on: `aligner train` and the service's worker never pay for them.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aligner.errors import ConfigError
from aligner.run_layout import MLFLOW_DB_FILE, MLFLOW_RUN_ID_FILE, TENSORBOARD_DIR

if TYPE_CHECKING:
    from aligner.config import LoggingConfig

INSTALL = "pip install 'aligner[tracking]'"
PARAM_VALUE_CHARS = 6000  # MLflow's limit on a param's value
PARAMS_PER_BATCH = 100  # MLflow's limit on params (and tags) in one log_batch
_SECTION_KEY = re.compile(r"[A-Za-z0-9_]+")  # keys a dict is flattened by; others (function_args) stay JSON


def require_packages(config: LoggingConfig) -> None:
    """A ConfigError naming the install command when a switched-on sink's package is missing (nothing imported)."""
    for field, module in (("tensorboard", "tensorboard"), ("mlflow", "mlflow")):
        if getattr(config, field) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"logging.{field}: true needs the `{module}` package: {INSTALL}")


def flatten_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"optim.lr": "0.001", "model.lora.target_modules": '["q_proj", ...]', ...}: a config dump as flat strings."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and all(_SECTION_KEY.fullmatch(str(k)) for k in value):
            flat.update(flatten_params(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[name] = text if len(text) <= PARAM_VALUE_CHARS else text[: PARAM_VALUE_CHARS - 3] + "..."
    return flat


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _markdown_table(params: dict[str, str]) -> str:
    rows = "".join(f"| {k} | {v.replace('|', chr(92) + '|')} |\n" for k, v in params.items())
    return "| key | value |\n|---|---|\n" + rows


class TensorBoardSink:
    name = "TensorBoard"

    def __init__(self, folder: Path, resume_step: int | None, params: dict[str, str]):
        from torch.utils.tensorboard import SummaryWriter

        if resume_step is None:
            shutil.rmtree(folder, ignore_errors=True)  # a run started afresh: as metrics.jsonl, from nothing
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(str(folder), purge_step=purge)
        self.writer.add_text("config", _markdown_table(params), global_step=resume_step or 0)
        self.writer.flush()

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in _numbers(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a step's events on disk at once: TensorBoard follows the run live, a crash loses none

    def close(self, status: str) -> None:
        self.writer.close()


class MlflowSink:
    name = "MLflow"

    def __init__(
        self,
        run_dir: Path,
        resume_step: int | None,
        params: dict[str, str],
        experiment: str,
        tracking_uri: str | None,
    ):
        from mlflow.entities import Param, RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        default_store = tracking_uri is None
        uri = f"sqlite:///{(run_dir / MLFLOW_DB_FILE).resolve()}" if default_store else tracking_uri
        run_dir.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            # mlflow's SQLAlchemy store uses a loader option SQLAlchemy 2.1 deprecates: harmless, not the user's.
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"mlflow\.")
            db_log = logging.getLogger("mlflow.store.db.utils")  # "Creating initial MLflow database tables..."
            level = db_log.level
            db_log.setLevel(logging.WARNING)
            try:
                self.client = MlflowClient(tracking_uri=uri)
            finally:
                db_log.setLevel(level)
            found = self.client.get_experiment_by_name(experiment)
            if found is not None:
                experiment_id = found.experiment_id
            else:
                # In the run folder's own store artifacts stay in the run folder too (none are logged today).
                location = (run_dir / "mlartifacts").resolve().as_uri() if default_store else None
                experiment_id = self.client.create_experiment(experiment, artifact_location=location)

        id_path = run_dir / MLFLOW_RUN_ID_FILE
        self.run_id = None
        if resume_step is not None and id_path.is_file():
            run_id = id_path.read_text().strip()
            try:
                run = self.client.get_run(run_id)
                if run.info.lifecycle_stage == "active":
                    self.run_id = run_id
            except MlflowException:  # another store (tracking URI changed) or a deleted run: a new run
                pass
        if self.run_id is None:
            run = self.client.create_run(experiment_id, run_name=run_dir.name)
            self.run_id = run.info.run_id
            id_path.write_text(self.run_id + "\n")
            new, tags = params, {}
        else:
            self.client.update_run(self.run_id, status="RUNNING")
            logged = run.data.params
            new = {k: v for k, v in params.items() if k not in logged}
            # Params cannot change in MLflow: a value changed for this launch is kept as a tag.
            tags = {f"changed/{k}": v for k, v in params.items() if k in logged and logged[k] != v}
            tags["resumed_from_step"] = str(resume_step)
        items = [Param(k, v) for k, v in new.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start : start + PARAMS_PER_BATCH])
        tag_items = [RunTag(k, v) for k, v in tags.items()]
        for start in range(0, len(tag_items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=tag_items[start : start + PARAMS_PER_BATCH])
        # A run that dies without `close` (an exception ends the trainer) is marked failed rather than left running.
        atexit.register(self.close, "FAILED")

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in _numbers(metrics).items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self, status: str) -> None:
        """End the run: FINISHED, KILLED (stopped early; a resume continues it) or FAILED. Idempotent."""
        atexit.unregister(self.close)
        if self.run_id is not None:
            run_id, self.run_id = self.run_id, None
            try:
                self.client.set_terminated(run_id, status=status)
            except Exception as err:  # at exit, or with the store gone: say so, end anyway
                print(f"WARNING: could not end the MLflow run {run_id}: {err}", file=sys.stderr)


def open_sinks(
    run_dir: Path, config: LoggingConfig, resume_step: int | None, params: dict[str, Any]
) -> list[TensorBoardSink | MlflowSink]:
    """The sinks `config` switches on, each opened for a launch starting after `resume_step` (None: from nothing)."""
    if not (config.tensorboard or config.mlflow):
        return []
    require_packages(config)
    flat = flatten_params(params)
    sinks: list[TensorBoardSink | MlflowSink] = []
    if config.tensorboard:
        sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR, resume_step, flat))
    if config.mlflow:
        sinks.append(MlflowSink(run_dir, resume_step, flat, config.mlflow_experiment, config.mlflow_tracking_uri))
    return sinks
