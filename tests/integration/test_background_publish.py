"""A checkpoint is published (fsync, hash, rename, manifest) beside the next steps, not in front of them.

Real HF training on the demo model with the guard callback and a keeper whose publish is held
in its unsafe window (the drill's slow-save hook): the steps after a save go on meanwhile,
every checkpoint is sealed by the time ``train()`` returns, and a publish that fails fails the
training at the next step, as a failing save did when it was done in ``on_save``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import TrainerCallback

from steadytune.checkpoint.manifest import verify
from steadytune.guard.checkpoints import CheckpointKeeper
from steadytune.guard.core import Guard
from steadytune.guard.faults import Faults
from steadytune.guard.hf import GuardCallback
from steadytune.records import Event, StepRecord
from steadytune.telemetry.stream import iter_records
from tests.integration.test_grad_norm_clip import plain_trainer


class PublishFinished(TrainerCallback):
    """After the guard's on_save: waits for the publish thread, so the test knows when it failed."""

    def __init__(self, cb: GuardCallback) -> None:
        self.cb = cb

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        thread = self.cb._publishing
        if thread is not None:
            thread.join(timeout=30)


class StepsEnded(TrainerCallback):
    """After the guard's on_step_end (its step record written): tells the faults which step ended."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.faults.after_step(state.global_step, 0)


def trainer_with(
    tmp_path: Path, assets: Path, keeper_of: Any, wait: bool = False, after: list[Any] | None = None
) -> tuple[Any, Guard]:
    guard = Guard(tmp_path / "run", rank=0, attempt=0)
    cb = GuardCallback(guard, keeper_of(guard), guard.run.staging)
    trainer = plain_trainer(tmp_path, assets, [cb, *([PublishFinished(cb)] if wait else []), *(after or [])])
    trainer.args.max_steps, trainer.args.save_steps = 4, 2
    return trainer, guard


def test_the_steps_after_a_save_run_while_it_is_published_and_train_returns_it_sealed(
    tmp_path: Path, demo_assets: Path
) -> None:
    # checkpoint-2 is held in its window until step 3 has ended: a publish in front of the steps
    # would never see it end (the hold gives up after 120 s, and step 3 comes after the save).
    # A fixed 1.5 s hold stood for it, and a step slower than that on a loaded machine failed.
    held = Faults(slow_save_step=2, slow_save_until_step=3)

    def keeper(guard: Guard) -> CheckpointKeeper:
        return CheckpointKeeper(
            guard.run, min_free_bytes=0, save_fault=lambda step: held.in_save_window(step, 0)
        )

    trainer, guard = trainer_with(tmp_path, demo_assets, keeper, after=[StepsEnded(held)])
    trainer.train()
    for step in (2, 4):
        assert verify(guard.run.checkpoints / f"checkpoint-{step}").ok
    records = list(iter_records(guard.run.telemetry(0)))
    step3 = next(r for r in records if isinstance(r, StepRecord) and r.step == 3)
    saved2 = next(r for r in records if isinstance(r, Event) and r.name == "checkpoint_saved" and r.step == 2)
    assert step3.ts < saved2.ts  # step 3 trained while checkpoint-2 sat in its window
    guard.close()


def test_a_publish_that_fails_fails_the_training_at_the_next_step(tmp_path: Path, demo_assets: Path) -> None:
    class FullDisk(CheckpointKeeper):
        def publish(self, staged: Path, step: int, **kw: Any) -> Path:
            raise OSError(28, "No space left on device")

    trainer, guard = trainer_with(
        tmp_path, demo_assets, lambda g: FullDisk(g.run, min_free_bytes=0), wait=True
    )
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    steps = [r.step for r in iter_records(guard.run.telemetry(0)) if isinstance(r, StepRecord)]
    assert steps == [1, 2]  # step 3 never began
    guard.close()
