"""aligner/trainers/run_log.py with tracking.py: metrics.jsonl, and the same metrics in TensorBoard and MLflow, read
back with their own readers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aligner.config import LoggingConfig
from aligner.errors import ConfigError
from aligner.run_layout import METRICS_FILE, MLFLOW_RUN_ID_FILE
from aligner.trainers.run_log import RunLog, read_jsonl
from aligner.trainers.tracking import require_packages
from tests.helpers.tracking import mlflow_client, mlflow_history, tensorboard_scalars

BOTH = LoggingConfig(tensorboard=True, mlflow=True)
PARAMS = {"run_dir": "runs/x", "optim": {"lr": 0.001, "betas": [0.9, 0.98]}, "reward": {"function_args": {"a-b": 1}}}


def log_steps(log, steps, scale=1.0):
    for step in steps:
        log.log_metrics(step, {"train_rollouts/rewards": scale * step / 10, "timers/generate": 0.5})


def test_metrics_and_params_reach_tensorboard_and_mlflow_and_a_resume_continues_them(tmp_path):
    """One store for the whole story (creating an MLflow SQLite store takes a second or two)."""
    first = RunLog(tmp_path, tracking=BOTH, params=PARAMS)
    log_steps(first, range(5))  # steps 3 and 4 are past the checkpoint the resume takes (step 2)
    first.close(finished=False)

    expected = [(s, s / 10) for s in range(5)]
    assert [(r["step"], r["train_rollouts/rewards"]) for r in read_jsonl(tmp_path / METRICS_FILE)] == expected
    shown, events = tensorboard_scalars(tmp_path, "train_rollouts/rewards")
    assert shown == expected
    assert [e.value for e in events.Scalars("timers/generate")] == [0.5] * 5
    (text,) = events.Tensors("config/text_summary")
    assert "| optim.lr | 0.001 |" in text.tensor_proto.string_val[0].decode()
    client = mlflow_client(tmp_path)
    run_id = (tmp_path / MLFLOW_RUN_ID_FILE).read_text().strip()
    assert mlflow_history(client, run_id, "train_rollouts/rewards") == expected
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.info.run_name == tmp_path.name  # stopped early: to be resumed
    assert run.data.params == {
        "run_dir": "runs/x",
        "optim.lr": "0.001",
        "optim.betas": "[0.9, 0.98]",
        "reward.function_args": '{"a-b": 1}',  # a key no MLflow name could carry: the dict stays one JSON param
    }

    changed = {**PARAMS, "optim": {**PARAMS["optim"], "lr": 0.002}}
    resumed = RunLog(tmp_path, resume_step=2, tracking=BOTH, params=changed)
    log_steps(resumed, [3, 4], scale=-1.0)
    resumed.close(finished=True)

    again = [(0, 0.0), (1, 0.1), (2, 0.2), (3, -0.3), (4, -0.4)]
    assert tensorboard_scalars(tmp_path, "train_rollouts/rewards")[0] == again  # each step once: the resumed launch's
    assert (tmp_path / MLFLOW_RUN_ID_FILE).read_text().strip() == run_id  # the same run goes on
    both_kept = sorted(again + [(3, 0.3), (4, 0.4)])
    assert mlflow_history(client, run_id, "train_rollouts/rewards") == both_kept
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["optim.lr"] == "0.001"
    assert run.data.tags["changed/optim.lr"] == "0.002" and run.data.tags["resumed_from_step"] == "2"

    # Started afresh in the same folder: TensorBoard from nothing, a new MLflow run.
    fresh = RunLog(tmp_path, tracking=BOTH, params=PARAMS)
    log_steps(fresh, [1], scale=2.0)
    fresh.close(finished=True)
    assert tensorboard_scalars(tmp_path, "train_rollouts/rewards")[0] == [(1, 0.2)]
    fresh_id = (tmp_path / MLFLOW_RUN_ID_FILE).read_text().strip()
    assert fresh_id != run_id and mlflow_history(client, fresh_id, "train_rollouts/rewards") == [(1, 0.2)]


def test_off_by_default_writes_nothing_and_imports_nothing(tmp_path):
    log = RunLog(tmp_path, tracking=LoggingConfig(), params=PARAMS)
    log_steps(log, range(2))
    log.close(finished=True)
    assert [p.name for p in tmp_path.iterdir()] == [METRICS_FILE]
    code = (
        "import sys, aligner.trainers.run_log, aligner.trainers.tracking, aligner.config; "
        "found = sorted({'tensorboard', 'mlflow', 'torch'} & sys.modules.keys()); print(found); sys.exit(bool(found))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_missing_package_is_a_config_error_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed: find_spec answers None
    require_packages(LoggingConfig(tensorboard=True))
    with pytest.raises(ConfigError, match=r"logging\.mlflow: true needs the `mlflow` package: pip install"):
        require_packages(BOTH)


def test_a_failing_sink_is_dropped_with_a_warning_and_the_run_goes_on(tmp_path, capsys):
    class Broken:
        name = "MLflow"

        def log_metrics(self, step, metrics):
            raise OSError("store gone")

    log = RunLog(tmp_path)
    log.sinks = [Broken()]
    log_steps(log, range(2))
    assert len(read_jsonl(tmp_path / METRICS_FILE)) == 2 and log.sinks == []
    (event,) = read_jsonl(log.events_path)
    assert event["level"] == "warning" and event["message"] == "MLflow logging stopped: OSError: store gone"
    assert "WARNING: MLflow logging stopped" in capsys.readouterr().err
