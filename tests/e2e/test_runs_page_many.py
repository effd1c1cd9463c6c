"""The runs page over many runs: the table shows a page of 100, every run found by name, filtered or
sorted over all of them; the goodput panel draws the newest 100 until asked for all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import open_chromium, wait_js
from selenium.webdriver.support.select import Select

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
        state = "failed" if i % 10 == 7 else "completed"
        status = {"run_id": run.run_id, "state": state, "step": 2, "updated_ts": start + 5}
        atomic_write_text(run.status, json.dumps(status))
    handle = start_dashboard(runs, host="127.0.0.1", port=0)
    yield handle
    handle.stop()


def test_the_goodput_panel_draws_the_newest_hundred_until_asked_for_all(
    many_runs: DashboardHandle, chromium: tuple[str, str]
) -> None:
    with open_chromium(*chromium) as b:
        b.get(many_runs.url)
        wait_js(b, "return document.querySelectorAll('#runs tbody tr').length === 100", timeout=60)
        assert b.find_element("id", "runs-count").text == f"runs 1–100 of {RUNS}"
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


def _shown(b: object) -> list[str]:
    return b.execute_script(  # type: ignore[attr-defined,no-any-return]
        "return [...document.querySelectorAll('#runs tbody tr')].map(tr => tr.dataset.run)"
    )


def test_every_run_is_found_by_name_state_or_order_though_a_page_shows_100(
    many_runs: DashboardHandle, chromium: tuple[str, str]
) -> None:
    with open_chromium(*chromium) as b:
        b.get(many_runs.url)
        wait_js(b, "return document.querySelectorAll('#runs tbody tr').length === 100", timeout=60)
        assert _shown(b) == [f"run-{i:03d}" for i in range(100)]
        b.find_element("id", "runs-next").click()
        wait_js(b, "return document.querySelectorAll('#runs tbody tr').length === 20", timeout=30)
        assert _shown(b)[-1] == f"run-{RUNS - 1:03d}"
        assert b.find_element("id", "runs-count").text == f"runs 101–{RUNS} of {RUNS}"
        assert not b.find_element("id", "runs-next").is_enabled()
        # A run on the second page, found from the first by its name.
        b.find_element("id", "runs-prev").click()
        wait_js(b, "return document.querySelectorAll('#runs tbody tr').length === 100", timeout=30)
        b.find_element("id", "runs-search").send_keys("RUN-11")
        wait_js(b, "return document.querySelectorAll('#runs tbody tr').length === 10", timeout=30)
        assert _shown(b) == [f"run-{i:03d}" for i in range(110, 120)]
        assert b.find_element("id", "runs-count").text == f"runs 1–10 of 10 matching ({RUNS} in all)"
        # The state filter counts every run's state, and keeps the search.
        Select(b.find_element("id", "runs-state")).select_by_value("failed")
        wait_js(b, "return document.querySelectorAll('#runs tbody tr').length === 1", timeout=30)
        assert _shown(b) == ["run-117"]
        options = [o.text for o in Select(b.find_element("id", "runs-state")).options]
        assert options == ["every state", f"completed ({RUNS - 12})", "failed (12)"]
        b.find_element("id", "runs-search").send_keys("x")
        wait_js(b, "return !document.getElementById('no-match').classList.contains('hidden')", timeout=30)
        b.find_element("id", "runs-clear").click()
        wait_js(b, "return document.querySelectorAll('#runs tbody tr').length === 100", timeout=30)
        # Sorted by when each run last moved, the newest first: the last run made leads.
        b.find_element("css selector", "#runs th[data-sort=updated_ts]").click()
        newest = f"run-{RUNS - 1:03d}"
        wait_js(b, f"return document.querySelector('#runs tbody tr').dataset.run === '{newest}'", 30)
        assert _shown(b)[:3] == [f"run-{i:03d}" for i in (RUNS - 1, RUNS - 2, RUNS - 3)]
