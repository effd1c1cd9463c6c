"""The dashboard side of benchmarks/scale.py: answers timed over HTTP, pages in headless Chromium,
and runs folders by the hundred.

The dashboard is its own process (``steadytune dashboard``), as in use (``dashboard.py``'s
:class:`Dashboard`). Pages are timed from navigation to the page's own "drawn" mark, in
Debian's chromium through its chromedriver (``tests/e2e/chromium.py``); without them the page
rows are left out, said so, not guessed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from _scale_feed import GRADFLOW_EVERY, gradflow  # noqa: E402
from chromium import find_chromium, open_chromium, wait_js  # noqa: E402
from dashboard import Dashboard  # noqa: E402  (benchmarks/dashboard.py: the dashboard as its own process)


def timed_get(dash: Dashboard, path: str, repeat: int) -> tuple[float, int]:
    """Median seconds of ``repeat`` GETs of ``path`` (after one untimed), and the body's size."""
    dash.get(path)
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        with urllib.request.urlopen(dash.url + path, timeout=120) as r:
            size = len(r.read())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), size


def chromium() -> tuple[str | None, str | None]:
    return find_chromium()


def run_page(dash: Dashboard, run_id: str, spikes: list[tuple[int, float]], repeat: int) -> dict[str, Any]:
    """Median seconds from navigation to the run page's charts drawn; and whether every spike shows.

    A spike shows when the loss chart's bucket holding its step reaches its value (the band's top):
    the server sends min/max per bucket, and the page must draw them.
    """
    chrome, driver = chromium()
    assert chrome and driver
    times, missing = [], []
    with open_chromium(chrome, driver) as b:
        b.get(dash.url)  # warm the browser, not the run
        for _ in range(repeat):
            b.get(dash.url + f"run/{run_id}")
            wait_js(b, "return window.steadytune && window.steadytune.ready", timeout=120, interval=0.02)
            times.append(b.execute_script("return performance.now()") / 1000.0)
            missing = b.execute_script(
                """
                const s = window.steadytune.charts.loss.get("loss");
                return arguments[0].filter(([step, v]) => {
                  const i = s.x.findIndex((x) => x >= step);
                  return i < 0 || s.hi[i] === null || s.hi[i] < v * 0.999;
                });
                """,
                [list(p) for p in spikes],
            )
            b.get("about:blank")
    return {"load_s": statistics.median(times), "spikes": len(spikes), "spikes_missing": len(missing)}


def runs_page(dash: Dashboard, runs: int, repeat: int) -> float:
    """Median seconds from navigation to the runs page's table drawn: its first page (100 rows, or
    every run where fewer) with the count of every run (``runsPage.total``)."""
    chrome, driver = chromium()
    assert chrome and driver
    times = []
    with open_chromium(chrome, driver) as b:
        b.get(dash.url + "healthz")
        for _ in range(repeat):
            b.get(dash.url)
            wait_js(b, _drawn(runs), timeout=300, interval=0.02)
            times.append(b.execute_script("return performance.now()") / 1000.0)
            b.get("about:blank")
    return statistics.median(times)


def _drawn(runs: int) -> str:
    return (
        f"const p = window.steadytune && window.steadytune.runsPage; return !!p && p.total >= {runs} && "
        f"document.querySelectorAll('#runs tbody tr').length >= Math.min(p.limit, p.total)"
    )


def runs_found(dash: Dashboard, runs: int, run_id: str) -> float:
    """Seconds from typing ``run_id`` in the runs page's search box (the page drawn) to its row shown
    alone: a run past the first page is found over every run (the box waits 0.25 s for more keys)."""
    chrome, driver = chromium()
    assert chrome and driver
    with open_chromium(chrome, driver) as b:
        b.get(dash.url)
        wait_js(b, _drawn(runs), timeout=300, interval=0.02)
        t0 = b.execute_script(
            "const box = document.getElementById('runs-search'); box.value = arguments[0];"
            "box.dispatchEvent(new Event('input')); return performance.now()",
            run_id,
        )
        wait_js(
            b,
            f"const rows = [...document.querySelectorAll('#runs tbody tr')];"
            f"return rows.length === 1 && rows[0].dataset.run === {json.dumps(run_id)}",
            timeout=120,
            interval=0.02,
        )
        return float(b.execute_script("return performance.now()") - t0) / 1000.0


def copy_runs(template: Path, runs_dir: Path, n: int, now: float, spacing_s: float = 600.0) -> list[str]:
    """``n`` finished runs made from one real one: run ``i`` ended ``i * spacing_s`` seconds ago.

    The streams are hard links (the dashboard only reads them); ``run.db`` and the small files are
    copied, so each run has an index of its own.
    """
    ids = []
    for i in range(n):
        rid = f"run-{i:04d}"
        dst = runs_dir / rid
        shutil.copytree(
            template,
            dst,
            copy_function=lambda s, d: os.link(s, d) if "/telemetry/" in s else shutil.copy2(s, d),
            ignore=shutil.ignore_patterns("run.db-wal", "run.db-shm", "feed-*"),
        )
        status = json.loads((template / "status.json").read_text())
        ended = now - i * spacing_s
        status.update(run_id=rid, updated_ts=ended, started_ts=ended - 3600.0, supervisor_pid=None)
        (dst / "status.json").write_text(json.dumps(status))
        ids.append(rid)
    return ids


def make_long_run(
    runs_dir: Path, run_id: str, steps: int, gpus: int = 8, step_s: float = 0.1
) -> list[tuple[int, float]]:
    """A finished run's index as its supervisor leaves it, written straight into ``run.db``: ``steps``
    steps (a decaying loss under 3 % noise, one 3x spike per 100,000 steps) at ``step_s`` each, a
    gradient-flow recording of 27 layers every 50 steps (as the guard writes them: the run page's
    heat map), and a system sample with ``gpus`` GPUs every second of it. Returns the spikes as
    ``(step, loss)``.

    No supervisor and no JSONL: a million supervised steps take a quarter of an hour to feed; the
    dashboard's answers read only the index.
    """
    from steadytune.records import GpuSample, StepRecord, SystemSample
    from steadytune.rundir import RunDir, atomic_write_text
    from steadytune.telemetry.store import RunStore

    rng = random.Random(0)
    run = RunDir(runs_dir / run_id).create()
    store = RunStore(run.db)
    t0 = time.time() - steps * step_s
    spikes = []
    for lo in range(0, steps, 50_000):
        recs = []
        for s in range(lo, min(steps, lo + 50_000)):
            loss = 2.0 / (1 + s / 20_000) * (1 + rng.gauss(0, 0.03))
            if s % 100_000 == 50_000:
                loss *= 3
                spikes.append((s, loss))
            recs.append(
                StepRecord(
                    step=s,
                    ts=t0 + s * step_s,
                    loss=loss,
                    grad_norm=1.0 + rng.random(),
                    lr=1e-4,
                    tokens=4096,
                    step_time_s=step_s,
                    mem_allocated_bytes=9 << 30,
                    mem_reserved_bytes=11 << 30,
                    mem_peak_bytes=12 << 30,
                    eval_loss=1.0 if s % 5000 == 0 else None,
                    extra={"gradflow": gradflow(s)} if s % GRADFLOW_EVERY == 0 else {},
                )
            )
        store.add_steps(recs)
    samples = int(steps * step_s)
    for lo in range(0, samples, 20_000):
        store.add_system(
            [
                SystemSample(
                    ts=t0 + i,
                    cpu_ratio=rng.random(),
                    ram_used_bytes=rng.randrange(1 << 33),
                    ram_total_bytes=1 << 35,
                    disk_free_bytes=1 << 40,
                    disk_total_bytes=1 << 41,
                    worker_rss_bytes=rng.randrange(1 << 33),
                    gpus=tuple(
                        GpuSample(
                            index=g,
                            name="gpu",
                            util_ratio=rng.random(),
                            mem_used_bytes=rng.randrange(1 << 36),
                            mem_total_bytes=80 << 30,
                            temperature_c=60 + 20 * rng.random(),
                            power_w=300 + 400 * rng.random(),
                        )
                        for g in range(gpus)
                    ),
                )
                for i in range(lo, min(samples, lo + 20_000))
            ]
        )
    store.close()
    status = {
        "run_id": run_id,
        "state": "completed",
        "step": steps - 1,
        "max_steps": steps,
        "updated_ts": time.time(),
    }
    atomic_write_text(run.status, json.dumps(status))
    return spikes


__all__ = [
    "Dashboard", "chromium", "copy_runs", "make_long_run", "run_page", "runs_found", "runs_page", "timed_get",
]  # fmt: skip
