"""The control channel: operator and supervisor requests to a running worker.

Every sender — the CLI (``steadytune pause|resume|checkpoint|stop``), the dashboard,
the policy and the supervisor's signal handling — calls :func:`send_control`. It
validates the request, adds it to the run's queue (``control/``, one file per
request, see :mod:`steadytune.protocol`), and, when the sender is the supervisor
(``log`` given), files its ``control`` event at once. Anyone else's request is filed
by the supervisor when it reads the queue (one writer per event log); the worker's
guard reads it at the next step boundary, acts, and acknowledges in its stream.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from steadytune.protocol import COMMANDS, ControlError, check_request, write_request
from steadytune.rundir import RunDir
from steadytune.telemetry.events import EventLog

__all__ = ["COMMANDS", "ControlError", "send_control"]


def send_control(
    run: RunDir,
    command: str,
    issuer: str,
    args: dict[str, Any] | None = None,
    attempt: int | None = None,
    log: EventLog | None = None,
    clock: Callable[[], float] = time.time,
    new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
) -> dict[str, Any]:
    """Queue a control request for the worker of ``run``; returns the request as written.

    Args:
        run: the run directory.
        command: one of :data:`~steadytune.protocol.COMMANDS`.
        issuer: who asks, as recorded; an operator's comes from
            :func:`~steadytune.protocol.operator_issuer`.
        args: the command's arguments (``pause``: ``mode`` ``release`` or ``hold``).
        attempt: the attempt the request is for; a later attempt ignores it.
        log: the run's event log, when the supervisor itself sends the request.
        clock, new_id: injected for tests.

    Raises:
        ControlError: an unknown command or an argument it does not take.
    """
    request: dict[str, Any] = {
        "id": new_id(),
        "command": command,
        "issuer": issuer,
        "ts": clock(),
        "args": check_request(command, args, issuer),
    }
    if attempt is not None:
        request["attempt"] = attempt
    write_request(run.control, request)
    if log is not None:
        log.emit(
            "control",
            command,
            f"{command} requested by {issuer}",
            data={"request_id": request["id"], "issuer": issuer, "args": request["args"]},
        )
    return request
