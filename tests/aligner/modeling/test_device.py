import contextlib

import pytest
import torch

from aligner.modeling.cpu import BF16_ENV
from aligner.modeling.device import BFloat16MatmulsInFloat32, autocast, bf16_emulation, bf16_note, compute_dtype
from aligner.modeling.hf import copy_weights, frozen_copy, load_policy

pytestmark = pytest.mark.cpu_sensitive


def test_bf16_mixed_computes_matmuls_in_bfloat16_and_fp32_does_not():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast("bf16-mixed", torch.device("cpu")):
        mixed = a @ b
    with autocast("fp32", torch.device("cpu")):
        plain = a @ b
    assert mixed.dtype == torch.bfloat16 and plain.dtype == torch.float32
    assert compute_dtype("bf16-mixed") == torch.bfloat16 and compute_dtype("fp32") is None


BF16 = torch.bfloat16
PRODUCTS = {
    "linear": lambda x: torch.nn.functional.linear(x["batch_a"], x["b"].t(), x["bias"][0]),
    "matmul": lambda x: torch.matmul(x["batch_a"], x["b"]),
    "mm": lambda x: torch.mm(x["a"], x["b"]),
    "addmm": lambda x: torch.addmm(x["bias"], x["a"], x["b"], beta=0.5, alpha=2.0),
    "bmm": lambda x: torch.bmm(x["batch_a"], x["batch_b"]),
    "baddbmm": lambda x: torch.baddbmm(x["batch_bias"], x["batch_a"], x["batch_b"]),
    "mv": lambda x: torch.mv(x["a"], x["v"]),
    "addmv": lambda x: torch.addmv(x["bias"][0], x["a"], x["v"]),
}


@pytest.mark.parametrize("product", list(PRODUCTS))
def test_bf16_products_in_float32_round_the_float32_product_and_leave_float32_alone(product):
    torch.manual_seed(0)
    shapes = {"a": (16, 64), "b": (64, 16), "bias": (16, 16), "v": (64,)}
    shapes |= {"batch_a": (3, 16, 64), "batch_b": (3, 64, 16), "batch_bias": (3, 16, 16)}
    wide = {name: torch.randn(shape) for name, shape in shapes.items()}
    narrow = {name: t.to(BF16) for name, t in wide.items()}
    compute = PRODUCTS[product]
    with BFloat16MatmulsInFloat32():
        emulated, plain = compute(narrow), compute(wide)
    # bfloat16 inputs: the float32 product of the same (bfloat16) values, rounded once.
    assert emulated.dtype == BF16
    assert torch.equal(emulated, compute({k: t.float() for k, t in narrow.items()}).to(BF16))
    # torch's own bfloat16 kernel also accumulates in float32: the two differ at most by rounding (a 64-term sum in
    # another order moves the float32 result by ~1e-6, which flips a bfloat16 rounding now and then).
    torch.testing.assert_close(emulated.float(), compute(narrow).float(), rtol=2**-7, atol=1e-2)
    assert torch.equal(plain, compute(wide))  # float32 untouched


def test_bf16_products_in_float32_cover_the_backward_under_autocast():
    seen = []

    class Counting(BFloat16MatmulsInFloat32):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in self.OPS:
                seen.append(func)
            return super().__torch_dispatch__(func, types, args, kwargs)

    torch.manual_seed(0)
    layer, x = torch.nn.Linear(64, 32), torch.randn(8, 64, requires_grad=True)
    grads = []
    for mode in (Counting(), contextlib.nullcontext()):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with mode:
            with autocast("bf16-mixed", torch.device("cpu")):
                out = layer(x)
            out.float().square().sum().backward()
        grads.append((layer.weight.grad.clone(), x.grad.clone()))
    # The forward's addmm and the backward's two products (for the input and the weight).
    assert len(seen) == 3
    assert layer.weight.grad.dtype == torch.float32
    # Each product may round a bfloat16 ulp (2**-8) away from the native kernel's, and the backward's inputs carry
    # the forward's: a few ulps apart at most.
    for emulated, native in zip(*grads):
        torch.testing.assert_close(emulated, native, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("answer", "emulated"), [("slow", True), ("fast", False)])
def test_bf16_emulation_only_where_bfloat16_products_do_not_pay(monkeypatch, answer, emulated):
    cpu = torch.device("cpu")
    monkeypatch.setenv(BF16_ENV, answer)
    assert isinstance(bf16_emulation("bf16-mixed", cpu), BFloat16MatmulsInFloat32) is emulated
    assert not isinstance(bf16_emulation("fp32", cpu), BFloat16MatmulsInFloat32)
    note = bf16_note("bf16-mixed", cpu)
    assert (note is not None and "float32 on bfloat16 inputs" in note) is emulated
    assert bf16_note("fp32", cpu) is None


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
