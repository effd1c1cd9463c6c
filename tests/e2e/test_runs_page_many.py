"""The runs page over many runs: the goodput panel draws the newest 100 until asked for all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import open_chromium, wait_js

from steadytune.records import StepRecord
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.server import DashboardHandle, start_dashboard

pytestmark = pytest.mark.slow

RUNS = 120


@pytest.fixture
def many_runs(tmp_path: Path) -> Iterator[DashboardHandle]:
    runs = tmp_path / "runs"
    for i in range(RUNS):
        run = RunDir(runs / f"run-{i:03d}").create()
        start = 1_700_000_000.0 + 100 * i
        with JsonlWriter(run.telemetry(0)) as w:
            for s in range(3):
                w.write(StepRecord(step=s, ts=start + s + 1, loss=1.0, step_time_s=1.0))
        status = {"run_id": run.run_id, "state": "completed", "step": 2, "updated_ts": start + 5}
        atomic_write_text(run.status, json.dumps(status))
    handle = start_dashboard(runs, host="127.0.0.1", port=0)
    yield handle
    handle.stop()


def test_the_goodput_panel_draws_the_newest_hundred_until_asked_for_all(
    many_runs: DashboardHandle, chromium: tuple[str, str]
) -> None:
    with open_chromium(*chromium) as b:
        b.get(many_runs.url)
        wait_js(b, f"return document.querySelectorAll('#runs tbody tr').length === {RUNS}", timeout=60)
        # The runs are read in the background, newest first: each account is drawn once its run is read.
        wait_js(b, "return document.querySelectorAll('#goodput-runs .gp-run').length === 100", timeout=120)
        wait_js(b, "return document.getElementById('goodput-pending').textContent === ''", timeout=60)
        wait_js(b, "return document.getElementById('pending').textContent === ''", timeout=60)  # the table
        bars = b.execute_script(
            "return [...document.querySelectorAll('#goodput-runs .gp-run')].map(e => e.dataset.run)"
        )
        assert bars == [f"run-{i:03d}" for i in range(RUNS - 1, RUNS - 101, -1)]  # the newest first
        more = b.find_element("id", "goodput-more")
        assert more.is_displayed() and more.text == f"show all {RUNS} runs"
        more.click()
        wait_js(b, f"return document.querySelectorAll('#goodput-runs .gp-run').length === {RUNS}", timeout=30)
        assert not more.is_displayed()
