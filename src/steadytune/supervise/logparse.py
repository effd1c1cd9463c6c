"""What a training command that steadytune does not run prints, read back as values.

A line of its stdout is read by the line formats of :mod:`steadytune.importers` (the
registry ``analyze`` reads files with): HF Trainer log dicts, also behind a progress
bar, escape codes removed; v5 prints numbers as strings. Here besides: the Trainer's
own progress bar and summary, its logging interval from the command line, and the
error a failed command's log ends with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from steadytune.importers import parse_line as parse_log_line
from steadytune.importers.dict_log import STEP_KEYS, own_step, swift_progress, train_bar
from steadytune.importers.series import is_summary

__all__ = [
    "FOLLOWED",
    "STEP_KEYS",
    "is_summary",
    "last_exception",
    "last_lines",
    "logging_steps_from",
    "own_step",
    "parse_log_line",
    "swift_progress",
    "train_bar",
    "yaml_config",
    "yaml_value",
]


# What a supervised command's steps are read from, as the user is told when none were read.
FOLLOWED = (
    "HF log dicts on stdout ({'loss': ..., 'learning_rate': ...}), text lines naming a step and a loss "
    "('step 12 | loss 2.3 | lr 2e-05'), trainer_log.jsonl in --output-dir"
)


_LOGGING_FLAG = re.compile(r"^--?logging[_-]steps(?:=(\d+))?$")
_LOGGING_KV = re.compile(r"^logging_steps=(\d+)$")


def yaml_config(command: Sequence[str]) -> str | None:
    """The first YAML config the command names (LLaMA-Factory's and axolotl's), as written there."""
    return next((part for part in command if part.endswith((".yaml", ".yml"))), None)


def yaml_value(command: Sequence[str], key: str) -> str | None:
    """``key: value`` in the first YAML config the command names (LLaMA-Factory's and axolotl's
    flat configs), quotes and a trailing comment taken off; None when there is none."""
    path = yaml_config(command)
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(rf"^\s*{re.escape(key)}\s*:\s*(.*?)\s*(?:\s#.*)?$", text, re.MULTILINE)
    value = m.group(1).strip("'\"") if m else ""
    return value or None


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
    if found is None:
        value = yaml_value(command, "logging_steps") or ""
        found = int(value) if value.isdigit() else None
    return found if found and found > 0 else None


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


LINE_CHARS = 300  # a log line shown on the console and in run_failed: the tail's 8 kB was one line


def last_lines(tail: str, n: int = 5, width: int = LINE_CHARS) -> list[str]:
    """The last ``n`` non-blank lines of a log's tail, each cut at ``width`` characters (its end kept:
    where an error's message is). A worker that wrote one long line (a progress bar without a newline,
    a dumped tensor) put 8 kB of it on the console's failure line."""
    lines = [ln.rstrip() for ln in tail.replace("\r", "\n").splitlines() if ln.strip()]
    return [
        ln if len(ln) <= width else f"[line cut to its last {width} characters] …{ln[-width:]}"
        for ln in lines[-n:]
    ]
