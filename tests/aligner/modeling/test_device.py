import pytest
import torch

from aligner.config import ModelConfig
from aligner.modeling.device import autocast, compute_dtype
from aligner.modeling.hf import copy_weights, frozen_copy, load_policy


def test_bf16_mixed_computes_matmuls_in_bfloat16_and_fp32_does_not():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast("bf16-mixed", torch.device("cpu")):
        mixed = a @ b
    with autocast("fp32", torch.device("cpu")):
        plain = a @ b
    assert mixed.dtype == torch.bfloat16 and plain.dtype == torch.float32
    assert compute_dtype("bf16-mixed") == torch.bfloat16 and compute_dtype("fp32") is None


def test_frozen_copy_casts_parameters_not_buffers_and_follows_copy_weights(tiny_policy_dir):
    policy = load_policy(tiny_policy_dir)
    copy = frozen_copy(policy, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in copy.parameters())
    # The rotary frequencies stay float32: in bfloat16 every angle would be off by up to 0.4%.
    assert {b.dtype for b in copy.buffers()} == {b.dtype for b in policy.buffers()} == {torch.float32}
    assert all(p.dtype == torch.float32 and p.requires_grad for p in policy.parameters())  # the policy is untouched
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)
    copy_weights(copy, policy)
    for mine, theirs in zip(copy.parameters(), policy.parameters()):
        assert torch.equal(mine, theirs.to(torch.bfloat16))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dtype": "bfloat16"}, "keeps float32 master weights: set dtype: float32"),
        ({"backend": "megatron"}, "works with backend: hf"),
    ],
)
def test_bf16_mixed_refuses_what_it_cannot_keep(fields, message, monkeypatch):
    monkeypatch.setattr("aligner.config._megatron_installed", lambda: True)
    with pytest.raises(ValueError, match=message):
        ModelConfig(policy_path="p", precision="bf16-mixed", **fields)
    assert ModelConfig(policy_path="p").precision == "fp32"
