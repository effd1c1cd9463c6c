"""Where the drill places its faults: from the job's own save_steps and max_steps, never past its end;
and a fault that never fired reads as not injected, not as a failed detection or recovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.cli.drill import _finish, _summary, render, supervise_job
from steadytune.cli.main import build_parser
from steadytune.cli.main import main as cli
from steadytune.drill import external
from steadytune.drill.runner import final_loss, report_run
from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter


def _yaml(tmp_path: Path, save: int, last: int) -> Path:
    path = tmp_path / "sft.yaml"
    path.write_text(
        "model_name_or_path: tiny\n"
        "output_dir: saves/sft  # overridden by the drill\n"
        f"save_steps: {save}\n"
        f"max_steps: {last}\n"
        "learning_rate: 2.0e-3\n"
    )
    return path


def _args(tmp_path: Path, *words: str) -> object:
    argv = ["drill", "--supervise", "--preset", "llamafactory", "--runs-dir", str(tmp_path / "runs"), *words]
    return build_parser().parse_args(argv)


def test_a_llamafactory_job_has_its_faults_placed_from_its_yaml(tmp_path: Path) -> None:
    yaml = _yaml(tmp_path, save=10, last=40)
    args = _args(tmp_path, "--faults", "kill,truncated,hang,lr,sigterm", "--",
                 "llamafactory-cli", "train", str(yaml), "output_dir={output_dir}")  # fmt: skip
    job, faults, _, placed = supervise_job(args)
    placed_at = {f.kind: f.at_step for f in faults}
    assert placed_at == {"kill": 25, "truncated": 20, "hang": 25, "lr": 1, "sigterm": 25}  # not 50, 40, ...
    assert job.base_lr == pytest.approx(2e-3)  # the lr fault's base, from the YAML too
    assert f"save_steps: 10 in {yaml}" in placed and f"max_steps: 40 in {yaml}" in placed


def test_an_override_after_the_yaml_wins_as_in_the_tool(tmp_path: Path) -> None:
    yaml = _yaml(tmp_path, save=10, last=40)
    job = ["llamafactory-cli", "train", str(yaml), "output_dir={output_dir}", "save_steps=4"]
    args = _args(tmp_path, "--faults", "kill", "--", *job)
    _, (kill,), _, placed = supervise_job(args)
    assert kill.at_step == 10 and "save_steps 4 in the command" in placed


def test_a_fault_past_the_jobs_last_step_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    yaml = _yaml(tmp_path, save=20, last=40)
    rc = cli(["drill", "--supervise", "--preset", "llamafactory", "--faults", "kill,lr", "--runs-dir",
              str(tmp_path / "runs"), "--", "llamafactory-cli", "train", str(yaml),
              "output_dir={output_dir}"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "runs").exists()
    assert f"the run ends at step 40 (max_steps: 40 in {yaml}), at or before fault(s) kill@50," in err
    assert f"save_steps 20 (save_steps: 20 in {yaml})" in err
    assert "--save-steps" in err and "@STEP" in err
    assert "lr@1" not in err  # the fault that fits is not named


def test_steps_says_where_a_job_that_names_no_max_steps_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = ["python", "t.py", "--output_dir", "{output_dir}", "--save_steps", "10", "--num_train_epochs", "1"]
    args = _args(tmp_path, "--faults", "kill", "--steps", "60", "--", *job)
    assert "the run ends at step 60 (--steps 60)" in supervise_job(args)[3]
    assert cli(["drill", "--supervise", "--faults", "kill", "--steps", "20", "--", *job]) == 2
    assert "the run ends at step 20 (--steps 20), at or before fault(s) kill@25" in capsys.readouterr().err
    # The job's own max_steps wins over --steps, which only says what the job does not.
    args = _args(tmp_path, "--faults", "kill", "--steps", "20", "--", *job, "--max_steps", "40")
    assert "the run ends at step 40 (max_steps 40 in the command)" in supervise_job(args)[3]


def test_the_native_drill_refuses_faults_past_its_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["drill", "--steps", "40", "--faults", "nan,spike"]) == 2
    out = capsys.readouterr().out
    assert "the run ends at step 40 (--steps 40), at or before fault(s) nan@50, spike@61" in out
    assert "--save-steps" in out and "a larger --steps" in out


def _completed_run(root: Path, last: int) -> RunDir:
    """A run that trained steps 1..last with nothing done to it and completed."""
    run = RunDir(root).create()
    steps = JsonlWriter(run.telemetry(0))
    for s in range(1, last + 1):
        steps.write(StepRecord(step=s, ts=1000.0 + s, attempt=0, loss=2.0))
    EventLog(run.events, "run", audit=False).emit("lifecycle", "run_completed", "done", step=last)
    return run


def test_a_fault_that_never_fired_reads_not_injected_not_undetected(tmp_path: Path) -> None:
    hang = external.catalogue(20)["hang"]  # at step 50, an actor's
    spike = external.catalogue(20, inject=True)["spike"]  # at step 61, the guard's, which files no event
    run = _completed_run(tmp_path / "run", 40)
    reports = [report_run(spec, run, "completed", None, True) for spec in (hang, spike)]
    assert [(r.injected, r.detected, r.recovered) for r in reports] == [(False, False, False)] * 2
    out = _summary(reports, True, final_loss(run), True, run)
    assert (out["completed"], out["weights_finite"], out["not_injected"]) == (True, True, ["hang", "spike"])
    text = render(out)
    assert "hang                  50  fault not injected" in text and " NO" not in text
    assert "not injected: hang, spike (the run never came to the fault)" in text
    assert _finish(out, build_parser().parse_args(["drill"])) == 1  # nothing was proven of them
    # The same fault, landed: the row speaks of detection and recovery again.
    landed = report_run(hang, run, "completed", 1040.0, True)
    assert landed.injected and not landed.detected
    assert "not injected" not in render(_summary([landed], True, final_loss(run), True, run))
