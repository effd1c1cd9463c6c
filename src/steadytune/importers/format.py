"""What a log format is: how it is recognised, how a file is read, how one live line is read.

Each reader module of this package declares its format(s) as a :class:`LogFormat`
constant; the package finds them (``importers/__init__.py``), so adding a format is
one module and its test. Detection goes through three stages, and within each the
formats that take part are tried by ``order``, the most specific first:

1. **by path** (``sniff_path``, or ``dir_file`` for a directory that stands for the
   log inside it): a steadytune run directory, TensorBoard events, an HF checkpoint;
2. **JSON** (the head starts with ``{``): the first line parsed (``sniff_row``), the
   head with that line (``sniff_json_head``), the whole file as one document
   (``sniff_document``);
3. **text** (``sniff_text``): the head, and for a long preamble the tail
   (``text_tail``).

``parse_line`` reads one line of a watched command's stdout, live: ``supervise``
tries the formats that have one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.importers.series import Series
from steadytune.importers.stream import StreamedLog


@dataclass(frozen=True)
class LogFormat:
    """One log format (see the module docstring for the stages ``sniff_*`` take part in)."""

    name: str
    order: int  # within a stage, lower is tried first: specific layouts low, catch-alls high
    read: Callable[[Path], Series]
    read_json: Callable[[Path, Any], Series] | None = None  # read the document detection already parsed
    sniff_path: Callable[[Path], bool] | None = None
    dir_file: str | None = None  # a directory holding this file is read as that file
    sniff_row: Callable[[Any], bool] | None = None
    sniff_json_head: Callable[[str, Any], bool] | None = None  # (head, first line parsed or None)
    sniff_document: Callable[[Any], bool] | None = None
    sniff_text: Callable[[str], bool] | None = None
    text_tail: bool = True
    parse_line: Callable[[str], dict[str, float] | None] | None = None
    # The log's records one at a time, kept nowhere (``analyze``): see importers/stream.py.
    stream: Callable[[Path], StreamedLog] | None = None
