"""`steadytune supervise` numbers a plain HF Trainer script's steps as the Trainer does.

Found by `drill --supervise`: the supervised script's telemetry said step 41 for a
40-step run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from steadytune.records import StepRecord
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

from .hfjob import hf_job, supervise_cmd

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sleep", [0.2, 0.0])  # the bar redrawn between step and dict, or stale
def test_the_steps_recorded_are_the_trainers_own(tmp_path: Path, demo_assets: Path, sleep: float) -> None:
    out, steps = tmp_path / "out", 8
    cmd = supervise_cmd(
        hf_job(demo_assets, out, steps, sleep, save_steps=4), out, tmp_path / "runs", "ext", "--preset", "hf"
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "runs" / "ext"
    # The Trainer's own record of its steps, which the supervisor must agree with.
    state = json.loads((out / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == list(range(1, steps + 1))
    recorded = [r.step for r in iter_records(run / "telemetry" / "rank-0.jsonl") if isinstance(r, StepRecord)]
    assert recorded == list(range(1, steps + 1))
    assert read_events(run / "events.jsonl")[-1].step == steps
