"""``resume`` of a run that was stopped says what ``resume`` continues and where the run stands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.cli.main import main
from steadytune.rundir import RunDir, atomic_write_text


def _ended(tmp_path: Path, state: str) -> RunDir:
    run = RunDir(tmp_path / "runs" / "r1").create()
    run.events.write_text("")
    ckpt = str(run.root / "checkpoints" / "checkpoint-35")
    atomic_write_text(run.status, json.dumps({"state": state, "step": 35, "last_checkpoint": ckpt}))
    return run


@pytest.mark.parametrize("state", ["stopped", "failed"])
def test_resume_of_a_stopped_run_names_its_checkpoint_and_what_to_run(
    tmp_path: Path, state: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _ended(tmp_path, state)
    assert main(["resume", str(run.root)]) == 1
    err = capsys.readouterr().err
    assert "nothing to resume" not in err
    assert "checkpoint-35" in err and "paused run" in err and "steadytune run CONFIG" in err


def test_other_controls_of_an_ended_run_stay_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _ended(tmp_path, "stopped")
    assert main(["stop", str(run.root)]) == 1
    assert "is stopped; nothing to stop" in capsys.readouterr().err
