"""A run's tokens/s is one figure wherever it is shown: the mean over its steps that the end-of-run
summary and ``status.json`` give, on the runs page and in ``top`` too, never the last step's alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.records import StepRecord
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.progress import RunProgress
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.api import runs_list
from steadytune.web.runs import RunsIndex
from steadytune.web.topview import scan_runs

NOW = 1_800_000_000.0


def _records() -> list[StepRecord]:
    # Steady steps, then a short last batch: its own rate is far above the run's.
    recs = [StepRecord(step=s, ts=NOW - 100 + s, loss=2.0, tokens=512, step_time_s=0.1 + 0.01 * (s % 3))
            for s in range(40)]  # fmt: skip
    recs.append(StepRecord(step=40, ts=NOW - 59, loss=1.9, tokens=216, step_time_s=0.0173))
    return recs


def _summary_figure(recs: list[StepRecord]) -> float:
    progress = RunProgress(max_steps=41)
    for r in recs:
        progress.add(r)
    assert progress.tokens_per_s is not None
    return progress.tokens_per_s


def _run(root: Path, with_supervisor: bool) -> float:
    recs = _records()
    run = RunDir(root / "runs" / "r1").create()
    with JsonlWriter(run.telemetry(0)) as w:
        for r in recs:
            w.write(r)
    figure = _summary_figure(recs)
    status = {"run_id": "r1", "state": "completed", "step": 40, "max_steps": 41, "updated_ts": NOW - 50}
    if with_supervisor:
        status["tokens_per_s"] = figure
    atomic_write_text(run.status, json.dumps(status))
    return figure


@pytest.mark.parametrize("with_supervisor", [True, False])
def test_the_runs_page_shows_the_summary_figure_once_indexed(tmp_path: Path, with_supervisor: bool) -> None:
    figure = _run(tmp_path, with_supervisor)
    index = RunsIndex(tmp_path / "runs", clock=lambda: NOW, cache_dir=tmp_path / "cache")
    try:
        index.refresh_all()
        (row,) = runs_list(index)
    finally:
        index.close()
    assert not row.get("indexing")
    assert row["tokens_per_s"] == pytest.approx(figure)
    assert row["tokens_per_s"] < 216 / 0.0173 / 2  # not the last step's rate


@pytest.mark.parametrize("with_supervisor", [True, False])
def test_top_shows_the_summary_figure(tmp_path: Path, with_supervisor: bool) -> None:
    figure = _run(tmp_path, with_supervisor)
    (row,) = scan_runs(tmp_path / "runs")
    assert row.tokens_per_s == pytest.approx(figure)
