"""The common in-memory form of an imported log, and how raw values get into it.

Every importer emits ``(step, metric, value)`` triples into a
:class:`SeriesBuilder`; it orders the steps and turns them into :class:`StepRecord`
objects, the same records a live run writes. Detectors then never know where the
numbers came from.

A reader that hands its records over in the order the file holds them (``in_order``)
gets two rules more (docs/detectors.md, *Several runs in one file*): values a step
logs several times in a row (a loss per micro-batch) become their mean, one value
per step; and where the step goes back, the file holds several runs or attempts,
which :mod:`~steadytune.importers.runs` tells apart, each judged on its own.
Otherwise the *last* value per step and metric is kept.
"""

from __future__ import annotations

import gc
import math
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from steadytune.importers.runs import Rows, split_runs
from steadytune.objectives import objective_of
from steadytune.records import StepRecord, SystemSample, valid_step


class UnreadableLog(Exception):
    """A file that is not a training log this tool can read; ``str()`` is a one-line reason."""


# A log read whole holds every step at once (~330 bytes each, plus what its reader parsed on the
# way): past this many, it is refused rather than allowed to take the machine's memory (a 400 KB
# gzip of one-line steps unpacks to 21 M of them). Logs streamed (importers/stream.py) hold none
# and have no such bound.
MAX_RECORDS = 2_000_000


def too_many_steps() -> UnreadableLog:
    """The error for a log read whole that holds more than :data:`MAX_RECORDS` steps."""
    return UnreadableLog(
        f"more than {MAX_RECORDS:,} steps to hold: a log in this format is read whole (~330 bytes "
        "a step); split it, or write it as uncompressed JSON lines (one object per step), which "
        "are read as they stream, at any length"
    )


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
    "optim/total_grad_norm": "grad_norm",  # OLMo
    "total_grad_norm": "grad_norm",
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
    "val/loss": "eval_loss",  # verl's SFT trainer, Lightning
    "iteration-time": "step_time_s",
    "mem-allocated-bytes": "mem_allocated_bytes",
    "mem-max-allocated-bytes": "mem_peak_bytes",
}


_NAMES: dict[str, str] = dict(ALIASES)  # every name met, canonical: filled as logs are read
_MAX_NAMES = 1 << 16


# A batch's mean reward, however a script spells it, is TRL's ``reward``; its spread ``reward_std``.
# A mean reward inside a printed dict (``reward_data.mean_reward``) says it is a mean; a bare
# ``reward.reward`` may be one sample's, and is not taken for the batch's.
_MEAN_REWARD = re.compile(
    r"^(?:(?:avg|average|mean)[_/]|[\w/]+\.(?:avg|average|mean)_)?rewards?(?:_score)?(?:[_/](?:avg|average|mean))?$",
    re.IGNORECASE,
)
_REWARD_SPREAD = re.compile(r"^(?:rewards?[_/]std|std[_/]rewards?)$", re.IGNORECASE)


def canonical(name: str) -> str:
    """A metric's name as the detectors know it: its alias (:data:`ALIASES`), and without the
    ``train/`` that the Trainer's TensorBoard and W&B callbacks put before every training key
    (``train/reward`` is TRL's ``reward``), ``eval/x`` as the Trainer names it (``eval_x``); a
    mean reward (``mean_reward``, ``avg_reward``, ``reward/mean``, ``average_reward_score``,
    ``Reward``, a printed dict's ``reward_data.mean_reward``) is ``reward``, its spread
    (``std_reward``, ``rewards/std``) ``reward_std``."""
    out = ALIASES.get(name)
    if out is None:
        if _MEAN_REWARD.match(name):
            out = "reward"
        elif _REWARD_SPREAD.match(name):
            out = "reward_std"
        elif name.startswith("train/") and len(name) > 6:
            out = ALIASES.get(name[6:], name[6:])
        elif name.startswith("eval/") and len(name) > 5:
            out = ALIASES.get(f"eval_{name[5:]}", f"eval_{name[5:]}")
        else:
            out = name
    if len(_NAMES) < _MAX_NAMES:
        _NAMES[name] = out
    return out


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
    "crossentropyloss",  # OLMo's train/CrossEntropyLoss
    "cross_entropy_loss",
    "ce_loss",  # OLMo-core's "train/CE loss"
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


def is_summary(values: Mapping[str, object]) -> bool:
    """The Trainer's closing entry (``train_runtime``, ``train_loss``, ``total_flos``): a summary of
    the run, not an optimizer step.

    A step's own entry may carry the run time so far too (TRL 0.2x, and the Trainer with
    ``include_num_input_tokens_seen``, log ``train_runtime`` and ``train_tokens_per_second`` beside
    every loss): with a ``loss``, it is a step."""
    return (
        "train_runtime" in values or "train_loss" in values or "total_flos" in values
    ) and "loss" not in values


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


class Run(NamedTuple):
    """One run of a file that holds several: its records, and from which step its findings are its own.

    ``report_from``: for an attempt resumed from a checkpoint, the step it resumed at. Its records
    start with the steps the attempt before logged (the history a live detector would have had);
    what is found before ``report_from`` is the attempt before's, and reported there.
    """

    records: list[StepRecord]
    report_from: int | None = None
    label: str = ""


@dataclass
class Series:
    """One imported log: its step records (all ranks), system samples, and what it holds.

    A file holding several runs (appended, restarted, resumed with other values) has them one
    after another in ``records``, each ordered by step; ``parts`` says where each begins.
    """

    path: str
    format: str
    records: list[StepRecord]
    system: list[SystemSample] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what reading decided, said once (a loss ignored)
    parts: list[tuple[int, int | None]] = field(default_factory=list)  # (first record, report_from)

    @property
    def steps(self) -> int:
        return len({r.step for r in self.records})

    def runs(self) -> list[Run]:
        """The runs the file holds, each to be judged on its own (one for most files)."""
        if len(self.parts) < 2:
            return [Run(self.records)]
        ends = [start for start, _ in self.parts[1:]] + [len(self.records)]
        n = len(self.parts)
        return [
            Run(self.records[start:end], report_from, f"run {i} of {n}")
            for i, ((start, report_from), end) in enumerate(zip(self.parts, ends, strict=True), 1)
        ]

    def values(self, metric: str, records: list[StepRecord] | None = None) -> tuple[list[int], list[float]]:
        """Steps and values of one metric (a StepRecord field or an ``extra`` key), primary rank;
        of ``records`` (one of :meth:`runs`) when given."""
        xs: list[int] = []
        ys: list[float] = []
        records = self.records if records is None else records
        rank = min((r.rank for r in records), default=0)
        for r in records:
            if r.rank != rank:
                continue
            v = getattr(r, metric, None) if metric in _FIELDS else r.extra.get(metric)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                xs.append(r.step)
                ys.append(float(v))
        return xs, ys


class SeriesBuilder:
    """Collects (step, metric, value); the last value per step and metric wins.

    ``in_order``: the reader adds records in the order the file holds them, so a value logged
    again at the step just logged is one more sub-batch of that step (their mean is kept), and
    a step that goes back starts another segment of the file (:func:`runs.split_runs`).
    """

    def __init__(self, path: str, fmt: str, in_order: bool = False) -> None:
        self.path = path
        self.format = fmt
        self._rows: Rows = {}
        self._segments: list[Rows] = []
        self._in_order = in_order
        self._last: int | None = None  # the step added last
        self._seen: dict[str, int] = {}  # how many values each metric of that step has had
        self._held = 0  # the rows held, every segment's (a step of two segments is two)
        self._new_runs: list[int] = []  # ids of the segments a reader said start a new run
        self.notes: list[str] = []  # what the reader decided, said once beside the builder's own

    def _target(self, step: int) -> dict[str, Any]:
        """The row of ``step``; in order, a step lower than the last one starts another segment."""
        if step != self._last:
            if self._in_order and self._last is not None and step < self._last and self._rows:
                self._segments.append(self._rows)
                self._rows = {}
            self._last = step
            self._seen = {}
        target = self._rows.get(step)
        if target is None:
            self._count()
            target = self._rows[step] = {}
        return target

    def new_run(self) -> None:
        """What is added from here on is another run, whatever its steps: the reader knows where
        the run before ended (the HF Trainer's closing summary), which steps alone may not show
        (a Trainer's stdout names no step: its steps are counted from each run's start)."""
        if self._rows:
            self._segments.append(self._rows)
            self._rows = {}
        if self._segments:
            self._new_runs.append(id(self._rows))
        self._last = None
        self._seen = {}

    def _count(self) -> None:
        """One more step held; past :data:`MAX_RECORDS`, the log is refused."""
        self._held += 1
        if self._held > MAX_RECORDS:
            raise too_many_steps()

    def _put(self, target: dict[str, Any], name: str, value: Any) -> None:
        """Set a value; in order, a metric the step already has is one more sub-batch: the mean."""
        n = self._seen.get(name, 0) if self._in_order else 0
        old = target.get(name)
        if n and type(old) in (int, float) and type(value) in (int, float):
            value = old if old == value else old + (value - old) / (n + 1)  # a NaN stays a NaN
        target[name] = value
        if self._in_order:
            self._seen[name] = n + 1

    def add(self, step: int, metric: str, value: Any) -> None:
        if value is None:
            return
        self._put(self._target(step), _NAMES.get(metric) or canonical(metric), value)

    def add_numbers(self, step: int, row: Mapping[str, Any]) -> None:
        """Add the int/float fields of a parsed JSON row as they are (the fast path for big logs)."""
        numbers = canonical_numbers(row)
        if not self._in_order:  # last value wins: the fast path of a trainer_state.json
            target = self._rows.get(step)
            if target is None:
                self._count()
                self._rows[step] = numbers
            else:
                target.update(numbers)
            return
        target = self._target(step)
        if not target:  # the usual case: a step's first row
            target.update(numbers)
            self._seen = dict.fromkeys(numbers, 1)
        else:
            for name, value in numbers.items():
                self._put(target, name, value)

    def add_row(self, step: int, row: dict[str, Any], nan_means_missing: bool = False) -> None:
        """Add every numeric field of one logged row (strings are parsed)."""
        target = self._target(step)
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
            self._put(target, _NAMES.get(key) or canonical(key), x)

    def discard(self, step: int) -> None:
        """Forget what was added for ``step`` (another rank's line is to replace it)."""
        if self._rows.pop(step, None) is not None:
            self._held -= 1
        if step == self._last:
            self._seen = {}

    def __len__(self) -> int:
        return len(self._rows) + sum(len(s) for s in self._segments)

    def steps(self) -> list[int]:
        """The steps added so far (those of every segment), in the order first added."""
        return [step for seg in (*self._segments, self._rows) for step in seg]

    def build(self, require: tuple[str, ...] = ()) -> Series:
        marked = [(s, id(s) in self._new_runs) for s in (*self._segments, self._rows) if s]
        if any(not valid_step(s) for seg, _ in marked for s in seg):  # a damaged step: that row is left out
            marked = [({s: row for s, row in seg.items() if valid_step(s)}, new) for seg, new in marked]
            marked = [(seg, new) for seg, new in marked if seg]
        if not marked:
            wanted = f" (looked for entries with a step and {' / '.join(require)})" if require else ""
            raise UnreadableLog(f"no logged steps found{wanted}")
        segments = [seg for seg, _ in marked]
        new_runs = {i for i, (_, new) in enumerate(marked) if new and i}
        with no_gc():
            return self._build(segments, require, new_runs)

    @staticmethod
    def _choose_loss(runs: list[Rows]) -> list[str]:
        """Make the training loss (:class:`LossChoice`) the rows' ``loss``; the other loss-like
        series stay beside it under their names, not judged. Returns what was ignored, said once."""
        names: set[str] = set()
        for rows in runs:
            for row in rows.values():
                names.update(row)
        candidates = [n for n in TRAIN_LOSS_NAMES if n in names]
        if not candidates or candidates == ["loss"]:
            return []  # the usual log: one loss, under its usual name
        choice = LossChoice()
        for rows in runs:
            for row in rows.values():
                for n in candidates:
                    v = row.get(n)
                    if v is not None:
                        choice.see(n, v)
        chosen = choice.chosen()
        if chosen is not None and chosen != "loss":
            for rows in runs:
                for row in rows.values():
                    if "loss" in row:  # the loss field itself was not the loss: kept beside it
                        row["loss_as_logged"] = row.pop("loss")
                    if chosen in row:
                        row["loss"] = row.pop(chosen)
        return list(choice.notes().values())

    def _build(self, segments: list[Rows], require: tuple[str, ...], new_runs: set[int]) -> Series:
        split = split_runs(segments, new_runs) if len(segments) > 1 else None
        runs = [rows for rows, _ in split.runs] if split else segments
        notes = [*self.notes, *self._choose_loss(runs)]
        if split and split.note:
            notes.append(split.note)
        records: list[StepRecord] = []
        parts: list[tuple[int, int | None]] = []
        seen: set[str] = set()
        for i, rows in enumerate(runs):
            parts.append((len(records), split.runs[i][1] if split else None))
            self._records(rows, records, seen)
        # An RL log may carry no loss at all (TRL's PPOTrainer logs objective/kl, objective/scores,
        # loss/policy_avg): its reward and KL are what it is judged on, so they are enough.
        if require and not seen.intersection(require) and objective_of(dict.fromkeys(seen)) is None:
            raise UnreadableLog(
                f"none of the metrics {', '.join(require)} were found, nor an RL or preference "
                "signal (reward, kl, rewards/chosen, objective/kl, ...)"
            )
        metrics = sorted(m for m in seen if m not in {"ts", "skipped", "step"})
        series = Series(self.path, self.format, records, metrics=metrics, notes=notes)
        if len(parts) > 1:
            series.parts = parts
        return series

    @staticmethod
    def _records(rows: Rows, records: list[StepRecord], seen: set[str]) -> None:
        for step in sorted(rows):
            # Each row is let go as its record is made: a million-step log is held once, not twice.
            records.append(make_record(step, rows.pop(step), seen))


def canonical_numbers(row: Mapping[str, Any]) -> dict[str, Any]:
    """The int/float fields of a parsed JSON row under their canonical names (an integer past a
    float's range is infinite)."""
    return {
        _NAMES.get(k) or canonical(k): v
        if type(v) is float or -_MAXF <= v <= _MAXF
        else (math.inf if v > 0 else -math.inf)
        for k, v in row.items()
        if type(v) is float or type(v) is int
    }


def make_record(step: int, row: dict[str, Any], seen: set[str]) -> StepRecord:
    """The record of one step's row (which it may change), its field names added to ``seen``.

    Shared by the reader that holds a whole log and the one that streams it
    (:mod:`~steadytune.importers.stream`), so both make the very same records.
    """
    epoch = row.get("epoch")
    if epoch is not None and not (type(epoch) in (int, float) and math.isfinite(epoch)):
        del row["epoch"]  # an infinite or unreadable epoch says nothing of where the data is
    seen.update(row)
    if _PLAIN.issuperset(row):
        # Only float fields (the usual loss/grad_norm/lr/epoch row): no casting to do.
        values, extra = row, {}
    else:
        values = _typed(row)
        extra = values.pop("extra")
    rec = _new(StepRecord)
    # Only the fields the row has are set; the others read the class's defaults. A record
    # so made is equal to one built by __init__, and holds ~200 bytes less than one whose
    # every field was set (2 GB less on a ten-million-step log). One call a field: the fields put in
    # place as one dict saved the reader about what they then cost the detectors reading them.
    _put(rec, "ts", 0.0)
    for name, value in values.items():
        _put(rec, name, value)
    _put(rec, "step", step)
    _put(rec, "extra", extra)
    return rec


_new, _put = object.__new__, object.__setattr__

# Built without the frozen-dataclass ``__init__``: it sets the 20 fields one
# ``object.__setattr__`` at a time, which costs more than reading the log on 100k-step
# runs; make_record sets only the fields a row has (the class holds every field's default).
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
