"""A real headless Chromium opens the GPU server page: memory bars, the queue, an action behind the token."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from chromium import open_chromium, screenshot, wait_js
from tests.waiting import wait_for

from steadytune.server.daemon import Daemon, ServerPaths
from steadytune.server.ledger import GIB, GpuProcess, GpuReading
from steadytune.server.queue import JobQueue, QueueError
from steadytune.web.server import start_dashboard

pytestmark = pytest.mark.slow
TOKEN = "e2e-server-token-123456"
SLEEPER = "import sys, time; time.sleep(60)"
HOURS = """
const rows = [...document.querySelectorAll('[data-gpu-hours]')];
return rows.length > 0 && rows.every((r) => Number(r.dataset.allocated) > 0 || !r.innerText.includes('jobs'))
  && rows.map((r) => [Number(r.dataset.gpuHours), Number(r.dataset.allocated), Number(r.dataset.productive)]);
"""


def test_server_page_shows_gpus_queue_and_acts(chromium: tuple[str, str], tmp_path: Path, artifacts: Path):
    paths = ServerPaths(tmp_path / "srv", tmp_path / "runs")
    paths.runs_dir.mkdir(parents=True)
    readings = (
        GpuReading(0, 80 * GIB, 20 * GIB, "H100", 0.9, (GpuProcess(4242, 20 * GIB),)),
        GpuReading(1, 80 * GIB, 0, "H100", 0.0),
    )
    daemon = Daemon(
        JobQueue(paths.queue),
        paths,
        lambda: readings,
        command=lambda job, runs: [sys.executable, "-c", SLEEPER],
    )
    for label, need in (("lora", 50), ("qlora", 40), ("full", 45)):
        daemon.queue.submit({"kind": "supervise", "cmd": ["x"], "label": label}, need * GIB, "estimate")
    daemon.tick()
    # Each running job's scale history: j1's grow refused (GPU 0 lacks the room), j2 paused for pressure.
    with pytest.raises(QueueError, match="no room to grow j1"):
        daemon.resize("j1", 2, "GPU util 95% > 85% for 300s")
    daemon.queue.record(
        "j2", {"kind": "pause", "gpu": 0, "reason": "GPU 0 has 0.5 GiB free"}, paused="GPU 0 has 0.5 GiB free"
    )
    handle = start_dashboard(paths.runs_dir, port=0, token=TOKEN, server=daemon)
    try:
        with open_chromium(*chromium) as b:
            b.get(handle.url + "server")
            wait_js(b, "return document.querySelectorAll('#jobs tbody tr').length === 3", timeout=20)
            # GPU 0: 20 GiB foreign use (red), the 40 GiB job admitted there reserved (amber), the rest free.
            widths = b.execute_script(
                "return [...document.querySelectorAll('[data-gpu=\"0\"] .seg')].map((s) => s.style.width)"
            )
            assert widths == ["25%", "50%", "25%"], widths
            text = b.execute_script("return document.body.innerText")
            assert "foreign pids 4242" in text and "waits for room" in text, text
            assert "grow_refused" in text and "paused by the server: GPU 0 has 0.5 GiB free" in text, text
            assert "pause (GPU 0)" in text and "scale history" in text, text
            # GPU-hours: the running jobs hold GPUs from their start; their stand-in commands write no run,
            # so none of it is productive.
            hours = wait_js(b, HOURS, timeout=20)
            assert len(hours) == 2 and sum(a for _, a, _ in hours) > 0, hours
            assert all(p == 0 for *_, p in hours), hours
            shot = screenshot(b, artifacts / "server-page.png")
            assert shot.stat().st_size > 10_000
            b.execute_script(
                f"sessionStorage.setItem('steadytune-token', '{TOKEN}'); window.confirm = () => true;"
            )
            b.execute_script(
                "document.querySelector('[data-job=\"j3\"] button').click()"
            )  # j3 queued: its first button is hold
            wait_for(lambda: daemon.queue.get("j3").state == "held", timeout=10, what="j3 held from the page")
            wait_js(
                b, "return document.querySelector('[data-job=\"j3\"]').innerText.includes('held')", timeout=10
            )
    finally:
        handle.stop()
        for job in daemon.queue.jobs(["running"]):
            daemon.procs.signal(job.pid, 9)
