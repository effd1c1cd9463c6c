"""LLaMA-Factory ``trainer_log.jsonl``: one JSON object per logging step.

Rows carry ``current_steps``, ``loss``, ``lr``, ``epoch`` and, on evaluation
rows, ``eval_loss``; ``elapsed_time`` is "H:MM:SS" (or "N days, H:MM:SS") and
becomes the record timestamp. Progress fields are not metrics. A torn or
corrupt line is skipped, not fatal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from steadytune.importers.format import LogFormat
from steadytune.importers.lines import open_lines
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog

FORMAT = "llamafactory_trainer_log"
_PROGRESS = {"current_steps", "total_steps", "percentage", "remaining_time", "elapsed_time"}
_ELAPSED = re.compile(r"^(?:(\d+) days?, )?(\d+):(\d{2}):(\d{2})$")


def sniff(first: Any) -> bool:
    return isinstance(first, dict) and "current_steps" in first


def parse_row(row: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """A row as ``supervise`` reads it live: its step and every number in it, progress included.

    The progress fields stay (``total_steps`` says how far the run goes); a number too
    large for a float (``1e400`` written as an int) is no value. None: no ``current_steps``.
    """
    step = row.get("current_steps")
    if not isinstance(step, int):
        return None
    values = {}
    for k, v in row.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "current_steps":
            try:
                values[k] = float(v)
            except OverflowError:
                continue
    return step, values


def elapsed_seconds(text: Any) -> float | None:
    """Seconds in "H:MM:SS" or "N days, H:MM:SS"; None when it is not that."""
    m = _ELAPSED.match(str(text).strip())
    if not m:
        return None
    days, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + h) * 60 + mi) * 60 + s)


def read(path: Path) -> Series:
    b = SeriesBuilder(str(path), FORMAT)
    with open_lines(path) as lines:
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict) or not isinstance(row.get("current_steps"), int):
                continue
            step = row["current_steps"]
            b.add_row(step, {k: v for k, v in row.items() if k not in _PROGRESS})
            ts = elapsed_seconds(row.get("elapsed_time", ""))
            if ts is not None:
                b.add(step, "ts", ts)
    if not len(b):
        raise UnreadableLog("no LLaMA-Factory rows with current_steps")
    b.notes += lines.notes()
    return b.build(require=("loss", "eval_loss"))


LOG_FORMAT = LogFormat(FORMAT, order=30, read=read, dir_file="trainer_log.jsonl", sniff_row=sniff)
