"""``steadytune cancel|hold|release JOB``: act on a job of the GPU server's queue."""

from __future__ import annotations

import argparse
from typing import Any

from steadytune.cli._common import add_command, add_socket, fail
from steadytune.cli.submit import socket_path

HELP = {
    "cancel": ("cancel a queued job, or stop a running one (it checkpoints first)", "steadytune cancel j3"),
    "hold": ("keep a queued job from starting until it is released", "steadytune hold j3"),
    "release": ("let a held job start again when it fits", "steadytune release j3"),
}


def register(sub: Any) -> None:
    for name, (text, example) in HELP.items():
        p = add_command(sub, name, text, example)
        p.add_argument("job", help="the job id (j1, j2, ... as `steadytune queue` lists them)")
        add_socket(p)
        p.set_defaults(func=main, op=name)


def main(args: argparse.Namespace) -> int:
    from steadytune.server.api import request

    try:
        answer = request(socket_path(args.socket), {"op": args.op, "job": args.job})
    except ConnectionError as exc:
        return fail(str(exc), 1)
    if not answer.get("ok"):
        return fail(str(answer.get("error")))
    job = answer["job"]
    extra = (
        " (stopping: it checkpoints, then ends)"
        if job.get("cancel_requested") and job["state"] == "running"
        else ""
    )
    print(f"{job['id']}: {job['state']}{extra}")
    return 0
