"""`steadytune supervise` numbers a plain HF Trainer script's steps as the Trainer does.

Found by `drill --supervise`: the supervised script's telemetry said step 41 for a
40-step run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.records import StepRecord
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

from .runs import STEADYTUNE

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sleep", ["0.2", "0"])  # the bar redrawn between step and dict, or stale
def test_the_steps_recorded_are_the_trainers_own(tmp_path: Path, demo_assets: Path, sleep: str) -> None:
    out, steps = tmp_path / "out", 8
    cmd = [
        STEADYTUNE,
        "supervise",
        "--preset",
        "hf",
        "--output-dir",
        str(out),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--run-id",
        "ext",
        "--",
        sys.executable,
        str(REPO / "examples" / "hf_trainer_script.py"),
        "--output_dir",
        str(out),
        "--model",
        str(demo_assets / "model"),
        "--data",
        str(demo_assets / "train.jsonl"),
        "--max_steps",
        str(steps),
        "--save_steps",
        "4",
        "--step_sleep",
        sleep,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "runs" / "ext"
    # The Trainer's own record of its steps, which the supervisor must agree with.
    state = json.loads((out / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == list(range(1, steps + 1))
    recorded = [r.step for r in iter_records(run / "telemetry" / "rank-0.jsonl") if isinstance(r, StepRecord)]
    assert recorded == list(range(1, steps + 1))
    assert read_events(run / "events.jsonl")[-1].step == steps
