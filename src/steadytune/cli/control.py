"""``steadytune pause|resume|checkpoint|stop RUN``: operator controls of a live run.

Each request joins the run's control queue (``control/``, one file per request, so
requests sent back to back are all kept) and is acted on at the next step boundary,
in the order sent; the supervisor records it in ``events.jsonl`` with who issued it.

``resume`` of a run whose supervisor has ended (stopped, failed, or killed) before the run's last
step continues it instead: a new attempt in the same folder from its newest verified checkpoint,
supervised in the foreground as ``run`` does (:meth:`~steadytune.supervise.supervisor.Supervisor.reopen`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from steadytune.cli._common import add_command, fail
from steadytune.rundir import ENDED_STATES, RunDir, valid_run_id
from steadytune.telemetry.jsonl import JsonlReader

HELP = {
    "pause": (
        "pause a run at the next step (default --release: checkpoint and free the GPU)",
        "steadytune pause runs/demo-20261129-101500-ab12 --hold",
    ),
    "resume": (
        "resume a paused run; a stopped, failed or crashed one goes on from its newest verified "
        "checkpoint, in the foreground as `run`",
        "steadytune resume demo-20261129-101500-ab12",
    ),
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


ENDED = ENDED_STATES  # a supervisor that filed one of these has ended


def supervisor_alive(status: Mapping[str, Any], alive: Callable[[int], bool]) -> bool:
    """Whether the supervisor ``status.json`` names may still be running the run: one that filed its
    end has ended; otherwise its process is asked about (a killed one left its last state behind)."""
    pid = status.get("supervisor_pid")
    return status.get("state") not in ENDED and isinstance(pid, int) and alive(pid)


def resume_verdict(run_id: str, status: Mapping[str, Any], alive: Callable[[int], bool]) -> tuple[str, str]:
    """What ``resume`` does with a run: ``("request", "")``: its supervisor is alive and is asked (a
    paused run goes on); ``("reopen", was)``: it ended before its last step (``was``: stopped, failed,
    crashed) and is continued in its folder from its newest verified checkpoint; ``("refuse", why)``.
    ``alive``: whether a process id runs."""
    state = status.get("state")
    if supervisor_alive(status, alive):
        return "request", ""
    worker = status.get("worker_pid")
    if state not in ENDED and isinstance(worker, int) and alive(worker):
        # A supervisor killed outright leaves its worker training: two on one folder overwrite each other.
        return "refuse", (
            f"run {run_id}'s supervisor has died but its worker (pid {worker}) still runs: stop it "
            f"(kill {worker}) and resume again"
        )
    if state is None:
        return "refuse", f"run {run_id} has no readable status.json: there is nothing to resume from"
    if state == "completed":
        return "refuse", (
            f"run {run_id} is completed (step {status.get('step')}): there is nothing left to resume; "
            "to train further, start a new run with `steadytune run CONFIG`"
        )
    if status.get("source", "worker") != "worker":
        return "refuse", (
            f"run {run_id} supervised a command, which steadytune cannot start again by itself: run the "
            "same `steadytune supervise ... -- COMMAND` again (a trainer that resumes from its own "
            "output folder goes on from its last checkpoint)"
        )
    return "reopen", state if state in ENDED else "crashed"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def reopen(run: RunDir, was: str) -> int:
    """Continue a run that ended before its last step, in the foreground as ``run`` does."""
    from steadytune.cli.run import launch
    from steadytune.config import ConfigError, load_config

    try:
        cfg = load_config(run.config)
    except ConfigError as exc:
        return fail(f"cannot resume {run.run_id}: its config.yaml does not load:\n{exc.render()}", 2)
    # The run stays where it is, whatever folder this is run from.
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"runs_dir": str(run.root.parent)})})
    return launch(cfg, run_id=run.run_id, resume_after=was)


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
    if args.command_name == "resume":
        verdict, detail = resume_verdict(run.run_id, status, _pid_alive)
        if verdict == "refuse":
            return fail(detail)
        if verdict == "reopen":
            return reopen(run, detail)
        if state not in {"paused", "running"}:
            return fail(f"run {run.run_id} is {state or 'unknown'}, not paused")
    elif state in ENDED:
        return fail(f"run {run.run_id} is {state}; nothing to {args.command_name}")
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
