"""``steadytune env RUN | env diff RUN_A RUN_B | env export RUN``: the environment a run trained in."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_format, fail

USAGE = """\
  steadytune env RUN                    what RUN trained with (Python, torch/CUDA, driver, GPUs, git,
                                        packages)
  steadytune env diff RUN_A RUN_B       what changed from A to B: packages, torch/CUDA, driver, git commit
  steadytune env export RUN [-o FILE]   a requirements.txt pinning every package of RUN
                                        (default requirements.txt)"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "env",
        help="show, compare or export the environment a run trained in (env.json)",
        description="Every run directory holds env.json, written when the run starts: Python and every "
        "package with its version, torch / CUDA / cuDNN / NCCL, the driver and GPU models, and the git "
        "commit, branch and (bounded, secret-free) uncommitted diff of the working tree. "
        "A reading that was unavailable shows as n/a.\n\n" + USAGE,
        epilog="examples:\n  steadytune env runs/demo-1\n  steadytune env diff runs/last-week runs/today\n"
        "  steadytune env export runs/last-week -o requirements.txt && pip install -r requirements.txt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("words", nargs="+", metavar="RUN | diff A B | export RUN", help="what to do (see above)")
    add_format(p)
    p.add_argument("--all", action="store_true", help="env RUN: list every package, not only the key ones")
    p.add_argument(
        "-o", "--output", default="requirements.txt", help="env export: the file to write; - for stdout"
    )
    p.add_argument("--force", action="store_true", help="env export: replace an existing file")
    p.set_defaults(func=main)


def _load(path: str) -> tuple[Any, dict[str, Any]]:
    from steadytune.forensics.runview import resolve_run
    from steadytune.telemetry.runenv import read_run_env

    run = resolve_run(path)
    return run, read_run_env(run)


def show_env(args: argparse.Namespace, path: str) -> int:
    from steadytune.forensics.envdiff import render_env

    run, env = _load(path)
    if args.format == "json":
        print(json.dumps(env, indent=1))
    else:
        print(render_env(env, run.run_id, all_packages=args.all), end="")
    return 0


def diff_env(args: argparse.Namespace, a: str, b: str) -> int:
    from steadytune.forensics.envdiff import diff_envs, render_diff

    run_a, env_a = _load(a)
    run_b, env_b = _load(b)
    d = diff_envs(env_a, env_b)
    if args.format == "json":
        print(json.dumps({"a": str(run_a.root), "b": str(run_b.root), **d.to_dict()}, indent=1))
    else:
        print(render_diff(d, run_a.run_id, run_b.run_id), end="")
    return 0


def export_env(args: argparse.Namespace, path: str) -> int:
    from steadytune.forensics.envdiff import requirements
    from steadytune.rundir import atomic_write_text

    run, env = _load(path)
    text = requirements(env, f"{run.root}/env.json")
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.exists() and not args.force:
        return fail(f"{out} exists; pass --force to replace it, or -o another file", 2)
    atomic_write_text(out, text)
    pins = sum(1 for line in text.splitlines() if line and not line.startswith(("#", "-")))
    print(f"wrote {out}: {pins} pinned packages from {run.run_id} (pip install -r {out})")
    return 0


def main(args: argparse.Namespace) -> int:
    from steadytune.forensics.runview import ForensicsError
    from steadytune.telemetry.runenv import EnvError

    words = args.words
    try:
        if words[0] == "diff":
            if len(words) != 3:
                return fail("env diff takes two runs: steadytune env diff RUN_A RUN_B", 2)
            return diff_env(args, words[1], words[2])
        if words[0] == "export":
            if len(words) != 2:
                return fail("env export takes one run: steadytune env export RUN [-o FILE]", 2)
            return export_env(args, words[1])
        if words[0] == "show":
            words = words[1:]
        if len(words) != 1:
            return fail(f"env takes one run (got {' '.join(words) or 'none'}); usage:\n{USAGE}", 2)
        return show_env(args, words[0])
    except (EnvError, ForensicsError) as exc:
        return fail(str(exc))
