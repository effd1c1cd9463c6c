"""Megatron-LM / Megatron-DeepSpeed text logs: ``iteration N/ M | key: value | ...`` lines.

Logs copied from terminals wrap long lines, so a line that does not end with
"|" is continued by the next ones (joined without a separator: the wrap cut
words in half). Everything else in the file (tracebacks, checkpoint messages,
"time (ms)" tables) is ignored. Here "nan" is a real NaN: Megatron prints it
for a non-finite loss. An iteration line needs one ``| key: value |`` field to
count (``iteration 10/100 | loss 2.3`` is left to the generic text reader).
Launcher prefixes (``[rank7]:``, timestamps) are tolerated; when several ranks
print the same iteration, the lowest rank's line is kept.
"""

from __future__ import annotations

import re
from pathlib import Path

from steadytune.importers.prefix import LowestRank, strip_prefix
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, parse_number

FORMAT = "megatron_text"
ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_HAS_FIELD = re.compile(r"iteration\s+\d+\s*/\s*\d+\s*\|\s*[A-Za-z][^:|]*:\s*\S")
_FIELD = re.compile(r"^\s*([A-Za-z][^:|]*?)\s*:\s*(\S+)\s*$")
_MAX_CONTINUATION = 4


def sniff(head: str) -> bool:
    return bool(_HAS_FIELD.search(head))


def logical_lines(lines: list[str]) -> list[str]:
    """Iteration lines with their wrapped continuations joined back on."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\n")
        i += 1
        if not ITERATION.search(line):
            continue
        joined = 0
        while not line.rstrip().endswith("|") and i < len(lines) and joined < _MAX_CONTINUATION:
            nxt = lines[i].rstrip("\n")
            if ITERATION.search(nxt) or not nxt.strip():
                break
            line += nxt
            i += 1
            joined += 1
        out.append(line)
    return out


def parse_line(line: str) -> tuple[int, dict[str, float]] | None:
    """The step and the numeric fields of one logical iteration line."""
    m = ITERATION.search(line)
    if not m:
        return None
    fields: dict[str, float] = {}
    for part in line[m.end() :].split("|"):
        fm = _FIELD.match(part)
        if not fm:
            continue
        value = parse_number(fm.group(2))
        if value is not None:
            fields[fm.group(1).strip()] = value
    return int(m.group(1)), fields


def read(path: Path) -> Series:
    b = SeriesBuilder(str(path), FORMAT)
    ranks = LowestRank(b)
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    for line in logical_lines(lines):
        parsed = parse_line(line)
        if parsed is None:
            continue
        step, fields = parsed
        if not ranks.accept(step, strip_prefix(line)[0]):
            continue
        ms = fields.pop("elapsed time per iteration (ms)", None)
        if ms is not None:
            b.add(step, "step_time_s", ms / 1000.0)
        batch = fields.pop("global batch size", None)
        if batch is not None:
            b.add(step, "samples", batch)
        skipped = fields.get("number of skipped iterations")
        if skipped is not None:
            b.add(step, "skipped", skipped > 0)
        for key, value in fields.items():
            b.add(step, key, value)
    if not len(b):
        raise UnreadableLog("no Megatron 'iteration N/ M |' lines")
    return b.build(require=("loss",))
