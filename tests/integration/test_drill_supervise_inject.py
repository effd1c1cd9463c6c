"""`steadytune drill --supervise --inject -- CMD`: the faults done inside the plain HF Trainer script,
recovered."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from steadytune.drill.runner import finite_weights
from steadytune.records import StepRecord, run_end
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

from .runs import STEADYTUNE
from .test_drill_supervise import _run_of, _script

# A drill of supervised runs, one of them timed for a hang: kept off the other heavy tests.
pytestmark = [pytest.mark.slow, pytest.mark.serial]
FAULTS = ("nan", "spike", "kill", "sigterm")  # kill: an outside fault, with the guard inside


def _steps(run: Path) -> list[StepRecord]:
    recs = iter_records(run / "telemetry" / "rank-0.jsonl")
    return [r for r in recs if isinstance(r, StepRecord) and not r.extra.get("eval")]


def test_faults_inside_and_outside_an_injected_trainer_are_recovered_under_the_native_table(
    tmp_path: Path, demo_assets: Path
) -> None:
    import subprocess

    runs = tmp_path / "runs"
    cmd = [
        STEADYTUNE,
        "drill",
        "--supervise",
        "--inject",
        "--faults",
        ",".join(FAULTS),
        "--runs-dir",
        str(runs),
        "--",
        *_script(demo_assets, 40, 0.05, "--learning_rate", "2e-3"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in FAULTS and len(line.split()) == 8
    }
    assert set(rows) == set(FAULTS)
    for row in rows.values():
        assert row[2] == "yes" and row[5] == "yes", row
    assert rows["nan"][1:5] == ["25", "yes", "25", "skip_step"]
    assert (
        rows["spike"][4] == "rollback"
        and rows["sigterm"][4] == "run_stopped"
        and rows["kill"][4] == "restart"
    )
    assert "completed: yes   weights finite: yes" in out
    outputs = runs / "outputs"

    # nan: the poisoned update was skipped inside the trainer, at its step, and nothing restarted.
    nan = _run_of(runs, "nan")
    skip = next(e for e in read_events(nan / "events.jsonl") if e.name == "skip_step")
    assert skip.kind == "action" and skip.step == 25
    assert [r.step for r in _steps(nan) if r.skipped] == [25]
    assert {r.attempt for r in _steps(nan)} == {0} and max(r.step for r in _steps(nan)) == 40
    assert finite_weights(outputs / nan.name / "checkpoint-40")

    # spike: the burst at 31 was seen, rolled back to checkpoint-30, and the optimizer itself ran at
    # the policy's half of the job's LR (the checkpoint's scheduler would have brought back the old one).
    spike = _run_of(runs, "spike")
    events = read_events(spike / "events.jsonl")
    names = [e.name for e in events]
    assert (
        names.index("rollback")
        < names.index("restart")
        < names.index("lr_from_command")
        < names.index("run_completed")
    )
    started = [e.data["cmd"] for e in events if e.name == "worker_started"]
    assert started[-1][-4:] == ["--resume_from_checkpoint", str(outputs / spike.name / "checkpoint-30"),
                                "--learning_rate", "0.001"]  # fmt: skip
    by = {(r.attempt, r.step): r for r in _steps(spike)}
    assert by[(0, 31)].lr > 100 * by[(0, 30)].lr  # the burst (x1000 of the schedule)
    assert by[(1, 31)].lr == pytest.approx(0.5 * by[(0, 31)].lr / 1000)
    assert math.isfinite(by[(1, 40)].loss) and finite_weights(outputs / spike.name / "checkpoint-40")

    # kill: the injected trainer resumed from its checkpoint with the guard again, its records continuing.
    kill = _run_of(runs, "kill")
    resumed = [r.step for r in _steps(kill) if r.attempt == 1]
    assert resumed and 20 < resumed[0] <= 22 and resumed[-1] == 40
    assert [e.name for e in read_events(kill / "events.jsonl")].count("guard_injected") == 2

    # sigterm: a stop request, not a signal, reached the trainer: it saved the step it was on and stopped.
    stop = _run_of(runs, "sigterm")
    assert json.loads((stop / "status.json").read_text())["state"] == "stopped"
    events = read_events(stop / "events.jsonl")
    stopped = run_end(events)
    assert stopped.name == "run_stopped"
    saved = [e for e in events if e.name == "checkpoint_saved" and e.step == stopped.step]
    assert saved and Path(saved[0].data["path"]).name == f"checkpoint-{stopped.step}"
    assert finite_weights(outputs / stop.name / f"checkpoint-{stopped.step}")
