"""``steadytune compact RUN_DIR...``: shrink a finished run's ``run.db``, every chart kept."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, fail


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "compact",
        "shrink a finished run's run.db: keep every chart summary, drop raw rows no chart needs",
        "steadytune compact runs/2026-12-06-llama   # prints the size before and after",
        description="Rewrites a finished run's run.db keeping every summary level (the charts at any "
        "zoom down to 64 steps / 16 s), events, plans and gradient flow, and of the raw step and "
        "sample rows only the newest window, a margin around every event that names a step, and the "
        "steps with an evaluation, a non-finite value or a skip. A chart zoomed into a dropped range "
        "is drawn from the 64-step / 16 s buckets (every spike still shown); the telemetry streams "
        "keep every step, and deleting run.db rebuilds it whole. The new file is written beside the "
        "old one and renamed over it: a crash leaves one or the other. A live run is refused. "
        "See docs/scale.md.",
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="finished run directories")
    p.add_argument("--window-steps", type=int, default=10_000, help="newest raw steps kept (default 10000)")
    p.add_argument(
        "--margin-steps",
        type=int,
        default=1_000,
        help="raw steps kept either side of an event (default 1000)",
    )
    p.add_argument(
        "--window-s", type=float, default=3_600.0, help="newest seconds of samples kept (default 3600)"
    )
    p.add_argument(
        "--margin-s",
        type=float,
        default=300.0,
        help="seconds of samples kept either side of an event (default 300)",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from steadytune.rundir import RunDir
    from steadytune.telemetry.store.compact import CompactError, Keep, compact

    bad = [
        f"--{name.replace('_', '-')} {value}: must be 0 or more"
        for name in ("window_steps", "margin_steps", "window_s", "margin_s")
        if (value := getattr(args, name)) < 0
    ]
    if bad:
        return fail("; ".join(bad), 2)
    keep = Keep(args.window_steps, args.margin_steps, args.window_s, args.margin_s)
    code = 0
    for path in args.runs:
        if (wrong := _not_a_run(path)) is not None:
            code = fail(wrong)
            continue
        try:
            done = compact(RunDir(path), keep)
        except CompactError as exc:
            code = fail(str(exc))
            continue
        print(f"{path}: {done.summary()}")
    return code


def _not_a_run(path: Path) -> str | None:
    """What is wrong with ``path`` as a run directory to compact, or None when it is one."""
    from steadytune.rundir import looks_like_run

    if not path.exists():
        return f"{path}: no such directory"
    if not path.is_dir():
        return f"{path}: not a directory; give a run directory"
    if looks_like_run(path):
        return None
    runs = sorted(p.name for p in path.iterdir() if looks_like_run(p))
    if runs:
        return f"{path}/ is a folder of runs: give one run, e.g. {path / runs[-1]}"
    return f"{path}: not a run directory (no status.json, events.jsonl, telemetry/ or run.db in it)"
