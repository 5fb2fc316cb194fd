"""LoRA adapters (aligner/modeling/lora.py): only adapters train, the reference is the base with adapters disabled
(no copy), resume is exact, and the exported policy is a merged plain Hugging Face folder."""

import sys

import pytest
import torch
from safetensors.torch import load_file

from aligner.config import LoraConfig, config_from_dict
from aligner.errors import ConfigError
from aligner.modeling.batches import ResponseBatch
from aligner.modeling.hf import load_policy
from aligner.modeling.logprobs import grouped_response_logprobs
from aligner.modeling.lora import LoraReference, wrap_with_lora
from aligner.run_layout import ADAPTER_DIR, list_checkpoints
from tests.helpers.training import train

pytest.importorskip("peft")


def batch_of(seed: int = 0) -> ResponseBatch:
    """Two prompts, three responses (two to the first prompt), some padding."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(6, 250, (2, 5), generator=g)
    prompt_mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    response_ids = torch.randint(6, 250, (3, 4), generator=g)
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    return ResponseBatch(prompt_ids, prompt_mask, torch.tensor([0, 0, 1]), response_ids, response_mask)


def trained_lora_policy(path, steps: int = 3):
    """The tiny policy with adapters, after a few AdamW steps that move its log-probs."""
    torch.manual_seed(0)
    policy = wrap_with_lora(load_policy(path), LoraConfig(r=4, dropout=0.1))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    policy.train()
    for _ in range(steps):
        (-grouped_response_logprobs(policy, batch_of()).mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    return policy


def test_only_adapters_train_and_the_base_weights_stay_bit_identical(tiny_policy_dir):
    sft = load_policy(tiny_policy_dir).state_dict()
    policy = trained_lora_policy(tiny_policy_dir)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    base = LoraReference(policy).state_dict()
    assert base.keys() == sft.keys()
    assert all(torch.equal(base[k], sft[k]) for k in sft)


def test_reference_is_the_base_model_with_adapters_disabled(tiny_policy_dir):
    policy = trained_lora_policy(tiny_policy_dir)
    reference = LoraReference(policy)
    base = load_policy(tiny_policy_dir).eval()
    batch = batch_of(1)
    with torch.no_grad():
        expected = grouped_response_logprobs(base, batch)
        policy.eval()
        trained = grouped_response_logprobs(policy, batch)
    policy.train()
    got = reference.logprobs(batch)
    assert policy.training  # the training mode comes back
    assert not got.is_inference()
    # Equal up to float rounding (the CPU matmul rounds differently with the buffers' alignment).
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert (trained - expected).abs().max() > 1e-2  # the adapters did change the policy


def test_reference_keeps_no_copy_of_the_weights(tiny_policy_dir):
    policy = wrap_with_lora(load_policy(tiny_policy_dir), LoraConfig(r=2))
    reference = LoraReference(policy)
    assert reference.model is policy
    own = {t.data_ptr() for t in policy.state_dict().values()}
    assert all(t.data_ptr() in own for t in reference.state_dict().values())


def test_bad_lora_settings_name_the_field(tiny_policy_dir):
    base = {
        "model": {"policy_path": "p", "lora": {"r": -1}},
        "data": {"train_file": "t", "val_file": "v"},
        "reward": {"function": "a:b"},
    }
    with pytest.raises(ConfigError, match=r"model\.lora\.r: Input should be greater than or equal to 0"):
        config_from_dict(base)
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: .*\['qkv'\] match no module.*q_proj"):
        wrap_with_lora(load_policy(tiny_policy_dir), LoraConfig(r=4, target_modules=["q_proj", "qkv"]))


def test_missing_peft_names_the_extra(tiny_policy_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    with pytest.raises(ConfigError, match=r"model.lora needs the optional extra: pip install 'aligner\[lora\]'"):
        wrap_with_lora(load_policy(tiny_policy_dir), LoraConfig(r=4))


# ----------------------------------------------------------------------------------------------- in the trainer
@pytest.mark.slow
def test_lora_training_resumes_exactly_and_exports_a_merged_policy(run_config, tiny_policy_dir):
    def lora_config(run_dir):
        lora = {"policy_path": str(tiny_policy_dir), "lora": {"r": 4, "alpha": 8, "dropout": 0.1}}
        return run_config(run_dir, model=lora, optim={"lr": 1e-2})

    from transformers import AutoModelForCausalLM

    straight = train(lora_config("straight"))
    interrupted = lora_config("resumed")
    train(interrupted, until_step=2)
    resumed = train(interrupted, resume=True)
    assert resumed.step == 4

    # The optimiser holds the adapters only; checkpoints hold them as a peft folder, not the whole policy.
    trainable = [p for p in straight.policy.parameters() if p.requires_grad]
    assert [p.shape for p in straight.optimizer.param_groups[0]["params"]] == [p.shape for p in trainable]
    checkpoint = list_checkpoints(straight.run_dir)[-1]
    assert (checkpoint / ADAPTER_DIR / "adapter_config.json").is_file() and not (checkpoint / "policy").exists()

    # 2 steps + resume + 2 steps == 4 steps, bit for bit: adapters, optimiser state, merged export.
    a = load_file(list_checkpoints(straight.run_dir)[-1] / ADAPTER_DIR / "adapter_model.safetensors")
    b = load_file(list_checkpoints(resumed.run_dir)[-1] / ADAPTER_DIR / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for sa, sb in zip(straight.optimizer.state.values(), resumed.optimizer.state.values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
    fa = load_file(straight.final_policy_dir / "model.safetensors")
    fb = load_file(resumed.final_policy_dir / "model.safetensors")
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)

    # The base weights are the SFT policy's still: the KL reference never moved.
    sft = AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir)).state_dict()
    ref = straight.reference.state_dict()
    assert ref.keys() == sft.keys() and all(torch.equal(ref[k], sft[k]) for k in sft)

    # The final policy is a plain Hugging Face folder with the adapters merged in, and computes what the policy does.
    assert not (straight.final_policy_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(straight.final_policy_dir)).eval()
    assert type(merged).__module__.startswith("transformers.") and merged.state_dict().keys() == sft.keys()
    assert not all(torch.equal(fa[k], sft[k]) for k in fa)  # training changed the merged weights
    x = torch.randint(6, 250, (2, 9))
    straight.policy.eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, straight.policy(x).logits, rtol=0, atol=1e-5)
