"""Reading a log's lines without holding one that has no end.

Whoever hands ``analyze`` a file decides how long its lines are. A JSON-lines log may open with a
config dumped as one record (megabytes), and a hostile or broken file may be one line of
gigabytes: ``for line in f`` would hold all of it, and parsing it several times more. So a
line longer than :data:`MAX_LINE_CHARS` is read past in chunks of that size and left out: no
step record is that long, and memory stays bounded by the chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, AnyStr

# A step record is a few hundred bytes; a config dumped as the first record, a few megabytes.
MAX_LINE_CHARS = 16 << 20


def bounded_lines(f: IO[AnyStr], limit: int | None = None) -> Iterator[AnyStr]:
    """The lines of ``f`` (text or bytes), each longer than ``limit`` characters (default
    :data:`MAX_LINE_CHARS`) left out, never held whole."""
    limit = MAX_LINE_CHARS if limit is None else limit
    readline = f.readline
    while line := readline(limit):
        if len(line) < limit or _ended(line):
            yield line
        else:
            skip_line(f, limit)


def skip_line(f: IO[AnyStr], chunk: int) -> None:
    """Read ``f`` past the end of its current line, ``chunk`` characters at a time."""
    while (part := f.readline(chunk)) and not _ended(part):
        pass


def _ended(line: str | bytes) -> bool:
    return line[-1:] in ("\n", b"\n")
