"""Memory planning (aligner/modeling/memory.py): hand-computed byte counts, parameter counts from headers and from
the meta device against a loaded model, FSDP's share, LoRA's trainable count, and the planning table."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from aligner.modeling.memory import (
    GB,
    DeviceMemory,
    ModelShape,
    activation_bytes,
    device_memory,
    kv_cache_bytes,
    lora_parameters,
    model_shape,
    needed_bytes,
    planning_table,
    safetensors_parameters,
    shape_from_config,
    training_memory,
)

# A million parameters in one layer of hidden size 8: the parts are whole numbers of bytes to check by hand.
MILLION = ModelShape(
    parameters=1_000_000, layers=1, hidden_size=8, num_attention_heads=2, num_key_value_heads=2, vocab_size=16,
    layer_parameters=900_000,
)  # fmt: skip


def test_a_million_fp32_parameters_on_one_process_hold_16_bytes_each_plus_what_a_step_adds():
    plan = training_memory(MILLION, micro_batch_size=1, seq_len=4, generation_rows=1)
    assert plan.device["weights"] == 4_000_000
    assert plan.device["gradients"] == 4_000_000
    assert plan.device["optimizer"] == 8_000_000  # AdamW's two float32 moments
    assert plan.host["reference"] == plan.device["reference"] == 4_000_000  # fp32 copy, on the device for its pass
    assert "generation_weights" not in plan.device  # fp32 generation shares the training module
    # Activations by Korthikanti's count: 4 tokens x 8 x 34 + 5 x 2 heads x 4 positions a token, in fp32 (x 2), plus
    # the last hidden states (4 x 8 x 4) and 4 x 16 float32 logits with their softmax (x 8).
    acts = 4 * (8 * 34 + 5 * 2 * 4) * 2 + 4 * 8 * 4 + 4 * 16 * 8
    assert plan.device["activations"] == acts
    assert plan.device["kv_cache"] == 2 * 1 * 2 * 4 * 4 * 1 * 4  # K and V, 1 layer, 2 heads of 4, fp32, 1 x 4 tokens
    # The peak: weights and moments all step, then the training phase's gradients and activations on top (more
    # than the reference's 4 MB alone or the KV cache).
    assert plan.per_rank_bytes == 12_000_000 + 4_000_000 + acts


def test_bf16_mixed_adds_generations_copy_and_autocasts_casts_and_halves_the_reference():
    plan = training_memory(MILLION, precision="bf16-mixed")
    fp32 = training_memory(MILLION)
    assert plan.device["weights"] == fp32.device["weights"] == 4_000_000  # the float32 weights are the masters
    assert plan.device["generation_weights"] == 2_000_000
    assert plan.device["autocast_weights"] == 2_000_000
    assert plan.host["reference"] == 2_000_000


def test_activation_checkpointing_keeps_a_layers_input_instead_of_all_of_it():
    shape = dataclasses.replace(MILLION, layers=10, hidden_size=64, num_attention_heads=4)
    full = activation_bytes(shape, tokens=1024, seq_len=512, compute_bytes=2, checkpointing=False)
    kept = activation_bytes(shape, tokens=1024, seq_len=512, compute_bytes=2, checkpointing=True)
    assert kept < full / 4  # per layer: 2 h of about 34 h + 5 a s bytes a token, and one layer whole


def test_fsdp_on_two_processes_holds_half_of_ddps_state():
    ddp = training_memory(MILLION, backend="hf")
    fsdp = training_memory(MILLION, backend="fsdp", world_size=2)
    for part in ("weights", "gradients", "optimizer"):
        assert fsdp.device[part] == ddp.device[part] // 2
    # Plus the gathered units (root + 2 layers in fp32, one layer's fp32 gradient) and generation's whole copy.
    root = MILLION.parameters - MILLION.layer_parameters
    assert fsdp.device["gathered_units"] == (root + 2 * 900_000) * 4 + 900_000 * 4


def test_fsdps_fewer_gathers_hold_the_whole_weights_and_gradients_while_training():
    """reshard_after_forward false keeps every layer gathered through a pass; sync_each_micro_batch false also the
    whole gradient (float32, the reduce dtype, under bf16-mixed) until the step's one reduce-scatter. Both only in
    the training phase: the state between steps stays sharded."""
    shape = dataclasses.replace(MILLION, layers=10, layer_parameters=90_000)
    lean = training_memory(shape, backend="fsdp", world_size=2, precision="bf16-mixed")
    kept = training_memory(shape, backend="fsdp", world_size=2, precision="bf16-mixed", reshard_after_forward=False)
    unsynced = training_memory(
        shape, backend="fsdp", world_size=2, precision="bf16-mixed", sync_each_micro_batch=False
    )
    assert lean.device["gathered_units"] == (100_000 + 2 * 90_000) * 2 + 90_000 * 4  # root + 2 layers, 1 gradient
    assert kept.device["gathered_units"] == unsynced.device["gathered_units"] == 1_000_000 * 2 + 90_000 * 4
    assert "unsharded_gradients" not in kept.device and unsynced.device["unsharded_gradients"] == 4_000_000
    assert lean.device["optimizer"] == unsynced.device["optimizer"] == 4_000_000
    assert lean.per_rank_bytes < kept.per_rank_bytes < unsynced.per_rank_bytes
    assert {"gathered_units", "unsharded_gradients"} <= set(unsynced.phases["training"])


def test_fsdp_cpu_offload_moves_the_shards_to_the_host():
    plan = training_memory(MILLION, backend="fsdp", world_size=4, cpu_offload=True)
    assert {"weights", "gradients", "optimizer"}.isdisjoint(plan.device)
    assert plan.host["weights_shard"] == 1_000_000 and plan.host["optimizer_shard"] == 2_000_000


def test_megatron_splits_the_state_over_tensor_and_pipeline_ranks_and_keeps_a_whole_replica():
    plan = training_memory(MILLION, backend="megatron", world_size=4, tensor_parallel=2, pipeline_parallel=2)
    assert plan.device["optimizer"] == 2_000_000
    assert plan.device["hf_replica"] == 4_000_000


def test_the_kv_cache_counts_keys_and_values_of_every_layer():
    shape = dataclasses.replace(MILLION, layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3)
    # SmolLM2-135M in bf16: 22.5 KiB a token (aligner/config.py, generation.kv_cache_memory_mb).
    assert kv_cache_bytes(shape, rows=1, seq_len=1, dtype_bytes=2) == 22.5 * 1024


def test_parameters_counted_without_loading_equal_the_loaded_models(tiny_policy_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_policy_dir)
    loaded = sum(p.numel() for p in model.parameters())
    shape = model_shape(tiny_policy_dir)
    assert shape.parameters == safetensors_parameters(tiny_policy_dir) == loaded
    meta = shape_from_config(AutoConfig.from_pretrained(tiny_policy_dir))
    assert meta.parameters == loaded
    assert (
        shape.layer_parameters == meta.layer_parameters == sum(p.numel() for p in model.model.layers[0].parameters())
    )
    assert (shape.layers, shape.hidden_size, shape.vocab_size) == (meta.layers, meta.hidden_size, meta.vocab_size)


def test_lora_counts_only_the_adapters_as_trainable(tiny_policy_dir):
    from transformers import AutoModelForCausalLM

    from aligner.config import LoraConfig
    from aligner.modeling.lora import wrap_with_lora

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"])
    wrapped = wrap_with_lora(AutoModelForCausalLM.from_pretrained(tiny_policy_dir), lora)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    shape = model_shape(tiny_policy_dir)
    assert lora_parameters(shape, lora.r, lora.target_modules) == trainable
    plan = training_memory(shape, lora_r=lora.r, lora_targets=lora.target_modules)
    assert plan.trainable_parameters == trainable < shape.parameters
    assert plan.device["optimizer"] == 2 * trainable * 4
    assert "reference" not in plan.device  # the base with adapters off is the reference


def test_a_folder_whose_weights_or_sizes_cannot_be_read_has_no_shape(tmp_path):
    # A config that leaves the sizes to the class defaults would describe a 7B Llama: it is not guessed from.
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="does not state num_hidden_layers"):
        model_shape(tmp_path)
    sizes = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32, "vocab_size": 300}
    (tmp_path / "config.json").write_text(json.dumps(sizes))
    with pytest.raises(ValueError, match="model.safetensors is not a safetensors file"):
        model_shape(tmp_path)


def test_processes_sharing_the_hosts_ram_need_all_of_their_memory_there():
    plan = training_memory(MILLION, backend="fsdp", world_size=2)
    own = DeviceMemory(10**12, "declared", shared=False)
    host = DeviceMemory(10**12, "measured: host RAM", shared=True)
    assert needed_bytes(plan, own) == plan.per_rank_bytes
    assert needed_bytes(plan, host) == 2 * (plan.per_rank_bytes + plan.host_bytes)


def test_declared_device_memory_wins_over_a_measure(monkeypatch):
    assert device_memory(24.0) == DeviceMemory(24_000_000_000, "declared", shared=False)
    measured = device_memory(None)
    assert measured.bytes > 0 and measured.shared == (not torch.cuda.is_available())
    if torch.cuda.is_available():
        assert measured.bytes == torch.cuda.get_device_properties(0).total_memory
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no device visible: the host's RAM, shared by the processes
    assert device_memory(None).source == "measured: host RAM" and device_memory(None).shared


def test_planning_table_for_llamas_on_eight_80_gb_devices():
    rows = {(r["model"], r["setup"]): r for r in planning_table()}
    assert len(rows) == 12
    assert 1.2e9 < rows[("1B", "fsdp")]["parameters"] < 1.3e9 and 70e9 < rows[("70B", "fsdp")]["parameters"] < 71e9
    for model in ("1B", "8B", "70B"):
        hf, fsdp, offload = (rows[(model, s)]["per_rank_gb"] for s in ("hf (DDP)", "fsdp", "fsdp + cpu_offload"))
        assert offload < fsdp < hf
    # 8B full fine-tuning: 16 bytes a parameter are 128 GB, more than one device; sharded over 8 they fit.
    assert not rows[("8B", "hf (DDP)")]["fits"] and rows[("8B", "fsdp")]["fits"]
    assert rows[("1B", "hf (DDP)")]["fits"]
    assert rows[("70B", "fsdp")]["per_rank_gb"] > 70.55 * 16 / 8  # its state alone is 141 GB a rank
    assert all(r["fits"] == (r["per_rank_gb"] <= 80) for r in rows.values())
    assert rows[("70B", "fsdp + cpu_offload")]["sharded_copies_fit"]
    assert GB == 1e9
