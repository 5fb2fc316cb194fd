"""Reading back what logging.tensorboard / logging.mlflow wrote, with TensorBoard's and MLflow's own readers."""

from __future__ import annotations

from pathlib import Path

from aligner.run_layout import MLFLOW_DB_FILE, TENSORBOARD_DIR


def tensorboard_scalars(run_dir: Path, name: str):
    """([(step, value rounded to 6 places), ...] of scalar `name`, the loaded EventAccumulator)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    return [(e.step, round(e.value, 6)) for e in events.Scalars(name)], events


def mlflow_client(run_dir: Path):
    """A client of the run folder's default MLflow store."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{run_dir / MLFLOW_DB_FILE}")


def mlflow_history(client, run_id: str, name: str) -> list[tuple[int, float]]:
    """Every (step, value rounded to 6 places) MLflow keeps of metric `name`, sorted."""
    return sorted((m.step, round(m.value, 6)) for m in client.get_metric_history(run_id, name))
