"""`model.backend: fsdp` through the trainer (aligner/trainers/policy_backends.py FsdpBackend): the update of FSDP2
shards on 2 ranks and on 1 is the `hf` backend's on 1 process, a 2-rank checkpoint resumes on 1 process and goes on
as the uninterrupted run, and the final policy is a Hugging Face folder; the same for LoRA on the shards
(FsdpLoraBackend) against the `hf` + LoRA backend. The building blocks themselves are tested
in tests/aligner/modeling/test_fsdp.py; the equivalence harness is tests/aligner/test_distributed.py's."""

import json
import subprocess
import sys

import pytest
import torch

from aligner.run_layout import FINAL_POLICY_DIR, STATE_FILE, list_checkpoints
from aligner.trainers.policy_backends import BACKEND_KEY, FSDP_DIR, POLICY_DIR
from tests.aligner.test_distributed import (
    ROOT,
    TORCHRUN,
    _assert_same_run,
    _config,
    _one_and_two_ranks,
    _ppo_config,
)

WORKER = [sys.executable, "-m", "tests.helpers.distributed_worker"]


def _fsdp(config: dict) -> dict:
    return {**config, "model": {**config["model"], "backend": "fsdp"}}


def _worker(args: list[str], ranks: int) -> None:
    command = [*TORCHRUN, *WORKER[1:]] if ranks > 1 else WORKER
    done = subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def _two_ranks_stop_and_one_resumes(tmp_path, shape, policy) -> dict:
    """A 4-step run (its config `shape`d, e.g. LoRA): backend fsdp on 2 ranks stops after step 2 (checkpointed), one
    process resumes it to step 4 and must hold the weights of the 4 uninterrupted steps of the hf backend on 1
    process, whose results (distributed_worker's) it returns."""
    from tests.helpers import distributed_worker

    steps = {"trainer": {"max_steps": 4, "val_check_interval": 0, "save_interval": 2}}
    hf = tmp_path / "hf.json"
    hf.write_text(json.dumps(shape(_config(tmp_path, policy, "hf", **steps))))
    fsdp = tmp_path / "fsdp.json"
    fsdp.write_text(json.dumps(_fsdp(shape(_config(tmp_path, policy, "fsdp", **steps)))))
    first = subprocess.Popen(
        [*TORCHRUN, *WORKER[1:], str(fsdp), str(tmp_path / "half.pt"), "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        distributed_worker.main(str(hf), str(tmp_path / "hf.pt"))  # meanwhile, the uninterrupted reference
    finally:
        output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output[-4000:]
    assert [c.name for c in list_checkpoints(tmp_path / "fsdp")] == ["step_000002"]
    _worker([str(fsdp), str(tmp_path / "resumed.pt"), "", "resume"], ranks=1)

    straight = torch.load(tmp_path / "hf.pt", weights_only=False)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=False)
    assert resumed["world_size"] == 1 and [r["step"] for r in resumed["metrics"]][-1] == 4
    for name, weight in straight["weights"].items():
        torch.testing.assert_close(resumed["weights"][name], weight, rtol=1e-5, atol=1e-6)
    return straight


@pytest.mark.slow(60)
def test_fsdp_on_two_ranks_makes_the_one_process_hf_update(tmp_path, tiny_policy_dir):
    """Same rollouts, 2 optimiser steps, uneven shares (3 and 2 prompts, so the ranks run 3 micro-batches and 2 plus
    an idle pass): the gathered gradients, weights, metrics and samples of the 2-rank FSDP run are the 1-process hf
    run's, to float32 rounding. With fewer gathers (`model.fsdp.reshard_after_forward: false`,
    `sync_each_micro_batch: false`: gradients accumulated whole over the passes, one reduce-scatter in the last);
    the other tests here take the defaults."""
    fewer_gathers = {"reshard_after_forward": False, "sync_each_micro_batch": False}
    configs = {
        1: _config(tmp_path, tiny_policy_dir, "hf1"),
        2: _fsdp(_config(tmp_path, tiny_policy_dir, "fsdp2", model={"fsdp": fewer_gathers})),
    }
    one, two = _one_and_two_ranks(tmp_path, configs)
    _assert_same_run(one, two, optimiser_steps=2)
    newest = list_checkpoints(tmp_path / "fsdp2")[-1]
    assert torch.load(newest / STATE_FILE, weights_only=False)[BACKEND_KEY] == "fsdp"
    assert (newest / FSDP_DIR / ".metadata").is_file() and (newest / POLICY_DIR / "config.json").is_file()


@pytest.mark.slow(40)
def test_bf16_mixed_fsdp_on_two_ranks_takes_the_one_process_bf16_mixed_step(tmp_path, tiny_policy_dir):
    """bf16-mixed: FSDP2's MixedPrecisionPolicy (bfloat16 parameters gathered for the compute, float32 shards and
    reduction) against hf's autocast over float32 weights, one optimiser step on the same rollout. The two compute in
    bfloat16 differently (autocast keeps some ops in float32), so they agree to bfloat16's precision (8 bits of
    mantissa, ~0.4% an op, ~1% over a forward and backward of this depth), not to float32's: the loss and gradient
    norm within 5%, and the weight updates pointing the same way (cosine > 0.98; AdamW's first step moves each
    weight by about lr * sign(g), so entries whose gradient is near 0 may flip)."""
    bf16 = {"model": {"precision": "bf16-mixed"}, "trainer": {"max_steps": 1, "save_interval": 1}}
    configs = {
        1: _config(tmp_path, tiny_policy_dir, "hf1", **bf16),
        2: _fsdp(_config(tmp_path, tiny_policy_dir, "f2", **bf16)),
    }
    one, two = _one_and_two_ranks(tmp_path, configs)
    (r1,), (r2,) = ([r for r in run["metrics"] if r["step"] == 1] for run in (one, two))
    for key in ("train_optim/loss", "train_optim/grad_norm", "train_rollouts/rewards"):
        assert r2[key] == pytest.approx(r1[key], rel=5e-2, abs=1e-4), key
    from safetensors.torch import load_file

    start = load_file(tiny_policy_dir / "model.safetensors")

    def moved(run: dict) -> torch.Tensor:
        return torch.cat([(w.float() - start[k]).flatten() for k, w in sorted(run["weights"].items()) if k in start])

    moved = {"hf": moved(one), "fsdp": moved(two)}
    assert moved["hf"].abs().max() > 0
    assert torch.nn.functional.cosine_similarity(moved["hf"], moved["fsdp"], dim=0) > 0.98


@pytest.mark.slow(90)
def test_a_two_rank_fsdp_checkpoint_resumes_on_one_process_and_exports_a_hugging_face_folder(
    tmp_path, tiny_policy_dir
):
    """2 ranks stop after step 2; one process resumes their sharded checkpoint (DCP reshards it) and trains to step
    4: the weights are those of 4 uninterrupted hf steps on 1 process, and final_policy loads with from_pretrained
    and holds them."""
    from transformers import AutoModelForCausalLM

    straight = _two_ranks_stop_and_one_resumes(tmp_path, lambda c: c, tiny_policy_dir)
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "fsdp" / FINAL_POLICY_DIR)).state_dict()
    for name, weight in straight["weights"].items():
        torch.testing.assert_close(exported[name], weight, rtol=1e-5, atol=1e-6)


@pytest.mark.slow(60)
def test_ppo_actor_on_fsdp_shards_makes_the_one_process_hf_update(tmp_path, tiny_policy_dir, reward_model_dir):
    """PPO's actor as FSDP2 shards on 2 ranks (one critic server for both, trained on the gathered batch): actor
    gradients, weights, metrics and samples are those of the 1-process hf actor."""
    pytest.importorskip("pytriton")
    configs = {r: _ppo_config(tmp_path, tiny_policy_dir, reward_model_dir, f"ppo{r}") for r in (1, 2)}
    configs[2] = _fsdp(configs[2])
    one, two = _one_and_two_ranks(tmp_path, configs)
    _assert_same_run(one, two, optimiser_steps=2)
    assert all(r["train_optim/critic_loss"] > 0 for r in one["metrics"][1:])


def _lora(config: dict) -> dict:
    return {
        **config,
        "model": {**config["model"], "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
    }


@pytest.mark.slow(60)
def test_lora_on_two_fsdp_ranks_makes_the_one_process_lora_update_and_leaves_the_base_alone(tmp_path, tiny_policy_dir):
    """LoRA on FSDP2 shards (FsdpLoraBackend) on 2 ranks: the adapters' gathered gradients, the weights, metrics and
    samples are those of the 1-process hf + LoRA run; only adapters have gradients, and the base weights are the
    policy folder's, bit for bit; the checkpoint holds the adapters' shards (DCP, no base) and a peft folder."""
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    from aligner.modeling.lora import file_name, is_adapter
    from aligner.run_layout import ADAPTER_DIR

    # Seed 3: both steps' rollouts have rewards. With the default seed step 2's are all 0, so its whitened advantages
    # are the KL penalty alone divided by its tiny spread, which magnifies float rounding past any fair tolerance.
    configs = {r: {**_lora(_config(tmp_path, tiny_policy_dir, f"lora{r}")), "seed": 3} for r in (1, 2)}
    configs[2] = _fsdp(configs[2])
    one, two = _one_and_two_ranks(tmp_path, configs)
    _assert_same_run(one, two, optimiser_steps=2)
    assert all(is_adapter(name) for grads in two["grads"] for name in grads)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir)).state_dict()
    for name, weight in two["weights"].items():
        if not is_adapter(name):
            assert torch.equal(weight, base[file_name(name)]), name
    assert any(w.abs().max() > 0 for n, w in two["weights"].items() if ".lora_B." in n)  # the adapters trained
    newest = list_checkpoints(tmp_path / "lora2")[-1]
    assert torch.load(newest / STATE_FILE, weights_only=False)[BACKEND_KEY] == "fsdp-lora"
    assert (newest / FSDP_DIR / ".metadata").is_file() and (newest / ADAPTER_DIR / "adapter_config.json").is_file()
    saved = FileSystemReader(str(newest / FSDP_DIR)).read_metadata().state_dict_metadata
    weights = [key for key in saved if key.startswith("model.")]
    assert weights and all(is_adapter(key) for key in weights)  # the frozen base is the policy folder's alone


@pytest.mark.slow(90)
def test_a_two_rank_lora_fsdp_checkpoint_resumes_on_one_process_and_exports_the_merged_policy(
    tmp_path, tiny_policy_dir
):
    """2 ranks of LoRA on fsdp shards stop after step 2; one process resumes (DCP reshards) to step 4: the weights
    are those of 4 uninterrupted hf + LoRA steps on 1 process, and final_policy is a plain Hugging Face folder
    (from_pretrained, no peft) holding the merged weights, those of peft's own merge_and_unload."""
    from transformers import AutoModelForCausalLM

    from aligner.modeling.lora import file_name, is_adapter

    straight = _two_ranks_stop_and_one_resumes(tmp_path, _lora, tiny_policy_dir)
    assert any(n.endswith(".lora_B.default.weight") and w.abs().max() > 0 for n, w in straight["weights"].items())

    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "fsdp" / FINAL_POLICY_DIR)).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf" / FINAL_POLICY_DIR)).state_dict()
    assert exported.keys() == merged.keys()
    assert not any(is_adapter(name) or ".base_layer." in name for name in exported)
    for name, weight in merged.items():
        torch.testing.assert_close(exported[name], weight, rtol=1e-5, atol=1e-6)
    base = {file_name(n): w for n, w in straight["weights"].items() if not is_adapter(n)}
    assert not torch.equal(
        exported["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
