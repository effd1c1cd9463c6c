"""JSON lines from custom loggers, W&B-like dumps and typed event streams: one object per line.

Examples of what is read::

    {"type": "config", "model": "llama-7b", "lr": 0.0001}          skipped: a config record
    {"type": "train", "step": 1, "loss": 2.3, "grad_norm": 1.1, "lr": 1e-4}
    {"type": "eval", "step": 100, "loss": 2.1}                     an eval row: loss is eval_loss
    {"_step": 10, "_runtime": 12.5, "train/loss": 2.2, "train/learning_rate": 1e-4}
    {"iter": 20, "metrics": {"loss": 2.0, "grad_norm": 0.9}}       nested one level

The rules:

- A row needs a step, the first integer of :data:`STEP_KEYS`; rows without one
  (headers, summaries) and lines that are not JSON objects (torn writes) are skipped.
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
- The file is this format when one of its first lines is such a row with a loss.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from steadytune.importers.format import LogFormat
from steadytune.importers.prefix import LowestRank
from steadytune.importers.series import ALIASES, Series, SeriesBuilder, UnreadableLog

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
LOOKED_FOR = f"a step ({'/'.join(STEP_KEYS)}) and a loss (loss, train/loss, eval_loss, val_loss)"


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in _NOT_METRICS:
            continue
        kind = type(value)
        if kind is float or kind is int:
            out[key] = value
        elif kind is dict:
            for inner, x in value.items():
                if type(x) is float or type(x) is int:
                    out[inner if key in _CONTAINERS else f"{key}/{inner}"] = x
    return out


def _step(row: dict[str, Any]) -> int | None:
    for key in STEP_KEYS:
        value = row.get(key)
        if type(value) is int:
            return value
        if type(value) is float and value.is_integer():
            return int(value)
    # ms-swift's logging.jsonl: "global_step/max_steps": "10/100".
    swift = row.get("global_step/max_steps")
    if isinstance(swift, str):
        done, _, _ = swift.partition("/")
        if done.isdigit():
            return int(done)
    return None


def parse_row(row: Any) -> tuple[int | None, int, dict[str, float]] | None:
    """``(rank, step, metrics)`` of one decoded line, metric names resolved; None if not a metrics row."""
    if not isinstance(row, dict):
        return None
    step = _step(row)
    if step is None:
        return None
    kind = next((row[k] for k in TYPE_KEYS if isinstance(row.get(k), str)), "").lower()
    if kind in SKIP_TYPES:
        return None
    numbers = {ALIASES.get(k, k): v for k, v in _numbers(row).items()}
    if kind in EVAL_TYPES:
        numbers = {_eval_name(k): v for k, v in numbers.items()}
    rank = row.get("rank", row.get("global_rank"))
    return (rank if type(rank) is int else None), step, numbers


def _eval_name(name: str) -> str:
    if name == "loss" or name == "eval_loss":
        return "eval_loss"
    if name.startswith(("eval", "val", "test")) or name in {"epoch", "lr", "ts"}:
        return name
    return f"eval_{name}"


def _rows(lines: Iterable[str]) -> Iterator[tuple[int | None, int, dict[str, float]]]:
    """The metrics rows of ``lines``, one at a time: a million-line log is never held as lines."""
    loads = json.loads
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            parsed = parse_row(loads(line))
        except ValueError:
            continue
        if parsed is not None:
            yield parsed


def sniff(head: str) -> bool:
    lines = head.splitlines()
    if not head.endswith("\n"):
        lines = lines[:-1]  # the head may have cut it
    return any(any(k in numbers for k in _LOSSES) for _, _, numbers in _rows(lines[:50]))


def read(path: Path) -> Series:
    b = SeriesBuilder(str(path), FORMAT)
    # A log without ranks (most are) keeps no rank per step: 50 bytes a step, 50 MB a million.
    ranks: LowestRank | None = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for rank, step, numbers in _rows(f):
            if rank and ranks is None:  # the first line with a rank: every step before it was rank 0's
                ranks = LowestRank(b, dict.fromkeys(b.steps(), 0))
            if ranks is None or ranks.accept(step, rank):
                b.add_numbers(step, numbers)
    if not len(b):
        raise UnreadableLog(f"no JSON object with {LOOKED_FOR}")
    return b.build(require=_LOSSES)


LOG_FORMAT = LogFormat(FORMAT, order=60, read=read, sniff_json_head=lambda head, _first: sniff(head))
