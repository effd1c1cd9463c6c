"""The common in-memory form of an imported log, and how raw values get into it.

Every importer emits ``(step, metric, value)`` triples into a
:class:`SeriesBuilder`; it keeps the *last* value per step and metric (logs that
were resumed or appended twice repeat steps, interleaved with others), orders
the steps, and turns them into :class:`StepRecord` objects, the same records a
live run writes. Detectors then never know where the numbers came from.
"""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from steadytune.objectives import objective_of
from steadytune.records import StepRecord, SystemSample, valid_step


class UnreadableLog(Exception):
    """A file that is not a training log this tool can read; ``str()`` is a one-line reason."""


# StepRecord fields an importer may fill, with the cast each one needs.
_FIELDS: dict[str, type] = {
    "loss": float,
    "grad_norm": float,
    "lr": float,
    "epoch": float,
    "eval_loss": float,
    "tokens": int,
    "samples": int,
    "step_time_s": float,
    "mem_allocated_bytes": int,
    "mem_reserved_bytes": int,
    "mem_peak_bytes": int,
    "rss_bytes": int,
    "ts": float,
    "skipped": bool,
}

# Names other tools give to the fields above; anything else is kept in ``extra``.
ALIASES: dict[str, str] = {
    "loss": "loss",
    "train/loss": "loss",
    "train_loss_step": "loss",
    "lm loss": "loss",
    "lm_loss": "loss",
    "lm-loss": "loss",
    "grad_norm": "grad_norm",
    "train/grad_norm": "grad_norm",
    "grad norm": "grad_norm",
    "grad-norm": "grad_norm",
    "gradient_norm": "grad_norm",
    "gnorm": "grad_norm",
    "actor/grad_norm": "grad_norm",  # verl
    "actor/pg_loss": "loss",  # verl's policy-gradient loss: an RL loss, judged only for NaN/Inf
    "actor/lr": "lr",
    "learning_rate": "lr",
    "train/learning_rate": "lr",
    "learning rate": "lr",
    "learning-rate": "lr",
    "lr": "lr",
    "epoch": "epoch",
    "train/epoch": "epoch",
    "eval_loss": "eval_loss",
    "eval/loss": "eval_loss",
    "validation loss": "eval_loss",
    "lm loss validation": "eval_loss",
    "val_loss": "eval_loss",
    "iteration-time": "step_time_s",
    "mem-allocated-bytes": "mem_allocated_bytes",
    "mem-max-allocated-bytes": "mem_peak_bytes",
}


# Names a log gives its training loss, most preferred first, after ALIASES (so ``train/loss`` and
# ``lm loss`` are ``loss`` already): the loss of the step, then named variants, then the running
# means a script prints beside it. docs/detectors.md, *Which series is the loss*.
TRAIN_LOSS_NAMES: tuple[str, ...] = (
    "loss",
    "train_loss",
    "training_loss",
    "reduced_train_loss",
    "gpt_loss",
    "loss_train",
    "total_loss",
    "avg_loss",
    "mean_loss",
)
_LOSS_RANK = {name: i for i, name in enumerate(TRAIN_LOSS_NAMES)}


class LossChoice:
    """Which of a log's loss-like series is its training loss: the rule, in one place.

    A series named like a training loss (:data:`TRAIN_LOSS_NAMES`) that stays exactly constant
    while another one varies is a logging artefact (a stray ``avg_loss=0.0000`` a script prints
    every tenth step): it is ignored, never judged. Of the rest, the most preferred name is the
    loss. Fed values as they come (``supervise``) or a whole log at once (``analyze``).
    """

    __slots__ = ("_first", "_varies")

    def __init__(self) -> None:
        self._first: dict[str, float] = {}
        self._varies: set[str] = set()

    def see(self, name: str, value: float) -> None:
        first = self._first.setdefault(name, value)
        if value != first:  # NaN != NaN: a NaN loss varies
            self._varies.add(name)

    @property
    def settled(self) -> bool:
        """Whether the choice is known: one series so far, or one of several has varied."""
        return len(self._first) < 2 or bool(self._varies)

    def ignored(self) -> dict[str, float]:
        """The constant series, with their one value, while another varies."""
        if not self._varies:
            return {}
        return {n: v for n, v in self._first.items() if n not in self._varies}

    def chosen(self) -> str | None:
        ignored = self.ignored()
        names = [n for n in self._first if n not in ignored]
        return min(names, key=_LOSS_RANK.__getitem__) if names else None

    def notes(self) -> dict[str, str]:
        """Each ignored series and why (``ignored `avg_loss`: always 0.0000 while `loss` varies``)."""
        chosen = self.chosen()
        ignored = self.ignored().items()
        return {n: f"ignored `{n}`: always {v:.4f} while `{chosen}` varies" for n, v in ignored}


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off for a while, as it was before after.

    Reading a big log makes hundreds of thousands of objects that are all kept (the
    parsed JSON, the rows, the records): the collections they set off free nothing
    and, on 100k steps, cost longer than the building itself.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def parse_number(raw: Any, nan_means_missing: bool = False) -> float | None:
    """A float from a JSON/CSV/text value; None for missing, empty or placeholder values.

    ``nan_means_missing`` is for formats where the string "nan" is a placeholder
    for *not recorded* (Megatron golden values), not a NaN loss.
    """
    if raw is None or isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        x = float(raw)
    else:
        text = str(raw).strip().strip('"')
        if not text or text.lower() in {"none", "null", "-", "n/a"}:
            return None
        try:
            x = float(text)
        except ValueError:
            return None
    if math.isnan(x) and nan_means_missing:
        return None
    return x


@dataclass
class Series:
    """One imported run: its step records (all ranks), system samples, and what it holds."""

    path: str
    format: str
    records: list[StepRecord]
    system: list[SystemSample] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what reading decided, said once (a loss ignored)

    @property
    def steps(self) -> int:
        return len({r.step for r in self.records})

    def values(self, metric: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric (a StepRecord field or an ``extra`` key), primary rank."""
        xs: list[int] = []
        ys: list[float] = []
        rank = min((r.rank for r in self.records), default=0)
        for r in self.records:
            if r.rank != rank:
                continue
            v = getattr(r, metric, None) if metric in _FIELDS else r.extra.get(metric)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                xs.append(r.step)
                ys.append(float(v))
        return xs, ys


class SeriesBuilder:
    """Collects (step, metric, value); the last value per step and metric wins."""

    def __init__(self, path: str, fmt: str) -> None:
        self.path = path
        self.format = fmt
        self._rows: dict[int, dict[str, Any]] = {}

    def add(self, step: int, metric: str, value: Any) -> None:
        if value is None:
            return
        name = ALIASES.get(metric, metric)
        self._rows.setdefault(step, {})[name] = value

    def add_numbers(self, step: int, row: dict[str, Any]) -> None:
        """Add the int/float fields of a parsed JSON row as they are (the fast path for big logs)."""
        numbers = {
            ALIASES.get(k, k): v
            if type(v) is float or -_MAXF <= v <= _MAXF
            else (math.inf if v > 0 else -math.inf)
            for k, v in row.items()
            if type(v) is float or type(v) is int
        }
        target = self._rows.get(step)
        if target is None:
            self._rows[step] = numbers
        else:
            target.update(numbers)

    def add_row(self, step: int, row: dict[str, Any], nan_means_missing: bool = False) -> None:
        """Add every numeric field of one logged row (strings are parsed)."""
        target = self._rows.get(step)
        if target is None:
            target = self._rows[step] = {}
        for key, raw in row.items():
            kind = type(raw)
            if kind is float or kind is int:  # the common case, without the string parsing
                x: float | None = (
                    float(raw)
                    if kind is float or -_MAXF <= raw <= _MAXF
                    else (math.inf if raw > 0 else -math.inf)
                )
                if nan_means_missing and x != x:
                    continue
            else:
                x = parse_number(raw, nan_means_missing)
                if x is None:
                    continue
            target[ALIASES.get(key, key)] = x

    def discard(self, step: int) -> None:
        """Forget what was added for ``step`` (another rank's line is to replace it)."""
        self._rows.pop(step, None)

    def __len__(self) -> int:
        return len(self._rows)

    def steps(self) -> list[int]:
        """The steps added so far, in the order first added."""
        return list(self._rows)

    def build(self, require: tuple[str, ...] = ()) -> Series:
        if any(not valid_step(s) for s in self._rows):  # a damaged step number: that row is left out
            self._rows = {s: row for s, row in self._rows.items() if valid_step(s)}
        if not self._rows:
            wanted = f" (looked for entries with a step and {' / '.join(require)})" if require else ""
            raise UnreadableLog(f"no logged steps found{wanted}")
        with no_gc():
            return self._build(require)

    def _choose_loss(self) -> list[str]:
        """Make the training loss (:class:`LossChoice`) the rows' ``loss``; the other loss-like
        series stay beside it under their names, not judged. Returns what was ignored, said once."""
        names: set[str] = set()
        for row in self._rows.values():
            names.update(row)
        candidates = [n for n in TRAIN_LOSS_NAMES if n in names]
        if not candidates or candidates == ["loss"]:
            return []  # the usual log: one loss, under its usual name
        choice = LossChoice()
        for row in self._rows.values():
            for n in candidates:
                v = row.get(n)
                if v is not None:
                    choice.see(n, v)
        chosen = choice.chosen()
        if chosen is not None and chosen != "loss":
            for row in self._rows.values():
                if "loss" in row:  # the loss field itself was not the loss: kept beside it
                    row["loss_as_logged"] = row.pop("loss")
                if chosen in row:
                    row["loss"] = row.pop(chosen)
        return list(choice.notes().values())

    def _build(self, require: tuple[str, ...]) -> Series:
        notes = self._choose_loss()
        records: list[StepRecord] = []
        seen: set[str] = set()
        new, put = object.__new__, object.__setattr__
        rows = self._rows
        for step in sorted(rows):
            # Each row is let go as its record is made: a million-step log is held once, not twice.
            row = rows.pop(step)
            epoch = row.get("epoch")
            if epoch is not None and not (type(epoch) in (int, float) and math.isfinite(epoch)):
                del row["epoch"]  # an infinite or unreadable epoch says nothing of where the data is
            seen.update(row)
            if _PLAIN.issuperset(row):
                # Only float fields (the usual loss/grad_norm/lr/epoch row): no casting to do.
                row.pop("step", None)
                extra: dict[str, Any] = {}
            else:
                row = _typed(row)
                extra = row.pop("extra")
            rec = new(StepRecord)
            # Only the fields the row has are set; the others read the class's defaults. A record
            # so made is equal to one built by __init__, and holds ~200 bytes less than one whose
            # every field was set (2 GB less on a ten-million-step log).
            put(rec, "step", step)
            put(rec, "ts", 0.0)
            for name, value in row.items():
                put(rec, name, value)
            put(rec, "extra", extra)
            records.append(rec)
        # An RL log may carry no loss at all (TRL's PPOTrainer logs objective/kl, objective/scores,
        # loss/policy_avg): its reward and KL are what it is judged on, so they are enough.
        if require and not seen.intersection(require) and objective_of(dict.fromkeys(seen)) is None:
            raise UnreadableLog(
                f"none of the metrics {', '.join(require)} were found, nor an RL or preference "
                "signal (reward, kl, rewards/chosen, objective/kl, ...)"
            )
        metrics = sorted(m for m in seen if m not in {"ts", "skipped", "step"})
        return Series(self.path, self.format, records, metrics=metrics, notes=notes)


# Built without the frozen-dataclass ``__init__``: it sets the 20 fields one
# ``object.__setattr__`` at a time, which costs more than reading the log on 100k-step
# runs; _build sets only the fields a row has (the class holds every field's default).
_MAXF = sys.float_info.max  # an integer in a log past this (a 400-digit loss) cannot become a float
_PLAIN = frozenset(name for name, cast in _FIELDS.items() if cast is float) | {"step"}


def _typed(row: dict[str, Any]) -> dict[str, Any]:
    """StepRecord fields cast to their types, everything else under ``extra``."""
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in row.items():
        cast = _FIELDS.get(name)
        if name == "step":
            continue  # rows may repeat their own step column
        if cast is None:
            extra[name] = value
        elif cast is int:
            if type(value) is int or math.isfinite(value):
                values[name] = int(value)
        elif type(value) is int and not -_MAXF <= value <= _MAXF:
            values[name] = (
                math.inf if value > 0 else -math.inf
            )  # a number past a float's range is infinite to us
        else:
            values[name] = cast(value)
    values["extra"] = extra
    return values
