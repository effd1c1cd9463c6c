"""``steadytune replay RUN``: the detectors and the policy, again, over what the run recorded."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from steadytune.cli._common import add_command, add_format, fail


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "replay",
        "re-run detection and policy over a run's telemetry and print the timeline",
        "steadytune replay runs/my-run",
        description="Feed the recorded step records and system samples through the live detectors and "
        "the policy, "
        "as the supervisor did, and print the timeline: anomalies, actions, restarts, alerts. Then "
        "compare the "
        "anomalies with events.jsonl (exit 1 when they differ), e.g. after changing detect: thresholds.",
    )
    p.add_argument("run", help="the run directory (runs/<run-id>)")
    add_format(p)
    p.set_defaults(func=main)


def _line(e: Any, t0: float) -> str:
    at = f"+{(e.ts or t0) - t0:7.1f}s" if e.ts else " " * 9
    step = "-" if e.step is None else str(e.step)
    text = e.message if len(e.message) <= 90 else e.message[:89] + "…"
    return f"  {at}  step {step:>6}  {e.kind:<9} {e.name:<22} {e.severity:<8} {text}"


def main(args: argparse.Namespace) -> int:
    from steadytune.forensics.runview import ForensicsError, resolve_run
    from steadytune.forensics.timeline import anomaly_keys, first_difference, recorded, replay_run, settings

    try:
        run = resolve_run(args.run)
    except ForensicsError as exc:
        return fail(str(exc), 2)
    entries = replay_run(run)
    notes = settings(run)[2]
    live = recorded(run)
    mine, theirs = anomaly_keys(entries), anomaly_keys(live)
    diff = first_difference(mine, theirs)
    if args.format == "json":
        print(
            json.dumps(
                {
                    "timeline": [e.__dict__ for e in entries],
                    "matches_live": diff is None,
                    "first_difference": diff,
                    "replayed": mine,
                    "recorded": theirs,
                    "notes": notes,
                },
                indent=1,
                default=list,
            )
        )
        return 0 if diff is None else 1
    t0 = min((e.ts for e in entries + live if e.ts), default=time.time())
    print(f"timeline of {run.run_id} (replayed: {len(mine)} anomaly/resolved entries, live: {len(theirs)})")
    for e in entries:
        print(_line(e, t0))
    if not entries:
        print("  (nothing happened)")
    for note in notes:
        print(f"note: {note}")
    if diff is None:
        print("\nverdict: the replay equals what happened live")
        return 0
    got = mine[diff] if diff < len(mine) else "(nothing)"
    want = theirs[diff] if diff < len(theirs) else "(nothing)"
    print(
        f"\nverdict: DIFFERS from live at entry {diff + 1}: replay {got}, live {want} "
        "(different detect: settings, or a live-only timing effect; see docs/forensics.md)"
    )
    return 1
