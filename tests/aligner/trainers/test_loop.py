"""The optimiser step every training loop shares (aligner/trainers/loop.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from aligner.trainers.loop import RunClock, adamw, is_save_step, is_validation_step, optimizer_step, run_length
from aligner.trainers.schedule import lr_scheduler


def _model_and_batch(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return model, torch.randn(5, 4)


def test_optimizer_step_is_clip_step_schedule_zero_bit_for_bit():
    """The same numbers as the sequence the trainers wrote out: clip, optimiser step, scheduler step."""
    finals, norms = [], []
    for shared in (False, True):
        model, x = _model_and_batch()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        scheduler = lr_scheduler(optimizer, 1, 5)
        for _ in range(3):
            (model(x) ** 2).sum().backward()
            if shared:
                norm = optimizer_step(optimizer, model.parameters(), 0.5, scheduler)
                assert all(p.grad is None for p in model.parameters())
            else:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            norms.append(norm.item())
        assert scheduler.last_epoch == 3
        finals.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*finals))
    assert norms[:3] == norms[3:] and norms[0] > 0.5  # the norm before clipping


def test_optimizer_step_without_a_scheduler_leaves_the_rate():
    model, x = _model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = lr_scheduler(optimizer, 2, 5)
    (model(x) ** 2).sum().backward()
    optimizer_step(optimizer, model.parameters(), 1.0)
    assert scheduler.last_epoch == 0 and optimizer.param_groups[0]["lr"] == 0.05


def test_adamw_takes_the_config_section():
    optim = SimpleNamespace(lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    model, _ = _model_and_batch()
    group = adamw(model.parameters(), optim, torch.device("cpu")).param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (0.01, (0.8, 0.9), 1e-6, 0.1)
    assert group["fused"]


def test_validation_steps():
    assert [s for s in range(1, 8) if is_validation_step(s, 3, 7)] == [3, 6, 7]
    assert [s for s in range(1, 5) if is_validation_step(s, 10, 4)] == [4]
    assert not any(is_validation_step(s, 0, 4) for s in range(1, 5))  # 0: validation off, even at the end


def test_save_steps_on_their_own_interval_or_tied_to_validation():
    trainer = SimpleNamespace(save_interval=2, val_check_interval=3, save_on_validation=False)
    assert [s for s in range(1, 8) if is_save_step(s, trainer, 7)] == [2, 4, 6, 7]
    trainer.save_on_validation = True  # NeMo's tie: checkpoints where validation runs
    assert [s for s in range(1, 8) if is_save_step(s, trainer, 7)] == [3, 6, 7]


def test_run_length_takes_whichever_of_max_steps_and_max_epochs_ends_first():
    trainer = SimpleNamespace(max_steps=100, max_epochs=None)
    assert run_length(trainer, num_prompts=10, prompts_per_step=4) == 100
    trainer.max_epochs = 2  # 20 prompts drawn in steps of 4: 5 steps
    assert run_length(trainer, num_prompts=10, prompts_per_step=4) == 5
    trainer.max_epochs = 3  # 30 prompts: 7 whole steps, the 2 left over do not make one
    assert run_length(trainer, num_prompts=10, prompts_per_step=4) == 7
    trainer.max_steps = 6
    assert run_length(trainer, num_prompts=10, prompts_per_step=4) == 6


def test_run_clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("aligner.trainers.loop.time.monotonic", lambda: now[0])
    clock, unlimited = RunClock(30.0), RunClock(None)
    now[0] = 129.9
    assert not clock.expired()
    now[0] = 130.0
    assert clock.expired() and not unlimited.expired()
