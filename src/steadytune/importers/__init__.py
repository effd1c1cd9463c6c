"""Readers of other tools' training logs, for ``steadytune analyze``.

:func:`detect_format` looks at a path's content (not only its name) and names
its format; :func:`load` reads it into a :class:`Series` of step records.
Formats, in the order they are tried (a file is the first one it fits):

- ``steadytune_run``: a steadytune run directory;
- ``tensorboard``: TensorBoard event files, or a directory of them;
- ``hf_trainer_state``: HF ``trainer_state.json`` (or a checkpoint directory);
- ``llamafactory_trainer_log``: LLaMA-Factory ``trainer_log.jsonl``;
- ``megatron_golden_values``: Megatron golden-values JSON;
- ``jsonl_log``: JSON lines with a step and a loss, typed (``{"type": "eval", ...}``) or not;
- ``composer_console``: MosaicML Composer / llm-foundry stdout, ``[batch=N/M]:`` then
  ``Train loss/train/total: X`` lines;
- ``megatron_text``: Megatron/DeepSpeed ``iteration N/ M | lm loss: X |`` lines;
- ``llmc_log``: llm.c ``main.log``, ``s:N trl:X`` / ``s:N tel:X``;
- ``llmc_stdout``: llm.c's ``step N/M | train loss X | norm Y | lr Z | T ms`` and ``val loss X``;
- ``nanogpt_log``: build-nanoGPT ``log.txt``, ``N train X`` / ``N val X`` / ``N hella Y``;
- ``nanogpt_stdout``: build-nanoGPT's ``step N | loss: X | lr Y | norm: Z | dt: Tms`` and
  ``validation loss: X``;
- ``dict_log``: lines ending in a printed dict with a loss: HF Trainer, TRL, axolotl and
  LLaMA-Factory stdout (``{'loss': 2.3, 'grad_norm': 1.1, ...}``, also after a progress
  bar), fairseq's ``train_inner | {"loss": "2.3", "num_updates": "5", ...}``;
- ``csv``: CSV/TSV with a step column (W&B export);
- ``text_log``: any text whose lines name a step and a loss (``step 10 | loss 2.3``,
  ``iter 10: loss=2.3``, ``Step [10/500], Loss: 2.3``), by the rules in
  :mod:`~steadytune.importers.text_log`.

Text layouts are matched after launcher and logger prefixes are stripped
(``[rank0]:``, ``0:``, ``2024-05-01 12:00:00,123 - INFO -``: see
:mod:`~steadytune.importers.prefix`); with several ranks the lowest one is kept.
A gzip-compressed file (``train.log.gz``) is read as what it holds. A file that fits
none raises :class:`UnreadableLog` with a one-line reason that says what was looked for.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from steadytune.importers import (
    composer,
    csv_log,
    dict_log,
    hf_state,
    jsonl_log,
    llamafactory,
    llmc,
    megatron_golden,
    megatron_text,
    nanogpt,
    rundir,
    tensorboard,
    text_log,
)
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, no_gc, parse_number

__all__ = ["FORMATS", "Series", "SeriesBuilder", "UnreadableLog", "detect_format", "load", "parse_number"]

FORMATS: tuple[str, ...] = (
    hf_state.FORMAT,
    llamafactory.FORMAT,
    rundir.FORMAT,
    csv_log.FORMAT,
    tensorboard.FORMAT,
    composer.FORMAT,
    megatron_text.FORMAT,
    megatron_golden.FORMAT,
    jsonl_log.FORMAT,
    llmc.FORMAT,
    llmc.FORMAT_STDOUT,
    nanogpt.FORMAT,
    nanogpt.FORMAT_STDOUT,
    dict_log.FORMAT,
    text_log.FORMAT,
)

# Text layouts, most specific first; the generic text log comes last.
_TEXT_SNIFFERS = (
    (composer.FORMAT, composer.sniff),
    (megatron_text.FORMAT, megatron_text.sniff),
    (llmc.FORMAT, llmc.sniff),
    (llmc.FORMAT_STDOUT, llmc.sniff_stdout),
    (nanogpt.FORMAT, nanogpt.sniff),
    (nanogpt.FORMAT_STDOUT, nanogpt.sniff_stdout),
    (dict_log.FORMAT, dict_log.sniff),
    (csv_log.FORMAT, csv_log.sniff),
    (text_log.FORMAT, text_log.sniff),
)

_HEAD_BYTES = 64 << 10
# Lines only source code starts with: the reason given when such a file is not a log either.
_SOURCE = re.compile(r"^(?:from [\w.]+ import |import [\w.]+\s*$|def \w+\(|class \w+[(:])", re.MULTILINE)
_DIR_FILES = ("trainer_state.json", "trainer_log.jsonl")


def _head(path: Path) -> str:
    with open(path, "rb") as f:
        raw = f.read(_HEAD_BYTES)
    if b"\x00" in raw[:4096]:
        raise UnreadableLog("binary file, not a text log")
    return raw.decode("utf-8", errors="replace")


def _tail(path: Path) -> str:
    """The last ``_HEAD_BYTES`` of a file longer than that, from its first whole line ("" if shorter)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size <= _HEAD_BYTES:
            return ""
        f.seek(size - _HEAD_BYTES)
        raw = f.read()
    return raw[raw.find(b"\n") + 1 :].decode("utf-8", errors="replace")


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
    with _plain(Path(path)) as plain, _too_deep():
        return _sniff(plain)[0]


@contextmanager
def _too_deep() -> Iterator[None]:
    """JSON nested deeper than the parser's recursion (one ``[`` run) is an unreadable log, not a crash."""
    try:
        yield
    except RecursionError:
        raise UnreadableLog("JSON nested too deep to read") from None


_GZIP_MAGIC = b"\x1f\x8b"
# A compressed log is read from a decompressed copy; a file that would unpack past this is refused
# rather than allowed to fill the disk (a 100,000-step text log is a few tens of MB).
MAX_GUNZIPPED_BYTES = 4 << 30
GUNZIP_SPARE_BYTES = 64 << 20  # left free on the temporary disk, for everything else that writes there


@contextmanager
def _plain(path: Path) -> Iterator[Path]:
    """The path itself, or a decompressed copy of a gzip-compressed log (``main.log.gz``)."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == _GZIP_MAGIC
    except OSError:  # a folder, a missing or unreadable file: detection says which
        gz = False
    if not gz:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="steadytune-gunzip-") as tmp:
        out = Path(tmp) / (path.name[:-3] if path.name.endswith(".gz") else path.name)
        # Never fill the temporary disk: stop short of its free space, less a margin for others.
        room = min(MAX_GUNZIPPED_BYTES, shutil.disk_usage(tmp).free - GUNZIP_SPARE_BYTES)
        written = 0
        try:
            with gzip.open(path, "rb") as src, open(out, "wb") as dst:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    if written > MAX_GUNZIPPED_BYTES:
                        raise UnreadableLog(f"gzip file unpacks to more than {MAX_GUNZIPPED_BYTES >> 30} GiB")
                    if written > room:
                        raise UnreadableLog(
                            f"gzip file unpacks to more than the {max(room, 0) >> 20} MiB free in "
                            f"{Path(tmp).parent} (less a reserve); set TMPDIR to a larger disk, or unpack it "
                            "yourself"
                        )
                    dst.write(chunk)
        except (OSError, EOFError) as e:
            raise UnreadableLog(f"corrupt gzip file: {e}") from e
        yield out


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
        if jsonl_log.sniff(head):
            return jsonl_log.FORMAT, None
        if first is None and dict_log.sniff(head):  # printed Python dicts: stdout of an HF Trainer
            return dict_log.FORMAT, None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            if first is not None:  # the first line parsed: JSON lines, none of them a record
                raise UnreadableLog(f"JSON lines, but no object with {jsonl_log.LOOKED_FOR}") from e
            raise UnreadableLog(f"invalid JSON: {e}") from e
        fmt = _json_format(data)
        if fmt:
            return fmt, data
        raise UnreadableLog(
            "JSON, but neither a trainer_state.json (log_history), Megatron golden values "
            "({metric: {values}}), a trainer_log.jsonl (current_steps) nor JSON lines with a step and a loss"
        )
    for fmt, sniff in _TEXT_SNIFFERS:
        if sniff(head):
            return fmt, None
    tail = _tail(path)
    if tail:  # a long preamble (a code dump, a config, pip freeze) before the first step
        for fmt, sniff in _TEXT_SNIFFERS:
            if fmt != csv_log.FORMAT and sniff(tail):
                return fmt, None
    if len(_SOURCE.findall(head)) >= 2:
        raise UnreadableLog("Python source, not a log")
    tried = ", ".join(fmt for fmt, _ in _TEXT_SNIFFERS)
    raise UnreadableLog(f"unrecognised format: {text_log.why_not(head)}; text formats tried: {tried}")


def load(path: Path | str, fmt: str | None = None) -> Series:
    """Read a log into a :class:`Series`; ``fmt`` skips detection. Raises :class:`UnreadableLog`.

    A gzip-compressed log is read as its content; the series keeps the path given.
    """
    path = Path(path)
    with no_gc(), _plain(path) as plain, _too_deep():
        series = _load(plain, fmt)
    if plain != path:
        series.path = str(path)
    return series


def _load(path: Path, fmt: str | None) -> Series:
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
        composer.FORMAT: composer.read,
        megatron_text.FORMAT: megatron_text.read,
        megatron_golden.FORMAT: megatron_golden.read,
        jsonl_log.FORMAT: jsonl_log.read,
        llmc.FORMAT: llmc.read,
        llmc.FORMAT_STDOUT: llmc.read_stdout,
        nanogpt.FORMAT: nanogpt.read,
        nanogpt.FORMAT_STDOUT: nanogpt.read_stdout,
        dict_log.FORMAT: dict_log.read,
        text_log.FORMAT: text_log.read,
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
