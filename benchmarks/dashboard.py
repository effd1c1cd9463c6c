"""Dashboard benchmark: figures printed side by side with their targets.

    python benchmarks/dashboard.py [--quick]

1. /metrics scrape time with 10 live runs                 target < 50 ms
2. record-to-screen latency (record written → drawn)      target < 1 s
3. run page load for a 1,000,000-step run                  target < 2 s
4. dashboard server CPU with a run page open               target < 5% of a core

The dashboard runs as its own process (`steadytune dashboard`), as in use, so
the writers of this script do not share its interpreter. With Debian's chromium
and chromedriver installed, 2-4 are measured in a real headless browser;
without them, 2 is measured to the wire (SSE) and 3 as the page's requests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from chromium import find_chromium, open_chromium, wait_js  # noqa: E402
from live_run import LiveRun  # noqa: E402

from steadytune.records import StepRecord  # noqa: E402
from steadytune.rundir import RunDir, atomic_write_text  # noqa: E402
from steadytune.telemetry.store import RunStore  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dashboard:
    def __init__(self, runs_dir: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "steadytune.cli.main",
                "dashboard",
                str(runs_dir),
                "--port",
                str(self.port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "STEADYTUNE_DASHBOARD_TOKEN": ""},
        )
        self.url = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.url + "healthz", timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("dashboard did not start")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return r.read()

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def row(name: str, value: str, target: str, ok: bool) -> str:
    return f"  {name:<62} {value:>12}   target {target:<8} {'OK' if ok else 'MISSED'}"


def bench_scrape(tmp: Path, quick: bool) -> tuple[float, float, float]:
    runs = tmp / "scrape"
    live = [LiveRun(runs, f"run-{i:02d}", rate=5.0).start() for i in range(10)]
    dash = Dashboard(runs)
    try:
        time.sleep(3)
        dash.get("metrics")  # first scrape opens the ten indexes
        times = []
        for _ in range(10 if quick else 40):
            t0 = time.perf_counter()
            body = dash.get("metrics")
            times.append(time.perf_counter() - t0)
            time.sleep(0.1)
        assert body.count(b"steadytune_step{") == 10
        times.sort()
        return statistics.median(times), times[int(0.95 * (len(times) - 1))], times[-1]
    finally:
        dash.close()
        for r in live:
            r.stop()


def bench_live(tmp: Path, quick: bool, chromium: tuple[str | None, str | None]) -> dict[str, float | str]:
    """Latency and server CPU with one run page open on a run writing 10 steps/s."""
    runs = tmp / "live"
    run = LiveRun(runs, "live", rate=10.0).start()
    time.sleep(2)
    dash = Dashboard(runs)
    out: dict[str, float | str] = {}
    try:
        if chromium[0] and chromium[1]:
            with open_chromium(chromium[0], chromium[1]) as b:
                b.get(dash.url + "run/live")
                wait_js(b, "return window.steadytune && window.steadytune.ready", timeout=30)
                time.sleep(2)
                lat, seen = [], set()
                cpu0, t0 = dash.cpu_seconds(), time.monotonic()
                while time.monotonic() - t0 < (8 if quick else 20):
                    r = b.execute_script("return window.steadytune.lastRender")
                    if r and r["step"] not in seen:
                        seen.add(r["step"])
                        lat.append(r["shownAt"] - r["recordTs"])
                    time.sleep(0.05)
                cpu = (dash.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            out.update(
                how="headless Chromium",
                p50=statistics.median(lat),
                p95=sorted(lat)[int(0.95 * len(lat))],
                cpu=cpu,
            )
        else:
            lat = []
            cpu0, t0 = dash.cpu_seconds(), time.monotonic()
            with urllib.request.urlopen(dash.url + "api/runs/live/stream?since=0", timeout=30) as r:
                while time.monotonic() - t0 < (8 if quick else 20):
                    line = r.readline()
                    if line.startswith(b"data: [") and b'"step"' in line:
                        now = time.time()
                        rows = json.loads(line[6:])
                        if len(rows) < 5:  # skip the backlog sent on connect
                            lat.extend(now - x["ts"] for x in rows)
            cpu = (dash.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            out.update(
                how="SSE client (no chromium)",
                p50=statistics.median(lat),
                p95=sorted(lat)[int(0.95 * len(lat))],
                cpu=cpu,
            )
    finally:
        dash.close()
        run.stop()
    return out


def make_big_run(runs: Path, steps: int) -> None:
    run = RunDir(runs / "big").create()
    store = RunStore(run.db)
    batch = 50_000
    t0 = 1_700_000_000.0
    # The JSONL (the truth) and the index, as a supervisor would have left them.
    with open(run.telemetry(0), "w") as f:
        for lo in range(0, steps, batch):
            recs = [
                StepRecord(
                    step=s,
                    ts=t0 + s * 0.5,
                    loss=2.0 / (1 + s / 20000) + (0.5 if s % 99991 == 0 else 0.0),
                    grad_norm=1.0,
                    lr=1e-4,
                    tokens=4096,
                    step_time_s=0.5,
                    mem_allocated_bytes=9 << 30,
                    mem_reserved_bytes=11 << 30,
                    mem_peak_bytes=12 << 30,
                    eval_loss=1.0 if s % 5000 == 0 else None,
                )
                for s in range(lo, min(steps, lo + batch))
            ]
            store.add_steps(recs)
            f.write(
                "".join(
                    json.dumps({"type": "step", "step": r.step, "ts": r.ts, "loss": r.loss}) + "\n"
                    for r in recs
                )
            )
    store.close()
    atomic_write_text(run.status, json.dumps({"run_id": "big", "state": "completed", "step": steps - 1,
                                              "max_steps": steps, "updated_ts": time.time()}))  # fmt: skip


def bench_big(
    tmp: Path, steps: int, chromium: tuple[str | None, str | None], repeat: int = 1
) -> tuple[float, str]:
    """Median time of ``repeat`` loads of the run page, each in a fresh tab state."""
    runs = tmp / "big"
    make_big_run(runs, steps)
    dash = Dashboard(runs)
    try:
        if chromium[0] and chromium[1]:
            times = []
            with open_chromium(chromium[0], chromium[1]) as b:
                b.get(dash.url)  # warm the browser, not the run
                for _ in range(repeat):
                    b.get(dash.url + "run/big")
                    wait_js(
                        b, "return window.steadytune && window.steadytune.ready", timeout=60, interval=0.02
                    )
                    # From navigation start to charts drawn with the downsampled series.
                    times.append(b.execute_script("return performance.now()") / 1000.0)
                    n = b.execute_script("return window.steadytune.charts.loss.pointCount()")
                    assert n > 100, n
                    b.get("about:blank")
            return statistics.median(
                times
            ), f"headless Chromium, navigation → charts drawn, median of {repeat}"
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            dash.get("run/big")
            dash.get("api/runs/big")
            dash.get("api/runs/big/series?points=1500")
            times.append(time.perf_counter() - t0)
        return statistics.median(times), f"page requests (no chromium), median of {repeat}"
    finally:
        dash.close()


def page_weight() -> int:
    """Bytes of the static files the run page loads (its HTML, scripts and styles)."""
    static = REPO / "src" / "steadytune" / "web" / "static"
    html = (static / "run.html").read_text()
    names = re.findall(r'(?:src|href)="/static/([^"]+)"', html)
    return len(html.encode()) + sum((static / n).stat().st_size for n in names)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples, a 200,000-step run")
    parser.add_argument(
        "--page-only", action="store_true", help="only the run page of the 1,000,000-step run (3 loads)"
    )
    args = parser.parse_args()
    chromium = find_chromium()
    steps = 200_000 if args.quick else 1_000_000
    if args.page_only:
        with tempfile.TemporaryDirectory(prefix="steadytune-bench-") as d:
            load, how = bench_big(Path(d), steps, chromium, repeat=3)
        print(f"steadytune dashboard benchmark ({os.cpu_count()} CPU cores)")
        print(row(f"run page load, {steps:,} steps ({how})", f"{load:.2f} s", "< 2 s", load < 2))
        print(f"  run page static weight (HTML, scripts, styles): {page_weight():,} bytes")
        return 0
    with tempfile.TemporaryDirectory(prefix="steadytune-bench-") as d:
        tmp = Path(d)
        med, p95, worst = bench_scrape(tmp, args.quick)
        live = bench_live(tmp, args.quick, chromium)
        load, how = bench_big(tmp, steps, chromium)
        how = how.split(",")[0]
    print(f"steadytune dashboard benchmark ({os.cpu_count()} CPU cores)")
    print(row("/metrics scrape, 10 live runs (median)", f"{med * 1000:.1f} ms", "< 50 ms", med < 0.05))
    print(row("/metrics scrape, 10 live runs (p95)", f"{p95 * 1000:.1f} ms", "< 50 ms", p95 < 0.05))
    print(
        row(
            "/metrics scrape, 10 live runs (worst of the sample)",
            f"{worst * 1000:.1f} ms",
            "< 50 ms",
            worst < 0.05,
        )
    )
    print(
        row(
            f"record-to-screen p50 ({live['how']})",
            f"{float(live['p50']) * 1000:.0f} ms",
            "< 1 s",
            float(live["p50"]) < 1,
        )
    )
    print(
        row(
            f"record-to-screen p95 ({live['how']})",
            f"{float(live['p95']) * 1000:.0f} ms",
            "< 1 s",
            float(live["p95"]) < 1,
        )
    )
    print(row(f"run page load, {steps:,} steps ({how})", f"{load:.2f} s", "< 2 s", load < 2))
    print(f"  run page static weight (HTML, scripts, styles): {page_weight():,} bytes")
    print(
        row(
            "dashboard server CPU, one run page open",
            f"{float(live['cpu']) * 100:.1f}% core",
            "< 5%",
            float(live["cpu"]) < 0.05,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
