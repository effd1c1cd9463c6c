"""The worker/supervisor protocol: the events a worker reports, the requests it is sent.

Upstream, a worker (steadytune's guard, or the log adapter of a command it watches)
writes :class:`~steadytune.records.Event` records into its telemetry stream; the
names it may use are :class:`WorkerEvent`, and the supervisor handles each one in
``on_<name>``. Names outside the enum are still filed, just not acted on.

Downstream, control requests (pause, resume, checkpoint, stop, memory snapshot) are
a queue: one JSON file per request under the run's ``control/`` directory, named so
that names sort in the order the requests were sent, and written whole (temp file,
then rename), so back-to-back requests never overwrite each other. Readers keep
what they have seen (:class:`RequestQueue`); the supervisor empties the queue when
it starts a worker, so a new attempt never acts on requests meant for the last one.

Every sender of a request (the CLI's ``steadytune pause|resume|checkpoint|stop``, the
dashboard, the policy, the supervisor's signal handling, the GPU server) calls
:func:`send_control`: it checks the request, adds it to the queue, and, when the sender is
the supervisor (``log`` given), files its ``control`` event at once. Anyone else's request
is filed by the supervisor when it reads the queue (one writer per event log).

This module imports nothing heavy: the guard, the supervisor, the CLI and the
dashboard all share it.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from steadytune.regularfile import FileTooLarge, NotRegularFile, read_bytes
from steadytune.rundir import RunDir, atomic_write_text

COMMANDS = ("pause", "resume", "checkpoint", "stop", "memory_snapshot", "rollback")
# Commands only the supervisor sends: a rollback carries out a plan revision it has just written,
# so one from anyone else would reload a checkpoint no plan asked for.
SUPERVISOR_COMMANDS = ("rollback",)

# The arguments each command takes, with the values each may have.
ARGS: dict[str, dict[str, tuple[str, ...]]] = {
    "pause": {"mode": ("release", "hold")},
    "resume": {},
    "checkpoint": {},
    "stop": {},
    "memory_snapshot": {},
    "rollback": {},
}

# Issuers the supervisor alone may use: its policy's actions and the signals it received. An operator
# claiming one would file a request the audit trail attributes to steadytune itself.
RESERVED_ISSUERS = ("policy:", "signal")
ISSUER_MAX = 64
MAX_REQUEST_BYTES = 64 << 10  # a request is a few hundred bytes; a bigger file is refused unread
# Parentheses are dropped too: "(front end, address)" is what steadytune adds, and a typed one would
# read the same in the audit trail.
_ISSUER_DROP = re.compile(r"[^A-Za-z0-9 ,._@:-]")
_REQUEST_ID = r"[0-9A-Za-z]{1,64}"
_REQUEST_NAME = re.compile(rf"^(\d{{20}})-({_REQUEST_ID})\.json$")


class WorkerEvent(str, Enum):
    """Every event a worker may report; the value is the event's ``name`` in the stream.

    The supervisor's handler for an event is the method of ``supervise/worker_events.WorkerEvents``
    named by :attr:`handler`.
    """

    TRAIN_BEGIN = "train_begin"
    CHECKPOINT_PUBLISHING = "checkpoint_publishing"  # the trainer's save is written; its publish has begun
    CHECKPOINT_SAVED = "checkpoint_saved"
    CHECKPOINT_PUBLISH_FAILED = "checkpoint_publish_failed"  # that publish failed: the checkpoint is not one
    SKIP_STEP = "skip_step"
    REDUCE_MICROBATCH = "reduce_microbatch"
    AUTO_MICRO_BATCH = "auto_micro_batch"
    DISK_LOW = "disk_low"
    GRAD_NORM_AFTER_CLIPPING = "grad_norm_after_clipping"
    INJECT_FAILED = "inject_failed"
    GUARD_INJECTED = "guard_injected"
    GUARD_OFF = "guard_off"
    OPTIMIZER_GROUPS = "optimizer_groups"
    LR_FROM_COMMAND = "lr_from_command"
    FAULT_INJECTED = "fault_injected"  # a drill fault ($STEADYTUNE_FAULTS) landed: a drill checks it did
    NO_STEPS_READ = "no_steps_read"  # a supervised command printed for a while and no step was read from it
    ROLLBACK_LR = "rollback_lr"  # the LR a supervised command's rollback restarts it at, and why that one
    LOSS_FIELD_IGNORED = "loss_field_ignored"  # a loss-like field the log adapter will not judge, and why
    WORKER_GROUP_STARTED = "worker_group_started"  # a Ray worker group (re)started: its size, attempt, resume
    WORKER_GROUP_FAILED = "worker_group_failed"  # Ray's group failed (ranks, errors); Ray is forming the next
    RESOURCES_REQUESTED = (
        "resources_requested"  # the Ray driver asked Ray's autoscaler for the rules' workers
    )
    ACK_PAUSE = "ack_pause"
    ACK_RESUME = "ack_resume"
    ACK_CHECKPOINT = "ack_checkpoint"
    ACK_STOP = "ack_stop"
    ACK_MEMORY_SNAPSHOT = "ack_memory_snapshot"
    ACK_ROLLBACK = "ack_rollback"
    ROLLED_BACK = "rolled_back"  # an in-process rollback reloaded its checkpoint; training goes on
    ROLLBACK_FAILED = "rollback_failed"  # it could not: the supervisor restarts the worker instead

    # A member written into a record or a message reads as its name in the stream, on every Python.
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # str's, on purpose: Enum's is the one replaced

    @property
    def handler(self) -> str:
        """The supervisor's method for this event."""
        return f"on_{self.value}"

    @classmethod
    def ack(cls, command: str) -> WorkerEvent:
        """The acknowledgement of a control ``command`` (``ack_<command>``)."""
        return cls(f"ack_{command}")

    @classmethod
    def get(cls, name: str) -> WorkerEvent | None:
        """The member named ``name``, or None for a name outside the protocol."""
        try:
            return cls(name)
        except ValueError:
            return None


class ControlError(ValueError):
    """A control request that cannot be sent; the message names the value and the fix."""


def check_request(command: str, args: dict[str, Any] | None, issuer: str | None = None) -> dict[str, Any]:
    """The request's arguments, validated for ``command``; every problem is named at once.

    ``issuer`` is who sends it: a command of :data:`SUPERVISOR_COMMANDS` from anyone but the
    supervisor (a reserved issuer) is refused.
    """
    if command not in COMMANDS:
        operator = [c for c in COMMANDS if c not in SUPERVISOR_COMMANDS]
        raise ControlError(f"unknown control command {command!r}; expected one of {', '.join(operator)}")
    if command in SUPERVISOR_COMMANDS and not (issuer or "").startswith(RESERVED_ISSUERS):
        raise ControlError(
            f"command {command!r} (issuer {issuer!r}) is the supervisor's own: it carries out a plan "
            "revision the policy wrote; send stop, pause or checkpoint instead"
        )
    args = dict(args or {})
    allowed = ARGS[command]
    problems = []
    for key, value in args.items():
        if key not in allowed:
            takes = ", ".join(allowed) or "no arguments"
            problems.append(f"{command} takes {takes}, not {key!r}: remove {key}={value!r}")
        elif value not in allowed[key]:
            problems.append(
                f"{command} {key}={value!r} is not one of {', '.join(allowed[key])}: use one of those"
            )
    if problems:
        raise ControlError("; ".join(problems))
    return args


def operator_issuer(name: str, via: str) -> str:
    """Who asked, as the audit trail records it: ``name`` cleaned, then ``(via)`` added.

    ``name`` is what a person typed (dashboard) or their login (CLI): it is made printable
    and bounded before the suffix, so the suffix (which front end, which client address)
    is never cut off or forged. The supervisor's own issuers cannot be claimed.
    """
    cleaned = _ISSUER_DROP.sub("", name or "").strip()[:ISSUER_MAX].strip()
    if not cleaned:
        raise ControlError(
            f"issuer {name!r}: say who you are: the issuer name is required and is recorded with the "
            "request (letters, digits, spaces and , . _ @ : -)"
        )
    for prefix in RESERVED_ISSUERS:
        if cleaned.lower().startswith(prefix):
            raise ControlError(
                f"issuer {cleaned!r}: names starting with {prefix!r} are the supervisor's own; "
                "give your own name"
            )
    return f"{cleaned} ({via})"


def request_name(stamp_ns: int, request_id: str) -> str:
    """The file name of a request: sorts by send time, then id."""
    return f"{stamp_ns:020d}-{request_id}.json"


def _stamp(name: str) -> int | None:
    m = _REQUEST_NAME.match(name)
    return int(m.group(1)) if m else None


def request_names(directory: Path) -> list[str]:
    """The names of the requests in ``directory``, in send order (temp files and strays skipped)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if _REQUEST_NAME.match(n))


def write_request(directory: Path, request: dict[str, Any]) -> Path:
    """Add ``request`` (with ``id`` and ``ts``) to the queue in ``directory``; returns its file.

    Its stamp is after every request already queued, even if the clock stepped back or two
    requests share a clock tick, so the queue keeps the order requests were sent in.
    """
    if not re.fullmatch(_REQUEST_ID, str(request["id"])):
        raise ValueError(f"request id {request['id']!r} must be 1-64 letters and digits: it names the file")
    names = request_names(directory)
    newest = _stamp(names[-1]) if names else None
    stamp = int(float(request["ts"]) * 1e9)
    if newest is not None and stamp <= newest:
        stamp = newest + 1
    path = directory / request_name(stamp, str(request["id"]))
    atomic_write_text(path, json.dumps(request))
    return path


class EventFiler(Protocol):
    """Where the supervisor files its own requests: the run's event log."""

    def emit(self, kind: str, name: str, message: str = "", **fields: Any) -> Any: ...


def send_control(
    run: RunDir,
    command: str,
    issuer: str,
    args: dict[str, Any] | None = None,
    attempt: int | None = None,
    log: EventFiler | None = None,
    clock: Callable[[], float] = time.time,
    new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
) -> dict[str, Any]:
    """Queue a control request for the worker of ``run``; returns the request as written.

    Args:
        run: the run directory.
        command: one of :data:`COMMANDS`.
        issuer: who asks, as recorded; an operator's comes from :func:`operator_issuer`.
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


def clear_requests(directory: Path) -> int:
    """Empty the queue (at a worker's start); returns how many requests were dropped."""
    dropped = 0
    for name in request_names(directory):
        try:
            (directory / name).unlink()
            dropped += 1
        except FileNotFoundError:
            pass
    return dropped


class RefusedRequest(ValueError):
    """A file in the control queue that is not a request; the message says why."""


def read_request(path: Path) -> dict[str, Any] | None:
    """The request in ``path``, checked as when it was sent; ``None`` if it was cleared meanwhile.

    Whoever can write the run folder can put anything in ``control/``: a FIFO (reading it waited
    for a writer), a link, a file of gigabytes, ``[`` repeated 200,000 times (``RecursionError``
    stopped the supervisor). So: a regular file, opened without following a link and without
    waiting, of at most :data:`MAX_REQUEST_BYTES`, UTF-8 JSON of one object whose command,
    arguments and issuer :func:`check_request` accepts.

    Raises:
        RefusedRequest: anything else, with the reason.
    """
    try:
        raw = read_bytes(path, MAX_REQUEST_BYTES, follow=False)
    except FileNotFoundError:
        return None
    except NotRegularFile as exc:
        raise RefusedRequest(f"is {exc.strerror}") from None
    except FileTooLarge:
        too_large = f"is larger than {MAX_REQUEST_BYTES:,} bytes; a request is a few hundred"
        raise RefusedRequest(too_large) from None
    except OSError as exc:
        raise RefusedRequest(
            f"cannot be opened as a plain file ({exc.strerror}); a link is never followed"
        ) from None
    try:
        request = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RefusedRequest("is not UTF-8 text") from None
    except RecursionError:
        raise RefusedRequest("is JSON nested too deep to read") from None
    except ValueError as exc:
        raise RefusedRequest(f"is not JSON ({exc})") from None
    if not isinstance(request, dict):
        raise RefusedRequest(f"holds a JSON {type(request).__name__}, not an object")
    command, issuer, args = request.get("command"), request.get("issuer"), request.get("args")
    if not isinstance(command, str):
        raise RefusedRequest("names no command")
    if issuer is not None and (not isinstance(issuer, str) or len(issuer) > 2 * ISSUER_MAX + 64):
        raise RefusedRequest("has an issuer that is not a name, or too long to be one")
    if args is not None and not isinstance(args, dict):
        raise RefusedRequest("has arguments that are not an object")
    try:
        check_request(command[:64], args, issuer)
    except ControlError as exc:
        raise RefusedRequest(str(exc)) from None
    return request


class RequestQueue:
    """One reader's view of the queue: each request is returned once, in send order.

    Every reader (each rank's guard, the supervisor) keeps its own list of what it has
    read; the files stay for the other readers until the supervisor clears the queue. A file
    that is not a request (:func:`read_request`) is skipped once and kept in :attr:`refused`
    as ``(name, why)``, for the supervisor to file.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._seen: set[str] = set()
        self.refused: list[tuple[str, str]] = []

    def new(self) -> list[dict[str, Any]]:
        """Requests queued since the last call, oldest first; what is not a request is skipped once."""
        try:
            names = os.listdir(self.directory)
        except (FileNotFoundError, NotADirectoryError):
            return []
        # Called at every step: only names not seen before are matched and sorted.
        fresh = sorted(n for n in set(names) - self._seen if _REQUEST_NAME.match(n))
        out = []
        for name in fresh:
            self._seen.add(name)
            try:
                request = read_request(self.directory / name)
            except RefusedRequest as exc:
                self.refused.append((name, str(exc)))
                continue
            if request is not None:  # None: cleared meanwhile
                out.append(request)
        return out


# Variables a worker reads only once its attempt begins, so a standby worker takes them with its orders;
# any other difference in the environment (CUDA_VISIBLE_DEVICES, WORLD_SIZE, the thread counts) is read
# by the imports the standby worker has already done, and needs a new process.
LATE_ENV = ("STEADYTUNE_ATTEMPT", "STEADYTUNE_FAULTS")


def standby_orders(log: Path, env: dict[str, str | None]) -> str:
    """The line that sends a standby worker into its attempt: where its output goes, and ``LATE_ENV``.

    A variable set to None is removed from the worker's environment.
    """
    late = {k: v for k, v in env.items() if k in LATE_ENV}
    return json.dumps({"log": str(log), "env": late}) + "\n"


def read_standby_orders(line: str) -> tuple[Path, dict[str, str | None]]:
    """The log path and late variables of ``line``; a ``ValueError`` for anything else."""
    data = json.loads(line)
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict) or not isinstance(data.get("log"), str):
        raise ValueError(f"standby orders must be {{'log': path, 'env': {{...}}}}, got {line[:200]!r}")
    bad = [k for k, v in env.items() if k not in LATE_ENV or not (v is None or isinstance(v, str))]
    if bad:
        raise ValueError(f"standby orders may set only {', '.join(LATE_ENV)} to text or null, got {bad}")
    return Path(data["log"]), env
