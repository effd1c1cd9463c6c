"""In-process OOM recovery: the split step's gradients equal the unsplit step's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from steadytune.config.load import validate_dict
from steadytune.guard.core import Guard
from steadytune.guard.faults import Faults
from steadytune.records import PlanRevision
from steadytune.train.runner import SplitExhausted, build_trainer


def make_trainer(tmp_path: Path, assets: Path, faults: Faults | None = None, method: str = "full"):
    cfg = validate_dict(
        {
            "model": {"name_or_path": str(assets / "model")},
            "method": method,
            "data": {"train_file": str(assets / "train.jsonl"), "max_seq_length": 64},
            "train": {"per_device_train_batch_size": 8, "max_steps": 4, "max_grad_norm": 0.0},
            "run": {"runs_dir": str(tmp_path)},
        },
        base=tmp_path,
    )
    guard = Guard(tmp_path / "run")
    plan = PlanRevision(revision=0, ts=0, reason="start")
    trainer = build_trainer(cfg, plan, guard, [], tmp_path / "staging", faults=faults)
    trainer.create_optimizer_and_scheduler(num_training_steps=4)
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop in real runs
    return trainer, guard


def grads_for(trainer, batch, split: int, num_items) -> dict[str, torch.Tensor]:
    model = trainer.model
    model.zero_grad(set_to_none=True)
    trainer.st_split = split
    trainer._st_step_of_inputs = -1
    trainer.training_step(model, dict(batch), num_items)
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("use_num_items", [True, False])
def test_split_gradients_equal_unsplit(tmp_path: Path, demo_assets: Path, use_num_items: bool) -> None:
    trainer, _ = make_trainer(tmp_path, demo_assets)
    batch = next(iter(trainer.get_train_dataloader()))
    num_items = int((batch["labels"][:, 1:] != -100).sum()) if use_num_items else None
    if not use_num_items:
        trainer.model_accepts_loss_kwargs = False  # the mean-reduced path must be exact too
    ref = grads_for(trainer, batch, 1, num_items)
    for split in (2, 4, 8):
        got = grads_for(trainer, batch, split, num_items)
        assert got.keys() == ref.keys()
        for name in ref:
            torch.testing.assert_close(
                got[name], ref[name], rtol=1e-5, atol=1e-6, msg=f"{name} split={split}"
            )


def test_injected_oom_splits_the_same_batch_and_records_it(tmp_path: Path, demo_assets: Path) -> None:
    trainer, guard = make_trainer(tmp_path, demo_assets, Faults(oom_at_step=1, oom_above=2))
    batch = next(iter(trainer.get_train_dataloader()))
    num_items = int((batch["labels"][:, 1:] != -100).sum())
    ref_trainer, _ = make_trainer(tmp_path / "ref", demo_assets)
    ref = grads_for(ref_trainer, batch, 1, num_items)
    trainer.model.zero_grad(set_to_none=True)
    trainer.training_step(trainer.model, dict(batch), num_items)
    assert trainer.st_split == 4  # 8 samples > 2 -> split 2 (4 each) -> OOM again -> split 4 (2 each)
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-5, atol=1e-6)
    guard.writer.sync()
    text = (tmp_path / "run" / "telemetry" / "rank-0.jsonl").read_text()
    assert text.count('"name":"reduce_microbatch"') == 2 and '"micro_batch_split":4' in text


def test_split_limit_escalates(tmp_path: Path, demo_assets: Path) -> None:
    trainer, _ = make_trainer(tmp_path, demo_assets, Faults(oom_at_step=1, oom_above=0))
    trainer.st_max_split = 4
    batch = next(iter(trainer.get_train_dataloader()))
    with pytest.raises(SplitExhausted, match="split into 4 chunks"):
        trainer.training_step(trainer.model, dict(batch), None)
