"""``resume`` of a run: a live supervisor is asked, an ended run goes on, a completed one is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.cli.control import resume_verdict, supervisor_alive
from steadytune.cli.main import main
from steadytune.rundir import RunDir, atomic_write_text


def _ended(tmp_path: Path, state: str) -> RunDir:
    run = RunDir(tmp_path / "runs" / "r1").create()
    run.events.write_text("")
    ckpt = str(run.root / "checkpoints" / "checkpoint-35")
    atomic_write_text(run.status, json.dumps({"state": state, "step": 35, "last_checkpoint": ckpt}))
    return run


@pytest.mark.parametrize("state", ["stopped", "failed"])
def test_an_ended_run_is_reopened_as_it_ended(state: str) -> None:
    assert resume_verdict("r1", {"state": state, "source": "worker"}, alive=lambda pid: True) == (
        "reopen",
        state,
    )


@pytest.mark.parametrize("state", ["running", "paused", "restarting"])
def test_a_run_whose_supervisor_died_is_reopened_as_crashed(state: str) -> None:
    status = {"state": state, "supervisor_pid": 4321, "worker_pid": 4322}
    assert resume_verdict("r1", status, alive=lambda pid: False) == ("reopen", "crashed")


def test_a_crashed_run_whose_worker_still_trains_is_refused() -> None:
    status = {"state": "running", "supervisor_pid": 4321, "worker_pid": 4322}
    verdict, why = resume_verdict("r1", status, alive=lambda pid: pid == 4322)
    assert verdict == "refuse" and "worker (pid 4322) still runs" in why


def test_a_live_supervisor_is_asked_and_never_reopened() -> None:
    status = {"state": "paused", "supervisor_pid": 4321}
    assert resume_verdict("r1", status, alive=lambda pid: pid == 4321) == ("request", "")


def test_a_finished_supervisor_is_not_alive_whatever_holds_its_pid_now() -> None:
    assert not supervisor_alive({"state": "stopped", "supervisor_pid": 4321}, alive=lambda pid: True)


def test_a_watched_command_is_refused_with_how_to_go_on() -> None:
    verdict, why = resume_verdict("r1", {"state": "stopped", "source": "job"}, alive=lambda pid: False)
    assert verdict == "refuse" and "steadytune supervise" in why


def test_resume_of_a_completed_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _ended(tmp_path, "completed")
    assert main(["resume", str(run.root)]) == 1
    err = capsys.readouterr().err
    assert "r1 is completed" in err and "nothing left to resume" in err


def test_other_controls_of_an_ended_run_stay_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _ended(tmp_path, "stopped")
    assert main(["stop", str(run.root)]) == 1
    assert "is stopped; nothing to stop" in capsys.readouterr().err
