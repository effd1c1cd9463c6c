"""A real headless Chromium opens the dashboard of a live run and watches it advance."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from browser import Browser
from live_run import LiveRun

from steadytune.web.server import DashboardHandle

pytestmark = pytest.mark.slow

STEP = "return Number(document.getElementById('step').dataset.step || -1)"
LOSS_POINTS = "return window.steadytune.charts.loss.pointCount()"


def test_live_run_page_advances_and_screenshot(
    chromium: tuple[str, str], live_run: LiveRun, dashboard: DashboardHandle, artifacts: Path
) -> None:
    time.sleep(11)  # enough history for the charts, a checkpoint and a few anomalies
    with Browser(*chromium) as b:
        b.get(dashboard.url + "run/live-run")
        b.wait_for("return window.steadytune && window.steadytune.ready === true", timeout=30)
        b.wait_for(f"{STEP.replace('return ', 'return (')}) > 0", timeout=10)
        step1, points1 = b.js(STEP), b.js(LOSS_POINTS)
        assert points1 > 0
        # Live: the counter and the chart advance with no reload.
        b.wait_for(f"return {STEP[7:]} >= {step1 + 5}", timeout=10)
        b.wait_for(f"return {LOSS_POINTS[7:]} >= {points1 + 5}", timeout=10)
        # Record-to-screen: the page notes when the newest record was drawn.
        last = b.wait_for("return window.steadytune.lastRender", timeout=5)
        assert last["shownAt"] - last["recordTs"] < 1.0, last
        # The side panels: events with cause and fix, a verified LAST_GOOD checkpoint, the plan.
        text = b.js("return document.body.innerText")
        assert "loss_spike" in text and "cause: a batch of unusually long samples" in text
        assert "LAST_GOOD" in text and "verified" in text and "initial" in text
        b.wait_for("return document.getElementById('note-mem').textContent.startsWith('headroom')", timeout=5)
        shot = b.screenshot(artifacts / "dashboard.png")
        assert shot.stat().st_size > 20_000
        docs_img = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
        if not docs_img.exists():
            docs_img.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, docs_img)
        # Dark theme renders too.
        b.js("document.getElementById('theme').click()")
        b.screenshot(artifacts / "dashboard-theme-toggled.png")
        # Runs page lists the run with its state and live step.
        b.get(dashboard.url)
        b.wait_for("return document.querySelectorAll('#runs tbody tr[data-run=\"live-run\"]').length === 1")
        row = b.js("return document.querySelector('#runs tbody tr').innerText")
        assert "live-run" in row and "running" in row
        b.screenshot(artifacts / "runs.png")
