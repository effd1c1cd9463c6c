"""Append-only JSONL streams: the writer the worker uses, the tailer the supervisor uses.

A line is only trusted once its newline is on disk: a crash mid-write leaves a
partial last line, which the tailer leaves alone until it is completed (or forever).
The reading itself is :mod:`steadytune.telemetry.jsonl`'s.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from steadytune.records import PlanRevision, Record, from_dict, from_json, to_json
from steadytune.rundir import RunDir
from steadytune.telemetry.jsonl import JsonlReader


class JsonlWriter:
    """Appends records to one JSONL file: one ``write(2)`` per record, straight to the kernel.

    The worker never blocks on the supervisor: it only appends to its own file.
    Each record is in the kernel's page cache when :meth:`write` returns, so it
    survives the death of the process, however it dies (an exception, ``os._exit``,
    SIGKILL, a segfault): nothing is buffered in-process. Only a crash of the
    machine itself can lose it before writeback, because ``fsync`` is left to
    :meth:`sync` (at checkpoints and at exit): fsync per step would cost more than
    the step on a tiny model. The file is opened ``O_APPEND``, unbuffered: Python's
    buffered text layer cost more per record than the system call itself.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        self._fd: int | None = os.open(self.path, flags, 0o644)
        # The worker's heartbeat thread writes too: one line must never interleave with another.
        self._lock = threading.Lock()

    def _line(self, text: str) -> None:
        data = (text + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                return
            view = memoryview(data)
            while view:  # a regular file takes it all at once; a short write is finished, not dropped
                view = view[os.write(self._fd, view) :]

    def write(self, record: Record) -> None:
        self._line(to_json(record))

    def write_raw(self, obj: dict[str, Any]) -> None:
        self._line(json.dumps(obj, separators=(",", ":")))

    def sync(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JsonlTailer(JsonlReader):
    """Reads the records of new complete lines from a file that another process appends to.

    The reading (torn last line, line-length bound, unparseable lines) is
    :class:`~steadytune.telemetry.jsonl.JsonlReader`'s; a line that parses but is no
    known record also counts in ``bad_lines``.
    """

    def records(self, max_bytes: int | None = None) -> Iterator[Record]:
        """The records of the new complete lines; ``max_bytes``: about that much of the file, at most
        (a soft budget, :meth:`~steadytune.telemetry.jsonl.JsonlReader.raw_lines`'), the rest next time."""
        for d in self.dicts(max_bytes):
            try:
                yield from_dict(d)
            except (ValueError, TypeError):
                self.bad_lines += 1

    def read(self) -> list[Record]:
        """The records of all complete lines appended since the last call."""
        return list(self.records())


def iter_records(path: Path) -> Iterator[Record]:
    """Every complete, parseable record of a JSONL file (a torn last line is skipped)."""
    yield from JsonlTailer(path).records()


def latest_plan(run: RunDir) -> PlanRevision:
    """The plan revision in force: the last of ``plan.jsonl`` (revision 0 before any is written).

    The worker reads it when its attempt starts and after a rollback request; the supervisor
    writes each revision whole and synced before it asks anything of the worker.
    """
    plan = PlanRevision(revision=0, ts=0.0, reason="start")
    if run.plan.exists():
        for line in run.plan.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = from_json(line)
                if isinstance(rec, PlanRevision):
                    plan = rec
    return plan
