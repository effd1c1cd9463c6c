"""``run.db`` of a finished run before and after ``steadytune compact``, and the series answers.

The run is the one ``scale.py``'s series section generates (``_scale_dash.make_long_run``: a decaying
loss with a 3x spike per 100k steps, 8 GPUs sampled every second at 10 steps/s), with an anomaly
event at each spike, as its supervisor would have filed. Prints the file size before and after, the
raw rows kept, the compaction's time, and the whole-run and zoomed series answers' time on both.

    python benchmarks/compact.py --steps 1000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _scale_dash import make_long_run

MB = 1 << 20


def _series_ms(db: Path, lo: float | None, hi: float | None, repeat: int = 5) -> float:
    from steadytune.telemetry.store import STEP_METRICS, RunStore

    with RunStore(db, readonly=True) as store:
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            store.step_series(STEP_METRICS, points=1500, lo=lo, hi=hi)
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> int:
    from steadytune.records import Event
    from steadytune.rundir import RunDir
    from steadytune.telemetry.store import RunStore
    from steadytune.telemetry.store.compact import Keep, compact

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--tmp", type=Path, help="work folder (default: a new one under /tmp, removed)")
    args = p.parse_args()
    tmp = args.tmp or Path(tempfile.mkdtemp(prefix="compact-bench-"))
    try:
        t = time.perf_counter()
        spikes = make_long_run(tmp, "long", args.steps)
        run = RunDir(tmp / "long")
        with RunStore(run.db) as store:
            store.add_events(
                [Event(ts=time.time() - (args.steps - s) * 0.1, kind="anomaly", name="loss_spike",
                       severity="warning", step=s, seq=k) for k, (s, _) in enumerate(spikes)]
            )  # fmt: skip
        print(f"generated {args.steps:,} steps in {time.perf_counter() - t:.0f} s; load {os.getloadavg()}")
        zoom = (spikes[0][0] - 30_000, spikes[0][0] - 20_000) if spikes else (0.0, 10_000.0)
        before = (_series_ms(run.db, None, None), _series_ms(run.db, *zoom))
        t, wall = time.process_time(), time.perf_counter()
        done = compact(run, Keep())
        cpu, wall = time.process_time() - t, time.perf_counter() - wall
        after = (_series_ms(run.db, None, None), _series_ms(run.db, *zoom))
        print(
            f"run.db: {done.bytes_before / MB:.1f} MB -> {done.bytes_after / MB:.1f} MB "
            f"({done.bytes_after / done.bytes_before:.1%}); raw steps {done.steps_before:,} -> "
            f"{done.steps_after:,}; system samples {done.samples_before:,} -> {done.samples_after:,}"
        )
        print(f"compaction: {cpu:.1f} s of CPU, {wall:.1f} s of wall time; load {os.getloadavg()}")
        print(f"series, 1,500 points, whole run: {before[0]:.1f} ms -> {after[0]:.1f} ms")
        print(f"series, 1,500 points, 10k steps in a dropped range: {before[1]:.1f} ms -> {after[1]:.1f} ms")
    finally:
        if args.tmp is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
