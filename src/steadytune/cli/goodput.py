"""``steadytune goodput RUN... | RUNS_DIR``: how much of each run's time became training, where it went."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_format, fail


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "goodput",
        "how much of each run's wall time became training kept in the final model, and where the rest went",
        "steadytune goodput runs/            # every run in the folder, and all of them together\n  "
        "steadytune goodput runs/a runs/b --format json",
        description="Each run's wall time, from its launch (or its submission to the GPU server) to its "
        "end, split into productive time (the steps that survive into the final model: the last "
        "attempt of each) and time lost by cause: queue wait, preflight, start-up, restarts, redone "
        "work, hangs, checkpoint saves, in-process recovery, pauses, shut-down, and evaluation (kept "
        "apart: useful, not training). Whatever cannot be attributed is shown as unattributed. A live "
        "run is counted up to now. See docs/goodput.md.",
    )
    p.add_argument("paths", nargs="+", metavar="RUN | RUNS_DIR", help="run directories, or folders of runs")
    add_format(p)
    p.set_defaults(func=main)


def run_dirs(paths: list[str]) -> list[Path]:
    """The run directories that ``paths`` name: each a run, or a folder whose runs are taken in order.

    Raises:
        ValueError: every path that is neither, at once, with the fix.
    """
    from steadytune.rundir import looks_like_run

    found: list[Path] = []
    problems: list[str] = []
    for raw in paths:
        path = Path(raw)
        if looks_like_run(path):
            found.append(path)
        elif path.is_dir():
            runs = sorted(p for p in path.iterdir() if looks_like_run(p))
            if not runs:
                problems.append(f"{raw}: a folder with no run in it (a run has events.jsonl or telemetry/)")
            found.extend(runs)
        else:
            problems.append(f"{raw}: no such directory")
    if problems:
        raise ValueError(
            "\n  - ".join([f"{len(problems)} path(s) are not runs:", *problems])
            + "\n  give run directories (runs/<run-id>) or the folder that holds them (runs/)"
        )
    return found


def main(args: argparse.Namespace) -> int:
    from steadytune.goodput.load import run_account
    from steadytune.goodput.text import pooled, table
    from steadytune.rundir import RunDir
    from steadytune.telemetry.progress import human_seconds

    try:
        dirs = run_dirs(args.paths)
    except ValueError as exc:
        return fail(str(exc), 2)
    accounts = sorted((run_account(RunDir(d)) for d in dirs), key=lambda a: (a.start_ts, a.run_id))
    interruptions = sum(a.interruptions for a in accounts)
    exposure = sum(a.exposure_s for a in accounts)
    if args.format == "json":
        out = {
            "runs": [a.to_dict() for a in accounts],
            "goodput": pooled(accounts),
            "interruptions": interruptions,
            "exposure_s": exposure,
            "mtbf_s": exposure / interruptions if interruptions else None,
        }
        print(json.dumps(out, indent=1))
        return 0
    print(table(accounts))
    every = f": one every {human_seconds(exposure / interruptions)}" if interruptions else ""
    print(f"\ninterruptions (restarts and rollbacks): {interruptions} in {human_seconds(exposure)}{every}")
    return 0
