"""Several runs in one file: where a log's step goes back, and what that means.

A reader that adds records in the order the file holds them (``SeriesBuilder(in_order=True)``)
starts a new *segment* wherever the step goes back. A segment is one of three things,
told apart by what it logs (:func:`split_runs`):

- **a new run**: it logs again a metric at a step the run before already logged, and its
  first step is back at that run's start (at most the run's second step: ``1`` after a run of
  ``0, 1, 2...``, ``10`` after one of ``0, 10, 20...``). A script run twice into one
  ``nohup.out``, a grid of runs appended to one JSON list, a pipeline's stages whose steps
  restart (pretraining, then mid-training, then SFT). Each run is judged on its own, at its
  own step numbers: one run's steps are not another's, and a jump from one run's end to the
  next one's start is no anomaly.
- **an attempt resumed from a checkpoint**: it logs again, with other values, a metric at a
  step the run had logged, but starts later than its start. The attempt before is judged on
  its own (whatever made it stop, a NaN or a blow-up, is in what it logged after the resume
  point); the resumed attempt is judged with the steps before its resume point as its
  history, as a live detector would have seen it, and what it finds before that point is
  the attempt before's.
- **neither**: it logs no metric again at a step that has it (an evaluation written after the
  next training step), logs the same values again (a deterministic resume), or logs one step
  again out of order (a late line): its rows join the run as if they had been in order, and
  the last value of a step logged twice is kept.

A new run or a resumed attempt logs other values at two steps or more, or at every step the
run before has from its first one on (a run that stopped right after its first log).

Where the reader itself knows a run ended (the HF Trainer's closing summary, in a stdout that
names no step), it says so (``SeriesBuilder.new_run``), and the segment after is a new run.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

Rows = dict[int, dict[str, Any]]

# Fields every row of a step may repeat without meaning the step was logged twice.
_BOOKKEEPING = frozenset({"epoch", "lr", "ts", "step", "tokens", "samples", "skipped"})


@dataclass
class Split:
    """The runs of a file, in order: each its rows and ``report_from`` (a resumed attempt's resume step)."""

    runs: list[tuple[Rows, int | None]] = field(default_factory=list)
    restarts: int = 0
    resumes: list[tuple[int, int]] = field(default_factory=list)  # (resumed at, last step before)

    @property
    def note(self) -> str:
        """What the output says about it, once (empty for a file that holds one run)."""
        parts = []
        if self.restarts:
            parts.append(
                f"holds {self.restarts + 1} runs one after another (its step goes back to the start): "
                "each is judged on its own, at its own steps"
            )
        for at, before in self.resumes:
            parts.append(
                f"resumed at step {at} after logging up to step {before} with other values: the attempt "
                "before is judged on its own too"
            )
        return "; ".join(parts)


def _logged_otherwise(run: Rows, seg: Rows) -> int:
    """At how many steps ``seg`` logs a metric again that ``run`` has there, with another value."""
    steps = 0
    for step, row in seg.items():
        old = run.get(step)
        if old is None:
            continue
        for name, value in row.items():
            if name in _BOOKKEEPING or name not in old:
                continue
            prev = old[name]
            if prev != value and not (prev != prev and value != value):  # NaN is NaN here
                steps += 1
                break
    return steps


def _is_another_attempt(run: Rows, seg: Rows) -> bool:
    """Whether ``seg`` runs again over what ``run`` logged: with other values at two steps or more,
    or at every step the run has from its first on (a run that stopped right after its first log).
    One step logged again out of order (a late line, a closing summary) is no second run."""
    steps = _logged_otherwise(run, seg)
    first = min(seg)
    return steps >= 2 or (steps == 1 and sum(1 for s in run if s >= first) == 1)


def _second_step(run: Rows) -> int:
    smallest = heapq.nsmallest(2, run)
    return smallest[-1]


def split_runs(segments: list[Rows], new_runs: set[int] | frozenset[int] = frozenset()) -> Split:
    """The runs a file's segments make (see the module docstring); ``new_runs``: the indices of
    the segments the reader knows start a new run."""
    out = Split()
    run: Rows = dict(segments[0])
    report_from: int | None = None
    for i, seg in enumerate(segments[1:], 1):
        if i in new_runs:
            out.runs.append((run, report_from))
            out.restarts += 1
            run, report_from = dict(seg), None
            continue
        if not _is_another_attempt(run, seg):
            for step, row in seg.items():  # out of order, or logged again alike: one run
                run.setdefault(step, {}).update(row)
            continue
        out.runs.append((run, report_from))
        first = min(seg)
        if first <= _second_step(run):
            out.restarts += 1
            run, report_from = dict(seg), None
        else:
            out.resumes.append((first, max(run)))
            history = {step: dict(row) for step, row in run.items() if step < first}
            run, report_from = {**history, **seg}, first
    out.runs.append((run, report_from))
    return out
