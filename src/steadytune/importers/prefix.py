"""What launchers and loggers put in front of a training script's own line, and which rank wrote it.

:func:`strip_prefix` removes, in any order and combination, from the start of a line:

- rank tags: ``[rank0]:`` and ``[default0]:`` (torchrun), ``rank0:`` / ``rank 0:``,
  ``0:`` (``srun -l``, ``torchrun --tee``), ``[1,0]<stdout>:`` (``mpirun --tag-output``),
  ``[Rank 0]`` (DeepSpeed); Ray's actor tag ``(TaskRunner pid=14640)`` (verl, OpenRLHF);
- timestamps: ``2024-05-01 12:00:00,123``, ``2024-05-01T12:00:00.123Z``,
  ``05/01/2024 12:00:00``, ``12:00:00``, bracketed or not;
- log levels and logger names: ``INFO``, ``[INFO]``, ``INFO:root:``, ``- INFO - __main__ -``,
  DeepSpeed's ``[logging.py:96:log_dist]``; loguru's ``| INFO     | __main__:train:101 -``
  (module, function, line); the tab-separated fields before a level, OLMo's
  ``host:0<TAB>olmo.train:990<TAB>INFO<TAB>`` (its ``host:N`` names the rank);
- the ``-``, ``|`` and ``:`` separators between them;
- terminal colour codes, and the echo of cursor keys typed while it ran (``^[[B``),
  anywhere in the line.

It returns the rank (None when the line names none) and the rest of the line,
which every text reader then matches against its own layout. :class:`LowestRank`
keeps, when several ranks print the same step, the lowest rank's line only.
"""

from __future__ import annotations

import re

from steadytune.importers.series import SeriesBuilder

_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|NOTICE)"
_PREFIX = re.compile(
    r"""^(?:\s*(?:
        \[(?:rank|default)\s*(?P<r1>\d+)\]:
      | \[\d+,(?P<r2>\d+)\]<std(?:out|err)>:
      | \[Rank\s+(?P<r3>\d+)\]
      | \([\w.-]+\s+pid=\d+(?:,\s*ip=[\w.:-]+)?\)
      | rank\s*(?P<r4>\d+)\s*:
      | \[?\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?\]?
      | \[?\d{1,2}/\d{1,2}/\d{2,4}[ ,]+\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\]?
      | \[?\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\]?
      | (?P<r5>\d{1,4}):(?=\s)
      | \[?"""
    + _LEVEL
    + r"""\b\]?(?::[\w.]+:|\s*-\s*[\w.]+(?=\s+-\s))?
      | \[[\w./-]+\.py:\d+(?::\w+)?\]
      | [\w.]+:[\w.<>]+:\d+(?=\s+-\s)
      | [\w.-]+:(?P<r6>\d+)(?=\t+[\w.-]+:\d+\t+"""
    + _LEVEL
    + r"""\b)
      | [\w.-]+:\d+(?=\t+"""
    + _LEVEL
    + r"""\b)
      | [-|:]
    ))+\s*""",
    re.VERBOSE | re.IGNORECASE,
)
_RANK_GROUPS = ("r1", "r2", "r3", "r4", "r5", "r6")
# Colour codes of a logger writing to a terminal (loguru, rich) survive a `tee` into the file; so
# does the terminal's echo of keys pressed while the run prints, in caret notation (``^[[B``:
# an arrow key), in front of the next line the script writes.
_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;?]*[A-Za-z]")


def strip_ansi(line: str) -> str:
    """The line without terminal colour codes and echoed cursor keys."""
    return _ANSI.sub("", line) if "\x1b" in line or "^[" in line else line


def strip_prefix(line: str) -> tuple[int | None, str]:
    """``(rank, rest)``: the rank the prefix names (None if none) and the line without its prefix."""
    line = strip_ansi(line)
    m = _PREFIX.match(line)
    if m is None:
        return None, line.strip()
    rank = next((int(g) for g in m.group(*_RANK_GROUPS) if g is not None), None)
    return rank, line[m.end() :].rstrip()


class LowestRank:
    """Per step, lets through the lines of the lowest rank that printed it.

    A lower rank arriving later replaces what a higher one had put in the builder;
    lines without a rank count as rank 0. Lines of one rank repeating a step (a
    resumed run) all pass, so the builder's "last value wins" still applies.
    """

    def __init__(self, builder: SeriesBuilder, seen: dict[int, int] | None = None) -> None:
        """``seen``: the rank already taken for each step (a reader that met its first rank late)."""
        self._builder = builder
        self._rank: dict[int, int] = seen if seen is not None else {}

    def accept(self, step: int, rank: int | None) -> bool:
        r = rank or 0
        seen = self._rank.get(step)
        if seen is None or r < seen:
            if seen is not None:
                self._builder.discard(step)
            self._rank[step] = r
            return True
        return r == seen
