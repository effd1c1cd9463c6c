"""Reading a log's lines without holding one that has no end.

Whoever hands ``analyze`` a file decides how long its lines are. A JSON-lines log may open with a
config dumped as one record (megabytes), and a hostile or broken file may be one line of
gigabytes: ``for line in f`` would hold all of it, and parsing it several times more. So a
line longer than :data:`MAX_LINE_CHARS` is read past in chunks of that size and left out: no
step record is that long, and memory stays bounded by the chunk. Every reader of lines reads
them here (:func:`open_lines`), and says in its series' notes how many it left out.

NUL bytes are dropped from the lines: a log emptied while its writer went on (``: > train.log``
beside ``nohup python train.py > train.log &``) reads back what was written before as NULs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, AnyStr, Generic

from steadytune.regularfile import open_regular

# A step record is a few hundred bytes; a config dumped as the first record, a few megabytes.
MAX_LINE_CHARS = 16 << 20


class BoundedLines(Generic[AnyStr]):
    """The lines of ``f`` (text or bytes), each longer than ``limit`` characters (default
    :data:`MAX_LINE_CHARS`) left out, never held whole; ``skipped`` counts those left out."""

    def __init__(self, f: IO[AnyStr], limit: int | None = None) -> None:
        self._f: IO[AnyStr] = f
        self.limit = MAX_LINE_CHARS if limit is None else limit
        self.skipped = 0

    def __iter__(self) -> Iterator[AnyStr]:
        f, limit = self._f, self.limit
        readline = f.readline
        while line := readline(limit):
            if len(line) < limit or _ended(line):
                yield _without_nuls(line)
            else:
                skip_line(f, limit)
                self.skipped += 1

    def notes(self) -> list[str]:
        """What the reader says once beside its records: the lines it left out, if any."""
        if not self.skipped:
            return []
        n = f"{self.skipped} line{'s' if self.skipped > 1 else ''}"
        return [f"{n} over {_chars(self.limit)} left out unread: no record is that long"]


def bounded_lines(f: IO[AnyStr], limit: int | None = None) -> Iterator[AnyStr]:
    """The lines of ``f`` as :class:`BoundedLines` gives them, where none need counting."""
    return iter(BoundedLines(f, limit))


@contextmanager
def open_lines(path: Path, newline: str | None = None) -> Iterator[BoundedLines[str]]:
    """The lines of the text log at ``path`` (UTF-8, a bad byte replaced), bounded; ``newline``
    as :func:`open` takes it (``""`` for the csv module)."""
    with open_regular(path, encoding="utf-8", errors="replace", newline=newline) as f:
        yield BoundedLines(f)


def skip_line(f: IO[AnyStr], chunk: int) -> None:
    """Read ``f`` past the end of its current line, ``chunk`` characters at a time."""
    while (part := f.readline(chunk)) and not _ended(part):
        pass


def _without_nuls(line: AnyStr) -> AnyStr:
    """The line without NUL bytes: a log emptied while its writer went on (``: > train.log``)
    reads back what was written before as NULs, the first line after them prefixed with them."""
    if isinstance(line, str):
        return line.replace("\x00", "") if "\x00" in line else line
    return line.replace(b"\x00", b"") if b"\x00" in line else line


def _ended(line: str | bytes) -> bool:
    return line[-1:] in ("\n", b"\n")


def _chars(n: int) -> str:
    return f"{n >> 20} Mi characters" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} characters"
