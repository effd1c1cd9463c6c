"""Reading JSONL that another process appends to: the one reader every part of steadytune uses.

- **Incremental.** :class:`JsonlReader` keeps a byte offset. A line counts once its
  newline is on disk: a torn last line (a writer that died mid-line, or one still
  writing) is left where it is and read by a later call once it is complete.
- **Rotation-proof.** A stream rotated into segments (:mod:`steadytune.telemetry.segments`)
  is read as one file: its segments in order, then the live file, across rotations that
  happen while a reader is mid-file.
- **Cheap to follow.** A reader made with ``keep_open`` (the supervisor's, which looks five
  times a second) holds the live file open between calls: a call is an ``fstat``, a ``pread``
  of what is new and a ``stat`` of the path (was it sealed?), where opening the file, looking for
  the next segment and reading to its end took eleven system calls, the first of them dear right
  after the supervisor's sleep.
- **Bounded.** A line longer than ``max_line_bytes`` (default :data:`MAX_LINE_BYTES`,
  16 MiB) is skipped and counted in ``long_lines``. It is never held in memory whole:
  the file is read in chunks, and the part of a line seen so far is dropped once it
  passes the bound, whether or not its newline ever comes.
- **Defensive.** A line that is not JSON, is JSON but not an object, or is nested
  too deep for the parser (``[[[[…``, which raises ``RecursionError``) is skipped and
  counted in ``bad_lines``.
- :func:`last_line` reads backwards from the end, for "where did this file stop".
- :func:`grep_lines` finds the few lines that name something (one step of a million) at
  the disk's pace: the search runs over whole chunks, not line by line.

Torch-free: the supervisor and the web server import it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Generator, Iterator
from enum import Enum
from pathlib import Path
from typing import IO, Any

from steadytune.regularfile import open_regular
from steadytune.telemetry import segments

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 16 << 20
CHUNK_BYTES = 1 << 20
BACK_BLOCK_BYTES = 1 << 16


class Skipped(Enum):
    """Stands in for the value of a line that was skipped."""

    BAD = "bad"  # not JSON, or nested too deep to parse
    TOO_LONG = "too long"  # over the line-length bound, never read whole


# Records nest a few levels (a step's extra.gradflow.hist rows sit 5 deep); deeper is no record of
# ours, and would blow the stack of whatever walks it next (to_dict, json.dumps, the web's clean()).
MAX_JSON_DEPTH = 64


def within_depth(obj: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a parsed JSON value nests at most ``limit`` lists/objects deep (walked without recursion)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return False
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def parse_line(raw: bytes) -> Any:
    """The JSON value of one line, or :attr:`Skipped.BAD` (not JSON, or nested past MAX_JSON_DEPTH)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # ValueError covers bad UTF-8 too
        return Skipped.BAD
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and not within_depth(value):
        return Skipped.BAD
    return value


class JsonlReader:
    """Reads the complete lines appended to a stream since the last call.

    A stream is its live file and, once it has been rotated, its sealed segments before it
    (:mod:`steadytune.telemetry.segments`): they are read in order, as one file. The position
    is ``(segment, offset)``: the number of the segment being read (while that segment is not
    there, the live file is the one being read) and the byte offset of the first line not read
    yet in it. Save both and pass them back (as :meth:`RunStore.sync` does) to continue in
    another process; a rotation between two calls loses and repeats nothing, since the bytes
    a reader was reading become, byte for byte, the segment of its number. An offset inside a
    line (saved while skipping an over-long one) is fine: the rest of that line is skipped.
    ``lines`` counts the lines consumed, blank ones included, so it is the 1-based line number
    of the last line read when the reader started at the stream's beginning.
    """

    def __init__(
        self,
        path: Path | str,
        offset: int = 0,
        *,
        segment: int = 1,
        max_line_bytes: int | None = None,
        chunk_bytes: int | None = None,
        keep_open: bool = False,
    ) -> None:
        """``keep_open``: hold the live file open between calls (see :class:`HeldFile`); :meth:`close`
        lets it go. For a reader that follows one stream for long, not for one that reads once."""
        self.path = Path(path)
        self.offset = offset
        self.segment = segment
        self.max_line_bytes = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
        # Chunks much larger than the bound would only make a skipped line cost more memory.
        self.chunk_bytes = chunk_bytes or max(4096, min(CHUNK_BYTES, self.max_line_bytes))
        self.lines = 0
        self.bad_lines = 0
        self.long_lines = 0
        self._skipping: bool | None = None  # inside an over-long line; None: not known yet
        self.stopped_at_budget = False  # the last read left the file's end unread (its max_bytes)
        self._placed = False  # whether the position was checked against the segments there
        self.keep_open = keep_open
        self._held: HeldFile | None = None  # the live file of the position's segment, held open

    @property
    def position(self) -> tuple[int, int]:
        """``(segment, offset)``: where the next call goes on."""
        return self.segment, self.offset

    def _next_file(self) -> None:
        self.segment, self.offset, self._skipping = self.segment + 1, 0, None

    def close(self) -> None:
        """Let go of the live file held open (the next call opens it again)."""
        if self._held is not None:
            self._held.close()
            self._held = None

    def _place(self) -> None:
        """Step over segments that are gone (removed by hand): go on at the next one there."""
        self._placed = True
        if segments.segment(self.path, self.segment) is not None:
            return
        later = [s for s in segments.segments(self.path) if s.number > self.segment]
        if later:
            log.warning("%s: segments %d..%d are missing; reading on from segment %d",
                        self.path, self.segment, later[0].number - 1, later[0].number)  # fmt: skip
            self.segment, self.offset, self._skipping = later[0].number, 0, None

    def raw_lines(self, max_bytes: int | None = None, final: bool = False) -> Iterator[bytes | None]:
        """Each complete line's bytes (without its newline); ``None`` for a line over the bound.

        ``max_bytes`` is a soft budget: no new chunk is read once that much was read and
        some progress made (a line longer than the budget is still read whole).
        ``final``: the stream is finished, so an unterminated last line counts as a line.
        """
        if not self._placed:
            self._place()
        budget = [max_bytes]
        self.stopped_at_budget = False
        while True:
            if self._held is not None:
                done = yield from self._held_lines(self._held, budget, final)
                if done:
                    return
                continue
            # The live file is opened before segment n is looked for: if n is not there yet, the
            # file opened is the one this reader was reading, even if it is sealed a moment later.
            try:  # held, it is read by pread alone: no buffer
                live: IO[bytes] | None = open_regular(self.path, "rb", buffering=0 if self.keep_open else -1)
            except FileNotFoundError:
                live = None  # between a rotation's rename and the writer's fresh file
            seg = segments.segment(self.path, self.segment)
            if seg is None:
                if live is not None and self.keep_open:
                    self._held = HeldFile(live)
                    continue
                if live is not None:
                    with live:
                        self.stopped_at_budget = not (yield from self._file_lines(live, budget, final))
                return
            if live is not None:
                live.close()
            if not segments.trusted(seg):
                self._next_file()
                continue
            try:
                with segments.open_segment(seg) as f:
                    whole = yield from self._file_lines(f, budget, final=True)
            except FileNotFoundError:
                continue  # its plain form was compressed away just now: the .gz is there
            if not whole:
                self.stopped_at_budget = True
                return
            self._next_file()
            if budget[0] is not None and budget[0] <= 0:
                self.stopped_at_budget = True  # the segments after it, or the live file, wait
                return

    def _held_lines(
        self, held: HeldFile, budget: list[int | None], final: bool
    ) -> Generator[bytes | None, None, bool]:
        """The new lines of the live file held open; returns whether this call's reading is over
        (False: the file was sealed and read to its end, or was replaced: the loop goes on).

        Read to its end, it is looked for at its path: still there, the lines written after this
        read are read from it next time; sealed (renamed to segment n), its last lines are read now
        and segment n + 1 is next. Three system calls a call: ``fstat``, ``pread``, ``stat``.
        """
        held.refresh()
        if not (yield from self._file_lines(held, budget, final)):
            self.stopped_at_budget = True
            return True
        try:
            ino: int | None = os.stat(self.path).st_ino
        except FileNotFoundError:
            ino = None  # sealed, the writer's fresh file not made yet; or removed
        if ino == held.ino:
            return True
        self._held = None
        if segments.segment(self.path, self.segment) is None:
            # Replaced or removed by someone else, not sealed: the file now there is read from the
            # same offset, as by a reader that opens it at every call.
            held.close()
            return ino is None
        held.refresh()  # sealed: no line is added after the rename
        if not (yield from self._file_lines(held, budget, final=True)):
            self._held = held  # the rest of segment n, from this file, next time
            self.stopped_at_budget = True
            return True
        held.close()
        self._next_file()
        if budget[0] is not None and budget[0] <= 0:
            self.stopped_at_budget = True  # the next segment, or the live file, waits
            return True
        return False

    def _file_lines(
        self, f: IO[bytes] | HeldFile, budget: list[int | None], final: bool
    ) -> Generator[bytes | None, None, bool]:
        """The lines of one file from ``self.offset``; returns whether its end was reached."""
        if self._skipping is None:
            self._skipping = False
            if self.offset > 0:
                f.seek(self.offset - 1)
                self._skipping = f.read(1) not in (b"\n", b"")
        f.seek(self.offset)
        start, eof = self.offset, False
        buf = bytearray()  # the part read so far of the line starting at self.offset
        while budget[0] is None or budget[0] > 0 or self.offset == start:
            data = f.read(self.chunk_bytes)
            if not data:
                eof = True
                break
            if budget[0] is not None:
                budget[0] -= len(data)
            pos = 0
            while pos < len(data):
                nl = data.find(b"\n", pos)
                if nl < 0:  # the line goes on past this chunk
                    if self._skipping:
                        self.offset += len(data) - pos
                    else:
                        buf += data[pos:]
                        if len(buf) > self.max_line_bytes:
                            self.offset += len(buf)
                            buf.clear()
                            self._skipping = True
                    break
                size = len(buf) + nl - pos
                self.offset += size + 1
                self.lines += 1
                if self._skipping or size > self.max_line_bytes:
                    self._skipping = False
                    buf.clear()
                    pos = nl + 1
                    self.long_lines += 1
                    yield None
                    continue
                if buf:
                    line = bytes(buf) + data[pos:nl]
                    buf.clear()
                else:
                    line = data[pos:nl]
                pos = nl + 1
                yield line
        if final and eof and (buf or self._skipping):
            self.offset += len(buf)
            self.lines += 1
            if self._skipping:
                self._skipping = False
                self.long_lines += 1
                yield None
            else:
                yield bytes(buf)
        return eof

    def values(self, max_bytes: int | None = None, final: bool = False) -> Iterator[tuple[int, Any]]:
        """``(line number, value)`` of each non-blank line; a skipped one's value is a :class:`Skipped`."""
        for raw in self.raw_lines(max_bytes, final):
            if raw is None:
                yield self.lines, Skipped.TOO_LONG
                continue
            if not raw.strip():
                continue
            value = parse_line(raw)
            if value is Skipped.BAD:
                self.bad_lines += 1
            yield self.lines, value

    def dicts(self, max_bytes: int | None = None, final: bool = False) -> Iterator[dict[str, Any]]:
        """The JSON objects among the new lines; anything else is skipped and counted."""
        for _, value in self.values(max_bytes, final):
            if isinstance(value, dict):
                yield value
            elif not isinstance(value, Skipped):
                self.bad_lines += 1  # JSON, but not an object

    def read_dicts(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        """The JSON objects of all complete lines appended since the last call."""
        return list(self.dicts(max_bytes))


class HeldFile:
    """A live file held open by a :class:`JsonlReader`: ``read`` is a ``pread`` at the reader's
    offset, up to the size the last ``fstat`` found, so reading what is new takes one system call
    and finding its end none (no ``lseek``, no last ``read`` that returns nothing). The file is the
    same inode across a rotation: once sealed, its bytes are the segment's, to their end.
    """

    def __init__(self, f: IO[bytes]) -> None:
        self.file, self.fd = f, f.fileno()
        st = os.fstat(self.fd)
        self.ino, self.size, self.pos = st.st_ino, st.st_size, 0

    def refresh(self) -> int:
        """The file's size now (one ``fstat``)."""
        self.size = os.fstat(self.fd).st_size
        return self.size

    def seek(self, pos: int) -> int:
        self.pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        want = self.size - self.pos if n < 0 else min(n, self.size - self.pos)
        if want <= 0:
            return b""
        data = os.pread(self.fd, want, self.pos)
        self.pos += len(data)
        return data

    def close(self) -> None:
        self.file.close()


def grep_lines(
    path: Path | str,
    pattern: re.Pattern[bytes],
    *,
    max_line_bytes: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[bytes]:
    """The complete lines of the stream ``path`` in which ``pattern`` occurs, in order, each once.

    For a question about a few lines of a long stream (the batch of one step): ``pattern`` is
    searched over whole chunks, so a line that does not match is never split out, let alone
    parsed, and memory is one chunk plus the longest line whatever the stream's length. Its
    segments are read in order, then the live file. As everywhere here, a torn last line of the
    live file is left out and a line over ``max_line_bytes`` is passed over. ``pattern`` must
    not match across a newline.
    """
    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    live = Path(path)
    for seg in segments.segments(live):
        if not segments.trusted(seg):
            continue
        try:
            with segments.open_segment(seg) as f:
                yield from _grep_file(f, pattern, limit, chunk_bytes, final=True)
        except FileNotFoundError:
            continue  # compressed away meanwhile; a rotation mid-search is not followed
    try:
        f = open_regular(live, "rb")  # closed below; a generator holds it
    except OSError:
        return
    with f:
        yield from _grep_file(f, pattern, limit, chunk_bytes, final=False)


def _grep_file(
    f: IO[bytes], pattern: re.Pattern[bytes], limit: int, chunk: int, final: bool
) -> Iterator[bytes]:
    carry, skipping = b"", False  # the start of a line not complete yet; inside an over-long one
    while data := f.read(chunk):
        if skipping:
            nl = data.find(b"\n")
            if nl < 0:
                continue
            data, skipping = data[nl + 1 :], False
        buf = carry + data
        end = buf.rfind(b"\n") + 1
        carry, done = buf[end:], 0  # done: where the lines not yet looked at begin
        for m in pattern.finditer(buf, 0, end):
            start = buf.rfind(b"\n", 0, m.start()) + 1
            if start < done:
                continue  # another match in a line already given
            done = buf.find(b"\n", m.end()) + 1
            if done - 1 - start <= limit:
                yield buf[start : done - 1]
        if len(carry) > limit:
            carry, skipping = b"", True
    if final and carry and not skipping and pattern.search(carry):
        yield carry  # a sealed segment's last line, unterminated: it is finished


def _backwards(f: IO[bytes], size: int, block: int, limit: int) -> Iterator[tuple[int, bytes | None, bool]]:
    """``(offset just past the line, its bytes or None if over limit, ends with a newline)``, last first."""
    pos = end = size
    terminated = False  # the segment after the last newline has none
    parts: list[bytes] = []  # the current line's bytes seen so far, right to left
    length, too_long = 0, False
    while pos > 0:
        n = min(block, pos)
        pos -= n
        f.seek(pos)
        data = f.read(n)
        i = len(data)
        while True:
            nl = data.rfind(b"\n", 0, i)
            if nl < 0:
                if not too_long:
                    parts.append(data[:i])
                    length += i
                    if length > limit:
                        parts, too_long = [], True
                break
            seg = data[nl + 1 : i]
            if too_long or length + len(seg) > limit:
                yield end + terminated, None, terminated
            else:
                yield end + terminated, seg + b"".join(reversed(parts)), terminated
            parts, length, too_long = [], 0, False
            end, terminated, i = pos + nl, True, nl
    yield end + terminated, (None if too_long else b"".join(reversed(parts))), terminated


def last_line(
    path: Path | str,
    *,
    torn: bool = False,
    accept: Callable[[dict[str, Any]], bool] | None = None,
    max_line_bytes: int | None = None,
    block: int = BACK_BLOCK_BYTES,
) -> tuple[int, dict[str, Any] | None]:
    """``(offset just past it, its value)`` of the last line of ``path`` that is a JSON object.

    Reads backwards from the end, block by block, passing over blank, unparseable and
    over-long lines (never held whole), and objects ``accept`` turns down. Only lines
    that end with a newline count, unless ``torn`` (then an unterminated last line
    counts too, if it parses). ``(0, None)`` when there is none or the file cannot be read.
    """
    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    try:
        f = open_regular(path, "rb")
    except OSError:
        return 0, None
    with f:
        size = f.seek(0, 2)
        for end, raw, terminated in _backwards(f, size, block, limit):
            if raw is None or not raw.strip() or not (terminated or torn):
                continue
            value = parse_line(raw)
            if isinstance(value, dict) and (accept is None or accept(value)):
                return end, value
    return 0, None


def tail_dicts(path: Path | str, max_bytes: int = BACK_BLOCK_BYTES) -> list[dict[str, Any]]:
    """The JSON objects of the lines wholly inside the last ``max_bytes`` of a file, in order.

    For a glance at a file's end (the runs overview): an unterminated last line is
    included if it parses; unparseable lines are passed over.
    """
    out: list[dict[str, Any]] = []
    try:
        f = open_regular(path, "rb")
    except OSError:
        return out
    with f:
        size = f.seek(0, 2)
        for end, raw, terminated in _backwards(f, size, BACK_BLOCK_BYTES, max_bytes):
            if raw is None:
                break
            start = end - terminated - len(raw)
            if start < size - max_bytes:
                break
            value = parse_line(raw) if raw.strip() else None
            if isinstance(value, dict):
                out.append(value)
    return out[::-1]


def stream_last_line(
    path: Path | str, *, accept: Callable[[dict[str, Any]], bool] | None = None
) -> tuple[tuple[int, int], dict[str, Any] | None]:
    """``(position just past it, its value)`` of the last JSON object of a stream that ``accept`` takes.

    :func:`last_line` over the live file, then over the sealed segments, newest first (a
    compressed one is read through, since a gzip stream cannot be read backwards). The position
    is a :class:`JsonlReader`'s ``(segment, offset)``; ``((1, 0), None)`` when there is none.
    """
    path = Path(path)
    sealed = segments.segments(path)
    end, value = last_line(path, accept=accept)
    if value is not None:
        return ((sealed[-1].number if sealed else 0) + 1, end), value
    for seg in reversed(sealed):
        if not seg.compressed:
            end, value = last_line(seg.path, accept=accept)
        elif segments.trusted(seg):
            reader = JsonlReader(path, segment=seg.number)
            for d in reader.dicts(final=True):
                if reader.segment != seg.number:
                    break
                if accept is None or accept(d):
                    end, value = reader.offset, d
        if value is not None:
            return (seg.number, end), value
    return (1, 0), None
