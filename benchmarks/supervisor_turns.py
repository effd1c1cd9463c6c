"""Where a supervisor's own CPU goes, turn by turn: each part of its loop on its thread's CPU clock.

    python benchmarks/supervisor_turns.py                       # 1,000 live steps at 10 steps/s
    python benchmarks/supervisor_turns.py --set run.poll_s=0.5  # the same with two looks a second
    PYTHONPATH=../other/src python benchmarks/supervisor_turns.py   # another checkout's supervisor

The real supervisor (``_scale_supervisor.py``: its store, detectors, system sampler and status file)
over ``_scale_feed.py``'s generated stream, nothing prefilled, in this process, so each part of a turn
is timed on the main thread's own CPU clock: reading the streams, handling each record (the
detectors), the tick (the books, the observers' flush, the operator's requests), the status file, the
system sample, the worker's poll. Counted from the first step to the last, so the start (imports, the
environment snapshot) is left out. A cost per call that is much higher here than the same call in a
tight loop is the turn running cold after its sleep (docs/scale.md, *The supervisor's own CPU*).

Run two at once (this checkout and another, or two settings) to compare them at the same load: the
figures move by 2-4x between an idle machine and a loaded one.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import resource
import runpy
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
spent: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()


def timed(cls: Any, name: str, label: str) -> None:
    """Count ``cls.name``'s calls and the main thread's CPU they take (their callees included)."""
    f = getattr(cls, name)

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - t
            calls[label] += 1

    setattr(cls, name, run)


def timed_generator(cls: Any, name: str, label: str) -> None:
    """As :func:`timed`, for a generator: only the time inside it, not its consumer's between items."""
    f = getattr(cls, name)

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Iterator[Any]:
        it = f(*args, **kwargs)
        calls[label] += 1
        while True:
            t = time.thread_time()
            try:
                item = next(it)
            except StopIteration:
                spent[label] += time.thread_time() - t
                return
            spent[label] += time.thread_time() - t
            yield item

    setattr(cls, name, run)


PARTS = (  # in the turn's order; indented under the part that calls them
    "a turn (pump)",
    "  read the streams",
    "    the ranks' files",
    "    a stream's new records",
    "  handle a record",
    "    detectors (observe_step)",
    "  system sample",
    "  tick",
    "    LAST_GOOD",
    "    status.json",
    "    observers' flush (run.db)",
    "worker's poll",
)


def instrument(on_first_step: Callable[[], None]) -> None:
    from steadytune.detect.live import LiveDetector
    from steadytune.supervise import intake, observers, process, status, supervisor
    from steadytune.telemetry.stream import JsonlTailer

    sup = supervisor.Supervisor
    timed(sup, "pump", "a turn (pump)")
    pump = sup.pump

    def first_then_pump(self: Any) -> None:
        if self.state.progress.step and not calls["turns"]:
            on_first_step()
        calls["turns"] += 1 if self.state.progress.step else 0
        pump(self)

    timed(sup, "handle", "  handle a record")
    timed(LiveDetector, "observe_step", "    detectors (observe_step)")
    timed(sup, "tick", "  tick")
    timed(observers.Observers, "flush", "    observers' flush (run.db)")
    timed(status.RunBooks, "write_status", "    status.json")
    timed(status.RunBooks, "update_last_good", "    LAST_GOOD")
    timed_generator(intake.Intake, "read", "  read the streams")
    timed_generator(JsonlTailer, "records", "    a stream's new records")
    timed(intake.RankFiles, "__call__", "    the ranks' files")
    timed(intake.Intake, "sample", "  system sample")
    timed(process.WorkerProcess, "poll", "worker's poll")
    sup.pump = first_then_pump  # type: ignore[method-assign]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000, help="live steps (default 1000)")
    p.add_argument("--rate", type=float, default=10.0, help="steps per second (default 10)")
    p.add_argument("--set", action="append", default=[], help="config override, key=value")
    args = p.parse_args()
    start: list[float] = []

    def on_first_step() -> None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        start.extend([ru.ru_utime + ru.ru_stime, time.thread_time(), time.monotonic()])
        spent.clear()
        calls.clear()

    instrument(on_first_step)
    with tempfile.TemporaryDirectory(prefix="st-turns-") as tmp:
        sets = [x for s in args.set for x in ("--set", s)]
        feed = ["--prefill", "0", "--rate", str(args.rate), "--max-live", str(args.steps)]
        sys.argv = [str(HERE / "_scale_supervisor.py"), tmp, "turns", *sets, "--", *feed]
        try:
            runpy.run_path(str(HERE / "_scale_supervisor.py"), run_name="__main__")
        except SystemExit:
            pass
    if not start:
        print("the run made no step")
        return 1
    ru = resource.getrusage(resource.RUSAGE_SELF)
    process_cpu = ru.ru_utime + ru.ru_stime - start[0]
    main_cpu, wall = time.thread_time() - start[1], time.monotonic() - start[2]
    turns, per_1k = max(1, calls["turns"]), 1000 / args.steps
    print(
        f"{args.steps:,} live steps at {args.rate:g} steps/s, {' '.join(args.set) or 'defaults'}; "
        f"load {os.getloadavg()[0]:.2f}, {wall:.0f} s, {turns} turns ({turns / wall:.1f} a second)"
    )
    print(
        f"  supervisor process CPU: {process_cpu * per_1k:.2f} s per 1,000 steps (target < 1 s); "
        f"main thread {main_cpu * per_1k:.2f} s, {1000 * main_cpu / turns:.2f} ms a turn"
    )
    print(f"  {'part':34s} {'s per 1,000 steps':>18s} {'ms a call':>10s} {'calls':>7s}")
    for label in PARTS:
        n, cpu = max(1, calls[label]), spent[label]
        print(f"  {label:34s} {cpu * per_1k:18.3f} {1000 * cpu / n:10.3f} {calls[label]:7d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
