"""The metric registry (aligner/metrics.py): the names users see stay as they are, what the trainers log is all in it,
no product file spells a name of its own, the charts it describes hang together, and it loads without torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aligner import metrics
from aligner.metrics import CHART_ORDER, CHARTS, COMPARE_METRICS, GOLD_REWARD_PREFIX, names, spec
from aligner.run_layout import METRICS_FILE
from aligner.trainers.run_log import read_jsonl
from tests.helpers.training import train

ROOT = Path(__file__).resolve().parents[2]
# The names as metrics.jsonl, TensorBoard, MLflow, the API and users' scripts know them: a rename must be on purpose.
USER_VISIBLE = [
    "train_rollouts/rewards",
    "train_rollouts/rewards_with_kl",
    "train_rollouts/rewards_with_kl_sum",
    "train_rollouts/init_policy_kl",
    "train_rollouts/baseline",
    "train_rollouts/response_lengths",
    "train_rollouts/fraction_of_samples_properly_ended",
    "train_optim/loss",
    "train_optim/grad_norm",
    "train_optim/lr",
    "train_optim/importance_weight",
    "train_optim/importance_weight_capped",
    "val/rewards",
    "val/response_lengths",
    "val/fraction_of_samples_properly_ended",
    "val/pass@1",
    "val/pass@k",
    "val/mean@k",
    "train_rollouts/values",
    "train_rollouts/returns",
    "train_optim/critic_loss",
    "train_optim/critic_warmup",
    "train_optim/clip_fraction",
    "train_optim/clip_fraction_low",
    "train_optim/clip_fraction_high",
    "train_optim/ratio_mean",
    "train_optim/ratio_min",
    "train_optim/ratio_max",
    "train_rollouts/mismatch_kl",
    "train_rollouts/mismatch_ppl_ratio",
    "train_rollouts/rollout_corrected",
    "train_optim/entropy",
    "train_rollouts/entropy",
    "train_rollouts/reward_length_corr",
    "train_rollouts/frac_zero_std_groups",
    "train_rollouts/dropped_groups",
    "train_rollouts/sampling_rounds",
    "train_rollouts/overlong_penalty",
    "throughput/tokens_per_s",
    "throughput/samples_per_s",
    "timers/generate",
    "timers/generate_wait",
    "timers/logprobs",
    "timers/init_logprobs",
    "timers/reward",
    "timers/critic_infer",
    "timers/train",
    "timers/critic_train",
    "timers/refit",
    "timers/validate",
    "timers/step",
    "timers/wall",
    "memory/peak_gb",
    "memory/refit_peak_gb",
    "train/loss",
    "train/accuracy",
    "train/margin",
    "train/grad_norm",
    "train/lr",
    "val/loss",
    "val/accuracy",
    "val/margin",
]


def test_the_names_users_see_are_unchanged():
    assert names() == USER_VISIBLE
    assert metrics.gold_reward("rule") == "val/extra_rewards/rule"


def logged_keys(run_dir: Path) -> set[str]:
    return {key for row in read_jsonl(run_dir / METRICS_FILE) for key in row} - {"step"}


def unregistered(keys: set[str], by: str) -> set[str]:
    """The keys that are not the registry's, or not registered as logged by trainer `by`."""
    return {key for key in keys if spec(key) is None or by not in spec(key).by}


@pytest.mark.parametrize("trainer", [{}, {"async_rollouts": 1}], ids=["sync", "async"])
def test_every_metric_a_reinforce_run_logs_is_in_the_registry(run_config, trainer):
    gold = {"varied": {"function": "tests.helpers.rewards:varied_reward"}}
    config = run_config(
        trainer={"max_steps": 2, "val_check_interval": 1, "save_interval": 10, **trainer},
        validation={"extra_rewards": gold, "num_samples_per_prompt": 2},
    )
    keys = logged_keys(train(config).run_dir)
    assert {metrics.TRAIN_REWARD, metrics.VAL_REWARD, metrics.gold_reward("varied"), metrics.TIMER_STEP} <= keys
    assert {metrics.VAL_PASS_AT_1, metrics.VAL_PASS_AT_K, metrics.VAL_MEAN_AT_K} <= keys
    if trainer:
        assert {metrics.IMPORTANCE_WEIGHT, metrics.TIMER_GENERATE_WAIT} <= keys
    assert unregistered(keys, metrics.REINFORCE) == set()


def test_every_metric_the_reward_model_trainer_logs_is_in_the_registry(tmp_path, tiny_policy_dir):
    from aligner.config import config_from_dict
    from aligner.trainers.reward_model import RM_PATH_FIELDS, RewardModelTrainConfig, train_reward_model

    words = ("dog", "sea", "song")
    pairs = [{"prompt": "the cat", "chosen": f"a happy {w}.", "rejected": f"a sad {w}."} for w in words]
    for name in ("train", "val"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    config = config_from_dict(
        {
            "output_dir": str(tmp_path / "rm"),
            "model": {"init_path": str(tiny_policy_dir), "device": "cpu"},
            "data": {"train_file": str(tmp_path / "train.jsonl"), "val_file": str(tmp_path / "val.jsonl")},
            "optim": {"batch_size": 2, "warmup_steps": 0},
            "trainer": {"max_steps": 1, "val_check_interval": 1, "progress_bar": False},
        },
        schema=RewardModelTrainConfig,
        path_fields=RM_PATH_FIELDS,
    )
    keys = logged_keys(train_reward_model(config))
    assert {metrics.RM_TRAIN_LOSS, metrics.RM_VAL_ACCURACY} <= keys
    assert unregistered(keys, metrics.REWARD_MODEL) == set()


def test_no_product_file_spells_a_registered_name():
    """A name spelled outside the registry goes stale silently when the registry's changes: a registered name in
    quotes, or a string that starts with a family's prefix (an f-string making a gold reward's or a timer's name)."""
    spelled = "|".join(map(re.escape, names()))
    prefixes = "|".join(map(re.escape, [GOLD_REWARD_PREFIX, *metrics.MACHINE_PREFIXES]))
    quoted = re.compile(rf"""["']({spelled})["']|["']({prefixes})""")
    found = []
    for folder in ("aligner", "webapp", "worker", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "aligner" / "metrics.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found += [f"{path.relative_to(ROOT)}:{number}: {m.group()}" for m in quoted.finditer(line)]
    assert found == []


def test_the_charts_hang_together():
    assert [c.title for c in CHARTS] == list(CHART_ORDER)
    for chart in CHARTS:
        members = [spec(name) for name in chart.metrics]
        assert members and {(s.unit, s.log) for s in members} == {(chart.unit, chart.log)}, chart.title
    assert {s.chart for s in map(spec, names()) if s.chart} == set(CHART_ORDER)
    assert [c.title for c in CHARTS if metrics.VAL_REWARD in c.metrics] == ["Reward"]
    assert metrics.chart_of(metrics.gold_reward("rule")) == "Reward"  # gold rewards join the Reward chart
    assert metrics.chart_of(metrics.LR) is None and metrics.chart_of("no/such_metric") is None
    assert spec(GOLD_REWARD_PREFIX) is None and spec("train_rollouts/no_such_metric") is None
    assert COMPARE_METRICS[0] == metrics.TRAIN_REWARD and set(COMPARE_METRICS) <= set(names())


def test_the_registry_imports_without_torch():
    """The worker and the dashboard read it: torch (and transformers) must not come with it."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = sys.modules['transformers'] = None\n"
        "import aligner.metrics\n"
        "print(sorted(m for m in ('torch', 'transformers', 'numpy', 'pydantic', 'yaml') if sys.modules.get(m)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
