"""Scale: what steadytune costs as the work grows, each figure at 10x-spaced sizes beside its target.

    python benchmarks/scale.py                      # every section (about an hour on 2 cores)
    python benchmarks/scale.py --only supervisor,ranks --quick
    python benchmarks/scale.py --json scale.json    # the figures, for docs/scale.md

Sections (``--only``):

- ``supervisor``: a supervised run of 1k / 10k / 100k / 1M steps (``--steps``): the real supervisor,
  its store, detectors and system sampler over a generated stream (``_scale_feed.py``, what the
  guard writes: a batch fingerprint per step, gradient flow every 50, no model), the prefill taken
  in as fast as it goes, then 10 steps/s. The supervisor's CPU per 1,000 steps and its memory,
  ``run.db`` and the JSONL per 1M steps, the dashboard's answers for that live run (series, detail
  with status and events, events) and its run page in headless Chromium, with every loss spike
  (one per 100,000 steps, 3x) still drawn. The telemetry on disk counts its rotated segments
  (``--set run.telemetry_segment_bytes=N`` rotates sooner than the default 64 MiB).
- ``series``: a finished run of 100k / 1M steps (``--series``) with 8 GPUs sampled every second and
  gradient flow recorded every 50 steps (the page's heat map),
  its index generated straight into ``run.db`` (a minute, where feeding the supervisor a million
  steps takes a quarter of an hour): the series answer with every GPU and as the run page asks
  for it (one GPU), and the run page in Chromium with every loss spike still drawn.
- ``ranks``: 1 / 8 / 64 rank streams at 10 steps/s: the supervisor's CPU, and how long after the
  fact a straggler (the last rank's compute time turns 3x) and a hang (every rank falls silent,
  ``detect.pace.heartbeat_timeout_s`` 5 s) are reported.
- ``runs``: 10 / 100 / 1,000 finished run folders (copies of one real 2,000-step run, ended 10
  minutes apart) and one live run under one dashboard: the first ``/metrics`` scrape,
  ``/api/runs``, ``/api/goodput`` and runs page of a dashboard that never read the runs, how long
  until it has read them all in the background (``steadytune_runs_pending_index`` 0) and its
  slowest scrape meanwhile; then ``/metrics``
  scrape time and size, ``/api/runs`` whole and its first page, the runs page in Chromium (its
  first page of 100 rows drawn), a run past that page found by name, the dashboard's open files; then
  the first scrape, ``/api/runs`` and runs page of a dashboard started again over the same folder
  (the finished runs' summaries and goodput accounts stored beside them by the first).
- ``server``: 10 / 100 / 1,000 queued jobs on 8 GPUs: the daemon's pass (admission included).
- ``analyze``: ``steadytune analyze`` of a 10k / 100k / 1M / 10M-step JSONL log (a decaying loss
  under noise, one 3x spike at 70 %), each a new process: wall time and peak memory.

Each figure is a median of several measurements (``--repeat``); the machine's load average is
printed with each section, since a shared machine's figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "e2e")]  # the helpers, and live_run/chromium

MB = 1 << 20


@dataclass
class Row:
    section: str
    figure: str
    size: str
    value: float
    shown: str
    target: str = ""
    ok: bool | None = None  # None: a figure without a target


ROWS: list[Row] = []


def row(
    section: str, figure: str, size: str, value: float, shown: str, target: str = "", ok: bool | None = None
) -> None:
    r = Row(section, figure, size, value, shown, target, ok)
    ROWS.append(r)
    verdict = "" if ok is None else ("OK" if ok else "MISSED")
    print(f"  {figure:<52} {size:>6} {shown:>14}   {target:<22} {verdict}", flush=True)


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def human(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k" if n >= 1000 else str(n)


def page_rows(section: str, size: str, page: dict[str, float]) -> None:
    """The run page's rows: its load time, and how many of the loss spikes it draws."""
    row(section, "run page load in Chromium", size, page["load_s"], f"{page['load_s']:.2f} s", "< 2 s",
        page["load_s"] < 2.0)  # fmt: skip
    shown = f"{page['spikes'] - page['spikes_missing']} of {page['spikes']}"
    row(section, "loss spikes drawn on the run page", size, page["spikes_missing"], shown, "all",
        page["spikes_missing"] == 0)  # fmt: skip


# -- supervisor, store and dashboard ------------------------------------------------------------
def bench_supervisor(
    tmp: Path,
    sizes: list[int],
    windows: int,
    window_s: float,
    repeat: int,
    sets: tuple[str, ...] = (),
    save_every: int = 0,
) -> None:
    from _scale_dash import Dashboard, chromium, run_page, timed_get
    from _scale_feed import is_spike, loss_at
    from _scale_run import SupervisedRun

    from steadytune.supervise.replay import KEEP_FROM_STEP

    have_chrome = all(chromium())
    saves = f", a checkpoint reported every {save_every} steps" if save_every else ", no checkpoints"
    print(f"\nsupervisor, store and dashboard: one supervised run per size{saves} ({load()})")
    for n in sizes:
        runs = tmp / f"sup-{n}"
        rid = f"run-{human(n)}"
        run = SupervisedRun(runs, rid, prefill=n, sets=sets, save_every=save_every)
        try:
            took = run.wait_prefill()
            row("supervisor", "prefill taken in (steps/s)", human(n), n / took, f"{n / took:,.0f}/s")
            if save_every and n >= KEEP_FROM_STEP + 2 * save_every:
                # The windows measure a run watched all along: one whose state is kept up at each save.
                caught = run.wait_state(n - 2 * save_every)
                row("supervisor", "detectors' state caught up after the prefill", human(n), caught,
                    f"{caught:.1f} s")  # fmt: skip
            time.sleep(2)
            cpu = run.cpu_windows(windows, window_s)
            row(
                "supervisor",
                "supervisor CPU per 1,000 steps at 10 steps/s",
                human(n),
                cpu["cpu_s_per_1k"],
                f"{cpu['cpu_s_per_1k']:.2f} s",
                "< 1 s (1 % of a core)",
                cpu["cpu_s_per_1k"] < 1.0,
            )
            _, hwm = run.memory()
            row("supervisor", "supervisor resident memory (peak)", human(n), hwm, f"{hwm / MB:.0f} MB")
            dash = Dashboard(runs)
            try:
                for name, path in (
                    ("series", f"api/runs/{rid}/series?points=1500"),
                    ("run detail (status, events)", f"api/runs/{rid}"),
                    ("events", f"api/runs/{rid}/events"),
                ):
                    t, _ = timed_get(dash, path, repeat)
                    row(
                        "supervisor",
                        f"dashboard answers: {name}",
                        human(n),
                        t,
                        f"{t * 1000:.0f} ms",
                        "< 200 ms",
                        t < 0.2,
                    )
                if have_chrome:
                    now = run.step()
                    spikes = [(s, loss_at(s, random.Random(0))) for s in range(1, now + 1, 1) if is_spike(s)]
                    page_rows("supervisor", human(n), run_page(dash, rid, spikes, max(1, repeat // 2)))
            finally:
                dash.close()
        finally:
            state = run.stop()
        steps = run.step()
        sizes_on_disk = run.sizes()
        per = 1_000_000 / max(1, steps)
        row(
            "supervisor",
            "run.db per 1M steps",
            human(n),
            sizes_on_disk["run_db"] * per,
            f"{sizes_on_disk['run_db'] * per / MB:,.0f} MB",
        )
        row(
            "supervisor",
            "telemetry JSONL per 1M steps",
            human(n),
            sizes_on_disk["jsonl"] * per,
            f"{sizes_on_disk['jsonl'] * per / MB:,.0f} MB",
        )
        if state != "completed":
            print(f"  (the run ended {state}: see {run.log})")
        shutil.rmtree(runs, ignore_errors=True)


# -- the run page of a long run, on a generated index -----------------------------------------------
def bench_series(tmp: Path, sizes: list[int], repeat: int) -> None:
    from _scale_dash import Dashboard, chromium, make_long_run, run_page, timed_get

    print(f"\nseries: a finished run's index of 8 GPUs, generated straight into run.db ({load()})")
    have_chrome = all(chromium())
    for n in sizes:
        runs = tmp / f"series-{n}"
        spikes = make_long_run(runs, "long", n)
        dash = Dashboard(runs)
        try:
            for name, query in (("every GPU", "points=1500"), ("as the page asks", "points=1500&gpus=0")):
                t, size = timed_get(dash, f"api/runs/long/series?{query}", repeat)
                row(
                    "series",
                    f"series, 1,500 points, {name}",
                    human(n),
                    t,
                    f"{t * 1000:,.0f} ms",
                    "< 200 ms",
                    t < 0.2,
                )
                row("series", f"series size, {name}", human(n), size, f"{size / MB:.2f} MB")
            if have_chrome:
                page_rows("series", human(n), run_page(dash, "long", spikes, max(1, repeat // 2)))
        finally:
            dash.close()
        shutil.rmtree(runs, ignore_errors=True)


# -- ranks ----------------------------------------------------------------------------------------
def bench_ranks(tmp: Path, counts: list[int], windows: int, window_s: float) -> None:
    from _scale_run import SupervisedRun

    print(f"\nranks: streams tailed at once, at 10 steps/s ({load()})")
    for r in counts:
        runs = tmp / f"ranks-{r}"
        run = SupervisedRun(
            runs, f"ranks-{r}", prefill=600, ranks=r, sets=("detect.pace.heartbeat_timeout_s=5",)
        )
        try:
            run.wait_prefill()
            time.sleep(2)
            # The prefill is a backlog of every rank's stream: taken in, no rank may read as trailing.
            false = sum(e.get("kind") == "anomaly" and e.get("name") == "straggler" for e in run.events())
            row(
                "ranks",
                "straggler raised while the prefill was taken in",
                str(r),
                false,
                str(false),
                "0",
                false == 0,
            )
            cpu = run.cpu_windows(windows, window_s)
            row(
                "ranks",
                "supervisor CPU per 1,000 steps (all ranks)",
                str(r),
                cpu["cpu_s_per_1k"],
                f"{cpu['cpu_s_per_1k']:.2f} s",
                "< 1 s at 1 rank",
                None if r > 1 else cpu["cpu_s_per_1k"] < 1,
            )
            row(
                "ranks",
                "supervisor share of a core",
                str(r),
                cpu["core_share"],
                f"{cpu['core_share'] * 100:.2f} %",
            )
            if r > 1:
                t0 = time.time()
                run.order("straggle")
                ev = run.wait_event("straggler", t0, 60)
                began = run.feed().get("straggle_ts", t0)
                delay = ev["ts"] - began if ev else float("inf")
                row(
                    "ranks",
                    "straggler reported after (8 slow points = 0.8 s)",
                    str(r),
                    delay,
                    f"{delay:.2f} s",
                    "as at 8 ranks",
                )
            t0 = time.time()
            run.order("hang")
            ev = run.wait_event("stall", t0, 60)
            began = run.feed().get("hang_ts", t0)
            delay = ev["ts"] - began if ev else float("inf")
            row("ranks", "hang reported after (limit 5 s)", str(r), delay, f"{delay:.2f} s", "as at 1 rank")
        finally:
            run.stop()
        shutil.rmtree(runs, ignore_errors=True)
    _judge_unchanged("ranks", "hang reported after (limit 5 s)", tolerance_s=0.5)
    _judge_unchanged("ranks", "straggler reported after (8 slow points = 0.8 s)", tolerance_s=0.5)


def _judge_unchanged(section: str, figure: str, tolerance_s: float) -> None:
    """Rows of ``figure`` are judged against its first (smallest) size: within ``tolerance_s``."""
    rows = [r for r in ROWS if r.section == section and r.figure == figure]
    if not rows:
        return
    base = rows[0].value
    for r in rows[1:]:
        r.ok = r.value <= base + tolerance_s
        r.target = f"<= {base + tolerance_s:.2f} s"
        print(f"  {figure:<52} {r.size:>6} {r.shown:>14}   {r.target:<22} {'OK' if r.ok else 'MISSED'}")


# -- runs under one dashboard ----------------------------------------------------------------------
def make_template(tmp: Path) -> Path:
    """One finished run of 2,000 steps by the real supervisor, with three checkpoints."""
    from _scale_run import SupervisedRun
    from live_run import write_checkpoint

    from steadytune.rundir import RunDir

    run = SupervisedRun(tmp / "template", "template", prefill=2000)
    run.wait_prefill()
    run.stop()
    for step in (1000, 1500, 2000):
        write_checkpoint(RunDir(run.root), step, time.time())
    return run.root


def first_get(url: str, path: str) -> float:
    """Seconds of one GET that may read every run first (minutes for a thousand never read)."""
    import urllib.request

    t0 = time.perf_counter()
    with urllib.request.urlopen(url + path, timeout=900) as r:
        r.read()
    return time.perf_counter() - t0


PENDING_GAUGE = re.compile(rb"^steadytune_runs_pending_index ([0-9.e+]+)$", re.M)


def read_in_background(url: str, since: float, timeout_s: float = 1800.0) -> tuple[float, list[float]]:
    """Scrape ``/metrics`` each second until no run is left to read (``steadytune_runs_pending_index``
    0, or no such gauge: a dashboard that reads every run before it answers). Returns the seconds
    from ``since`` to then, and how long each of those scrapes took."""
    import urllib.request

    took: list[float] = []
    while time.perf_counter() - since < timeout_s:
        t0 = time.perf_counter()
        with urllib.request.urlopen(url + "metrics", timeout=900) as r:
            body = r.read()
        took.append(time.perf_counter() - t0)
        found = PENDING_GAUGE.search(body)
        if found is None or float(found.group(1)) == 0:
            return time.perf_counter() - since, took
        time.sleep(max(0.0, 1.0 - took[-1]))
    raise RuntimeError(f"runs still unread after {timeout_s:.0f} s")


def bench_runs(tmp: Path, counts: list[int], repeat: int) -> None:
    import psutil
    from _scale_dash import Dashboard, chromium, copy_runs, runs_found, runs_page, timed_get
    from live_run import LiveRun

    print(f"\nruns: finished run folders and one live run under one dashboard ({load()})")
    template = make_template(tmp)
    have_chrome = all(chromium())
    for n in counts:
        runs = tmp / f"runs-{n}"
        ids = copy_runs(template, runs, n, time.time())
        live = LiveRun(runs, "live-run", rate=10.0).start()
        started = time.perf_counter()
        dash = Dashboard(runs)
        try:
            # A new dashboard over runs it never read: what Prometheus and a user meet first.
            first = first_get(dash.url, "metrics")
            row("runs", "first /metrics scrape, runs never read", str(n), first, f"{first * 1000:,.0f} ms",
                "< 500 ms", first < 0.5)  # fmt: skip
            first = first_get(dash.url, "api/runs")
            row("runs", "first /api/runs, runs never read", str(n), first, f"{first * 1000:,.0f} ms",
                "< 2 s", first < 2.0)  # fmt: skip
            first = first_get(dash.url, "api/goodput")
            row("runs", "first /api/goodput, runs never read", str(n), first, f"{first * 1000:,.0f} ms",
                "< 2 s", first < 2.0)  # fmt: skip
            if have_chrome:
                page = runs_page(dash, n + 1, 1)
                row("runs", "runs page, first load, runs never read", str(n), page, f"{page:.2f} s", "< 2 s",
                    page < 2.0)  # fmt: skip
            done, took = read_in_background(dash.url, started)
            row("runs", "every run read (from the dashboard's start)", str(n), done, f"{done:.1f} s")
            mid, slow = statistics.median(took), max(took)
            row("runs", f"median /metrics scrape meanwhile (of {len(took)})", str(n), mid,
                f"{mid * 1000:,.0f} ms", "< 500 ms", mid < 0.5)  # fmt: skip
            row("runs", "slowest /metrics scrape meanwhile", str(n), slow, f"{slow * 1000:,.0f} ms")
            t, size = timed_get(dash, "metrics", repeat)
            row("runs", "/metrics scrape", str(n), t, f"{t * 1000:,.0f} ms", "< 500 ms", t < 0.5)
            row("runs", "/metrics size", str(n), size, f"{size / 1024:,.0f} KB")
            t, size = timed_get(dash, "api/runs", repeat)
            row("runs", "/api/runs (every run)", str(n), t, f"{t * 1000:,.0f} ms, {size / 1024:,.0f} KB")
            t, size = timed_get(dash, "api/runs?limit=100", repeat)
            row("runs", "/api/runs?limit=100 (the page's first)", str(n), t,
                f"{t * 1000:,.0f} ms, {size / 1024:,.0f} KB")  # fmt: skip
            if have_chrome:
                page = runs_page(dash, n + 1, max(1, repeat // 2))
                row("runs", "runs page load in Chromium", str(n), page, f"{page:.2f} s", "< 2 s", page < 2.0)
                found = runs_found(dash, n + 1, ids[-1])  # the oldest: past the first page
                row("runs", "a run found by name on the runs page", str(n), found, f"{found:.2f} s")
            proc = psutil.Process(dash.proc.pid)
            row("runs", "dashboard open files", str(n), proc.num_fds(), f"{proc.num_fds():,}")
            row(
                "runs",
                "dashboard resident memory",
                str(n),
                proc.memory_info().rss,
                f"{proc.memory_info().rss / MB:.0f} MB",
            )
            # A dashboard started again over the same runs: the finished runs' summaries are stored.
            dash.close()
            dash = Dashboard(runs)
            first = first_get(dash.url, "metrics")
            row("runs", "first /metrics scrape after a restart", str(n), first, f"{first * 1000:,.0f} ms",
                "< 500 ms", first < 0.5)  # fmt: skip
            first = first_get(dash.url, "api/runs")
            row("runs", "first /api/runs after a restart", str(n), first, f"{first * 1000:,.0f} ms")
            if have_chrome:
                page = runs_page(dash, n + 1, 1)
                row("runs", "runs page after a restart, first load", str(n), page, f"{page:.2f} s", "< 2 s",
                    page < 2.0)  # fmt: skip
        finally:
            dash.close()
            live.stop()
        shutil.rmtree(runs, ignore_errors=True)


# -- the GPU server -----------------------------------------------------------------------------------
def bench_server(tmp: Path, counts: list[int], repeat: int) -> None:
    from steadytune.server.daemon import Daemon, ServerPaths
    from steadytune.server.ledger import GIB, GpuReading
    from steadytune.server.queue import JobQueue

    print(f"\nserver: queued jobs on 8 GPUs of 80 GiB, 60 GiB each ({load()})")
    readings = tuple(GpuReading(i, 80 * GIB, 0, "fake", 0.0, ()) for i in range(8))
    for n in counts:
        paths = ServerPaths(tmp / f"srv-{n}", tmp / f"srv-{n}" / "runs")
        paths.runs_dir.mkdir(parents=True)
        d = Daemon(
            JobQueue(paths.queue), paths, lambda: readings, command=lambda job, runs_dir: ["sleep", "3600"]
        )
        for i in range(n):
            spec = {"kind": "supervise", "cmd": ["stand-in"], "label": f"job {i}", "cwd": str(tmp)}
            d.queue.submit(spec, 60 * GIB, "user", priority=i % 3)
        try:
            t0 = time.perf_counter()
            d.tick()  # admits 8 (one per GPU) and starts them
            first = time.perf_counter() - t0
            passes = []
            for _ in range(repeat * 4):
                t0 = time.perf_counter()
                d.tick()
                passes.append(time.perf_counter() - t0)
            steady = statistics.median(passes)
            row("server", "first pass (8 admitted and started)", str(n), first, f"{first * 1000:,.0f} ms")
            row(
                "server",
                "admission pass, jobs waiting",
                str(n),
                steady,
                f"{steady * 1000:,.1f} ms",
                "< 100 ms",
                steady < 0.1,
            )
        finally:
            for job in d.queue.jobs(["running", "admitted"]):
                if job.pid is not None:
                    os.killpg(job.pid, signal.SIGKILL)  # the stand-ins run in sessions of their own
            d.queue.close()


# -- analyze ----------------------------------------------------------------------------------------------
def write_log(path: Path, steps: int) -> None:
    """A JSONL log: a decaying loss under noise, one 3x spike at 70 % of the run."""
    rng = random.Random(7)
    spike = int(steps * 0.7)
    with open(path, "w") as f:
        batch = []
        for s in range(1, steps + 1):
            level = 0.6 + 1.8 / (1 + s / (steps / 50))
            loss = 3 * level if s == spike else level * (1 + rng.gauss(0, 0.03))
            batch.append(f'{{"step": {s}, "loss": {loss:.6f}}}\n')
            if len(batch) == 100_000:
                f.write("".join(batch))
                batch.clear()
        f.write("".join(batch))


def analyze_once(path: Path) -> tuple[float, float, int, str]:
    """Wall and CPU seconds, peak resident bytes and the output of one ``steadytune analyze`` process."""
    out = path.with_suffix(".out")
    t0 = time.perf_counter()
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "steadytune.cli.main", "analyze", str(path)],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        _, _, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = 0  # reaped above
    cpu = usage.ru_utime + usage.ru_stime  # on a shared machine the wall time is mostly waiting
    return wall, cpu, usage.ru_maxrss * 1024, out.read_text(errors="replace")


def bench_analyze(tmp: Path, sizes: list[int], repeat: int) -> None:
    print(f"\nanalyze: a JSONL log, each measurement a new process ({load()})")
    for n in sizes:
        path = tmp / f"log-{human(n)}.jsonl"
        write_log(path, n)
        walls, cpus, peaks, text = [], [], [], ""
        for _ in range(repeat if n < 10_000_000 else 1):
            wall, cpu, peak, text = analyze_once(path)
            walls.append(wall)
            cpus.append(cpu)
            peaks.append(peak)
        wall, cpu, peak = statistics.median(walls), statistics.median(cpus), statistics.median(peaks)
        target_t, target_m = ("< 5 s", "< 300 MB") if n == 1_000_000 else ("", "")
        row(
            "analyze",
            "analyze wall time",
            human(n),
            wall,
            f"{wall:.1f} s",
            target_t,
            wall < 5 if target_t else None,
        )
        row("analyze", "analyze CPU time", human(n), cpu, f"{cpu:.1f} s")
        row(
            "analyze",
            "analyze peak memory",
            human(n),
            peak,
            f"{peak / MB:,.0f} MB",
            target_m,
            peak < 300 * MB if target_m else None,
        )
        found = "loss_spike" in text
        row("analyze", "the spike found", human(n), float(found), "yes" if found else "NO", "yes", found)
        # Every other anomaly is a false alarm: the curve falls steadily under its noise.
        kinds = re.findall(r"^(?:critical|warning|info)\s+(\S+)", text, re.M)
        others = [k for k in kinds if k != "loss_spike"]
        row(
            "analyze",
            "false alarms on the healthy curve",
            human(n),
            float(len(others)),
            ", ".join(others) or "none",
            "none",
            not others,
        )
        path.unlink()
    walls = {r.size: r.value for r in ROWS if r.figure == "analyze wall time"}
    if "1M" in walls and "10M" in walls:
        ratio = walls["10M"] / walls["1M"]
        row(
            "analyze",
            "10M time / 1M time (linear: about 10)",
            "10M",
            ratio,
            f"{ratio:.1f}x",
            "<= 12x",
            ratio <= 12,
        )


SECTIONS = ("supervisor", "series", "ranks", "runs", "server", "analyze")
FULL = {
    "steps": "1000,10000,100000,1000000",
    "series": "100000,1000000",
    "ranks": "1,8,64",
    "runs": "10,100,1000",
    "jobs": "10,100,1000",
    "logs": "10000,100000,1000000,10000000",
}
# Each section's top size takes the better part of the hour on 2 cores (a 1M-step prefill, 64 rank
# streams, a thousand run folders, a 10M-step log): --quick leaves it out, and says so.
QUICK = {
    **FULL,
    "steps": "1000,10000,100000",
    "ranks": "1,8",
    "runs": "10,100",
    "logs": "10000,100000,1000000",
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated: {', '.join(SECTIONS)}")
    p.add_argument("--steps", help=f"supervised run sizes (default {FULL['steps']})")
    p.add_argument("--series", help=f"generated run sizes for the series section (default {FULL['series']})")
    p.add_argument("--ranks", help=f"rank counts (default {FULL['ranks']})")
    p.add_argument("--runs", help=f"run folder counts (default {FULL['runs']})")
    p.add_argument("--jobs", help=f"queued job counts (default {FULL['jobs']})")
    p.add_argument("--logs", help=f"analyze log sizes (default {FULL['logs']})")
    p.add_argument("--repeat", type=int, default=5, help="measurements per figure (median)")
    p.add_argument(
        "--quick", action="store_true",
        help="shorter CPU windows, 3 repeats, each section's top size left out (minutes, not an hour)",
    )  # fmt: skip
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a config override for the supervised runs, e.g. run.telemetry_segment_bytes=8388608",
    )  # fmt: skip
    p.add_argument(
        "--save-every", type=int, default=300, metavar="STEPS",
        help="the supervised runs report a checkpoint every STEPS steps (0: none; default 300: one per "
        "30 s CPU window at 10 steps/s, so each window holds a save and its state keep-up past 20,000 steps)",
    )  # fmt: skip
    p.add_argument("--json", type=Path, help="write every row here")
    p.add_argument("--tmp", type=Path, help="work folder (default: a new one under /tmp, removed)")
    args = p.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        p.error(f"--only {','.join(unknown)}: unknown; sections are {', '.join(SECTIONS)}")
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    sizes = QUICK if args.quick else FULL
    chosen = {k: getattr(args, k) or sizes[k] for k in FULL}
    windows, window_s = (2, 15.0) if args.quick else (3, 30.0)
    repeat = 3 if args.quick else args.repeat
    tmp = args.tmp or Path(tempfile.mkdtemp(prefix="steadytune-scale-"))
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"steadytune scale benchmark: {os.cpu_count()} CPU cores, {load()}")
    if args.quick:
        top = {k: FULL[k].rsplit(",", 1)[1] for k in FULL}
        left = ", ".join(f"{k} {top[k]}" for k in FULL if top[k] not in chosen[k].split(","))
        if left:
            print(f"  --quick: the top sizes are left out ({left}); their rows are not measured here")
    print(f"  {'figure':<52} {'size':>6} {'value':>14}   {'target':<22}")
    try:
        if "supervisor" in only:
            bench_supervisor(
                tmp, ints(chosen["steps"]), windows, window_s, repeat, tuple(args.set), args.save_every
            )
        if "series" in only:
            bench_series(tmp, ints(chosen["series"]), repeat)
        if "ranks" in only:
            bench_ranks(tmp, ints(chosen["ranks"]), windows, window_s)
        if "runs" in only:
            bench_runs(tmp, ints(chosen["runs"]), repeat)
        if "server" in only:
            bench_server(tmp, ints(chosen["jobs"]), repeat)
        if "analyze" in only:
            bench_analyze(tmp, ints(chosen["logs"]), repeat)
    finally:
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in ROWS], indent=1))
        if args.tmp is None:
            shutil.rmtree(tmp, ignore_errors=True)
    missed = [r for r in ROWS if r.ok is False]
    print(
        f"\n{len(ROWS)} figures, {sum(1 for r in ROWS if r.ok)} targets met, {len(missed)} missed ({load()})"
    )
    for r in missed:
        print(f"  MISSED: {r.figure} at {r.size}: {r.shown} (target {r.target})")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
