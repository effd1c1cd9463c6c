"""The run page's gradient-flow heat map of a long run: in process and over HTTP, and the index rebuild.

A run of ``N`` gradient-flow recordings (one per 50 steps, 27 layers with their histograms, as
``_scale_feed.py`` writes them: 2,000 for 100k steps, 20,000 for 1M) is written as its stream;
its ``run.db`` is built from it (timed: the rebuild a lost index costs), then the heat map the
page asks for is timed: the whole run in ``--points`` columns, and a zoom on a tenth of it, in
process (``api.gradflow``) and as ``/api/runs/<run>/gradflow`` from a dashboard in this process.
``--writer``: what a recording costs the process that indexes a live run (the supervisor), per
1,000 steps, on an index already holding the largest size.

Run it under two checkouts at once to compare them (it uses only what both have)::

    PYTHONPATH=OLD/src python benchmarks/heatmap.py --label old &
    PYTHONPATH=NEW/src python benchmarks/heatmap.py --label new
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _scale_feed import GRADFLOW_EVERY, record


def load() -> str:
    return "load " + " / ".join(f"{v:.1f}" for v in os.getloadavg())


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # once untimed: the first read warms SQLite's page cache, as the page's second visit finds it
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def write_run(root: Path, recordings: int) -> Path:
    """A run's stream holding only its recording steps (what the heat map reads; the steps between
    them cost the heat map nothing)."""
    from steadytune.rundir import RunDir
    from steadytune.telemetry.stream import JsonlWriter

    run = RunDir(root / "r1").create()
    rng = random.Random(1)
    with JsonlWriter(run.telemetry(0)) as w:
        for i in range(1, recordings + 1):
            step = i * GRADFLOW_EVERY
            w.write(record(step, 0, 1e9 + step / 10, rng, 0.1))
    return run.root


def bench(recordings: int, points: int, repeat: int, label: str) -> None:
    from steadytune.rundir import RunDir
    from steadytune.telemetry.store import open_store
    from steadytune.web import api
    from steadytune.web.runs import RunsIndex
    from steadytune.web.server import start_dashboard

    with tempfile.TemporaryDirectory(prefix="steadytune-heatmap-") as tmp:
        runs = Path(tmp) / "runs"
        root = write_run(runs, recordings)
        t = time.perf_counter()
        open_store(RunDir(root)).close()
        rebuild_s = time.perf_counter() - t
        db_mb = (root / "run.db").stat().st_size / 2**20
        last = recordings * GRADFLOW_EVERY
        zoom = (last * 0.45, last * 0.55)
        index = RunsIndex(runs, cache_dir=Path(tmp) / "cache")
        try:
            entry = index.get("r1")
            assert entry is not None
            whole = median_ms(lambda: api.gradflow(entry, points), repeat)
            zoomed = median_ms(lambda: api.gradflow(entry, points, *zoom), repeat)
            columns = len(api.gradflow(entry, points)["columns"])
        finally:
            index.close()
        dash = start_dashboard(runs, port=0)
        try:
            url = f"{dash.url}api/runs/r1/gradflow?points={points}"
            size = 0

            def get() -> None:
                nonlocal size
                with urllib.request.urlopen(url, timeout=120) as r:
                    size = len(r.read())

            http = median_ms(get, repeat)
        finally:
            dash.stop()
    print(
        f"{label}: {recordings:,} recordings ({last:,} steps): index rebuilt from the stream "
        f"{rebuild_s:.2f} s "
        f"(run.db {db_mb:.1f} MB); heat map in process {whole:.0f} ms ({columns} columns of {points} asked), "
        f"zoom on a tenth {zoomed:.0f} ms; GET /gradflow {http:.0f} ms ({size / 1000:.0f} KB); {load()}",
        flush=True,
    )


def bench_writer(recordings: int, label: str, live: int = 500) -> None:
    """What a recording costs the process that indexes the run (the supervisor): ``add_steps`` of one
    step at a time, as a live run feeds them, on an index already holding ``recordings``."""
    from steadytune.telemetry.store import RunStore

    with tempfile.TemporaryDirectory(prefix="steadytune-heatmap-") as tmp:
        store = RunStore(Path(tmp) / "run.db")
        rng = random.Random(1)
        for i in range(0, recordings, 500):
            store.add_steps([record(GRADFLOW_EVERY * j, 0, 1e9 + j, rng, 0.1) for j in range(i + 1, i + 501)])
        with_flow, without = [], []
        for j in range(recordings + 1, recordings + live + 1):
            for step in range(GRADFLOW_EVERY * j, GRADFLOW_EVERY * j + GRADFLOW_EVERY, 5):
                r = record(step, 0, 1e9 + step / 10, rng, 0.1)
                t = time.perf_counter()
                store.add_steps([r])
                (with_flow if "gradflow" in r.extra else without).append(time.perf_counter() - t)
        store.close()
    extra = statistics.mean(with_flow) - statistics.mean(without)
    per_1000 = 1000 / GRADFLOW_EVERY * extra * 1000
    print(
        f"{label}: writer, {recordings:,} recordings indexed, {live} more one step at a time: a step with a "
        f"recording {statistics.mean(with_flow) * 1000:.2f} ms "
        f"(median {statistics.median(with_flow) * 1000:.2f}), "
        f"without {statistics.mean(without) * 1000:.2f} ms: the recordings cost {per_1000:.0f} ms per 1,000 "
        f"steps; {load()}",
        flush=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recordings", type=int, nargs="+", default=[2000, 20000])
    p.add_argument("--points", type=int, default=360, help="columns asked (the page: its width / 3 px)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--label", default="this checkout")
    p.add_argument("--writer", action="store_true", help="also what a recording costs the run's indexer")
    args = p.parse_args()
    for n in args.recordings:
        bench(n, args.points, args.repeat, args.label)
    if args.writer:
        bench_writer(max(args.recordings), args.label)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
