"""JSON lines from custom loggers, W&B-like dumps and typed event streams: one object per line.

Examples of what is read::

    {"type": "config", "model": "llama-7b", "lr": 0.0001}          skipped: a config record
    {"type": "train", "step": 1, "loss": 2.3, "grad_norm": 1.1, "lr": 1e-4}
    {"type": "eval", "step": 100, "loss": 2.1}                     an eval row: loss is eval_loss
    {"_step": 10, "_runtime": 12.5, "train/loss": 2.2, "train/learning_rate": 1e-4}
    {"iter": 20, "metrics": {"loss": 2.0, "grad_norm": 0.9}}       nested one level

The rules:

- A row's step is the first integer of :data:`STEP_KEYS`; rows without one (headers,
  summaries) and lines that are not JSON objects (torn writes) are skipped. A log that
  names none of them counts its steps its own way: the counter (an integer field named
  ``<something>_step``, ``<something>_iter`` or ``<something>_iteration``: ``grpo_step``,
  ``optimizer_step``) that the most rows carry is the step, the outer loop's where both an
  outer and an inner one are there; a log with no counter at all is numbered by the order of
  its rows (1, 2, ...).
- The record type is the string under ``type``, ``_type``, ``event`` or ``kind``.
  Types in :data:`SKIP_TYPES` (config, summary, heartbeat, ...) are not metrics and
  are skipped. In rows typed as an evaluation (:data:`EVAL_TYPES`: eval, val,
  validation, test, ...) ``loss`` is the eval loss and every other metric ``m``
  becomes ``eval_m`` (``eval_accuracy``) unless already named so. Other rows, typed
  or not, are read as they are.
- Numbers are read under their names, with the usual aliases (``train/loss``,
  ``learning_rate``, ``val_loss``, ...). A nested object is flattened one level:
  ``{"train": {"loss": 2}}`` is ``train/loss``, and the contents of ``metrics``,
  ``data``, ``scalars``, ``values``, ``logs`` or ``extra`` keep their own names.
- A ``rank`` (or ``global_rank``) field picks, when several ranks log the same
  step, the lowest rank's row. Otherwise the last value per step wins.
- The file is this format when one of its first lines is such a row with a loss, or with a
  signal only RL and preference runs log (a reward, a KL, ``logps``: objectives.py).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from steadytune.importers.format import LogFormat
from steadytune.importers.lines import open_lines
from steadytune.importers.prefix import LowestRank
from steadytune.importers.series import (
    ALIASES,
    Series,
    SeriesBuilder,
    UnreadableLog,
    canonical,
    canonical_numbers,
)
from steadytune.importers.stream import CHUNK, Row, StreamedLog
from steadytune.objectives import objective_of

FORMAT = "jsonl_log"
# The trainer's own step before W&B's ``_step``, which counts log calls (an eval row is one more).
STEP_KEYS = ("step", "global_step", "train/global_step", "trainer/global_step", "iter", "iteration", "_step")
TYPE_KEYS = ("type", "_type", "event", "kind")
EVAL_TYPES = frozenset({"eval", "evaluation", "val", "valid", "validation", "test", "dev"})
SKIP_TYPES = frozenset(
    {
        "config", "hparams", "hyperparameters", "args", "arguments", "params", "meta", "metadata",
        "header", "summary", "final", "system", "heartbeat", "exit", "event", "plan", "anomaly",
        "env", "environment", "info", "sample", "samples", "generation", "checkpoint",
    }
)  # fmt: skip
_CONTAINERS = frozenset({"metrics", "data", "scalars", "values", "logs", "extra"})
_NOT_METRICS = frozenset((*STEP_KEYS, *TYPE_KEYS, "rank", "global_rank"))
_LOSSES = ("loss", "eval_loss")
LOOKED_FOR = (
    f"a loss (loss, train/loss, eval_loss, val_loss) or an RL/preference signal (reward, kl, logps, ...), "
    f"at a step ({'/'.join(STEP_KEYS)}, a *_step counter, or the order of the rows)"
)


# A counter a script names after its own loop: grpo_step, optimizer_step, train_iter, outer_iteration.
# Not a count of steps done: a budget (max_steps), a size (num_...), a rate (time_per_step).
COUNTER = re.compile(
    r"^(?!max_|num_|total_|n_)(?!.*_per_)[a-z][a-z0-9]*(?:_[a-z0-9]+)*_(?:step|iter|iteration)$",
    re.IGNORECASE,
)


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in row.items():
        kind = type(value)
        if key in _NOT_METRICS or (kind is int and COUNTER.match(key)):  # other counters are no metrics
            continue
        if kind is float or kind is int:
            out[key] = value
        elif kind is dict:
            for inner, x in value.items():
                if type(x) is float or type(x) is int:
                    out[inner if key in _CONTAINERS else f"{key}/{inner}"] = x
    return out


def _integral(value: Any) -> int | None:
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    return None


def _step(row: dict[str, Any], counter: str | None = None) -> int | None:
    for key in (counter,) if counter else STEP_KEYS:
        value = _integral(row.get(key))
        if value is not None:
            return value
    # ms-swift's logging.jsonl: "global_step/max_steps": "10/100".
    swift = row.get("global_step/max_steps")
    if isinstance(swift, str):
        done, _, _ = swift.partition("/")
        if done.isdigit():
            return int(done)
    return None


def counter_of(rows: list[dict[str, Any]]) -> str | None:
    """The step counter of rows that carry none of :data:`STEP_KEYS`: the ``*_step`` /
    ``*_iter(ation)`` integer field most rows have (an outer loop's counter is on every row,
    an inner one's only on the rows of its loop); None when there is none."""
    seen: Counter[str] = Counter()
    for row in rows:
        seen.update(k for k, v in row.items() if COUNTER.match(k) and _integral(v) is not None)
    if not seen:
        return None
    best = max(seen.values())
    return next(k for k, n in seen.items() if n == best)  # the first named, among the most carried


def has_step(rows: list[dict[str, Any]]) -> bool:
    """Whether any row names its step by one of :data:`STEP_KEYS`."""
    return any(_step(row) is not None for row in rows)


def parse_row(
    row: Any, counter: str | None = None, index: int | None = None
) -> tuple[int | None, int, dict[str, float]] | None:
    """``(rank, step, metrics)`` of one decoded line, metric names resolved; None if not a metrics row.

    ``counter``: the field that is the step (see :func:`counter_of`); ``index``: the step of a
    row in a log that counts none (its place, from 1).
    """
    if not isinstance(row, dict):
        return None
    step = _step(row, counter) if index is None else index
    if step is None:
        return None
    kind = next((row[k] for k in TYPE_KEYS if isinstance(row.get(k), str)), "").lower()
    if kind in SKIP_TYPES:
        return None
    numbers = {ALIASES.get(k, k): v for k, v in _numbers(row).items()}
    if kind in EVAL_TYPES:
        numbers = {eval_name(k): v for k, v in numbers.items()}
    rank = row.get("rank", row.get("global_rank"))
    return (rank if type(rank) is int else None), step, numbers


def parse_rows(rows: Iterable[Any]) -> list[tuple[int | None, int, dict[str, float]]]:
    """Every metrics row of a log, each at its step: its :data:`STEP_KEYS` field where the log
    names one, else the log's own counter, else its place among the rows that hold numbers."""
    dicts = [r for r in rows if isinstance(r, dict)]
    if has_step(dicts):
        parsed = (parse_row(r) for r in dicts)
    elif (counter := counter_of(dicts)) is not None:
        parsed = (parse_row(r, counter) for r in dicts)
    else:
        numbered = [r for r in dicts if _numbers(r)]
        parsed = (parse_row(r, index=i) for i, r in enumerate(numbered, 1))
    return [p for p in parsed if p is not None]


def eval_name(name: str) -> str:
    """The name a metric of a row typed as an evaluation is read under (``loss``: ``eval_loss``)."""
    if name == "loss" or name == "eval_loss":
        return "eval_loss"
    if name.startswith(("eval", "val", "test")) or name in {"epoch", "lr", "ts"}:
        return name
    return f"eval_{name}"


def _decoded(lines: Iterable[str]) -> Iterator[Any]:
    """The JSON values of ``lines``, one at a time: a million-line log is never held as lines."""
    loads = json.loads
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            yield loads(line)
        except ValueError:
            continue


def _is_signal(numbers: dict[str, float]) -> bool:
    return any(k in numbers for k in _LOSSES) or objective_of(numbers) is not None


def sniff(head: str) -> bool:
    lines = head.splitlines()
    if not head.endswith("\n"):
        lines = lines[:-1]  # the head may have cut it
    return any(_is_signal(numbers) for _, _, numbers in parse_rows(_decoded(lines[:50])))


def read(path: Path) -> Series:
    """The log's rows into a series, one row at a time (:func:`parse_rows`'s rules).

    A log that names its steps (most do) is read as it streams by; only rows naming no step are
    kept aside until one does, for a log that names none is numbered by its counter or its rows.
    """
    b = SeriesBuilder(str(path), FORMAT, in_order=True)
    # A log without ranks (most are) keeps no rank per step: 50 bytes a step, 50 MB a million.
    ranks: LowestRank | None = None

    def add(rank: int | None, step: int, numbers: dict[str, float]) -> None:
        nonlocal ranks
        if rank and ranks is None:  # the first line with a rank: every step before it was rank 0's
            ranks = LowestRank(b, dict.fromkeys(b.steps(), 0))
        if ranks is None or ranks.accept(step, rank):
            b.add_numbers(step, numbers)

    stepless: list[dict[str, Any]] | None = []  # None once a row names its step
    with open_lines(path) as lines:
        for row in _decoded(lines):
            if not isinstance(row, dict):
                continue
            if _step(row) is None:
                if stepless is not None:
                    stepless.append(row)
                continue
            stepless = None
            parsed = parse_row(row)
            if parsed is not None:
                add(*parsed)
    for parsed in parse_rows(stepless or []):
        add(*parsed)
    if not len(b):
        raise UnreadableLog(f"no JSON object with {LOOKED_FOR}")
    b.notes += lines.notes()
    return b.build(require=_LOSSES)


# A row's keys -> its step key, each metric's key and canonical name, and whether the row less its step
# key is its numbers as they are (every other key a metric under its own name); None: the general rules.
_Plan = tuple[str, tuple[tuple[str, str], ...], bool] | None
_MAX_PLANS = 1024
_MAXF = sys.float_info.max
# orjson reads an integer past 64 bits as a float: a float this large may have been one.
_BIG = float(2**63)

_fast_loads: Callable[[str], Any]
try:  # installed with steadytune: about five times faster than json on small rows
    from orjson import loads as _fast_loads

    _FAST_IS_JSON = False
except ImportError:  # pragma: no cover - the fallback is the standard library
    _fast_loads = json.loads
    _FAST_IS_JSON = True


def _plan(keys: tuple[str, ...]) -> _Plan:
    """How to read a row of these keys without :func:`parse_row`'s general rules; None where they
    are needed (a record type, a rank, a counter, no step key)."""
    step_key = next((k for k in STEP_KEYS if k in keys), None)
    if step_key is None or any(k in TYPE_KEYS or k == "rank" or k == "global_rank" for k in keys):
        return None
    metrics = []
    for k in keys:
        if k in _NOT_METRICS:
            continue
        if COUNTER.match(k):
            return None
        metrics.append((k, canonical(ALIASES.get(k, k))))
    as_is = len(metrics) == len(keys) - 1 and all(k == name for k, name in metrics)
    return step_key, tuple(metrics), as_is


def stream_rows(path: Path, notes: list[str] | None = None) -> Iterator[list[Row]]:
    """The log's metrics rows in file order, as :func:`read` reads them, a :data:`~.stream.CHUNK` of
    rows at a time (rows naming no step are left out: a log that names none is read whole). What
    reading decided (a line left out) is added to ``notes`` once the file is read.

    Most logs repeat one or two shapes of row (``{"step": 1, "loss": 2.3}``): such a row is parsed
    by orjson where it is installed and read by its shape's plan, made once (:func:`_plan`), while
    its values are plain numbers. Any other row is parsed by :mod:`json` and read by
    :func:`parse_row`, as :func:`read` does: orjson refuses ``NaN`` and turns an integer past 64
    bits into a float, where :mod:`json` keeps both as they are. Rows are handed on in lists: a
    generator's turn for each row cost as much as a plain row's plan.
    """
    plans: dict[tuple[str, ...], _Plan] = {}
    loads = json.loads
    block: list[Row] = []
    add = block.append
    with open_lines(path) as lines:
        for line in lines:
            if len(block) >= CHUNK:
                yield block
                block = []
                add = block.append
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                row = _fast_loads(line)
            except ValueError:
                row = None
            if type(row) is dict:
                keys = tuple(row)
                try:
                    plan = plans[keys]
                except KeyError:
                    plan = plans[keys] = _plan(keys) if len(plans) < _MAX_PLANS else None
                if plan is not None:
                    step = row[plan[0]]
                    if type(step) is int:
                        # None: the row less its step key will be the numbers (no second dict).
                        numbers: dict[str, Any] | None = None if plan[2] else {}
                        for key, name in plan[1]:
                            v = row[key]
                            kind = type(v)
                            if (kind is float and -_BIG < v < _BIG) or (kind is int and -_MAXF <= v <= _MAXF):
                                if numbers is not None:
                                    numbers[name] = v
                            else:
                                break  # a string, a null, a nested object: the general rules
                        else:
                            if numbers is None:
                                del row[plan[0]]
                                numbers = row
                            add((None, step, numbers))
                            continue
            if _FAST_IS_JSON and row is not None:
                parsed_row: Any = row
            else:
                try:
                    parsed_row = loads(line)
                except ValueError:
                    continue
            if not isinstance(parsed_row, dict) or _step(parsed_row) is None:
                continue
            parsed = parse_row(parsed_row)
            if parsed is not None:
                rank, step, values = parsed
                add((rank, step, canonical_numbers(values)))
        if notes is not None:
            notes += lines.notes()
    if block:
        yield block


def stream(path: Path) -> StreamedLog:
    """The log's records one at a time, for ``analyze`` (:class:`~.stream.StreamedLog`)."""
    log = StreamedLog(str(path), FORMAT, lambda: stream_rows(path, log.notes))
    return log


LOG_FORMAT = LogFormat(
    FORMAT, order=60, read=read, sniff_json_head=lambda head, _first: sniff(head), stream=stream
)
