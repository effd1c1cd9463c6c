"""The supervisor's memory and CPU as a long run is taken in, then its CPU per 1,000 live steps.

    python benchmarks/supervisor_growth.py --steps 250000 --live-s 90
    python benchmarks/supervisor_growth.py --steps 25000 --live-s 300 --save-every 300
    /work/other/.venv/bin/python benchmarks/supervisor_growth.py --benchmarks /work/other/benchmarks

One supervised run of ``benchmarks/scale.py`` (the real supervisor over the generated stream):
a prefill of ``--steps`` steps taken in as fast as the supervisor goes, then 10 steps/s for
``--live-s`` seconds. Every 10 s it prints the step reached, the supervisor's resident and peak
memory, its CPU time and the load average, so a jump (a backlog held whole, a spike's look at
its batch) is seen where it happens, not only in the peak. ``--benchmarks``: another checkout's
benchmarks folder, to measure that checkout's supervisor (run it with that checkout's Python).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=250_000, help="prefill steps (default 250000)")
    p.add_argument("--live-s", type=float, default=90.0, help="seconds at 10 steps/s after the prefill")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument(
        "--save-every", type=int, default=0, metavar="STEPS",
        help="a checkpoint reported every STEPS steps (0: none); past 20,000 steps the detectors' saved "
        "state is kept up at saves, a cost a run without checkpoints never pays",
    )  # fmt: skip
    p.add_argument("--benchmarks", type=Path, default=Path(__file__).resolve().parent)
    args = p.parse_args()
    sys.path.insert(0, str(args.benchmarks))
    from _scale_run import SupervisedRun

    tmp = Path(tempfile.mkdtemp(prefix="steadytune-growth-"))
    run = SupervisedRun(tmp, "r", prefill=args.steps, ranks=args.ranks, save_every=args.save_every)
    t0 = time.monotonic()

    def snap(phase: str) -> None:
        rss, hwm = run.memory()
        load = Path("/proc/loadavg").read_text().split()[0]
        at = f"{phase:<8} {time.monotonic() - t0:7.1f} s  step {run.step():>9,}"
        mem = f"resident {rss >> 20:>6,} MB  peak {hwm >> 20:>6,} MB"
        print(f"{at}  {mem}  CPU {run.cpu_s():7.1f} s  load {load}", flush=True)

    try:
        while not (run.feed().get("phase") == "live" and run.step() >= args.steps):
            run._alive()
            snap("prefill")
            time.sleep(10)
        snap("live")
        c0, s0, w0 = run.cpu_s(), run.step(), time.monotonic()
        while time.monotonic() - w0 < args.live_s:
            time.sleep(10)
            snap("live")
        c1, s1, w1 = run.cpu_s(), run.step(), time.monotonic()
        _, hwm = run.memory()
        print(
            f"live: {(c1 - c0) / max(1, s1 - s0) * 1000:.2f} s of CPU per 1,000 steps over {s1 - s0} steps "
            f"({(c1 - c0) / (w1 - w0) * 100:.1f} % of a core); peak resident {hwm >> 20:,} MB"
        )
    finally:
        print(f"the run ended {run.stop()}")
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
