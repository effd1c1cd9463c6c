"""The real supervisor over a generated stream, for benchmarks/scale.py: no model, no torch.

    python benchmarks/_scale_supervisor.py RUNS_DIR RUN_ID [--set key=value ...] -- FEED_ARGS...

One ``Supervisor`` (the one ``run`` and ``supervise`` use, with its store, detectors, policy,
system sampler and status file) whose attempt is ``_scale_feed.py`` instead of the trainer: a
source like steadytune's own worker's, started with another command. It runs in a process of its
own, so the benchmark reads this process's CPU time and memory and nothing else's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from steadytune.config.load import load_supervise_config
from steadytune.records import PlanRevision
from steadytune.rundir import RunDir
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.source import NativeSource
from steadytune.supervise.supervisor import Supervisor
from steadytune.telemetry.segments import SEGMENT_ENV

FEED = Path(__file__).resolve().with_name("_scale_feed.py")


class FeedSource(NativeSource):
    """steadytune's own worker's source, whose attempt is the generated stream."""

    def __init__(self, run: RunDir, feed_args: list[str], segment_bytes: int) -> None:
        super().__init__(run, env={SEGMENT_ENV: str(segment_bytes)})  # as the supervisor tells its worker
        self.feed_args = feed_args

    def start(self, plan: PlanRevision, log_path: Path) -> WorkerProcess:
        cmd = [sys.executable, str(FEED), str(self.run.root), *self.feed_args]
        proc = WorkerProcess(cmd, log_path, env=self.attempt_env(plan.attempt))
        proc.how = "a new process: the generated stream of benchmarks/scale.py"
        return proc

    def describe(self) -> str:
        return "the generated stream of benchmarks/scale.py"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir", type=Path)
    p.add_argument("run_id")
    p.add_argument("--set", action="append", default=[], help="config override, key=value")
    p.add_argument("--profile", type=Path, help="write the cProfile statistics of the run here")
    p.add_argument(
        "--memory", type=Path, help="write what the supervisor holds at its end here (tracemalloc)"
    )
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, feed = p.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: the feed's own arguments
    cfg = load_supervise_config(None, [f"run.runs_dir={args.runs_dir}", *args.set])
    run = RunDir(args.runs_dir / args.run_id)
    sup = Supervisor(cfg, run, source=FeedSource(run, feed, cfg.run.telemetry_segment_bytes))
    if args.memory:  # what the supervisor holds at the end, by line of allocation
        import tracemalloc

        tracemalloc.start(3)
        result = sup.run_to_end()
        top = tracemalloc.take_snapshot().statistics("lineno")[:25]
        args.memory.write_text("\n".join(str(s) for s in top))
    elif args.profile:  # where the supervisor's CPU goes (cProfile's own cost included)
        import cProfile
        import time

        prof = cProfile.Profile(time.process_time)  # CPU, not wall: on a loaded machine most wall is waiting
        result = prof.runcall(sup.run_to_end)
        prof.dump_stats(args.profile)
    else:
        result = sup.run_to_end()
    print(f"{result.state}: {result.reason}")
    return 0 if result.state == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
