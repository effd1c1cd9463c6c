"""A restart's detection replay on a long stream: its time, beside another checkout's.

    python benchmarks/replay.py --steps 100000
    PYTHONPATH=/work/main/src python benchmarks/replay.py --steps 100000   # the same, main's code

A stream of ``--steps`` steps of ``_scale_feed.py`` (what steadytune's worker writes: a batch
fingerprint per step, gradient flow every 50 steps) with one restart in it: attempt 0 to 60 % of
the run, attempt 1 from a checkpoint at 50 % to the end. Then the detector a restart rebuilds from
it (``replay_detector`` up to the last step), ``--repeat`` times: wall and CPU time, with the
load average, and how the CPU splits between the look for each step's latest attempt and the
detectors' replay. Each time from the run's start (a run's first restart, or code before the saved
states), then, where the code saves the detectors' state beside the run, from the state saved
``--interval`` steps before (what the supervisor keeps at every checkpoint save). The stream is
written once into ``--dir`` and kept for the next run.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_stream(path: Path, steps: int) -> None:
    from _scale_feed import record

    from steadytune.records import replace, to_json
    from steadytune.telemetry.stream import JsonlWriter

    rng = random.Random(1)
    with JsonlWriter(path) as w:
        for attempt, (first, last) in enumerate([(1, steps * 6 // 10), (steps // 2 + 1, steps)]):
            for s in range(first, last + 1):
                rec = replace(record(s, 0, 1000.0 + s * 0.1, rng, 0.09), attempt=attempt)
                w._line(to_json(rec))


def timed(what: str, call: Callable[[], Any]) -> tuple[str, Any]:
    load = os.getloadavg()[0]
    w0, c0 = time.monotonic(), time.process_time()
    got = call()
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    return f"replay {what}: {wall:.2f} s wall, {cpu:.2f} s CPU (load {load:.1f})", got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument(
        "--interval", type=int, default=1000, help="steps between the saved state and the resume step"
    )
    p.add_argument("--dir", type=Path, default=Path("/tmp/steadytune-replay-bench"))
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import steadytune
    from steadytune.config.detect import DetectConfig
    from steadytune.rundir import RunDir

    try:
        from steadytune.supervise import replay as restarts  # where the replay lives since its saved states
    except ImportError:
        from steadytune.supervise import restarts  # type: ignore[no-redef]

    run = RunDir(args.dir / f"run-{args.steps}")
    if not run.telemetry(0).exists():
        write_stream(run.telemetry(0), args.steps)
    size = run.telemetry(0).stat().st_size
    print(f"code: {Path(steadytune.__file__).parent}; stream: {size / 1e6:.1f} MB, {args.steps:,} steps")
    saved = hasattr(restarts, "replay")  # this code saves the detectors' state beside the run
    for _ in range(args.repeat):
        shutil.rmtree(run.root / "replay-state", ignore_errors=True)  # a run's first restart: no state
        line, _ = timed("from the start", lambda: restarts.replay_detector(run, DetectConfig(), args.steps))
        if hasattr(restarts, "latest_attempts"):
            c1 = time.process_time()
            restarts.latest_attempts(run.telemetry(0), args.steps)
            line += f"; of it the look for the latest attempts {time.process_time() - c1:.2f} s CPU"
        print(line, flush=True)
        if saved:
            # What the supervisor keeps at every save: the state one checkpoint interval before.
            shutil.rmtree(run.root / "replay-state", ignore_errors=True)
            restarts.replay(run, DetectConfig(), args.steps - args.interval)
            line, done = timed(
                f"from the state {args.interval:,} steps back",
                lambda: restarts.replay(run, DetectConfig(), args.steps),
            )
            print(f"{line}; {done.fed:,} records fed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
