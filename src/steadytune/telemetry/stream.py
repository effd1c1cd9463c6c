"""Append-only JSONL streams: the writer the worker uses, the tailer the supervisor uses.

A line is only trusted once its newline is on disk: a crash mid-write leaves a
partial last line, which the tailer leaves alone until it is completed (or forever).
The reading itself is :mod:`steadytune.telemetry.jsonl`'s.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from steadytune.records import PlanRevision, Record, from_dict, from_json, to_json
from steadytune.regularfile import append_fd, read_text
from steadytune.rundir import RunDir
from steadytune.telemetry import segments
from steadytune.telemetry.jsonl import JsonlReader

log = logging.getLogger(__name__)


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

    ``segment_bytes`` (0: never) rotates the file once it has grown past that size: between two
    records, the file is sealed as the stream's next segment and a fresh one opened; the sealed
    segment is gzipped by a thread of this writer (zlib lets go of the GIL while it works), so a
    record is never held up by more than a rename. The rotation is the writer's own, since it
    alone knows where a line ends and holds the file open (see :mod:`~steadytune.telemetry.segments`).
    """

    def __init__(self, path: Path, segment_bytes: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._fd: int | None = None
        self._ino = 0
        self._open()
        # The worker's heartbeat thread writes too: one line must never interleave with another.
        self._lock = threading.Lock()
        self._compressing: threading.Thread | None = None
        self._sealed: list[Path] = []
        self._recover = bool(segment_bytes)  # put right what a crash mid-rotation left, first
        if self._recover:
            self._compress_later(None)

    def _open(self) -> None:
        self._fd = append_fd(self.path)
        self._ino = os.fstat(self._fd).st_ino

    def _line(self, text: str) -> None:
        data = (text + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                return
            if self.segment_bytes:
                self._follow()
            view = memoryview(data)
            while view:  # a regular file takes it all at once; a short write is finished, not dropped
                view = view[os.write(self._fd, view) :]
            if self.segment_bytes and os.fstat(self._fd).st_size >= self.segment_bytes:
                self._rotate()

    def _follow(self) -> None:
        """Write to the file now at ``path``: another writer of this stream (an earlier attempt's
        log adapter, a restarted worker) may have rotated it since this one last wrote."""
        try:
            ino = os.stat(self.path).st_ino
        except FileNotFoundError:
            ino = -1
        if ino != self._ino and self._fd is not None:
            os.close(self._fd)
            self._open()

    def _rotate(self) -> None:
        assert self._fd is not None
        try:
            sealed = segments.seal(self.path)
        except OSError as exc:  # a record is never lost to a rotation: the file just grows on
            log.warning("could not rotate %s (%s): it is no longer rotated by this writer", self.path, exc)
            self.segment_bytes = 0
            return
        os.close(self._fd)
        self._open()
        self._compress_later(sealed)

    def _compress_later(self, sealed: Path | None) -> None:
        """Compress ``sealed`` (None: finish what a crash left) in this writer's thread."""
        if sealed is not None:
            self._sealed.append(sealed)
        if self._compressing is not None and self._compressing.is_alive():
            return  # the running thread takes the new segment from the list before it ends
        self._compressing = threading.Thread(target=self._compress_all, name="jsonl-compress", daemon=True)
        self._compressing.start()

    def _compress_all(self) -> None:
        if self._recover:
            self._recover = False
            segments.finish(self.path)
        while True:
            with self._lock:
                if not self._sealed:
                    self._compressing = None
                    return
                sealed = self._sealed.pop(0)
            segments.compress(sealed)

    def write(self, record: Record) -> None:
        self._line(to_json(record))

    def write_raw(self, obj: dict[str, Any]) -> None:
        self._line(json.dumps(obj, separators=(",", ":")))

    def sync(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self) -> None:
        """Close the file, after the segments it sealed are compressed (a killed writer leaves
        them plain, which readers read as they are and the stream's next writer compresses)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            thread = self._compressing
        if thread is not None:
            thread.join()

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

    def records(self, max_bytes: int | None = None) -> Generator[Record, None, None]:
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
        for line in read_text(run.plan).splitlines():
            if line.strip():
                rec = from_json(line)
                if isinstance(rec, PlanRevision):
                    plan = rec
    return plan
