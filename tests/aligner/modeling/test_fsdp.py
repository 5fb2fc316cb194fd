"""FSDP2 building blocks (aligner/modeling/fsdp.py): 2 gloo ranks under torchrun (tests/aligner/modeling/
fsdp_worker.py) and 1 rank in this process, against the unsharded model in one process.

The model is a tiny Llama with tied embeddings and row counts that 2 ranks cannot split evenly (a 301-token
vocabulary, an MLP of 63), so FSDP2's padded last shard and the tied head are exercised.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from aligner import distributed
from aligner.modeling import fsdp
from aligner.trainers.loop import optimizer_step
from tests.aligner.modeling import fsdp_worker as worker
from tests.helpers.architectures import TINY_SHAPE, tiny_causal_lm

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def test_shard_rows_split_as_torch_chunk():
    for rows in (0, 1, 5, 6, 301):
        for world in (1, 2, 3):
            chunks = torch.arange(rows).chunk(world) if rows else ()
            spans = [fsdp.shard_rows(rows, world, r) for r in range(world)]
            assert [list(range(a, b)) for a, b in spans if b > a] == [c.tolist() for c in chunks]


def test_cpu_offload_is_named_a_no_op_on_the_cpu_only():
    """On the CPU the shards are in host memory already (torch refuses CPUOffloadPolicy on a CPU mesh): the run says
    the setting changes nothing there; on CUDA it offloads, and says nothing."""
    assert "changes nothing" in fsdp.offload_note(True, torch.device("cpu"))
    assert fsdp.offload_note(True, torch.device("cuda", 0)) is None
    assert fsdp.offload_note(False, torch.device("cpu")) is None


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gemma2"])
def test_decoder_layers_are_found_from_no_split_modules(architecture, tiny_policy_dir):
    from transformers import AutoTokenizer

    model = tiny_causal_lm(architecture, AutoTokenizer.from_pretrained(tiny_policy_dir))
    assert fsdp.decoder_layers(model) == list(model.model.layers)


@pytest.mark.slow(5)
def test_loading_a_folder_of_several_safetensors_files(tmp_path, tiny_policy_dir, monkeypatch):
    """One rank in this process; an untied head; model.safetensors.index.json says which file holds each tensor."""
    from transformers import AutoModelForCausalLM

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy_dir)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    cpu = torch.device("cpu")
    assert fsdp.init_process_group(cpu) == cpu
    try:
        sharded = fsdp.load_sharded_policy(tmp_path, cpu)
        assert fsdp.is_sharded(sharded) and "lm_head.weight" in dict(sharded.named_parameters())
        input_ids = worker.fixed_batch()[0].sequences()[0]
        torch.testing.assert_close(worker.logits(sharded, input_ids), worker.logits(model, input_ids))
    finally:
        distributed.destroy()


def test_a_buffer_that_cannot_be_recomputed_is_an_error_not_garbage():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.ones(3), persistent=False)

    model = torch.nn.Sequential(Scaled())
    with pytest.raises(NotImplementedError, match="Scaled.scale"):
        fsdp.recompute_buffers(model, torch.device("cpu"))


def _tied_odd_policy(out: Path, tokenizer_dir: Path) -> Path:
    """The tiny policy's shape with tied embeddings, a 301-token vocabulary and an MLP of 63 (uneven shards)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(1)
    config = LlamaConfig(
        **{**TINY_SHAPE, "intermediate_size": 63},
        vocab_size=301,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _reference(policy: Path, precision: str = "fp32") -> dict:
    """The unsharded model in one process: logits, then 4 steps on the whole batch (2 for bf16-mixed, under
    autocast as aligner's trainers run it), with `loop.optimizer_step`."""
    from aligner.modeling.device import autocast
    from aligner.modeling.hf import load_policy

    model = load_policy(policy)
    out = {"initial": {k: v.detach().clone() for k, v in model.named_parameters()}}
    out["logits"] = worker.logits(model, worker.fixed_batch()[0].sequences()[0])
    model.train()
    optimizer = worker.adamw(model)
    out["norms"] = []
    for step in range(1, 3 if precision == "bf16-mixed" else 5):
        with autocast(precision, torch.device("cpu")):
            loss = worker.loss_of(model, slice(0, 6))
        loss.backward()
        out["norms"].append(optimizer_step(optimizer, model.parameters(), worker.MAX_GRAD_NORM).item())
        if step in (2, 4):
            out[f"weights{step}"] = {k: v.detach().clone() for k, v in model.named_parameters()}
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_policy_dir):
    """One 2-rank torchrun of the worker, the worker's 1-rank run in this process, the unsharded references, and
    the 1-rank resume of the 2-rank checkpoint. The 2 ranks start (interpreter and imports, most of their time)
    while this process computes the references."""
    tmp = tmp_path_factory.mktemp("fsdp")
    policy = _tied_odd_policy(tmp / "policy", tiny_policy_dir)
    out1, out2 = tmp / "one", tmp / "two"
    out1.mkdir()
    out2.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        from aligner.modeling import llama_forward

        patch.setattr(llama_forward, "supports_fast_forward", lambda model: False)
        patch.delenv("WORLD_SIZE", raising=False)
        one = worker.main(str(policy), str(out1))
        command = [*TORCHRUN, "-m", "tests.aligner.modeling.fsdp_worker", str(policy), str(out2)]
        command.append(str(out1 / "checkpoint1"))
        two = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
        try:
            reference = _reference(policy)
            reference_bf16 = _reference(policy, "bf16-mixed")
        except BaseException:
            two.kill()
            two.communicate()
            raise
        output, _ = two.communicate(timeout=300)
        assert two.returncode == 0, output[-6000:]
        fsdp.init_process_group(torch.device("cpu"))
        try:
            one_from_two = worker.resume(str(policy), str(out2 / "checkpoint2"))
        finally:
            distributed.destroy()
    ranks = [torch.load(out2 / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    return dict(
        policy=policy,
        one=one,
        two=ranks[0],
        ranks=ranks,
        export=out2 / "export",
        checkpoint2=out2 / "checkpoint2",
        reference=reference,
        reference_bf16=reference_bf16,
        one_from_two=one_from_two,
    )


def _assert_same(actual: dict, expected: dict, rtol: float = 0.0, atol: float = 0.0) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.slow(20)  # the first test runs the module fixture: the 2 ranks and the references
def test_sharded_loading_reads_only_each_ranks_rows_and_gives_the_unsharded_logits(runs):
    two, one, reference = runs["two"], runs["one"], runs["reference"]
    # Tied head: one parameter, stored once, under the embedding's name; odd row counts: rank 0 holds one row more.
    assert "lm_head.weight" not in two["local_rows"]
    assert [r["local_rows"]["model.embed_tokens.weight"] for r in runs["ranks"]] == [151, 150]
    assert [r["local_rows"]["model.layers.0.mlp.gate_proj.weight"] for r in runs["ranks"]] == [32, 31]
    # The non-persistent rotary buffers are recomputed, so the logits are the unsharded model's (same arithmetic
    # on the gathered weights: equal to float rounding at most).
    for result in (one, *runs["ranks"]):
        torch.testing.assert_close(result["logits"], reference["logits"])

    with safe_open(str(runs["policy"] / "model.safetensors"), framework="pt") as f:
        sizes = {name: math.prod(f.get_slice(name).get_shape()) * 4 for name in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    largest = max(sizes.values())
    assert one["load"].bytes_read == sum(sizes.values())
    loads = [r["load"] for r in runs["ranks"]]
    assert sum(t.bytes_read for t in loads) == sum(sizes.values())  # every byte read once, by one rank
    # No rank read (so held) a whole weight: the largest read is the embedding's 151 rows of 301.
    assert max(t.largest_read for t in loads) == 151 * 32 * 4 < largest


@pytest.mark.slow(1)
def test_two_ranks_train_as_one_unsharded_process(runs):
    """4 AdamW steps on a REINFORCE loss, each rank taking half of the batch in micro-batches of 2 rows, divided by
    the global token count:
    the weights of 2 shards (and of 1 rank) are the unsharded process's to float32 rounding. Clipping acts at
    every step (max_grad_norm 0.05), so a norm miscounted over the shards would show."""
    reference = runs["reference"]
    assert all(n > worker.MAX_GRAD_NORM for n in reference["norms"])
    for result in (runs["one"], *runs["ranks"]):
        assert result["norms"] == pytest.approx(reference["norms"], rel=1e-5)
        for step in (2, 4):
            # fp32 sums in another order change a gradient entry by ~1e-7 relative; AdamW with eps 1e-4 passes that
            # on smoothly; the weights are O(0.1) and moved by up to ~4 lr = 4e-3.
            _assert_same(result[f"weights{step}"], reference[f"weights{step}"], rtol=1e-5, atol=1e-6)
    moved = max((runs["two"]["weights4"][k] - reference["initial"][k]).abs().max() for k in reference["initial"])
    assert moved > worker.LR  # a real update
    # Activation checkpointing recomputes the same forward: the same 2 steps.
    _assert_same(runs["two"]["checkpointed2"], runs["two"]["weights2"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow(1)
def test_bf16_mixed_shards_train_as_bf16_autocast(runs):
    """bf16-mixed FSDP (the forward and backward in bfloat16, float32 shards and reductions) against bf16 autocast in
    one unsharded process: the 2 steps' updates agree to bfloat16's precision, and differ from float32's."""
    initial, two = runs["reference"]["initial"], runs["two"]

    def relative_gap(weights: dict, reference: dict) -> float:
        """|update - reference update| / |reference update|, over all parameters (2-norms)."""
        gap = sum(float((weights[k] - reference[k]).norm()) ** 2 for k in initial) ** 0.5
        return gap / sum(float((reference[k] - initial[k]).norm()) ** 2 for k in initial) ** 0.5

    # bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); a few roundings through the layers put the
    # gradients, and AdamW's updates made of them, ~0.5% off (seen: 0.7% against autocast, and autocast itself 0.6%
    # off float32), while float32 shards agree with float32 to ~1e-6.
    assert relative_gap(two["bf16_2"], runs["reference_bf16"]["weights2"]) < 0.03
    assert relative_gap(two["bf16_2"], runs["reference"]["weights2"]) > 1e-3  # bfloat16 really was used
    assert relative_gap(two["weights2"], runs["reference"]["weights2"]) < 1e-5
    assert all(w.dtype == torch.float32 for w in two["bf16_2"].values())  # float32 master shards


@pytest.mark.slow(1)
def test_checkpoints_reload_at_the_same_and_another_world_size(runs):
    """DCP checkpoints of step 2: saved by 2 ranks, loaded by 2 ranks and by 1; saved by 1, loaded by 2. The loaded
    weights and AdamW moments are the saved ones exactly; 2 steps more give the run's 4 steps."""
    one, two = runs["one"], runs["two"]
    for resumed, saved in ((two["resumed"], two), (runs["one_from_two"], two), (two["resumed_from_one"], one)):
        _assert_same(resumed["weights2"], saved["weights2"])
        _assert_same(resumed["optimizer2"], saved["optimizer2"])
    assert two["optimizer2"]["model.embed_tokens.weight/step"] == 2
    # Each rank wrote its own shards into the one folder.
    assert sorted(p.name for p in runs["checkpoint2"].iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    _assert_same(two["resumed"]["weights4"], two["weights4"])  # same world size: the same arithmetic
    _assert_same(runs["one_from_two"]["weights4"], two["weights4"], rtol=1e-5, atol=1e-6)
    _assert_same(two["resumed_from_one"]["weights4"], one["weights4"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow(1)
def test_export_loads_with_from_pretrained_and_gives_the_trained_log_probs(runs):
    from transformers import AutoModelForCausalLM

    from aligner.modeling.logprobs import grouped_response_logprobs

    two = runs["two"]
    model = AutoModelForCausalLM.from_pretrained(runs["export"])
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied again
    _assert_same(dict(model.named_parameters()), two["weights4"])
    batch, _ = worker.fixed_batch()
    reference = runs["reference"]
    trained = type(model)(model.config)
    trained.load_state_dict(reference["weights4"], strict=False)
    trained.tie_weights()
    with torch.no_grad():
        torch.testing.assert_close(
            grouped_response_logprobs(model, batch), grouped_response_logprobs(trained, batch), rtol=1e-4, atol=1e-5
        )
    # The gather held one full parameter at a time: the largest, the embedding (float32, no cast).
    assert two["gather"].peak_bytes == 301 * 32 * 4
    assert (runs["export"] / "tokenizer.json").is_file()
    # Gathered in bfloat16: the float32 full tensor and its cast are held together, one parameter at a time.
    assert two["gather_bf16"].peak_bytes == 301 * 32 * (4 + 2)
    assert two["gather"].bytes_yielded == sum(w.numel() * 4 for w in two["weights4"].values())


@pytest.mark.slow(2)
def test_lora_shards_load_the_base_and_given_adapters_and_export_peft_s_merge(tmp_path, tiny_policy_dir, monkeypatch):
    """One rank: a peft-wrapped model sharded from the plain folder (`file_name` maps peft's names) with adapters
    given whole; only the adapters train; its logits are the unsharded peft model's, and `export_hf` through
    `lora.merged_weights` writes what peft's `merge_and_unload` makes, as a folder that loads without peft."""
    from transformers import AutoModelForCausalLM

    from aligner.config import LoraConfig
    from aligner.modeling import lora

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    settings = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    torch.manual_seed(0)
    whole = lora.wrap_with_lora(AutoModelForCausalLM.from_pretrained(tiny_policy_dir), settings)
    with torch.no_grad():
        for param in lora.adapter_weights(whole).values():
            param.normal_(std=0.1)  # B != 0, so the merge changes the weights
    adapters = {name: p.detach().clone() for name, p in lora.adapter_weights(whole).items()}
    cpu = torch.device("cpu")
    fsdp.init_process_group(cpu)
    try:
        sharded = fsdp.load_sharded_policy(
            tiny_policy_dir,
            cpu,
            wrap=lambda meta: lora.wrap_with_lora(meta, settings),
            file_name=lora.file_name,
            whole=adapters,
        )
        trainable = [n for n, p in sharded.named_parameters() if p.requires_grad]
        assert sorted(trainable) == sorted(adapters) and len(adapters) == 2 * 3 * 2  # A and B, 3 targets, 2 layers
        input_ids = worker.fixed_batch()[0].sequences()[0]
        torch.testing.assert_close(worker.logits(sharded, input_ids), worker.logits(whole, input_ids))
        fsdp.export_hf(sharded, tmp_path / "merged", transform=lambda w: lora.merged_weights(sharded, w))
    finally:
        distributed.destroy()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    merged = whole.merge_and_unload().state_dict()
    assert exported.keys() == merged.keys()
    for name, weight in merged.items():
        torch.testing.assert_close(exported[name], weight, rtol=1e-6, atol=1e-6)
