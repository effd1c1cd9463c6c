"""The drill's final loss: which figure it is, named for what it is, and how it meets the run summary's."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.cli.drill import render
from steadytune.drill.runner import final_loss
from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.progress import RunProgress
from steadytune.telemetry.stream import JsonlWriter


def _run(root: Path, records: list[StepRecord]) -> RunDir:
    run = RunDir(root).create()
    out = JsonlWriter(run.telemetry(0))
    for r in records:
        out.write(r)
    return run


def _logged(steps: range, attempt: int = 0, base: float = 6.0) -> list[StepRecord]:
    return [StepRecord(step=s, ts=1000.0 + s, attempt=attempt, loss=base - 0.05 * s) for s in steps]


def test_a_job_that_logs_every_10_steps_ends_on_the_summarys_last_loss(tmp_path: Path) -> None:
    records = _logged(range(10, 41, 10))  # LLaMA-Factory's logging_steps: 10 over max_steps: 40
    end = final_loss(_run(tmp_path, records))
    summary = RunProgress()
    for r in records:
        summary.add(r)
    assert end is not None and end.value == summary.last_loss  # not the mean of all four logged losses
    assert end.name == "training loss of step 40"


def test_a_job_that_logs_each_step_is_averaged_over_its_last_10(tmp_path: Path) -> None:
    records = _logged(range(1, 41))
    end = final_loss(_run(tmp_path, records))
    assert end is not None and end.name == "mean training loss of steps 31-40"
    assert end.value == pytest.approx(sum(r.loss or 0 for r in records[-10:]) / 10)
    sparse = final_loss(_run(tmp_path / "b", _logged(range(5, 41, 5))))
    assert sparse is not None and sparse.name == "mean training loss of steps 35-40, 2 logged"


def test_the_final_timeline_counts_not_the_abandoned_attempt(tmp_path: Path) -> None:
    # Attempt 0 ran to step 38 at a high loss; attempt 1 resumed from checkpoint 30 and finished.
    records = _logged(range(1, 39), attempt=0, base=60.0) + _logged(range(31, 41), attempt=1)
    end = final_loss(_run(tmp_path, records))
    assert end is not None and end.value == pytest.approx(sum(r.loss or 0 for r in records[-10:]) / 10)


def test_an_evaluated_run_ends_on_its_last_eval_loss_as_the_summary_does(tmp_path: Path) -> None:
    records = _logged(range(1, 41))
    records.append(StepRecord(step=40, ts=2000.0, eval_loss=2.5, extra={"eval": True}))
    end = final_loss(_run(tmp_path, records))
    summary = RunProgress()
    for r in records:
        summary.add(r)
    assert end is not None and (end.value, end.name) == (summary.last_eval_loss, "eval loss at step 40")


def test_the_report_names_the_figure_and_compares_only_like_with_like() -> None:
    faults = [
        {"kind": "kill", "at_step": 25, "injected": True, "detected": True, "detected_at_step": 25,
         "action": "restart", "recovered": True, "steps_redone": 5, "recovery_seconds": 8.0,
         "final_loss": 3.3, "final_loss_is": "training loss of step 40"},
        {"kind": "hang", "at_step": 25, "injected": True, "detected": True, "detected_at_step": 25,
         "action": "restart", "recovered": True, "steps_redone": 5, "recovery_seconds": 8.0,
         "final_loss": 2.9, "final_loss_is": "eval loss at step 40"},
    ]  # fmt: skip
    clean = {"clean_final_loss": 3.0, "clean_final_loss_is": "training loss of step 40"}
    text = render({"faults": faults, **clean, "completed": True, "weights_finite": True})
    assert "final loss (training loss of step 40):" in text
    assert "kill                3.3000 (+10.0%)" in text
    assert "hang                2.9000 (eval loss at step 40)" in text and "-3.3%" not in text
