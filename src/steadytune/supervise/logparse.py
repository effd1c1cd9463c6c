"""What a training command that steadytune does not run prints, read back as values.

HF Trainer log dicts (also behind a progress bar, escape codes removed; v5 prints
numbers as strings), the Trainer's own progress bar, its logging interval from the
command line, and the error a failed command's log ends with.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import Path

_LOG_DICT = re.compile(r"(\{[^{}]*'(?:loss|train_loss|eval_loss)'[^{}]*\})\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The Trainer's own progress bar has no description: "  25%|██▌       | 5/20 [00:00<00:00, 17.94it/s]".
_TRAIN_BAR = re.compile(r"^\s*\d{1,3}%\|[^|]*\|\s*(\d+)/(\d+)\s*\[[^\]]*(?:it/s|s/it)")


def _segments(line: str) -> list[str]:
    """What a terminal would show of each carriage-return-separated part, escape codes removed.

    A tqdm bar rewrites its line with ``\r`` and no newline, so when stdout and stderr
    share a pipe the next log dict lands at the end of the bar's line.
    """
    return [_ANSI.sub("", part) for part in line.replace("\r\n", "\n").split("\r")]


def parse_log_line(line: str) -> dict[str, float] | None:
    """An HF Trainer log dict printed on stdout, with numbers (v5 prints them as strings).

    The dict may follow a progress bar on the same line (``...17.94it/s]\r{'loss': ...}``).
    """
    m = None
    for part in reversed(_segments(line)):
        m = _LOG_DICT.search(part)
        if m:
            break
    if not m:
        return None
    try:
        raw = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return None
    out = {}
    for k, v in raw.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    return out or None


_LOGGING_FLAG = re.compile(r"^--?logging[_-]steps(?:=(\d+))?$")
_LOGGING_KV = re.compile(r"^logging_steps=(\d+)$")
_LOGGING_YAML = re.compile(r"^\s*logging_steps\s*:\s*(\d+)\s*$", re.MULTILINE)


def logging_steps_from(command: Sequence[str]) -> int | None:
    """The logging interval a training command sets: ``--logging_steps N``, ``logging_steps=N``
    (LLaMA-Factory overrides), or ``logging_steps: N`` in a YAML config it names."""
    found = None
    for i, part in enumerate(command):
        m = _LOGGING_FLAG.match(part)
        if m:
            value = m.group(1) or (command[i + 1] if i + 1 < len(command) else "")
            found = int(value) if value.isdigit() else found
            continue
        m = _LOGGING_KV.match(part)
        if m:
            found = int(m.group(1))
        elif found is None and part.endswith((".yaml", ".yml")):
            try:
                ym = _LOGGING_YAML.search(Path(part).read_text(encoding="utf-8", errors="replace"))
            except OSError:
                ym = None
            if ym:
                found = int(ym.group(1))
    return found if found and found > 0 else None


def is_summary(values: dict[str, float]) -> bool:
    """The Trainer's closing line (train_runtime, train_loss): a summary, not an optimizer step."""
    return "train_runtime" in values or ("train_loss" in values and "loss" not in values)


def train_bar(line: str) -> tuple[int, int] | None:
    """(steps done, total steps) from the last reading of the Trainer's progress bar in a line."""
    for part in reversed(_segments(line)):
        m = _TRAIN_BAR.match(part)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


_WRAPPERS = frozenset({"CalledProcessError", "ChildFailedError", "ProcessRaisedException"})
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt))(?::\s*(.*))?$")


def last_exception(tail: str) -> tuple[str, str] | None:
    """(type, message) of the error a log ends with, looking through launcher wrappers."""
    found: list[tuple[str, str]] = []
    for line in tail.splitlines():
        m = _EXC_LINE.match(line.strip())
        if m:
            found.append((m.group(1).rsplit(".", 1)[-1], (m.group(2) or "").strip()))
    for name, message in reversed(found):
        if name not in _WRAPPERS:
            return name, message[:300]
    return found[-1] if found else None


def last_lines(tail: str, n: int = 5) -> list[str]:
    lines = [ln.rstrip() for ln in tail.replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-n:]


def as_number(v: float) -> float | None:
    """A JSON number as a float; one too large for a float (``1e400`` as an int) is not a value."""
    try:
        return float(v)
    except OverflowError:
        return None
