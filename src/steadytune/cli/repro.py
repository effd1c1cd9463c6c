"""``steadytune repro RUN``: a minimal-repro bundle of one step; ``repro --check BUNDLE`` replays it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_format, fail


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "repro",
        "pack a step into a repro bundle, or replay a bundle (--check)",
        "steadytune repro runs/my-run --step 120 && steadytune repro --check "
        "runs/my-run/repro/repro-step120.tar.gz",
        description="Write a .tar.gz with the resolved config and plan revisions, an environment "
        "snapshot, seed "
        "and RNG states, the sample ids of the step's batch (raw samples only with --include-data), the "
        "checkpoint reference and its manifest hash (a copy only with --include-checkpoint), the metrics "
        "window, "
        "the events around the step, and replay.py. With --check, reload the newest verified checkpoint "
        "before "
        "the step, replay up to the step on the recorded batches, and say whether the anomaly reproduces "
        "(exit 0: reproduced, or a healthy step matched; 1: not).",
    )
    p.add_argument(
        "run",
        nargs="?",
        help="the run directory (runs/<run-id>); with --check, the run the bundle came from, to find the "
        "checkpoint, model and data its redacted paths name (found by itself when the bundle is still in it)",
    )
    p.add_argument(
        "--step", type=int, default=None, help="the step; default: the last one where something went wrong"
    )
    p.add_argument(
        "--attempt",
        type=int,
        default=None,
        help="the worker attempt to replay (default: the one running when the step went wrong)",
    )
    p.add_argument("--include-data", action="store_true", help="put the raw samples in the bundle")
    p.add_argument(
        "--include-checkpoint", action="store_true", help="put a copy of the checkpoint in the bundle"
    )
    p.add_argument(
        "-o", "--output", type=Path, default=None, help="bundle path (default RUN/repro/repro-step<N>.tar.gz)"
    )
    p.add_argument(
        "--redact-paths",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write paths relative to the run, ~ for the home directory and <abs>/<name> elsewhere, and no "
        "user or host name (default; --no-redact-paths keeps them, for a bundle that stays on this machine)",
    )
    p.add_argument("--check", type=Path, default=None, metavar="BUNDLE", help="replay this bundle instead")
    p.add_argument("--checkpoint", type=Path, default=None, help="with --check: use this checkpoint folder")
    p.add_argument("--data", type=Path, default=None, help="with --check: use this dataset file")
    p.add_argument("--model", type=Path, default=None, help="with --check: use this model folder")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="with --check: allow model.trust_remote_code: true from the bundle's config, which runs the "
        "model's own Python code (off by default: only for a bundle and a model you trust)",
    )
    from steadytune.forensics.unpack import add_limit_flags

    add_limit_flags(p)  # with --check
    add_format(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.check is not None:
        from steadytune.forensics.replaystep import main as replay_main

        argv = [str(args.check), "--format", args.format]
        if args.checkpoint:
            argv += ["--checkpoint", str(args.checkpoint)]
        if args.data:
            argv += ["--data", str(args.data)]
        if args.model:
            argv += ["--model", str(args.model)]
        if args.run:
            argv += ["--run", str(args.run)]
        if args.trust_remote_code:
            argv.append("--trust-remote-code")
        argv += ["--max-unpacked-bytes", str(args.max_unpacked_bytes), "--max-member-bytes"]
        argv += [str(args.max_member_bytes), "--max-members", str(args.max_members)]
        return replay_main(argv)
    if not args.run:
        return fail("pass a run directory to bundle, or --check BUNDLE to replay one", 2)
    from steadytune.forensics.bundle import build_bundle
    from steadytune.forensics.runview import ForensicsError, resolve_run

    try:
        info = build_bundle(
            resolve_run(args.run),
            args.step,
            args.include_data,
            args.include_checkpoint,
            args.output,
            attempt=args.attempt,
            redact_paths=args.redact_paths,
        )
    except ForensicsError as exc:
        return fail(str(exc))
    if args.format == "json":
        import json

        print(json.dumps({**info.__dict__, "path": str(info.path)}, indent=1))
        return 0
    start = (
        f"{info.checkpoint} (step {info.start_step})"
        if info.checkpoint
        else "the base model (no checkpoint before it)"
    )
    print(f"wrote {info.path} ({info.bytes / 1024:,.0f} KiB)")
    print(f"  step {info.step}: replays {info.steps_to_replay} step(s) from {start}")
    print(
        f"  raw samples: "
        f"{'included' if info.included_data else 'not included (ids and hashes only; --include-data)'}"
    )
    referenced = "referenced by path + manifest sha256 (--include-checkpoint)"
    print(f"  checkpoint: {'copied in' if info.included_checkpoint else referenced}")
    print(
        f"  paths: {'redacted (--no-redact-paths keeps them)' if args.redact_paths else 'kept as they are'}"
    )
    for note in info.notes:
        print(f"  note: {note}")
    print(f"check it: steadytune repro --check {info.path}")
    return 0
