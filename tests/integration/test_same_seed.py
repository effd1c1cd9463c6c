"""One config trained twice with one seed takes one path: the same loss at every step, bit for bit.

The LoRA adapters were made before the Trainer seeded anything, so each run drew its own ``A``
matrices: at a high learning rate one run blew up at step 31, the same config at step 137 or never.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .runs import finish, run_dir, start_run, steps, write_config

pytestmark = pytest.mark.slow


def test_two_lora_runs_of_one_config_have_the_same_losses(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(
        tmp_path,
        demo_assets,
        method="lora",
        lora={"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"},
        train={"learning_rate": 0.3, "max_steps": 8, "save_steps": 8, "logging_steps": 1, "seed": 7},
    )
    procs = {name: start_run(cfg, name) for name in ("first", "second")}
    for proc in procs.values():
        rc, out = finish(proc)
        assert rc == 0, out
    first, second = ([(r.step, r.loss) for r in steps(run_dir(cfg, name))] for name in procs)
    assert [s for s, _ in first] == list(range(1, 9))
    assert first == second
    # Past the warm-up the adapters move the loss off the base model's: the runs compared trained.
    assert len({loss for _, loss in first}) > 2
