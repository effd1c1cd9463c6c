"""Operator controls from the dashboard: pause, resume, checkpoint now, stop.

The supervisor owns the protocol (``steadytune.supervise.control.send_control``).
Until that module exists, the request file is written here the same way: an
atomic ``control.json`` plus a ``control`` event naming who asked.
"""

from __future__ import annotations

import importlib
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from steadytune.records import Event
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.events import EventLog

COMMANDS = ("pause", "resume", "checkpoint", "stop")
_ISSUER_RE = re.compile(r"[^A-Za-z0-9 ,._@:()-]")


class ControlError(ValueError):
    """A control request that is not acceptable; the message says why."""


def clean_issuer(name: str) -> str:
    """A printable, short issuer name: who clicked, as written into the audit trail."""
    name = _ISSUER_RE.sub("", name or "").strip()[:64]
    if not name:
        raise ControlError("say who you are: the issuer name is required and is recorded with the request")
    return name


def _supervisor_send() -> Callable[..., Any] | None:
    try:
        module = importlib.import_module("steadytune.supervise.control")
    except ImportError:
        return None
    return getattr(module, "send_control", None)


def write_control_request(
    run_dir: RunDir, command: str, issuer: str, args: dict[str, Any] | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:  # fmt: skip
    """The fallback: ``control.json`` written atomically, and a ``control`` event appended."""
    request = {
        "id": uuid.uuid4().hex,
        "command": command,
        "issuer": issuer,
        "ts": clock(),
        "args": args or {},
    }
    atomic_write_text(run_dir.control, json.dumps(request, indent=1))
    log = EventLog(run_dir.events, run_id=run_dir.run_id, clock=clock)
    log.append(
        Event(
            ts=request["ts"], kind="control", name=command, message=f"{command} requested by {issuer}",
            data={"id": request["id"], "issuer": issuer, "args": request["args"], "via": "dashboard"},
        )
    )  # fmt: skip
    return request


def send(
    run_dir: RunDir, command: str, issuer: str, args: dict[str, Any] | None = None,
    sender: Callable[..., Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Deliver one operator request; returns what was sent (``id`` when known)."""
    if command not in COMMANDS:
        raise ControlError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
    issuer = clean_issuer(issuer)
    sender = sender if sender is not None else _supervisor_send()
    if sender is None:
        return {**write_control_request(run_dir, command, issuer, args), "via": "control.json"}
    result = sender(run_dir, command, issuer, args)
    rid = result.get("id") if isinstance(result, dict) else getattr(result, "id", None)
    return {"id": rid, "command": command, "issuer": issuer, "via": "supervisor"}
