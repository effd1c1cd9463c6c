"""Where ``analyze``'s CPU goes on a JSON-lines log: reading, the engine's own turn, each detector.

    python benchmarks/analyze_split.py LOG [--steps 100000] [--repeat 3]

LOG is e.g. the 1M-step log ``benchmarks/scale.py --only analyze`` writes. Its first ``--steps``
records are read (timed: the streamed reader, each record made as ``analyze`` makes it and let
go), then read again and fed to the live engine, in process and without a profiler (cProfile
weighs calls, and this code is mostly calls), once per set of detectors shown a plain SFT step:
none (the engine's own turn: the point made, the observers called, the episodes kept), the loss
series alone, the loss and grad-norm series (every rule after them reads what they left on the
point), and those two with each other rule added in turn; then all of them. Each set runs
``--repeat`` times, the sets alternated, and the least time is printed (the machine's other work
only ever adds), with the load average. A rule's cost is its row less the loss-and-grad row.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from steadytune.config.detect import DetectConfig
from steadytune.detect.live import LiveDetector
from steadytune.importers import stream
from steadytune.records import StepRecord

_SERIES = ("LossWatch", "GradWatch")
_PLAIN_SFT = (False, False, False, False)  # live.NEEDS of a step with a loss and nothing else


def _shown(det: LiveDetector) -> list[str]:
    return [type(getattr(o, "__self__", o)).__name__ for o in det._feeds.signal_observers(_PLAIN_SFT)]


def feed(records: list[StepRecord], keep: set[str] | None) -> float:
    """µs of CPU a step for the engine showing only the detectors named in ``keep`` (None: all)."""
    det = LiveDetector(DetectConfig())
    feeds = det._feeds
    every: Callable[[tuple[bool, ...]], list[Any]] = feeds.signal_observers

    def only(has: tuple[bool, ...]) -> list[Any]:
        return [o for o in every(has) if keep is None or type(getattr(o, "__self__", o)).__name__ in keep]

    feeds.signal_observers = only
    start = time.process_time()
    for rec in records:
        det.observe_step(rec)
    det.finish()
    return (time.process_time() - start) / len(records) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.1f}")
    streamed = stream(args.log)
    if streamed is None:
        raise SystemExit(f"{args.log}: not a log analyze streams (a JSON-lines log of one run)")
    # Read and let go, as analyze reads: a list of them held would add the collector's passes over it.
    start = time.process_time()
    deque(itertools.islice(iter(streamed), args.steps), maxlen=0)
    read = (time.process_time() - start) / args.steps * 1e6
    again = stream(args.log)
    assert again is not None
    records = list(itertools.islice(iter(again), args.steps))
    sets: list[tuple[str, set[str] | None]] = [("the engine alone", set()), ("loss series", {"LossWatch"})]
    sets.append(("loss + grad-norm series", set(_SERIES)))
    for name in _shown(LiveDetector(DetectConfig())):
        if name not in _SERIES:
            sets.append((f"loss + grad + {name}", {*_SERIES, name}))
    sets.append(("every detector", None))
    times: dict[str, list[float]] = {name: [] for name, _ in sets}
    for _ in range(args.repeat):
        for name, keep in sets:
            times[name].append(feed(records, keep))
    print(f"reading (records made): {read:.2f} µs a step, {len(records):,} steps")
    base = min(times["loss + grad-norm series"])
    for name, values in times.items():
        least = min(values)
        extra = f"  (+{least - base:.2f})" if name.startswith("loss + grad + ") else ""
        print(f"{name:42s} {least:6.2f} µs a step{extra}   [{', '.join(f'{v:.2f}' for v in values)}]")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
