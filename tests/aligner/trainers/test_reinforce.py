import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from aligner import metrics
from aligner.cli import main
from aligner.errors import AlignerError, PromptDataError, RunDirError
from aligner.run_layout import (
    CHECKPOINT_DIR,
    EVENTS_FILE,
    MANIFEST_FILE,
    MLFLOW_DB_FILE,
    MLFLOW_RUN_ID_FILE,
    STATE_FILE,
    TENSORBOARD_DIR,
    RunEnd,
    checkpoint_name,
    checkpoint_problem,
    list_checkpoints,
    read_end,
)
from aligner.trainers.policy_backends import HfBackend
from aligner.trainers.reinforce import ReinforceTrainer
from aligner.trainers.run_log import read_jsonl
from aligner.trainers.schedule import lr_multiplier
from tests.helpers.checkpoints import tear
from tests.helpers.rewards import letter_reward, varied_reward
from tests.helpers.tracking import mlflow_client, mlflow_history, tensorboard_scalars
from tests.helpers.training import train

NEMO_METRICS = [
    metrics.TRAIN_REWARD,
    metrics.TRAIN_REWARD_WITH_KL,
    metrics.INIT_POLICY_KL,
    metrics.BASELINE,
    metrics.TRAIN_RESPONSE_LENGTH,
    metrics.TRAIN_PROPERLY_ENDED,
    metrics.LOSS,
    metrics.GRAD_NORM,
    metrics.LR,
    metrics.TIMER_GENERATE,
    metrics.TIMER_LOGPROBS,
    metrics.TIMER_INIT_LOGPROBS,
    metrics.TIMER_REWARD,
    metrics.TIMER_TRAIN,
    metrics.TIMER_STEP,
    metrics.TOKENS_PER_S,
    metrics.SAMPLES_PER_S,
]


def without_timers(rows):
    return [{k: v for k, v in row.items() if not k.startswith(metrics.MACHINE_PREFIXES)} for row in rows]


def test_two_steps_resume_two_steps_equals_four_steps(run_config, capsys):
    """... and the resume goes past damaged newer checkpoints: step 3 torn (its manifest tells), step 4 from an older
    version (no manifest) whose state cannot be loaded. Both are set aside with a warning; step 2 is taken. With two
    optimiser steps per rollout, log-probs in micro-batches of their own size, and a constant LR phase."""
    knobs = {
        "reinforce": {"num_mini_batches": 2},
        "optim": {"logprob_micro_batch_size": 2},
        "sched": {"constant_steps": 1},
    }
    straight = train(run_config("straight", **knobs))
    # With TensorBoard and MLflow on: both follow the resume (tests/aligner/trainers/test_run_log.py has the details).
    interrupted = run_config("resumed", logging={"tensorboard": True, "mlflow": True}, **knobs)
    first = train(interrupted, until_step=2)
    assert first.step == 2 and not first.final_policy_dir.exists()
    stopped = "stopped at step 2 of 4 on request; continue with --resume"
    assert read_end(first.run_dir) == first.end == RunEnd("stopped", 2, 4, stopped)
    two = first.run_dir / CHECKPOINT_DIR / "step_000002"
    assert checkpoint_problem(two) is None and (two / MANIFEST_FILE).is_file()
    torn = shutil.copytree(two, two.with_name("step_000003"))
    tear(torn / STATE_FILE)
    unloadable = shutil.copytree(two, two.with_name("step_000004"))
    (unloadable / MANIFEST_FILE).unlink()
    (unloadable / STATE_FILE).write_bytes(b"garbage")
    capsys.readouterr()
    resumed = train(interrupted, resume=True)
    assert resumed.step == 4 and resumed.resumed_from == two
    assert read_end(resumed.run_dir) == RunEnd(
        "completed", 4, 4, "completed step 4 of 4: final policy in final_policy/"
    )
    assert [s for s, _ in resumed.skipped_checkpoints] == [4, 3]
    events = read_jsonl(resumed.run_dir / EVENTS_FILE)
    assert [(e["step"], e["level"]) for e in events] == [(4, "warning"), (3, "warning")]
    assert events[0]["message"].startswith(f"checkpoint step 4 is damaged ({STATE_FILE}: cannot be loaded (")
    size = (two / STATE_FILE).stat().st_size
    assert events[1]["message"].endswith(f"{size // 2} bytes, manifest says {size}): resuming from step 2")
    assert f"WARNING: {events[1]['message']}" in capsys.readouterr().err
    aside = sorted(p.name for p in (resumed.run_dir / CHECKPOINT_DIR).glob("*.damaged"))
    assert aside == ["step_000003.damaged", "step_000004.damaged"]
    assert all(checkpoint_problem(c) is None for c in list_checkpoints(resumed.run_dir))  # step 4 written anew

    a = load_file(straight.final_policy_dir / "model.safetensors")
    b = load_file(resumed.final_policy_dir / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], straight.reference.state_dict()[k]) for k in a)  # training changed weights
    for sa, sb in zip(straight.optimizer.state.values(), resumed.optimizer.state.values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
        assert sa["step"].item() == sb["step"].item() == 8  # 4 rollouts x 2 mini-batches
    # The metrics of the resumed run are those of the straight run, each step once.
    rows_a = without_timers(read_jsonl(straight.run_dir / "metrics.jsonl"))
    rows_b = without_timers(read_jsonl(resumed.run_dir / "metrics.jsonl"))
    assert [r["step"] for r in rows_b] == [0, 1, 2, 3, 4]
    assert rows_a == rows_b
    samples_a, samples_b = (
        read_jsonl(straight.run_dir / "samples.jsonl"),
        read_jsonl(resumed.run_dir / "samples.jsonl"),
    )
    assert samples_a == samples_b
    rewards = [(r["step"], pytest.approx(r["train_rollouts/rewards"], abs=1e-6)) for r in rows_b if r["step"]]
    shown, _ = tensorboard_scalars(resumed.run_dir, "train_rollouts/rewards")
    assert shown == rewards
    client = mlflow_client(resumed.run_dir)
    run_id = (resumed.run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    assert mlflow_history(client, run_id, "train_rollouts/rewards") == rewards  # one run, through the resume
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["reinforce.baseline"] == "none"
    assert not (straight.run_dir / TENSORBOARD_DIR).exists() and not (straight.run_dir / MLFLOW_DB_FILE).exists()


def test_metrics_samples_checkpoints_and_final_policy(run_config):
    from transformers import AutoModelForCausalLM

    gold = {
        "varied": {"function": "tests.helpers.rewards:varied_reward"},
        "scaled": {"function": "tests.helpers.rewards:scaled_letter_reward", "function_args": {"scale": -3}},
    }
    trainer = train(
        run_config(
            trainer={"max_steps": 3, "val_check_interval": 2, "save_interval": 2},
            validation={"extra_rewards": gold},
        )
    )
    rows = read_jsonl(trainer.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "val/rewards" in rows[0] and "val/rewards" in rows[2] and "val/rewards" in rows[3]
    assert "val/rewards" not in rows[1]
    for row in rows[1:]:
        assert set(NEMO_METRICS) <= row.keys()
        assert all(math.isfinite(row[k]) for k in NEMO_METRICS)
        assert -1 <= row["train_rollouts/reward_length_corr"] <= 1
        assert 0 <= row["train_rollouts/frac_zero_std_groups"] <= 1
        # New metrics come after the existing ones: metrics.jsonl keeps its order.
        keys = [k for k in row if k.startswith("train_rollouts/")]
        newer = ["train_rollouts/entropy", "train_rollouts/mismatch_kl", "train_rollouts/mismatch_ppl_ratio"]
        assert keys[-5:] == ["train_rollouts/reward_length_corr", "train_rollouts/frac_zero_std_groups", *newer]
        # The hf engine and the trainer agree in float32: the mismatch is float rounding.
        assert (
            0 <= row["train_rollouts/mismatch_kl"] < 1e-6 and abs(row["train_rollouts/mismatch_ppl_ratio"] - 1) < 1e-4
        )
        assert row["train_rollouts/entropy"] > 0
    # The gold rewards of each validation are the functions' means over that validation's samples.
    samples = read_jsonl(trainer.run_dir / "samples.jsonl")
    for row in (r for r in rows if "val/rewards" in r):
        val = [s for s in samples if s["split"] == "validation" and s["step"] == row["step"]]
        assert len(val) == 6 and all(set(s["extra_rewards"]) == {"varied", "scaled"} for s in val)
        responses = [s["response"] for s in val]
        expected = {"varied": varied_reward([], responses), "scaled": [-3 * r for r in letter_reward([], responses)]}
        for name, values in expected.items():
            assert [s["extra_rewards"][name] for s in val] == pytest.approx(values, rel=1e-5, abs=1e-6)
            assert row[f"val/extra_rewards/{name}"] == pytest.approx(sum(values) / len(val), rel=1e-5, abs=1e-6)
    assert all("extra_rewards" not in s for s in samples if s["split"] == "train")
    assert rows[1]["train_optim/lr"] == pytest.approx(1e-3)  # warmup of one step
    assert {s["split"] for s in samples} == {"train", "validation"}
    assert {"step", "prompt", "response", "reward", "kl", "advantage", "is_end"} <= samples[0].keys()
    assert [p.name for p in list_checkpoints(trainer.run_dir)] == ["step_000002", "step_000003"]
    assert (list_checkpoints(trainer.run_dir)[-1] / "config.yaml").is_file()
    saved = yaml.safe_load((trainer.run_dir / "config.yaml").read_text())
    assert saved["generation"]["compile"] is False  # what generation.compile=auto resolved to for 3 steps
    model = AutoModelForCausalLM.from_pretrained(str(trainer.final_policy_dir))
    assert model(torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size


def test_max_epochs_max_time_and_validation_off(run_config, monkeypatch):
    """NeMo's loop knobs in one run: validation off (val_check_interval 0: not even at step 0), trainer.max_time
    stopping the first launch after step 1 with a checkpoint, and trainer.max_epochs ending the resumed launch
    before max_steps (2 passes over 6 prompts in steps of 4: 3 steps) with the final policy."""
    import aligner.trainers.reinforce as reinforce

    class ExpiredClock:  # the first launch's clock runs out at once: it stops at the first step boundary
        def __init__(self, max_time):
            pass

        def expired(self):
            return True

    config = run_config(trainer={"max_steps": 10, "max_epochs": 2, "val_check_interval": 0, "max_time": 3600})
    monkeypatch.setattr(reinforce, "RunClock", ExpiredClock)
    first = train(config)
    assert first.step == 1 and first.total_steps == 3 and not first.final_policy_dir.exists()
    assert [p.name for p in list_checkpoints(first.run_dir)] == ["step_000001"]
    events = read_jsonl(first.run_dir / EVENTS_FILE)
    [time_up] = [e for e in events if e.get("stop") == "max_time"]
    assert time_up["step"] == 1 and read_end(first.run_dir) == RunEnd("max_time", 1, 3, time_up["message"])
    monkeypatch.undo()
    resumed = ReinforceTrainer(config)
    resumed.setup(resume=True)
    assert read_end(resumed.run_dir) is None  # the first launch's record is gone: this one has not ended yet
    resumed.fit()
    assert resumed.step == 3 and resumed.final_policy_dir.is_dir() and read_end(resumed.run_dir).end == "completed"
    assert resumed.sampler.state_dict() == {"epoch": 1, "index": 6, "num_prompts": 6}  # exactly two passes
    rows = read_jsonl(resumed.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert not any(k.startswith("val/") for r in rows for k in r)
    assert [p.name for p in list_checkpoints(resumed.run_dir)] == ["step_000001", "step_000002", "step_000003"]


def test_an_error_in_the_loop_ends_the_run_with_a_failed_end_record(run_config):
    trainer = ReinforceTrainer(run_config(trainer={"max_steps": 2, "val_check_interval": 0}))
    trainer.setup()

    def broken(rollout):
        raise RuntimeError("the step broke")

    trainer.optimise = broken
    with pytest.raises(RuntimeError, match="the step broke"):
        trainer.fit()
    assert read_end(trainer.run_dir) == RunEnd("failed", 0, 2, "RuntimeError: the step broke")


def test_reference_stays_the_initial_policy(run_config):
    from transformers import AutoModelForCausalLM

    trainer = train(run_config(trainer={"max_steps": 2}))

    sft = AutoModelForCausalLM.from_pretrained(trainer.config.model.policy_path).state_dict()
    ref = trainer.reference.state_dict()
    assert all(torch.equal(sft[k], ref[k]) for k in ref)
    assert all(p.device.type == "cpu" and not p.requires_grad for p in trainer.reference.model.parameters())


def test_existing_checkpoints_need_resume(run_config):
    config = run_config(trainer={"max_steps": 2})
    train(config)
    with pytest.raises(RunDirError, match="pass --resume"):
        ReinforceTrainer(config).setup()


def test_a_full_disk_during_a_save_keeps_the_last_checkpoint_and_says_so(run_config, monkeypatch):
    """torch says only "file write failed" when the disk fills during a save: the trainer says the disk is full,
    removes the half-written folder, and a resume (space freed) continues from the checkpoint before."""
    from aligner.trainers import reinforce

    config = run_config(trainer={"max_steps": 4, "save_interval": 2})
    train(config, until_step=2)
    real_save = torch.save

    def full_disk(obj, path, *args, **kwargs):
        if str(path).endswith(".tmp/" + STATE_FILE):
            raise RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(reinforce.torch, "save", full_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 4096))
    with pytest.raises(
        AlignerError, match=r"the disk is full \(No space left on device\): checkpoint step 4 was not saved;"
    ):
        train(config, resume=True)
    checkpoints = [p for p in (Path(config.run_dir) / CHECKPOINT_DIR).iterdir() if p.is_dir()]
    assert [c.name for c in checkpoints] == [checkpoint_name(2)]  # no step_4.tmp, step_2 untouched
    assert checkpoint_problem(checkpoints[0]) is None
    monkeypatch.undo()
    assert train(config, resume=True).step == 4


def test_bad_prompt_data_fails_before_any_model_loads(run_config, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"promt": "typo"}\n')
    config = run_config(data={"train_file": str(tmp_path / "bad.jsonl")}, model={"policy_path": "/nonexistent"})
    with pytest.raises(PromptDataError, match=r"bad.jsonl:2: needs exactly one of the fields"):
        ReinforceTrainer(config).setup()


def test_cli_reports_user_errors_without_traceback(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("model: {policy_path: p}\nreward: {function: 'a:b'}\noptim: {lr: fast}\n")
    assert main(["train", "--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "data: required field is missing" in err and "optim.lr: Input should be a valid number" in err
    assert "Traceback" not in err


def test_cli_says_the_disk_is_full_wherever_the_write_failed(tmp_path, capsys, monkeypatch):
    """A full disk outside a checkpoint save (samples.jsonl, bench/chaos.py's disk-full run): one line the worker
    shows as the reason, in words, with no server path."""
    import errno

    from aligner import cli

    def full(_args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "samples.jsonl"))

    monkeypatch.setattr(cli, "_cmd_train", full)
    assert main(["train", "--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aligner train: error: the disk is full (No space left on device)")
    assert str(tmp_path) not in err and "Traceback" not in err


def test_lr_schedule_warmup_then_cosine():
    assert lr_multiplier(0, 4, 20, 0.1) == pytest.approx(0.25)
    assert lr_multiplier(3, 4, 20, 0.1) == pytest.approx(1.0)
    assert lr_multiplier(12, 4, 20, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the decay
    assert lr_multiplier(20, 4, 20, 0.1) == pytest.approx(0.1)


def test_cli_train_prints_a_reward_summary(run_config, tmp_path, capsys):
    import yaml

    config = run_config(trainer={"max_steps": 2, "val_check_interval": 1, "save_interval": 2})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    assert main(["train", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    first = rows[1]["train_rollouts/rewards"]
    assert f"train reward (mean of 2 steps): {(first + rows[2]['train_rollouts/rewards']) / 2:+.3f}" in out
    assert f"validation reward {rows[0]['val/rewards']:+.3f} at step 0" in out
    assert "final policy:" in out


def test_nemo_loss_gradient_is_autograd_of_nemos_formula_over_micro_batches(run_config):
    """The trainer's accumulated gradient in loss_aggregation: nemo (micro-batches of 2, 2, 1) equals the gradient
    of NeMo-Aligner's loss written out: per micro-batch the mean over its samples of is_end * the token mean of
    -logp * advantage, then the mean over the micro-batches."""
    from aligner.algorithms.reinforce import response_loss_mask
    from aligner.modeling.batches import ResponseBatch
    from aligner.modeling.hf import load_policy
    from aligner.modeling.logprobs import grouped_response_logprobs
    from aligner.trainers.reinforce import Rollout

    config = run_config(reinforce={"loss_aggregation": "nemo"}, optim={"micro_batch_size": 2})
    trainer = ReinforceTrainer(config)
    trainer.policy = load_policy(config.model.policy_path)
    trainer.backend = HfBackend.around(config, trainer.policy)
    gen = torch.Generator().manual_seed(0)
    batch = ResponseBatch(
        prompt_ids=torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]]),
        prompt_mask=torch.tensor([[False, True, True, True], [True, True, True, True]]),
        group=torch.tensor([0, 0, 1, 1, 1]),
        response_ids=torch.randint(12, 60, (5, 4), generator=gen),
        response_mask=torch.arange(4)[None, :] < torch.tensor([4, 2, 3, 1, 4])[:, None],
    )
    is_end = torch.tensor([True, False, True, True, True])
    advantages = torch.tensor([0.5, 2.0, -1.0, 3.0, -0.25])
    mask = response_loss_mask(batch.response_mask, is_end, exclude_truncated=True)
    loss = trainer._accumulate_gradients(Rollout(batch, mask, advantages), slice(0, 5))
    grads = [p.grad.clone() for p in trainer.policy.parameters()]

    trainer.policy.zero_grad()
    logprobs = grouped_response_logprobs(trainer.policy, batch)
    valid = batch.response_mask.float()
    per_sample = (-logprobs * advantages[:, None] * valid).sum(-1) / valid.sum(-1) * is_end
    reference = torch.stack([per_sample[0:2].mean(), per_sample[2:4].mean(), per_sample[4:5].mean()]).mean()
    reference.backward()
    assert loss == pytest.approx(reference.item(), rel=1e-5)
    for got, expected in zip(grads, (p.grad for p in trainer.policy.parameters())):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_k_validation_samples_a_prompt_give_pass_at_1_pass_at_k_and_mean_at_k(run_config):
    """validation.num_samples_per_prompt: 3 samples of each validation prompt; the logged pass@1, pass@k and mean@k
    are those of the validation rows in samples.jsonl, recomputed here per prompt (c passing of n = 3: pass@1 = c/n,
    pass@3 = 1 if c > 0; a sample passes at reward >= the threshold)."""
    threshold = 0.1
    config = run_config(
        trainer={"max_steps": 1, "val_check_interval": 1, "save_interval": 1, "progress_bar": False},
        validation={"num_samples_per_prompt": 3, "pass_threshold": threshold},
    )
    trainer = train(config)
    rows = [r for r in read_jsonl(trainer.run_dir / "samples.jsonl") if r["split"] == "validation" and r["step"] == 0]
    by_prompt: dict[str, list[float]] = {}
    for row in rows:
        by_prompt.setdefault(row["prompt"], []).append(row["reward"])
    assert len(rows) == 3 * len(by_prompt) and all(len(r) == 3 for r in by_prompt.values())
    passing = [sum(r >= threshold for r in rewards) for rewards in by_prompt.values()]
    assert 0 < sum(passing) < len(rows), "every sample passing, or none, would not tell pass@1 from pass@k"
    (first,) = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["step"] == 0]
    assert first[metrics.VAL_PASS_AT_1] == pytest.approx(sum(c / 3 for c in passing) / len(passing))
    assert first[metrics.VAL_PASS_AT_K] == pytest.approx(sum(c > 0 for c in passing) / len(passing))
    means = [sum(rewards) / 3 for rewards in by_prompt.values()]
    assert first[metrics.VAL_MEAN_AT_K] == pytest.approx(sum(means) / len(means))
    assert first[metrics.VAL_REWARD] == pytest.approx(sum(r["reward"] for r in rows) / len(rows))


def test_best_metric_marks_the_best_checkpoint_and_stop_at_value_ends_the_run_completed(run_config):
    """trainer.best_metric val/pass@k marks best.json by it and best_policy/ holds that checkpoint's policy;
    trainer.stop_at_metric ends the run, completed, with a checkpoint and the final policy, at the first validation
    reaching stop_at_value (0: the first one after step 0, as a validation at step 0 only records where the run
    starts)."""
    from aligner.metrics import VAL_PASS_AT_K
    from aligner.run_layout import BEST_FILE, BEST_POLICY_DIR, COMPLETED, FINAL_POLICY_DIR

    config = run_config(
        trainer={"max_steps": 6, "val_check_interval": 2, "save_interval": 6, "progress_bar": False,
                 "best_metric": VAL_PASS_AT_K, "stop_at_metric": VAL_PASS_AT_K, "stop_at_value": 0.0},
        validation={"num_samples_per_prompt": 2, "pass_threshold": 0.05},
    )  # fmt: skip
    trainer = train(config)
    assert trainer.step == 2 and read_end(trainer.run_dir).end == COMPLETED, read_end(trainer.run_dir)
    assert "reached trainer.stop_at_value" in read_end(trainer.run_dir).message
    assert [c.name for c in list_checkpoints(trainer.run_dir)] == [checkpoint_name(2)]
    assert (trainer.run_dir / FINAL_POLICY_DIR / "config.json").is_file()
    best = json.loads((trainer.run_dir / CHECKPOINT_DIR / BEST_FILE).read_text())
    assert best["step"] == 2 and set(best) == {"step", VAL_PASS_AT_K, "path"}
    # best_policy/ holds the best step's weights as a Hugging Face folder: here the final policy's, step 2's.
    exported = {name: load_file(trainer.run_dir / folder / "model.safetensors") for name, folder in
                (("best", BEST_POLICY_DIR), ("final", FINAL_POLICY_DIR))}  # fmt: skip
    assert exported["best"].keys() == exported["final"].keys()
    assert all(torch.equal(exported["best"][k], exported["final"][k]) for k in exported["final"])
    assert not (trainer.run_dir / (BEST_POLICY_DIR + ".tmp")).exists()
    events = read_jsonl(trainer.run_dir / EVENTS_FILE)
    assert any("reached trainer.stop_at_value" in e["message"] and e["step"] == 2 for e in events)
