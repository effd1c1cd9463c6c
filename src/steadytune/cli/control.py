"""``steadytune pause|resume|checkpoint|stop RUN``: operator controls of a live run.

Each request joins the run's control queue (``control/``, one file per request, so
requests sent back to back are all kept) and is acted on at the next step boundary,
in the order sent; the supervisor records it in ``events.jsonl`` with who issued it.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import time
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, fail
from steadytune.rundir import RunDir, valid_run_id
from steadytune.telemetry.jsonl import JsonlReader

HELP = {
    "pause": (
        "pause a run at the next step (default --release: checkpoint and free the GPU)",
        "steadytune pause runs/demo-20261129-101500-ab12 --hold",
    ),
    "resume": ("resume a paused run", "steadytune resume demo-20261129-101500-ab12"),
    "checkpoint": ("write a verified checkpoint at the next step", "steadytune checkpoint runs/my-run"),
    "stop": ("checkpoint, then stop the run", "steadytune stop runs/my-run"),
    "memory-snapshot": (
        "write a CUDA allocator snapshot of the worker (no-op on CPU)",
        "steadytune memory-snapshot runs/my-run",
    ),
}


def register(sub: Any) -> None:
    for command, (text, example) in HELP.items():
        p = add_command(sub, command, text, example)
        p.add_argument("run", help="the run directory, or a run id under --runs-dir")
        p.add_argument("--runs-dir", default="runs", help="where run ids are looked up (default ./runs)")
        p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the run to act")
        p.add_argument("--no-wait", action="store_true", help="send the request and return at once")
        if command == "pause":
            mode = p.add_mutually_exclusive_group()
            mode.add_argument(
                "--hold", action="store_true", help="keep the worker in memory for a quick resume"
            )
            mode.add_argument(
                "--release",
                action="store_true",
                help="checkpoint and exit the worker, freeing the GPU (default)",
            )
        p.set_defaults(func=main, command_name=command.replace("-", "_"))


def resolve_run(text: str, runs_dir: str) -> RunDir | None:
    path = Path(text)
    if path.is_dir() and (path / "events.jsonl").exists():
        return RunDir(path)
    if valid_run_id(text) and (Path(runs_dir) / text / "events.jsonl").exists():
        return RunDir(Path(runs_dir) / text)
    return None


def _events_end(run: RunDir) -> int:
    """Where ``events.jsonl`` ends now: an acknowledgement is looked for after it."""
    try:
        return run.events.stat().st_size
    except FileNotFoundError:
        return 0


def _acked(run: RunDir, request_id: str, since: int) -> dict[str, Any] | None:
    """The event acknowledging ``request_id`` among those appended after byte ``since``."""
    for ev in JsonlReader(run.events, since).dicts(final=True):
        data = ev.get("data") or {}
        if not isinstance(data, dict):
            continue
        if data.get("request_id") == request_id and str(ev.get("name", "")).startswith("ack_"):
            return ev
        if ev.get("name") in {"run_resumed", "run_paused"} and since:
            return ev
    return None


def ended_message(run_id: str, state: str, command: str, checkpoint: str | None) -> str:
    """Why a control cannot reach a run whose supervisor has ended, and, for ``resume``, what a
    person can do instead: ``resume`` continues a *paused* run, whose supervisor still waits."""
    if command != "resume" or state == "completed":
        return f"run {run_id} is {state}; nothing to {command}"
    kept = f"; its last checkpoint is {checkpoint}" if checkpoint else ""
    return (
        f"run {run_id} is {state}: its supervisor has ended, and `steadytune resume` continues only a "
        f"paused run (`steadytune pause`, not `stop` or Ctrl-C){kept}. A stopped run is not continued "
        "in place: start a new one with `steadytune run CONFIG`"
    )


def main(args: argparse.Namespace) -> int:
    from steadytune.protocol import ControlError, operator_issuer, send_control

    run = resolve_run(args.run, args.runs_dir)
    if run is None:
        return fail(f"no run at {args.run!r} (give a run directory, or a run id under {args.runs_dir})", 2)
    try:
        status = json.loads(run.status.read_text())
    except (FileNotFoundError, ValueError):
        status = {}
    state = status.get("state")
    if state in {"completed", "failed", "stopped"}:
        return fail(ended_message(run.run_id, state, args.command_name, status.get("last_checkpoint")))
    if args.command_name == "resume" and state not in {"paused", "running"}:
        return fail(f"run {run.run_id} is {state or 'unknown'}, not paused")
    cmd_args = {}
    if args.command_name == "pause":
        cmd_args["mode"] = "hold" if args.hold else "release"
    since = _events_end(run)
    try:
        issuer = operator_issuer(f"{getpass.getuser()}@{socket.gethostname()}", "cli")
        request = send_control(run, args.command_name, issuer=issuer, args=cmd_args)
    except ControlError as exc:
        return fail(str(exc), 2)
    print(f"{args.command_name} sent to {run.run_id} (request {request['id'][:8]})")
    if args.no_wait:
        return 0
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        ev = _acked(run, request["id"], since)
        if ev is not None:
            print(f"acknowledged: {ev.get('message')}")
            return 0
        time.sleep(0.25)
    return fail(
        f"no acknowledgement within {args.timeout:.0f}s; is the run's supervisor alive? (state: {state})"
    )
