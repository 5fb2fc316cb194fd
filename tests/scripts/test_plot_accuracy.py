"""scripts/plot_accuracy.py: the validation curve read from metrics.jsonl, drawn as a PNG."""

import importlib.util
import json
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("plot_accuracy", ROOT / "scripts" / "plot_accuracy.py")
script = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(script)


def test_curve_has_each_validation_with_the_minutes_of_the_steps_before_it(tmp_path):
    rows = [
        {"step": 0, "val/rewards": 0.25},
        {"step": 1, "train_rollouts/rewards": 0.3, "timers/step": 30.0, "timers/train": 20.0},
        {"step": 2, "train_rollouts/rewards": 0.4, "timers/step": 60.0, "val/rewards": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert script.read_curve(tmp_path) == [(0, 0.0, 0.25), (2, 1.5, 0.5)]
    script.main([str(tmp_path), "--out", str(tmp_path / "curve.png")])
    assert Image.open(tmp_path / "curve.png").size == (script.WIDTH, script.HEIGHT)
