"""A log read as it streams by: one step's record at a time, none of them kept.

:func:`~steadytune.importers.load` holds a whole log (it must: a file may hold several runs,
which are told apart only once all of it is read, and which of several loss-like series
is the loss is known only at its end). Most logs are one run with one loss, written in
order; ``analyze`` reads those through a :class:`StreamedLog` instead, so its memory does
not grow with the log. The records are made by the very function the whole-log reader
uses (:func:`~.series.make_record`), by the same rules (a step logged several times in a
row is the mean of its values). A log that turns out to need more than that (its step
goes back, it has ranks, a second loss-like series, a damaged step, no loss at all)
raises :class:`NotStreamable` when that shows, and is read whole instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from steadytune.importers.series import TRAIN_LOSS_NAMES, make_record
from steadytune.objectives import objective_of
from steadytune.records import MAX_STEP, StepRecord

# The rows a reader streams: (rank or None, step, numbers under their canonical names).
Row = tuple[int | None, int, dict[str, Any]]

_OTHER_LOSSES = frozenset(TRAIN_LOSS_NAMES) - {"loss"}  # a choice to make: the whole log is needed
_REQUIRED = ("loss", "eval_loss")
_NOT_METRICS = frozenset({"ts", "skipped", "step"})
CHUNK = 256  # the rows read, and records made, ahead of the detectors: what a streamed log holds at most


class NotStreamable(Exception):
    """The log needs the whole-log reader (:func:`~steadytune.importers.load`); ``str()`` says why."""


class StreamedLog:
    """The step records of one log, made as they are iterated; what it holds is known once read.

    Iterate it once: each record is made when the step after it is read, a :data:`CHUNK` at a
    time, and let go once judged. ``steps`` and ``metrics`` are complete when the iteration ends.

    Args:
        path: the log, as the user named it.
        fmt: its format's name.
        rows: opens the log and yields its rows in file order (:data:`Row`), in lists of up to
            :data:`CHUNK`.
    """

    def __init__(self, path: str, fmt: str, rows: Callable[[], Iterable[list[Row]]]) -> None:
        self.path = path
        self.format = fmt
        self._rows = rows
        self._seen: set[str] = set()
        self.steps = 0
        self.notes: list[str] = []  # what reading decided, said once (a line left out); ``rows`` adds them

    @property
    def metrics(self) -> list[str]:
        """The metrics the records hold, sorted (as :attr:`~.series.Series.metrics`)."""
        return sorted(m for m in self._seen if m not in _NOT_METRICS)

    def __iter__(self) -> Iterator[StepRecord]:
        try:
            # Made a chunk at a time, then judged: reading and judging each record in turn costs a
            # sixth more (the interpreter's caches are shared by both).
            for chunk in self._records():
                yield from chunk
        except NotStreamable:
            raise
        except Exception as e:  # the whole-log reader says what is wrong with the file, as ever
            raise NotStreamable(f"{type(e).__name__} while streaming") from e

    def _records(self) -> Iterator[list[StepRecord]]:
        """The records of each block of rows (the last one's last record waits for the next block)."""
        step: int | None = None
        row: dict[str, Any] = {}
        # How many values each metric of the step has had; None while it has had one row (most steps).
        counts: dict[str, int] | None = None
        for block in self._rows():
            done: list[StepRecord] = []
            for rank, s, numbers in block:
                if rank or type(s) is not int or not -MAX_STEP <= s <= MAX_STEP:  # records.valid_step
                    raise NotStreamable("several ranks, or a damaged step number")
                if s != step:
                    if step is not None:
                        if s < step:
                            raise NotStreamable("the step goes back: the file may hold several runs")
                        done.append(self._record(step, row))
                    step, row, counts = s, numbers, None
                    continue
                if counts is None:
                    counts = dict.fromkeys(row, 1)
                for name, value in numbers.items():  # one more sub-batch of the step: the mean
                    n = counts.get(name, 0)
                    old = row.get(name)
                    if n and type(old) in (int, float) and type(value) in (int, float):
                        value = old if old == value else old + (value - old) / (n + 1)  # a NaN stays a NaN
                    row[name] = value
                    counts[name] = n + 1
            yield done
        if step is None:
            raise NotStreamable("no row with a step")
        yield [self._record(step, row)]
        if not self._seen.intersection(_REQUIRED) and objective_of(dict.fromkeys(self._seen)) is None:
            raise NotStreamable("no loss, nor an RL or preference signal")

    def _record(self, step: int, row: dict[str, Any]) -> StepRecord:
        if not _OTHER_LOSSES.isdisjoint(row):
            raise NotStreamable("several loss-like series: the loss is chosen over the whole log")
        self.steps += 1
        return make_record(step, row, self._seen)
