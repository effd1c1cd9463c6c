"""CSV (or TSV) with a step column: W&B exports, Lightning ``metrics.csv``, pandas dumps, hand-made tables.

W&B chart exports name columns ``<run> - train/loss`` and add ``__MIN`` /
``__MAX`` band columns; the run prefix is dropped and the bands are ignored. A chart of
several runs exports each as its own columns: each run is read as a run of its own.

A table aligned by blanks is read too, where its header holds only names and its rows only
numbers: ``numpy.savetxt`` writes ``# epoch train_loss val_loss`` over rows of numbers.
Empty cells are missing values, so a row that holds only another metric (a
Lightning validation row, a W&B eval row) adds nothing to the loss; rows of
the same step merge.

The step is the trainer's (``train/global_step``, ``step``, ...), not W&B's
``_step``, which counts log calls: an HF run logging every 10 steps and
evaluating now and then has ``_step`` 51 at ``train/global_step`` 500. A table
with no step column but an ``epoch`` one (Keras' ``CSVLogger``, a table a script
writes once an epoch) is stepped by its epochs.

A table whose rows are typed (a ``type``, ``split``, ``phase`` or ``mode`` column, as the
JSON-lines reader's ``type``) reads an evaluation's row as one: ``step,type,loss`` with
``100,val,3.2`` is an eval loss of 3.2 at step 100, never a training loss, and its other
metrics are ``eval_``-named; a row typed as a config or a summary is skipped.

A table whose rows are all at one step (W&B's export of a project's runs table, one
row per run at its last step) is no log over steps, and is refused.

A column named in words (``Train Loss``, ``Val Loss``, ``Epoch``) is read as its words
lower-cased and joined by ``_`` (``train_loss``, ``val_loss``), as a text log's
keys are, unless the shared aliases know the name as written (``lm loss``).

The same tables are read where they are printed or pasted rather than written to a file
of their own: after lines of something else (a banner, a progress bar) and separated by
tabs, as a notebook's training table is copied out of it (``Step<TAB>Training Loss``), or
as a Markdown table, as the Trainer writes the *Training results* of a model card
(``| Training Loss | Epoch | Step | Validation Loss |``, its ``|---|`` rule skipped and its
``No log`` cells missing). The table starts at the first line, among the first
:data:`HEAD_LINES`, that names a step column and is followed by at least
:data:`MIN_ROWS` rows of as many cells with a number for the step; it ends at the first
line that is not such a row. A table printed before lines the text reader takes (a training
script's LR schedule, then its step lines) is not the log: the text reader reads it.
"""

from __future__ import annotations

import csv
import itertools
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from steadytune.importers import text_log
from steadytune.importers.format import LogFormat
from steadytune.importers.jsonl_log import EVAL_TYPES, SKIP_TYPES, TYPE_KEYS, eval_name
from steadytune.importers.lines import open_lines
from steadytune.importers.series import ALIASES, Series, SeriesBuilder, UnreadableLog, parse_number

FORMAT = "csv"
# Most preferred first; ``_step`` used only when no trainer step is there, and ``epoch`` only when
# no step is logged at all: it steps a table written once an epoch.
STEP_COLUMNS = (
    "train/global_step",
    "global_step",
    "trainer/global_step",
    "step",
    "iteration",
    "iter",
    "_step",
    "epoch",
)
# The step counters other than the one chosen are no metrics; an epoch is one where a step is logged.
_COUNTERS = frozenset(STEP_COLUMNS) - {"epoch"}
# The columns that say what a row is (train, val, eval, test: the JSON-lines reader's types).
TYPE_COLUMNS = (*TYPE_KEYS, "split", "phase", "mode")
# Training loss names, most preferred first. Lightning's ``self.log("train_loss", on_step=True,
# on_epoch=True)`` writes ``train_loss_step`` and ``train_loss_epoch``: the ``_epoch`` mean is
# another series and stays out, kept under its own name.
LOSS_COLUMNS = (
    "loss",
    "train_loss",
    "train/loss",
    "train_loss_step",
    "training_loss",
    "train/loss_step",
    "loss_step",
)
# Evaluation loss names; Lightning's ``val_loss_epoch`` is the epoch mean, the eval loss itself.
EVAL_LOSS_COLUMNS = (
    "val_loss",
    "val/loss",
    "eval_loss",
    "eval/loss",
    "valid_loss",
    "validation_loss",
    "val_loss_epoch",
)


def step_column(header: list[str]) -> int | None:
    names = [(_metric(h) or "").lower() for h in header]
    for candidate in STEP_COLUMNS:
        if candidate in names:
            return names.index(candidate)
    return None


def _metric(column: str) -> str | None:
    name = column.strip()
    if name.endswith(("__MIN", "__MAX")):
        return None
    if " - " in name:
        name = name.split(" - ", 1)[1]
    if (" " in name or name.isalpha()) and name not in ALIASES:
        words = name.lower().split()
        name = " ".join(words) if " ".join(words) in ALIASES else "_".join(words)
    return name


def _type_column(header: list[str], step_col: int) -> int | None:
    """The column that types each row (train, val, ...), if the table has one."""
    names = [h.strip().lower() for h in header]
    return next((i for i, n in enumerate(names) if n in TYPE_COLUMNS and i != step_col), None)


def _pick(names: list[str | None], preferred: tuple[str, ...], role: str) -> int | None:
    """The column for ``role``: the first preferred name there, else the first one aliased to it."""
    lowered = [n.lower() if n else None for n in names]
    for candidate in preferred:
        if candidate in lowered:
            return lowered.index(candidate)
    return next((i for i, n in enumerate(names) if n and ALIASES.get(n) == role), None)


def column_metrics(header: list[str], step_col: int) -> list[str | None]:
    """The metric each column feeds (None: left out), with one column each for loss and eval_loss.

    Other step counters are left out: they are not metrics. A column the builder would alias
    onto loss or eval_loss but that was not chosen for it is left out too, or two series
    would interleave under one name.
    """
    names = [_metric(h) for h in header]
    names[step_col] = None
    chosen = {
        _pick(names, LOSS_COLUMNS, "loss"): "loss",
        _pick(names, EVAL_LOSS_COLUMNS, "eval_loss"): "eval_loss",
    }
    out: list[str | None] = []
    for i, name in enumerate(names):
        if i in chosen:
            out.append(chosen[i])
        elif name is None or name.lower() in _COUNTERS or ALIASES.get(name) in ("loss", "eval_loss"):
            out.append(None)
        else:
            out.append(name)
    return out


# A table printed after other lines starts within these: a model card's results come after its
# model-index front matter, 80 lines and more (one for each benchmark result it names).
HEAD_LINES = 1024
MIN_ROWS = 2  # a model card's table may hold one row an epoch
_RULE = re.compile(r"^:?-{2,}:?$")  # a Markdown table's rule cell: |---|:---:|


# A table aligned by blanks rather than separated (``numpy.savetxt(..., header="epoch train_loss
# val_loss")`` writes ``# epoch train_loss val_loss`` and rows of numbers): its cells are the
# words of a line, the header's leading ``#`` dropped.
BLANKS = " "


def _cells(line: str, delim: str) -> list[str]:
    if delim == BLANKS:
        return line.strip().lstrip("#").split()
    if delim == "|":
        inner = line.strip()
        if not inner.startswith("|"):
            return []
        return [c.strip() for c in inner.strip("|").split("|")]
    return next(csv.reader([line], delimiter=delim), [])


def _is_rule(cells: list[str]) -> bool:
    return bool(cells) and all(_RULE.match(c) for c in cells)


def _table(lines: list[str]) -> tuple[int, str, int] | None:
    """Where the table starts: (its header's line, the delimiter, the step column), or None.

    A header must name a step column and be followed by :data:`MIN_ROWS` rows of as many
    cells whose step cell is a number, so a line of prose that names a step is no header. A
    table aligned by blanks is one only where its header holds no number and its rows nothing
    else (a text log's ``step 10 loss 2.3`` lines are no such table).
    """
    for i, line in enumerate(lines[:HEAD_LINES]):
        for delim in (",", "\t", "|", BLANKS):
            if delim not in line:
                continue
            header = _cells(line, delim)
            col = step_column(header) if len(header) >= 2 else None
            if col is None:
                continue
            rows = [c for c in (_cells(x, delim) for x in lines[i + 1 : i + 2 + MIN_ROWS]) if not _is_rule(c)]
            if len(rows) < MIN_ROWS or not all(
                len(r) == len(header) and parse_number(r[col]) is not None for r in rows[:MIN_ROWS]
            ):
                continue
            if delim == BLANKS and (
                any(parse_number(h) is not None for h in header)
                or any(parse_number(c) is None for r in rows[:MIN_ROWS] for c in r)
            ):
                continue
            return i, delim, col
    return None


def _first_line_header(first: str) -> tuple[str, int] | None:
    """A file whose first line names a step column is a table, however few its rows."""
    # The more frequent separator first: a tab-separated header may name a column with a comma.
    for delim in sorted((",", "\t"), key=first.count, reverse=True):
        if delim in first and (col := step_column(_cells(first, delim))) is not None:
            return delim, col
    return None


def _end(lines: list[str], at: int, delim: str, col: int) -> int:
    """The line after the table whose header is line ``at``: the first that is not one of its rows."""
    width = len(_cells(lines[at], delim))
    for i in range(at + 1, len(lines)):
        cells = _cells(lines[i], delim)
        if not _is_rule(cells) and (len(cells) != width or parse_number(cells[col]) is None):
            return i
    return len(lines)


def sniff(head: str) -> bool:
    lines = head.splitlines()
    if not lines:
        return False
    if _first_line_header(lines[0]) is not None:
        return True
    found = _table(lines)
    # A table a training script prints before its step lines (an LR schedule, a config with a step
    # column) is no log: read as one, the run's own lines would be passed over for its few rows.
    return found is not None and not text_log.sniff("\n".join(lines[_end(lines, *found) :]))


def _rows(lines: Iterable[str], delim: str, width: int) -> Iterator[list[str]]:
    """The table's rows, from the line after its header to the first line that is not one."""
    if delim not in ("|", BLANKS):
        yield from csv.reader(lines, delimiter=delim)
        return
    for line in lines:
        cells = _cells(line, delim)
        if _is_rule(cells):
            continue
        if len(cells) != width:
            return
        yield cells


def read(path: Path) -> Series:
    with open_lines(path, newline="") as read_lines:
        head = _head(read_lines)
        first = _first_line_header(head[0]) if head else None
        found = (0, *first) if first is not None else _table(head)
    if found is None:
        raise UnreadableLog(f"no table with a step column (looked for {', '.join(STEP_COLUMNS)})")
    header = _cells(head[found[0]], found[1])
    b = SeriesBuilder(str(path), FORMAT, in_order=True)
    stepped = 0
    for i, own in enumerate(_run_headers(header)):
        if i:
            b.new_run()
        stepped += _fill(path, b, found, own)
    steps = set(b.steps())
    if stepped > 1 and len(steps) == 1:
        # W&B's export of a project's runs table: one row per run, each at its last step. Read
        # in order, the rows would be one step's sub-batches, and the runs' final losses averaged.
        raise UnreadableLog(
            f"all {stepped} rows are at step {steps.pop()}: a table of runs or a summary "
            f"(W&B's runs export), not a log over steps"
        )
    return b.build(require=("loss", "eval_loss", "grad_norm"))


def _head(lines: Iterable[str]) -> list[str]:
    """The lines :func:`_table` looks at, their line ends removed."""
    return list(itertools.islice((line.rstrip("\r\n") for line in lines), HEAD_LINES + MIN_ROWS + 1))


def _run_headers(header: list[str]) -> list[list[str]]:
    """The header once for each run a W&B chart export holds as columns (``<run> - train/loss``),
    the other runs' columns blanked; the header itself where it holds one run or none."""
    runs = list(dict.fromkeys(h.split(" - ", 1)[0].strip() for h in header if " - " in h))
    if len(runs) < 2:
        return [header]
    return [
        [h if " - " not in h or h.split(" - ", 1)[0].strip() == run else "" for h in header] for run in runs
    ]


def _fill(path: Path, b: SeriesBuilder, found: tuple[int, str, int], header: list[str]) -> int:
    """Add the table's rows (the columns ``header`` names) to ``b``; returns how many had a step.

    Read a line at a time, never whole: a table's rows are held only as the builder holds its
    steps, which it bounds (series.MAX_RECORDS), where the text, its lines and its rows held at
    once took 30 times the file's size before the first step was counted."""
    at, delim, col = found
    metrics = column_metrics(header, col)
    kind_col = _type_column(header, col)
    if kind_col is not None:
        metrics[kind_col] = None
    evals = [eval_name(m) if m else None for m in metrics]
    stepped = 0
    with open_lines(path, newline="") as read_lines:
        lines = (line.rstrip("\r\n") for line in read_lines)
        rows = _rows(itertools.chain(_head(lines)[at + 1 :], lines), delim, len(header))
        try:
            for row in rows:
                if len(row) <= col:
                    continue
                step = parse_number(row[col])
                if step is None or not math.isfinite(step):
                    continue
                names = metrics
                if kind_col is not None and kind_col < len(row):
                    kind = row[kind_col].strip().lower()
                    if kind in SKIP_TYPES:
                        continue
                    names = evals if kind in EVAL_TYPES else metrics
                stepped += 1
                for i, cell in enumerate(row):
                    name = names[i] if i < len(names) else None
                    if name:
                        b.add(int(step), name, parse_number(cell))
        except csv.Error as e:  # it named no file nor row, and not the likely cause
            raise UnreadableLog(
                f"a cell after step {max(b.steps(), default='(none)')} cannot be read ({e}): a quote "
                "opened in a cell and never closed runs on through the lines after it"
            ) from None
    b.notes += [n for n in read_lines.notes() if n not in b.notes]
    return stepped


# A table's header is at its head: a tail has none to go by.
LOG_FORMAT = LogFormat(FORMAT, order=140, read=read, sniff_text=sniff, text_tail=False)
