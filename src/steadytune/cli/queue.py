"""``steadytune queue``: the server's GPUs, reservations and jobs, and why each waiting job waits."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from steadytune.cli._common import add_command, add_socket, fail
from steadytune.cli.submit import socket_path


def register(sub: Any) -> None:
    p = add_command(sub, "queue",
                    "show the GPU server's GPUs and jobs (why a job waits, its GPUs, its scale history)",
                    "steadytune queue --all")  # fmt: skip
    p.add_argument("--all", action="store_true", help="also list finished jobs")
    p.add_argument("--json", action="store_true", help="the whole snapshot as JSON")
    add_socket(p)
    p.set_defaults(func=main)


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f}G"


def history_lines(job: dict[str, Any]) -> list[str]:
    """The server's part in a job's size, oldest first: resizes (GPUs before -> after), refusals, pauses."""
    out = []
    for h in job.get("history") or []:
        when = time.strftime("%H:%M:%S", time.localtime(h.get("ts", 0)))
        kind = h.get("kind", "?")
        if kind in ("grow", "shrink"):
            before = ",".join(map(str, h.get("from") or [])) or "-"
            what = f"{kind} gpu {before} -> {','.join(map(str, h.get('to') or []))}"
        else:
            what = kind + (f" (gpu {h['gpu']})" if h.get("gpu") is not None else "")
        out.append(f"{when} {what}" + (f": {h['reason']}" if h.get("reason") else ""))
    return out


def render(snap: dict[str, Any], show_all: bool = False) -> str:
    """The snapshot as the text `steadytune queue` prints."""
    lines = [f"GPUs (headroom {gib(snap['headroom_bytes'])} each):"]
    if not snap["gpus"]:
        lines.append("  none seen yet")
    for g in snap["gpus"]:
        util = "-" if g["util_ratio"] is None else f"{100 * g['util_ratio']:.0f}%"
        foreign = f"  foreign pids {','.join(str(p['pid']) for p in g['foreign'])}" if g["foreign"] else ""
        jobs = f"  jobs {','.join(g['jobs'])}" if g["jobs"] else ""
        lines.append(
            f"  {g['index']} {g['name'] or 'gpu'}: total {gib(g['total_bytes'])} used {gib(g['used_bytes'])} "
            f"reserved {gib(g['reserved_bytes'])} free {gib(g['free_bytes'])} "
            f"left {gib(max(0, g['free_bytes'] - g['reserved_bytes']))} util {util}{jobs}{foreign}"
        )
    rows = [j for j in snap["jobs"] if show_all or j["state"] not in ("done", "failed", "cancelled")]
    lines.append(
        "jobs:" if rows else "jobs: none" + ("" if show_all else " waiting or running (--all for finished)")
    )
    for j in rows:
        where = ",".join(map(str, j["gpus"])) or "-"
        run = j.get("run") or {}
        step = f" step {run.get('step')}/{run.get('max_steps') or '?'}" if run.get("step") is not None else ""
        lines.append(
            f"  {j['id']:<5} {j['state']:<9} prio {j['priority']:<3} need "
            f"{gib(j['need_bytes'])}×{j['gpus_wanted']} "
            f"gpu {where:<5} {j['spec'].get('label', '')}{step}"
        )
        if j.get("paused"):
            lines.append(f"        paused by the server: {j['paused']}")
        elif j["reason"]:
            lines.append(f"        {j['reason']}")
        lines.extend(f"        {line}" for line in history_lines(j))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from steadytune.server.api import request

    try:
        answer = request(socket_path(args.socket), {"op": "queue"})
    except ConnectionError as exc:
        return fail(str(exc), 1)
    if not answer.get("ok"):
        return fail(str(answer.get("error")))
    if args.json:
        print(json.dumps(answer, indent=1))
    else:
        print(render(answer, args.all))
    return 0
