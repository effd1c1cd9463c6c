"""Readers of other tools' training logs, for ``steadytune analyze`` and ``supervise``.

Each module here declares its format(s) as a :class:`~.format.LogFormat` (name,
how it is recognised, how a file is read, how a live line is read); this package
finds them, so adding a format is one module and its test. :func:`detect_format`
looks at a path's content (not only its name) and names its format; :func:`load`
reads it into a :class:`Series` of step records; :data:`LINE_FORMATS` are those a
watched command's stdout is read with, live. Formats, in the order they are tried
(a file is the first one it fits):

- ``steadytune_run``: a steadytune run directory;
- ``hf_trainer_state``: HF ``trainer_state.json`` (or a checkpoint directory);
- ``llamafactory_trainer_log``: LLaMA-Factory ``trainer_log.jsonl``;
- ``megatron_golden_values``: Megatron golden-values JSON;
- ``tensorboard``: TensorBoard event files, or a directory of them;
- ``jsonl_log``: JSON lines with a loss or an RL/preference signal, typed (``{"type": "eval", ...}``)
  or not, at their step, their own ``*_step`` counter, or their place;
- ``composer_console``: MosaicML Composer / llm-foundry stdout, ``[batch=N/M]:`` then
  ``Train loss/train/total: X`` lines;
- ``megatron_text``: Megatron/DeepSpeed ``iteration N/ M | lm loss: X |`` lines;
- ``llmc_log``: llm.c ``main.log``, ``s:N trl:X`` / ``s:N tel:X``;
- ``llmc_stdout``: llm.c's ``step N/M | train loss X | norm Y | lr Z | T ms`` and ``val loss X``;
- ``modded_nanogpt``: modded-nanogpt (the speedrun) ``step:N/M val_loss:X train_time:Tms``; the
  step time is what the training clock grew between step lines;
- ``nanogpt_log``: build-nanoGPT ``log.txt``, ``N train X`` / ``N val X`` / ``N hella Y``;
- ``nanogpt_stdout``: build-nanoGPT's ``step N | loss: X | lr Y | norm: Z | dt: Tms`` and
  ``validation loss: X``;
- ``dict_log``: lines ending in a printed dict with a loss: HF Trainer, TRL, axolotl and
  LLaMA-Factory stdout (``{'loss': 2.3, 'grad_norm': 1.1, ...}``, also after a progress
  bar), fairseq's ``train_inner | {"loss": "2.3", "num_updates": "5", ...}``;
- ``csv``: CSV/TSV with a step column (W&B export), also printed after other lines, or a
  Markdown table (a model card's results);
- ``json_document``: a JSON list of per-step dicts, or a document holding one, or series of
  ``{step, value}`` points, or columns of numbers;
- ``text_log``: any text whose lines name a step and a loss (``step 10 | loss 2.3``,
  ``iter 10: loss=2.3``, ``Step [10/500], Loss: 2.3``; a dict printed after a key,
  ``reward_data: {'total_reward': 144.0}``, read as ``reward_data.total_reward`` and never
  evaluated), by the rules in :mod:`~steadytune.importers.text_log`.

Text layouts are matched after launcher and logger prefixes are stripped
(``[rank0]:``, ``0:``, ``2024-05-01 12:00:00,123 - INFO -``: see
:mod:`~steadytune.importers.prefix`); with several ranks the lowest one is kept.
A gzip-compressed file (``train.log.gz``) is read as what it holds. A file that fits
none raises :class:`UnreadableLog` with a one-line reason that says what was looked for.
"""

from __future__ import annotations

import gzip
import importlib
import json
import pkgutil
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from steadytune.importers import jsonl_log, text_log
from steadytune.importers.document import document_bytes
from steadytune.importers.format import LogFormat
from steadytune.importers.lines import bounded_lines, skip_line
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, no_gc, parse_number
from steadytune.importers.stream import NotStreamable, StreamedLog
from steadytune.regularfile import NotRegularFile, open_regular
from steadytune.scratch import owned_tempdir_for

__all__ = [
    "FORMATS",
    "LINE_FORMATS",
    "LogFormat",
    "NotStreamable",
    "Series",
    "SeriesBuilder",
    "StreamedLog",
    "UnreadableLog",
    "detect_format",
    "load",
    "parse_line",
    "parse_number",
    "stream",
]


def parse_line(line: str) -> dict[str, float] | None:
    """The values one line of a watched command's stdout holds, by the first line format that reads it."""
    for parse in _LINE_PARSERS:
        values = parse(line)
        if values is not None:
            return values
    return None


def _registered() -> tuple[LogFormat, ...]:
    """Every :class:`LogFormat` the modules of this package declare, by ``order``."""
    found: dict[str, LogFormat] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, LogFormat):
                if found.get(value.name, value) is not value:
                    raise RuntimeError(f"two log formats are named {value.name!r}")
                found[value.name] = value
    return tuple(sorted(found.values(), key=lambda f: (f.order, f.name)))


REGISTRY: tuple[LogFormat, ...] = _registered()
BY_NAME: dict[str, LogFormat] = {f.name: f for f in REGISTRY}
FORMATS: tuple[str, ...] = tuple(BY_NAME)
# A watched command's stdout, read a line at a time (supervise/log_adapter.py).
LINE_FORMATS: tuple[LogFormat, ...] = tuple(f for f in REGISTRY if f.parse_line is not None)
_LINE_PARSERS = tuple(f.parse_line for f in LINE_FORMATS if f.parse_line is not None)

_BY_PATH = tuple(f for f in REGISTRY if f.sniff_path is not None or f.dir_file is not None)
_BY_ROW = tuple(f for f in REGISTRY if f.sniff_row is not None)
_BY_JSON_HEAD = tuple(f for f in REGISTRY if f.sniff_json_head is not None)
_BY_DOCUMENT = tuple(f for f in REGISTRY if f.sniff_document is not None)
_BY_TEXT = tuple(f for f in REGISTRY if f.sniff_text is not None)

_HEAD_BYTES = 64 << 10
# A JSON array, not a text line that starts with a bracket ("[2024-05-01 12:00:00]", "[INFO]").
_JSON_ARRAY = re.compile(r'\s*\[\s*(?:[{\["\]]|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\s*[,\]])')
# Lines only source code starts with: the reason given when such a file is not a log either.
_SOURCE = re.compile(r"^(?:from [\w.]+ import |import [\w.]+\s*$|def \w+\(|class \w+[(:])", re.MULTILINE)


def _head(path: Path) -> str:
    with open_regular(path, "rb") as f:
        raw = f.read(_HEAD_BYTES)
        if raw[:1] == b"\x00":
            raw = _past_nuls(raw, f)
    if b"\x00" in raw[:4096]:
        raise UnreadableLog("binary file, not a text log")
    return raw.decode("utf-8", errors="replace")


# Bytes no text log holds: C0 controls other than tab, newlines, form feed and escape.
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f]")


def _past_nuls(raw: bytes, f: IO[bytes]) -> bytes:
    """A head of ``f`` from the end of the run of NUL bytes ``raw`` (read from its start) opens
    with, when text follows it; ``raw`` itself (a binary file) when none does.

    A log emptied while its writer went on (``: > train.log`` beside ``nohup python train.py >
    train.log &``) keeps the writer's offset: what it had written reads back as NULs, and the log
    goes on after them. Those NULs are no content (lines.BoundedLines drops them from a line)."""
    rest = raw.lstrip(b"\x00")
    while not rest and (chunk := f.read(_HEAD_BYTES)):
        rest = chunk.lstrip(b"\x00")
    rest += f.read(_HEAD_BYTES - len(rest))
    return rest if rest and not _CONTROL.search(rest[:4096]) else raw


def _tail(path: Path) -> str:
    """The last ``_HEAD_BYTES`` of a file longer than that, from its first whole line ("" if shorter)."""
    with open_regular(path, "rb") as f:
        size = f.seek(0, 2)
        if size <= _HEAD_BYTES:
            return ""
        f.seek(size - _HEAD_BYTES)
        raw = f.read()
    return raw[raw.find(b"\n") + 1 :].decode("utf-8", errors="replace")


# Words a record line holds; a log's lines that hold none are what lies between its records.
_RECORD_WORDS = re.compile(rb"loss|reward|step|iter|epoch", re.IGNORECASE)


def _middle(path: Path) -> str:
    """``_HEAD_BYTES`` from the middle of a file three heads long or more, whole lines ("" if shorter)."""
    with open_regular(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 3 * _HEAD_BYTES:
            return ""
        f.seek(size // 2)
        raw = f.read(_HEAD_BYTES)
    return raw[raw.find(b"\n") + 1 : raw.rfind(b"\n") + 1].decode("utf-8", errors="replace")


def _digest(path: Path) -> str:
    """The lines of a file longer than its head that hold a record's words, up to a head's worth
    (empty for a short file): sniffed when the head and the tail held too few records."""
    if path.stat().st_size <= _HEAD_BYTES:
        return ""
    kept: list[bytes] = []
    size = 0
    with open_regular(path, "rb") as f:
        for line in bounded_lines(f, 16384):
            if len(line) < 16384 and _RECORD_WORDS.search(line):
                kept.append(line)
                size += len(line)
                if size >= _HEAD_BYTES:
                    break
    return b"".join(kept).decode("utf-8", errors="replace")


def _after_first_line(path: Path) -> str:
    """Up to ``_HEAD_BYTES`` of the lines after the first ("" if there are none), the first line
    read past a head at a time, never held: a JSON-lines log may open with a config of megabytes
    dumped as one record, and a hostile file be one line of gigabytes."""
    with open_regular(path, "rb") as f:
        skip_line(f, _HEAD_BYTES)
        raw = f.read(_HEAD_BYTES)
    if len(raw) == _HEAD_BYTES:
        raw = raw[: raw.rfind(b"\n") + 1]  # whole lines only, as the head's sniffers expect
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


def _resolve_dir(path: Path) -> Path:
    """A directory stands for the log inside it (an HF checkpoint, a LLaMA-Factory output)."""
    for f in _BY_PATH:
        if f.dir_file is not None and (path / f.dir_file).is_file():
            return path / f.dir_file
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
GUNZIP_PREFIX = "steadytune-gunzip-"


@contextmanager
def _plain(path: Path) -> Iterator[Path]:
    """The path itself, or a decompressed copy of a gzip-compressed log (``main.log.gz``)."""
    try:
        with open_regular(path, "rb") as f:
            gz = f.read(2) == _GZIP_MAGIC
    except NotRegularFile as exc:
        if not path.is_dir():  # a FIFO would wait for a writer for good, a device never end
            raise UnreadableLog(exc.strerror) from None
        gz = False
    except OSError:  # a folder, a missing or unreadable file: detection says which
        gz = False
    if not gz:
        yield path
        return
    # Named for this process, so a copy a SIGKILL left is removed by the next analyze (scratch.py).
    with owned_tempdir_for(GUNZIP_PREFIX) as tmp:
        out = tmp / (path.name[:-3] if path.name.endswith(".gz") else path.name)
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
                            f"{tmp.parent} (less a reserve); set TMPDIR to a larger disk, or unpack it "
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
        for f in _BY_PATH:
            if f.sniff_path is not None and f.sniff_path(path):
                return f.name, None
            if f.dir_file is not None and (path / f.dir_file).is_file():
                return _sniff(path / f.dir_file)
        raise UnreadableLog("directory holds no run telemetry, trainer_state.json or TensorBoard events")
    for f in _BY_PATH:
        if f.sniff_path is not None and f.sniff_path(path):
            return f.name, None
    head = _head(path)
    if not head.strip():
        raise UnreadableLog("empty file")
    if head.lstrip().startswith("{") or _JSON_ARRAY.match(head):
        return _sniff_json(path, head)
    return _sniff_text(path, head)


def _sniff_json(path: Path, head: str) -> tuple[str, Any]:
    """A file whose head looks like JSON: JSON lines, one JSON document, or printed dicts."""
    first = _first_json_line(head)
    loaded: tuple[Any, ValueError | None] | None = None
    if first is None and "\n" not in head.strip() and len(head) >= _HEAD_BYTES:
        # A first line longer than the head: the line sniffers would judge a cut line by the dicts
        # inside it. A JSON-lines log whose first record is a config dump is told by the lines after
        # it; a file of one line (a trainer_state.json dumped without indent) is one document.
        rest = _after_first_line(path)
        if rest.strip():
            head, first = rest, _first_json_line(rest)
        else:
            loaded = _read_document(path)
            found = _document_format(loaded[0]) if loaded[1] is None else None
            if found is not None:
                return found
    for f in _BY_ROW:
        if f.sniff_row is not None and f.sniff_row(first):
            return f.name, first if f.read_json is not None else None
    for f in _BY_JSON_HEAD:
        if f.sniff_json_head is not None and f.sniff_json_head(head, first):
            return f.name, None
    data, error = loaded if loaded is not None else _read_document(path)
    if error is not None:
        if first is not None:  # the first line parsed: JSON lines, none of them a record
            raise UnreadableLog(f"JSON lines, but no object with {jsonl_log.LOOKED_FOR}") from error
        raise UnreadableLog(f"invalid JSON: {error}") from error
    found = _document_format(data)
    if found is not None:
        return found
    raise UnreadableLog(
        "JSON, but neither a trainer_state.json (log_history), Megatron golden values "
        "({metric: {values}}), a trainer_log.jsonl (current_steps), JSON lines with a step and a loss, "
        "nor a list of per-step records or series of {step, value} points"
    )


def _read_document(path: Path) -> tuple[Any, ValueError | None]:
    """The file as one JSON document, or the error that says it is not one (read once per sniff).

    Raises :class:`UnreadableLog` for a file over :data:`~.document.MAX_DOCUMENT_BYTES`, read no further.
    """
    raw = document_bytes(path, "; a log of JSON lines is read a line at a time: write one record per line")
    try:
        return json.loads(raw.decode("utf-8")), None
    except ValueError as e:
        return None, e


def _document_format(data: Any) -> tuple[str, Any] | None:
    """The format a document reader claims ``data`` for, with the data; None if none does."""
    for f in _BY_DOCUMENT:
        if f.sniff_document is not None and f.sniff_document(data):
            return f.name, data
    return None


def _sniff_text(path: Path, head: str) -> tuple[str, Any]:
    for f in _BY_TEXT:
        if f.sniff_text is not None and f.sniff_text(head):
            return f.name, None
    tail = _tail(path)
    if tail:  # a long preamble (a code dump, a config, pip freeze) before the first step
        for f in _BY_TEXT:
            if f.text_tail and f.sniff_text is not None and f.sniff_text(tail):
                return f.name, None
    # A log whose head is a config dump and whose tail a traceback: its middle. A log whose few
    # records lie far apart, among pages of generations: the lines that hold a record's words.
    for sample in (_middle, _digest):
        text = sample(path)
        for f in _BY_TEXT:
            if text and f.text_tail and f.sniff_text is not None and f.sniff_text(text):
                return f.name, None
    if len(_SOURCE.findall(head)) >= 2:
        raise UnreadableLog("Python source, not a log")
    tried = ", ".join(f.name for f in _BY_TEXT)
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


def stream(path: Path | str) -> StreamedLog | None:
    """The log's records one at a time, none kept (:mod:`~.stream`), where its format reads so;
    None for a folder, a compressed or unreadable file, or a format read only whole (:func:`load`).

    Iterating the result raises :class:`NotStreamable` where the log turns out to need
    :func:`load` after all (several runs, ranks, several loss-like series).
    """
    path = Path(path)
    try:
        with open_regular(path, "rb") as f:
            if f.read(2) == _GZIP_MAGIC:
                return None
        with _too_deep():
            fmt, _ = _sniff(path)
    except (OSError, UnreadableLog):
        return None
    read = BY_NAME[fmt].stream
    return None if read is None else read(path)


def _load(path: Path, fmt: str | None) -> Series:
    data = None
    if fmt is None:
        fmt, data = _sniff(path)
    f = BY_NAME.get(fmt)
    if f is None:
        raise UnreadableLog(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if path.is_dir() and f.sniff_path is None:
        path = _resolve_dir(path)
    if data is not None and f.read_json is not None:
        return f.read_json(path, data)
    try:
        return f.read(path)
    except UnreadableLog:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UnreadableLog(
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"
        ) from e
