"""On a resume the command's learning rate replaces the one the checkpoint's scheduler brings back."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from steadytune.guard.hf import restore_base_lrs as command_lr  # noqa: E402


def _built(lr: float, steps_done: int = 0) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """An optimizer with two groups (LoRA+-style: the second at 4x) and a linear decay over 10 steps."""
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([{"params": [a], "lr": lr}, {"params": [b], "lr": 4 * lr}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / 10)
    for _ in range(steps_done):
        opt.step()
        sched.step()
    return opt, sched


def test_the_commands_rate_wins_and_the_schedule_goes_on_where_it_was() -> None:
    saved_opt, saved_sched = _built(2e-3, steps_done=3)  # the checkpoint, at step 3
    opt, sched = _built(1e-3)  # the resumed trainer, built from a command that says 1e-3
    fresh = list(sched.base_lrs)
    # What the HF Trainer does on resume: both states come back from the checkpoint.
    opt.load_state_dict(saved_opt.state_dict())
    sched.load_state_dict(saved_sched.state_dict())
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1.4e-3, 5.6e-3])  # the old rate
    assert command_lr(opt, sched, fresh) == ([2e-3, 8e-3], [1e-3, 4e-3])
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.7e-3, 2.8e-3])  # step 3 of the new one
    opt.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.6e-3, 2.4e-3])
    assert sched.get_last_lr() == pytest.approx([0.6e-3, 2.4e-3])


def test_a_resume_at_the_same_rate_or_another_shape_is_left_alone() -> None:
    saved_opt, saved_sched = _built(2e-3, steps_done=3)
    opt, sched = _built(2e-3)
    fresh = list(sched.base_lrs)
    opt.load_state_dict(saved_opt.state_dict())
    sched.load_state_dict(saved_sched.state_dict())
    assert command_lr(opt, sched, fresh) is None
    assert command_lr(opt, sched, [1e-3]) is None  # not one rate per group: not ours to guess
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1.4e-3, 5.6e-3])
