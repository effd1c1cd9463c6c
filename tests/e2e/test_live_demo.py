"""The real thing: `steadytune demo --dashboard` trains under its supervisor while headless Chromium watches.

No fixture writer here: the supervisor, the worker (a tiny model really training on
the CPU), the in-process dashboard and the run index are the shipped code. Steps
are slowed to ~50 ms more each (``STEADYTUNE_FAULTS``) so the page can be seen
advancing; SIGINT then stops the run the way an operator's Ctrl-C does: the worker
checkpoints and exits, and the command exits 0.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import open_chromium, screenshot, wait_js
from selenium.webdriver.remote.webdriver import WebDriver
from tests.waiting import ANSWER_S

pytestmark = pytest.mark.slow

STEADYTUNE = str(Path(sys.executable).parent / "steadytune")
STEP = "return Number(document.getElementById('step').dataset.step || -1)"
LOSS_POINTS = "return window.steadytune.charts.loss.pointCount()"
HIST = """
const h = window.steadytune.gradhist;
return h.step !== null && h.barCount() > 0 && {step: h.step, layers: h.layers, bars: h.barCount()};
"""
# Click the middle of the heat map's first column (the recording of step 1).
PICK_FIRST_COLUMN = """
const h = window.steadytune.heatmap, g = h.geom, r = h.canvas.getBoundingClientRect();
h.canvas.dispatchEvent(new MouseEvent('click',
  {bubbles: true, clientX: r.left + g.L + g.cw / 2, clientY: r.top + g.T + g.ch / 2}));
"""
DASHBOARD_LINE = re.compile(r"^dashboard: (http://127\.0\.0\.1:\d+/)\s*$")
RUN_LINE = re.compile(r"^run (\S+) → ")


class Demo:
    """The demo command in its own process group, its output collected line by line as it comes."""

    def __init__(self, runs_dir: Path, cache_dir: Path, steps: int = 300) -> None:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "STEADYTUNE_CACHE": str(cache_dir),  # the session's demo assets, built once
            "STEADYTUNE_DATA_CACHE": str(cache_dir / "data"),
            "STEADYTUNE_FAULTS": json.dumps({"step_sleep_s": 0.05}),
            "PYTHONUNBUFFERED": "1",  # the URL line must arrive now, not when a pipe buffer fills
        }
        cmd = [
            STEADYTUNE,
            "demo",
            "--dashboard",
            "--port",
            "0",
            "--runs-dir",
            str(runs_dir),
            "--steps",
            str(steps),
            "train.max_grad_norm=1.0",
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        self.lines: list[str] = []
        self._q: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, name="demo-stdout", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._q.put(self.lines[-1])

    def expect(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first line (from now on) matching ``pattern``; fails with the output so far."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self._q.empty():
                    break
                continue
            m = pattern.search(line)
            if m:
                return m
        pytest.fail(
            f"no line matching {pattern.pattern!r} (exit code {self.proc.poll()}); output:\n{self.output}"
        )

    @property
    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # only this test's own process group
            self.proc.wait(10)


@pytest.fixture
def demo(tmp_path: Path, demo_assets: Path, cache_dir: Path) -> Iterator[Demo]:
    d = Demo(tmp_path / "runs", cache_dir)
    yield d
    d.close()


def check_hardware_panels(b: WebDriver, url: str, run_id: str) -> None:
    """On a host without a GPU the GPU panels say so, and memory is the worker's RSS; with one, they
    draw it."""
    wait_js(b, "return window.steadytune.charts.host.pointCount() > 0", timeout=60)  # a system sample is in
    with urllib.request.urlopen(f"{url}api/runs/{run_id}", timeout=ANSWER_S) as r:
        gpus = json.loads(r.read())["system"]["gpus"]
    text = b.execute_script(
        "return [...document.querySelectorAll('#chart-gpu, #chart-power')].map((e) => e.innerText)"
    )
    if gpus:
        assert "no GPU on this host" not in " ".join(text), text
        return
    assert all("no GPU on this host" in t for t in text), text
    assert b.execute_script("return document.getElementById('card-mem').classList.contains('hidden')")
    rss = wait_js(b, "return !document.getElementById('card-rss').classList.contains('hidden') && "
                     "window.steadytune.charts.rss.pointCount()", timeout=30)  # fmt: skip
    assert rss > 0
    title = b.execute_script("return document.querySelector('#card-rss h3').innerText")
    assert "no CUDA on this host" in title, title


def wait_http_ok(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} did not answer 200 within {timeout:.0f} s")


def test_live_demo_dashboard_in_browser(chromium: tuple[str, str], demo: Demo, artifacts: Path) -> None:
    run_id = demo.expect(RUN_LINE, timeout=120).group(1)
    url = demo.expect(DASHBOARD_LINE, timeout=30).group(1)
    # The run becomes visible to the dashboard with its first file (status or events).
    wait_http_ok(f"{url}api/runs/{run_id}", timeout=60)
    with open_chromium(*chromium) as b:
        b.get(f"{url}run/{run_id}")
        wait_js(b, "return window.steadytune && window.steadytune.ready === true", timeout=60)
        # Model load and the first optimizer step come first: allow for a busy 2-core machine.
        wait_js(b, f"return {STEP[7:]} > 0 && {LOSS_POINTS[7:]} > 0", timeout=180)
        step1, points1 = b.execute_script(STEP), b.execute_script(LOSS_POINTS)
        # Live, with no reload: the counter and the loss chart advance.
        wait_js(b, f"return {STEP[7:]} >= {step1 + 5}", timeout=90)
        wait_js(b, f"return {LOSS_POINTS[7:]} >= {points1 + 5}", timeout=90)
        step2, points2 = b.execute_script(STEP), b.execute_script(LOSS_POINTS)
        assert step2 > step1 and points2 > points1, (step1, step2, points1, points2)
        # The real worker's gradient flow (steps 1, 50, 100) reaches the heat map live.
        wait_js(b, "return window.steadytune.heatmap.columns.length >= 3", timeout=180)
        layers = b.execute_script("return window.steadytune.heatmap.layers")
        assert (
            layers[0] == "embeddings"
            and layers[-1] == "lm_head"
            and any(n.startswith("layers.") for n in layers)
        )
        assert b.execute_script("return window.steadytune.heatmap.cellCount()") >= 3 * len(layers)
        # The worker's |grad| histograms of the newest recording, drawn per layer, then one picked on the map.
        hist = wait_js(b, HIST, timeout=60)
        assert hist["layers"] == layers and hist["bars"] >= len(layers) and hist["step"] >= 50, hist
        b.execute_script(PICK_FIRST_COLUMN)
        wait_js(b, "return window.steadytune.gradhist.step === 1", timeout=30)
        assert "picked on the heat map" in b.execute_script(
            "return document.getElementById('note-gradhist').textContent"
        )
        check_hardware_panels(b, url, run_id)
        wait_js(b, "return document.querySelectorAll('#checkpoints td.mono').length > 0", timeout=60)
        # The eval at step 75 is logged after that step was drawn: its dot is filled in live.
        wait_js(
            b, "return window.steadytune.charts.loss.get('eval_loss').y.some((v) => v !== null)", timeout=30
        )
        b.execute_script("window.scrollTo(0, 0)")
        shot = screenshot(b, artifacts / "dashboard-live-demo.png")
        assert shot.stat().st_size > 20_000
    # Ctrl-C: the supervisor asks the worker to checkpoint and stop; the command exits 0.
    demo.proc.send_signal(signal.SIGINT)
    try:
        rc = demo.proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the demo did not stop within 180 s of SIGINT; output:\n{demo.output}")
    demo.reader.join(30)  # the output ends with the process: the reader has taken the last lines
    assert not demo.reader.is_alive(), demo.output
    assert rc == 0, demo.output
    assert re.search(r"^\s*state\s+stopped", "\n".join(demo.lines), re.M), demo.output
    status = json.loads(
        (Path(demo.proc.args[demo.proc.args.index("--runs-dir") + 1]) / run_id / "status.json").read_text()
    )
    assert status["state"] == "stopped" and status["step"] >= step2, status
