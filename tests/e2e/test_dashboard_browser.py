"""A real headless Chromium opens the dashboard of a live run and watches it advance."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from chromium import open_chromium, screenshot, wait_js
from live_run import LAYER_LIMITS, LiveRun
from selenium.webdriver.remote.webdriver import WebDriver
from tests.waiting import wait_for

from steadytune.web.server import DashboardHandle, start_dashboard

pytestmark = pytest.mark.slow

STEP = "return Number(document.getElementById('step').dataset.step || -1)"
LOSS_POINTS = "return window.steadytune.charts.loss.pointCount()"
HEAT_COLUMNS = "return window.steadytune.heatmap.columns.length"
# Opaque pixels on the heat map canvas: proof the cells were painted, not just received.
HEAT_PIXELS = """
const c = document.querySelector('#heatmap canvas');
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let n = 0;
for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
return n;
"""
# Hover the middle of the cell (row i, column j) and return the tooltip text.
HOVER_CELL = """
const h = window.steadytune.heatmap, g = h.geom, c = h.canvas, r = c.getBoundingClientRect();
const [i, j] = arguments;
c.dispatchEvent(new MouseEvent('mousemove', {bubbles: true,
  clientX: r.left + g.L + (j + 0.5) * g.cw, clientY: r.top + g.T + (i + 0.5) * g.ch}));
return h.tip.style.display === 'block' ? h.tip.innerText : '';
"""


def check_heatmap(b: WebDriver) -> None:
    """The gradient-flow heat map is painted, marks flagged layers, grows live and explains a cell on
    hover."""
    wait_js(b, f"{HEAT_COLUMNS} >= 3", timeout=10)
    hm = b.execute_script(
        "const h = window.steadytune.heatmap; return {cells: h.cellCount(), layers: h.layers, f: h.flagged()}"
    )
    assert hm["cells"] >= 3 * 9 and hm["layers"][0] == "embeddings" and hm["layers"][-1] == "lm_head", hm
    assert hm["f"]["exploding"] > 0 and hm["f"]["dead"] + hm["f"]["vanishing"] > 0, hm
    assert b.execute_script(HEAT_PIXELS) > 5_000
    cols = b.execute_script(HEAT_COLUMNS)
    wait_js(b, f"{HEAT_COLUMNS} >= {cols + 2}", timeout=10)  # one recording per 10 steps, pushed live
    # lm_head (last row) explodes at step 20, 60, 100...: hover a column where it did.
    j = b.execute_script(
        "return window.steadytune.heatmap.columns.findIndex((c) => c.state[c.state.length - 1] === 3)"
    )
    tip = b.execute_script(HOVER_CELL, len(hm["layers"]) - 1, j)
    assert "layer: lm_head" in tip and "grad norm: 250" in tip and "zero fraction: 1.0%" in tip, tip
    assert "exploding" in tip and "step " in tip
    note = b.execute_script("return document.getElementById('note-gradflow').textContent")
    assert "recordings" in note and "exploding" in note and "dead/vanishing" in note, note
    # The legend states the limits the API sent: this run's own, not the defaults (1e-3, 90%).
    sent = b.execute_script("return window.steadytune.heatmap.thresholds")
    assert sent == LAYER_LIMITS, sent
    legend = b.execute_script("return document.getElementById('heatmap-legend').textContent")
    assert "< 2e-3, or > 95% zeros" in legend and "exploding (> 1e2 or not finite)" in legend, legend


# Record what the page gets from /series, then give the loss chart a budget the live run outgrows.
WATCH_SERIES = """
const ST = window.steadytune, get = ST.getJSON, c = ST.charts.loss;
window.seriesSent = [];
ST.getJSON = async (url) => {
  const d = await get(url);
  if (url.includes('/series?')) window.seriesSent.push(d.steps);
  return d;
};
c.opts.maxPoints = Math.ceil(c.get('loss').length / 2);
"""
# The loss chart's x values begin with the buckets the server sent last, as sent (each one's last x).
DRAWS_WHAT_IT_GOT = """
const sent = window.seriesSent[window.seriesSent.length - 1];
const xs = window.steadytune.charts.loss.get('loss').x;
return sent.x.length > 0 && sent.x.every((x, i) => xs[i] === x);
"""


def check_live_chart_is_rebucketed_by_the_server(b: WebDriver) -> None:
    """A live chart past its point budget is fetched again from the server, not merged in the page."""
    b.execute_script(WATCH_SERIES)
    wait_js(b, "return window.seriesSent.length > 0", timeout=15)
    assert b.execute_script(DRAWS_WHAT_IT_GOT)
    b.execute_script("window.steadytune.charts.loss.opts.maxPoints = 3000")
    points = b.execute_script(LOSS_POINTS)
    wait_js(b, f"return {LOSS_POINTS[7:]} >= {points + 3}", timeout=10)  # and it goes on live


def test_live_run_page_advances_and_screenshot(
    chromium: tuple[str, str], live_run: LiveRun, dashboard: DashboardHandle, artifacts: Path
) -> None:
    # Enough history for the charts, a checkpoint (every 100 steps) and a few anomalies (steps 20, 60).
    wait_for(lambda: live_run.last_checkpoint, timeout=120, what="the live run's first checkpoint")
    with open_chromium(*chromium) as b:
        b.get(dashboard.url + "run/live-run")
        wait_js(b, "return window.steadytune && window.steadytune.ready === true", timeout=30)
        wait_js(b, f"{STEP.replace('return ', 'return (')}) > 0", timeout=10)
        step1, points1 = b.execute_script(STEP), b.execute_script(LOSS_POINTS)
        assert points1 > 0
        # Live: the counter and the chart advance with no reload.
        wait_js(b, f"return {STEP[7:]} >= {step1 + 5}", timeout=10)
        wait_js(b, f"return {LOSS_POINTS[7:]} >= {points1 + 5}", timeout=10)
        # Record-to-screen: the page notes when the newest record was drawn.
        # (How soon is a benchmark's figure, benchmarks/dashboard.py, not a bound a loaded machine can keep.)
        last = wait_js(b, "return window.steadytune.lastRender", timeout=5)
        # drawn after it was written
        assert last["step"] >= step1 and last["shownAt"] >= last["recordTs"] > 0, last
        # The side panels: events with cause and fix, a verified LAST_GOOD checkpoint, the plan.
        text = b.execute_script("return document.body.innerText")
        assert "loss_spike" in text and "cause: a batch of unusually long samples" in text
        assert "LAST_GOOD" in text and "verified" in text and "initial" in text
        wait_js(b, "return document.getElementById('note-mem').textContent.startsWith('headroom')", timeout=5)
        check_heatmap(b)
        check_live_chart_is_rebucketed_by_the_server(b)
        # The histogram view follows the newest recording; this run's samples carry GPUs, so the panels draw.
        hist = wait_js(
            b, "const h = window.steadytune.gradhist; return h.barCount() > 0 && [h.step, h.layers]"
        )
        steps = b.execute_script("return window.steadytune.heatmap.columns.map((c) => c.last)")
        assert hist[0] in steps and hist[1] == b.execute_script("return window.steadytune.heatmap.layers"), (
            hist
        )
        gpu = b.execute_script("return document.getElementById('card-gpu').innerText")
        assert (
            "no GPU on this host" not in gpu
            and b.execute_script("return window.steadytune.charts.gpu.pointCount()") > 0
        )
        b.execute_script("window.steadytune.heatmap.canvas.dispatchEvent(new MouseEvent('mouseleave'))")
        shot = screenshot(b, artifacts / "dashboard.png")
        assert shot.stat().st_size > 20_000
        docs_img = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
        if not docs_img.exists():
            docs_img.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, docs_img)
        # The other theme renders too, heat map included.
        b.execute_script("document.getElementById('theme').click()")
        wait_js(b, f"return (() => {{ {HEAT_PIXELS} }})() > 5000", timeout=5)
        screenshot(b, artifacts / "dashboard-theme-toggled.png")
        # Runs page lists the run with its state and live step.
        b.get(dashboard.url)
        wait_js(b, "return document.querySelectorAll('#runs tbody tr[data-run=\"live-run\"]').length === 1")
        row = b.execute_script("return document.querySelector('#runs tbody tr').innerText")
        assert "live-run" in row and "running" in row
        screenshot(b, artifacts / "runs.png")


def test_exposed_dashboard_asks_for_the_token_then_goes_live(
    chromium: tuple[str, str], live_run: LiveRun, runs_dir: Path
) -> None:
    """Reachable from other machines, the pages load, ask for the token, then read and stream with it."""
    token = "browser-read-token-0123456789"
    handle = start_dashboard(runs_dir, host="127.0.0.1", port=0, token=token, exposed=True)
    try:
        with open_chromium(*chromium) as b:
            b.get(f"http://127.0.0.1:{handle.port}/run/live-run")
            wait_js(b, "return !!document.getElementById('token-gate')", timeout=15)
            assert b.execute_script("return window.steadytune.ready === true") is not True
            b.execute_script(
                "document.getElementById('gate-token').value = arguments[0];"
                "document.getElementById('token-gate').requestSubmit()",
                token,
            )
            wait_js(b, "return window.steadytune && window.steadytune.ready === true", timeout=30)
            step = wait_js(b, f"return {STEP[7:]} > 0 && {STEP[7:]}", timeout=10)
            wait_js(b, f"return {STEP[7:]} >= {step + 3}", timeout=10)  # the stream carries the token too
            assert not b.execute_script("return !!document.getElementById('token-gate')")
            b.get(f"http://127.0.0.1:{handle.port}/")  # the tab keeps the token: no second prompt
            wait_js(
                b, "return document.querySelectorAll('#runs tbody tr[data-run=\"live-run\"]').length === 1"
            )
            wait_js(b, "return document.getElementById('live').classList.contains('on')", timeout=10)
            assert not b.execute_script("return !!document.getElementById('token-gate')")
    finally:
        handle.stop()
