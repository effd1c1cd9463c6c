"""The control channel: operator and supervisor requests to a running worker.

A request is one JSON file (``control.json``) replaced atomically; the worker's
guard reads it at the next step boundary, acts, and acknowledges in its stream.
Every request is filed in ``events.jsonl`` with who issued it: by the supervisor
when it sends one itself (``log`` given), else through the worker's
acknowledgement, which the supervisor files (one writer per event log).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.events import EventLog

COMMANDS = ("pause", "resume", "checkpoint", "stop", "memory_snapshot")


def send_control(
    run: RunDir,
    command: str,
    issuer: str,
    args: dict[str, Any] | None = None,
    attempt: int | None = None,
    log: EventLog | None = None,
) -> dict[str, Any]:
    """Write a control request for the worker of ``run`` and record it as an event."""
    if command not in COMMANDS:
        raise ValueError(f"unknown control command {command!r}; expected one of {', '.join(COMMANDS)}")
    request = {
        "id": uuid.uuid4().hex,
        "command": command,
        "issuer": issuer,
        "ts": time.time(),
        "args": args or {},
    }
    if attempt is not None:
        request["attempt"] = attempt
    atomic_write_text(run.control, json.dumps(request))
    if log is not None:
        log.emit(
            "control",
            command,
            f"{command} requested by {issuer}",
            data={"request_id": request["id"], "issuer": issuer},
        )
    return request
