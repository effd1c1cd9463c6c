"""A JSON document that holds a run's log: a list of per-step dicts, or metrics kept as series.

What scripts write with ``json.dump`` at the end of (or during) a run, when it is not a
format of its own (``trainer_state.json`` and Megatron's golden values are read before)::

    [{"step": 1, "loss": 0.69, "reward": 0.1, ...}, {"step": 2, ...}]     a trainer's log_history, dumped
    {"config": {...}, "history": [{"step": 10, "loss": 2.3}, ...]}         the log under a key
    {"loss": [{"step": 1, "value": 0.69}, ...], "lr": [...]}               one series per metric
    {"run_a/loss": [{"step": 1, "value": 0.69}, ...], "run_b/loss": [...]}  several runs side by side
    {"loss": [2.3, 2.1, 1.9], "grad_norm": [1.1, 0.9, 0.8]}               columns, one value per step

The rules:

- **Records** are the dicts of a list (at the top, or under keys up to three levels down) that
  hold numbers. Each is read like a JSON-lines row (:mod:`~.jsonl_log`): its step is its
  ``step``/``global_step``/... field, else the log's own ``*_step`` counter, else its place in
  the list (1, 2, ...); a ``type`` field is honoured; one level of nesting is flattened; the
  Trainer's closing summary (``train_runtime``) is no step. Every list of records is read, one
  after another: lists that repeat each other (a raw history beside per-metric copies of it)
  make one run, and lists that log other values at the same steps are several runs
  (:mod:`~.runs`), each judged on its own.
- **Series**: a key whose value is a list of ``{"step": N, "value": X}`` points (``x``/``y`` too)
  is the metric the key names. Where the keys are ``<run>/<metric>`` and more than one ``<run>``
  has a loss or a reward of its own, each ``<run>`` is a run of its own; otherwise the key is
  the metric's name.
- **Columns**: a key whose value is a list of numbers is a metric logged once a step, the
  list's place its step (1, 2, ...), when the document holds no records and no series.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from steadytune.importers import jsonl_log
from steadytune.importers.document import read_document
from steadytune.importers.format import LogFormat
from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, is_summary, parse_number

FORMAT = "json_document"
_DEPTH = 3
_MIN_POINTS = 2
_POINT_STEP = ("step", "x", "iteration", "iter", "global_step", "_step")
_POINT_VALUE = ("value", "y", "v")
_SIGNALS = ("loss", "train_loss", "eval_loss", "reward", "rewards", "score")


def _is_record(x: Any) -> bool:
    return isinstance(x, dict) and any(type(v) in (int, float) for v in x.values())


def _record_lists(doc: Any, depth: int = 0) -> Iterator[list[dict[str, Any]]]:
    """Every list of records in the document, in its order, series of points aside."""
    if isinstance(doc, list):
        if sum(_is_record(x) for x in doc) >= _MIN_POINTS and not _points(doc):
            yield [x for x in doc if isinstance(x, dict)]
        return
    if isinstance(doc, dict) and depth < _DEPTH:
        for value in doc.values():
            if isinstance(value, (list, dict)):
                yield from _record_lists(value, depth + 1)


def _points(items: list[Any]) -> list[tuple[int, Any]] | None:
    """``[(step, value)]`` of a list of ``{"step": N, "value": X}`` points; None if it is not one."""
    out = []
    for item in items:
        if not isinstance(item, dict):
            return None
        step = next((item[k] for k in _POINT_STEP if k in item), None)
        value = next((item[k] for k in _POINT_VALUE if k in item), None)
        if value is None or not isinstance(step, (int, float)) or not float(step).is_integer():
            return None
        out.append((int(step), value))
    return out or None


def _series_map(doc: Any, depth: int = 0) -> dict[str, list[tuple[int, Any]]]:
    """``{metric: [(step, value)]}`` of every list of points in the document, by its key."""
    found: dict[str, list[tuple[int, Any]]] = {}
    if isinstance(doc, dict) and depth <= _DEPTH:
        for key, value in doc.items():
            if isinstance(value, list) and value and (points := _points(value)) is not None:
                found[str(key)] = points
            elif isinstance(value, dict):
                found.update(_series_map(value, depth + 1))
    return found


def _columns(doc: Any) -> dict[str, list[Any]]:
    if not isinstance(doc, dict):
        return {}
    return {
        str(k): v
        for k, v in doc.items()
        if isinstance(v, list) and len(v) >= _MIN_POINTS and all(type(x) in (int, float) for x in v)
    }


def _runs_by_prefix(names: list[str]) -> dict[str, list[str]] | None:
    """``{run: [names]}`` where the names are ``<run>/<metric>`` and several runs log a signal."""
    groups: dict[str, list[str]] = {}
    for name in names:
        prefix, sep, metric = name.partition("/")
        if not sep:
            return None
        groups.setdefault(prefix, []).append(metric)
    with_signal = [p for p, metrics in groups.items() if any(m in _SIGNALS for m in metrics)]
    return groups if len(with_signal) > 1 else None


def sniff(doc: Any) -> bool:
    return next(_record_lists(doc), None) is not None or bool(_series_map(doc)) or len(_columns(doc)) > 0


def read(path: Path, doc: Any | None = None) -> Series:
    if doc is None:
        doc = read_document(path)
    b = SeriesBuilder(str(path), FORMAT, in_order=True)
    lists = list(_record_lists(doc))
    points = _series_map(doc)
    if lists:
        for records in lists:
            rows = [r for r in records if not (isinstance(r, dict) and is_summary(r))]
            for _rank, step, numbers in jsonl_log.parse_rows(rows):
                b.add_numbers(step, numbers)
    elif points:
        runs = _runs_by_prefix(list(points))
        for prefix, metrics in (runs or {"": list(points)}).items():
            for metric in metrics:  # each run's series, one after another: the builder parts them
                key = f"{prefix}/{metric}" if prefix else metric
                for step, value in sorted(points[key], key=lambda p: p[0]):
                    b.add(step, metric, parse_number(value))
    else:
        for metric, values in _columns(doc).items():
            for i, value in enumerate(values, 1):
                b.add(i, metric, parse_number(value))
    if not len(b):
        raise UnreadableLog("JSON, but no list of per-step records, series of points or columns of numbers")
    return b.build(require=("loss", "eval_loss", "grad_norm"))


# Tried after every JSON format of its own (trainer_state.json, golden values, trainer_log.jsonl).
LOG_FORMAT = LogFormat(FORMAT, order=900, read=read, read_json=read, sniff_document=sniff)
