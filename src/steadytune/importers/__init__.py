"""Readers of other tools' training logs, for ``steadytune analyze``.

:func:`detect_format` looks at a path's content (not only its name) and names
its format; :func:`load` reads it into a :class:`Series` of step records.
Formats: HF ``trainer_state.json``, LLaMA-Factory ``trainer_log.jsonl``, a
steadytune run directory, CSV with a step column (W&B export), TensorBoard
event files, Megatron/DeepSpeed text logs, Megatron golden-values JSON, and
llm.c ``s:N trl:X`` logs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from steadytune.importers import (
    csv_log,
    hf_state,
    llamafactory,
    llmc,
    megatron_golden,
    megatron_text,
    rundir,
    tensorboard,
)
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, parse_number

__all__ = ["FORMATS", "Series", "SeriesBuilder", "UnreadableLog", "detect_format", "load", "parse_number"]

FORMATS: tuple[str, ...] = (
    hf_state.FORMAT,
    llamafactory.FORMAT,
    rundir.FORMAT,
    csv_log.FORMAT,
    tensorboard.FORMAT,
    megatron_text.FORMAT,
    megatron_golden.FORMAT,
    llmc.FORMAT,
)

_HEAD_BYTES = 64 << 10
_DIR_FILES = ("trainer_state.json", "trainer_log.jsonl")


def _head(path: Path) -> str:
    with open(path, "rb") as f:
        raw = f.read(_HEAD_BYTES)
    if b"\x00" in raw[:4096]:
        raise UnreadableLog("binary file, not a text log")
    return raw.decode("utf-8", errors="replace")


def _first_json_line(head: str) -> Any:
    for line in head.splitlines():
        line = line.strip()
        if line:
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _json_format(data: Any) -> str | None:
    if hf_state.sniff(data):
        return hf_state.FORMAT
    if megatron_golden.sniff(data):
        return megatron_golden.FORMAT
    return None


def _resolve_dir(path: Path) -> Path:
    """A directory stands for the log inside it (an HF checkpoint, a LLaMA-Factory output)."""
    for name in _DIR_FILES:
        if (path / name).is_file():
            return path / name
    return path


def detect_format(path: Path) -> str:
    """The format of a log file or directory. Raises :class:`UnreadableLog` with the reason."""
    return _sniff(Path(path))[0]


def _sniff(path: Path) -> tuple[str, Any]:
    """The format, and the parsed JSON document when detection had to parse it (so it is parsed once)."""
    if not path.exists():
        raise UnreadableLog("no such file or directory")
    if path.is_dir():
        if rundir.sniff_path(path):
            return rundir.FORMAT, None
        inner = _resolve_dir(path)
        if inner != path:
            return _sniff(inner)
        if tensorboard.sniff_path(path):
            return tensorboard.FORMAT, None
        raise UnreadableLog("directory holds no run telemetry, trainer_state.json or TensorBoard events")
    if tensorboard.sniff_path(path):
        return tensorboard.FORMAT, None
    head = _head(path)
    if not head.strip():
        raise UnreadableLog("empty file")
    if head.lstrip().startswith("{"):
        first = _first_json_line(head)
        if llamafactory.sniff(first):
            return llamafactory.FORMAT, None
        fmt = _json_format(first)
        if fmt:
            return fmt, first
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise UnreadableLog(f"invalid JSON: {e}") from e
        fmt = _json_format(data)
        if fmt:
            return fmt, data
        raise UnreadableLog("JSON, but neither a trainer_state.json, a trainer_log.jsonl nor golden values")
    for module in (megatron_text, llmc, csv_log):
        if module.sniff(head):
            return module.FORMAT, None
    raise UnreadableLog("unrecognised format (no step/loss records in a known layout)")


def load(path: Path | str, fmt: str | None = None) -> Series:
    """Read a log into a :class:`Series`; ``fmt`` skips detection. Raises :class:`UnreadableLog`."""
    path = Path(path)
    data = None
    if fmt is None:
        fmt, data = _sniff(path)
    if path.is_dir() and fmt not in (rundir.FORMAT, tensorboard.FORMAT):
        path = _resolve_dir(path)
    if data is not None and fmt == hf_state.FORMAT:
        return hf_state.read(path, data)
    if data is not None and fmt == megatron_golden.FORMAT:
        return megatron_golden.read(path, data)
    readers = {
        hf_state.FORMAT: hf_state.read,
        llamafactory.FORMAT: llamafactory.read,
        rundir.FORMAT: rundir.read,
        csv_log.FORMAT: csv_log.read,
        tensorboard.FORMAT: tensorboard.read,
        megatron_text.FORMAT: megatron_text.read,
        megatron_golden.FORMAT: megatron_golden.read,
        llmc.FORMAT: llmc.read,
    }
    reader = readers.get(fmt)
    if reader is None:
        raise UnreadableLog(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    try:
        return reader(path)
    except UnreadableLog:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UnreadableLog(
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"
        ) from e
