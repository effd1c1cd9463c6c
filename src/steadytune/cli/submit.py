"""``steadytune submit``: queue a job on the GPU server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, add_socket, fail

EXAMPLE = """steadytune submit examples/lora.yaml train.max_steps=500 --priority 5
  steadytune submit --need-gib 30 --gpus 2 -- torchrun --nproc-per-node 2 train.py
  steadytune submit --config my.yaml -- llamafactory-cli train sft.yaml"""

DESCRIPTION = """\
Queues a job on the host's `steadytune server`. A config job runs as `steadytune run
CONFIG [key=value ...]`; a command after -- runs as `steadytune supervise [--config C]
-- CMD`. Its memory need per GPU is the estimator's peak for the config (as
`steadytune estimate` gives it), unless --need-gib says otherwise; a command without a
config and without --need-gib is measured by a short probe (--probe-s). The job runs in
this directory with this environment, on the GPUs the server picks (CUDA_VISIBLE_DEVICES)."""


def register(sub: Any) -> None:
    p = add_command(sub, "submit", "queue a job on the GPU server", EXAMPLE, DESCRIPTION)
    p.add_argument(
        "overrides", nargs="*", metavar="CONFIG.yaml [key=value ...] | -- CMD ...",
        help="a run config (a first word ending in .yaml or .yml) and its overrides, or a command after --",
    )  # fmt: skip
    p.add_argument("--config", type=Path, default=None, help="with -- CMD: the supervise config")
    p.add_argument(
        "--need-gib", type=float, default=None, help="peak memory per GPU in GiB (beats the estimate)"
    )
    p.add_argument(
        "--probe-s", type=float, default=None,
        help="a command without --need-gib is measured: run alone this long at most (default 60) "
        "while the server watches its GPU memory, then stopped and queued with peak + 15%%",
    )  # fmt: skip
    p.add_argument(
        "--memory-cap-gib", type=float, default=None,
        help="cap the job's PyTorch memory per GPU at this many GiB, so an overrun is its own clean OOM "
        "(config jobs and supervise --inject; docs/server.md)",
    )  # fmt: skip
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs the job needs (default: a config's run.nproc_per_node, else 1)",
    )
    p.add_argument("--priority", type=int, default=0, help="higher starts first (default 0)")
    p.add_argument("--hold", action="store_true", help="queue it held: it waits for `steadytune release`")
    p.add_argument("--skip-check", action="store_true", help="start the run without its preflight check")
    add_socket(p)
    p.set_defaults(func=main)


def socket_path(arg: Path | None) -> Path:
    from steadytune.server.daemon import default_dir

    return arg if arg is not None else default_dir() / "server.sock"


def is_config(word: str) -> bool:
    return word.endswith((".yaml", ".yml"))


def build_request(args: argparse.Namespace) -> dict[str, Any]:
    """The submit request; ``{"error": ...}`` when the words say neither a config nor a command.

    argparse drops the ``--`` before a command, so the words themselves tell: a config
    job is a YAML file and ``key=value`` overrides; anything else is a command.
    """
    words = list(args.overrides)  # named so that main() appends key=value given after options
    if not words:
        return {"error": "give a config (steadytune submit CONFIG.yaml) or a command after --"}
    if is_config(words[0]) and all("=" in w and not w.startswith("-") for w in words[1:]):
        kind, config, overrides, cmd = "run", Path(words[0]), words[1:], []
        if args.config is not None:
            return {"error": "--config is for a command job (-- CMD); a config job is CONFIG.yaml itself"}
    else:
        kind, config, overrides, cmd = "supervise", args.config, [], words
    req: dict[str, Any] = {
        "op": "submit",
        "kind": kind,
        "config": str(config.resolve()) if config else None,
        "overrides": overrides,
        "cmd": cmd,
        "need_gib": args.need_gib,
        "memory_cap_gib": args.memory_cap_gib,
        "probe_s": args.probe_s,
        "gpus": args.gpus,
        "priority": args.priority,
        "hold": args.hold,
        "skip_check": args.skip_check,
        "cwd": os.getcwd(),
        # Like a batch scheduler's default: the job sees the environment it was submitted from.
        "env": dict(os.environ),
    }
    return req


def main(args: argparse.Namespace) -> int:
    from steadytune.estimate import format_bytes
    from steadytune.server.api import request

    req = build_request(args)
    if "error" in req:
        return fail(req["error"], 2)
    try:
        answer = request(socket_path(args.socket), req)
    except ConnectionError as exc:
        return fail(str(exc), 1)
    if not answer.get("ok"):
        return fail(str(answer.get("error")), 2)
    job = answer["job"]
    state = "held" if job["state"] == "held" else "queued"
    print(f"{job['id']} {state}: needs {format_bytes(job['need_bytes'])} on {job['gpus_wanted']} GPU(s) "
          f"({job['spec'].get('need')}); `steadytune queue` shows where it stands")  # fmt: skip
    if answer.get("never_fits"):
        # Queued all the same (the server may get bigger GPUs), but said now, not only in `queue`.
        print(f"warning: {job['id']} never fits here: {answer['never_fits']}; "
              f"`steadytune cancel {job['id']}` takes it out of the queue", file=sys.stderr)  # fmt: skip
    return 0
