"""What comes in at each turn of the supervisor's loop, in the order it is handled.

First the records the source itself makes (a Ray driver's reports), then what is new in
every rank's stream (``telemetry/rank-N.jsonl``), then, once per ``run.sample_interval_s``,
a sample of the system. System samples are kept in ``system.jsonl`` as they are handled.

A stream is read at most ``budget_bytes`` a turn: a supervisor that adopts a run a million steps
in finds a backlog of gigabytes, and read in one go it was held whole, with every record of it
waiting in the store's batch until the turn ended (and ``status.json`` standing still meanwhile).
Taken a budget at a time, each part is handled, stored and counted before the next is read.

The ranks' streams are taken in step with each other (:func:`in_step`): the record of the lowest
step waiting comes first, whichever rank wrote it, as a live run's ranks write them. Read one
stream after another, rank 0's backlog ran thousands of steps ahead of rank 1's before rank 1
was read at all, and the straggler rule saw rank 1 trail the leader at step 1. A turn ends when
the first stream reaches its budget: the others stop there too, each with the one record it
has read ahead held for the next turn, so no rank runs ahead of the rest by more than a record.
A rank that is behind where its stream ends is still behind: the merge orders what is written,
it does not wait for what is not.

The ranks' files are looked for again only when the telemetry folder changed (its mtime, one
``stat`` a turn) or a second has passed: listed at every turn, with each name matched and made
a path, the folder cost a tenth of the supervisor's own CPU at 10 steps/s, and more as a long
run's sealed segments pile up beside the live files. The second bounds how late a rank's new
file is seen when it was made within the same tick of the folder's clock as the last listing.
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from steadytune.records import Record, StepRecord, SystemSample
from steadytune.rundir import RunDir
from steadytune.supervise.runstate import Attempt
from steadytune.supervise.source import WorkerSource
from steadytune.telemetry.jsonl import CHUNK_BYTES
from steadytune.telemetry.sampler import SystemSampler
from steadytune.telemetry.stream import JsonlTailer, JsonlWriter

BUDGET_BYTES = 4 << 20  # of each stream, per turn: ~7,000 step records of steadytune's own worker


class Intake:
    """The run's incoming records: the source's own, every rank's stream, the system sampler."""

    def __init__(
        self,
        run: RunDir,
        source: WorkerSource,
        sampler: SystemSampler,
        interval_s: float,
        segment_bytes: int = 0,
        budget_bytes: int = BUDGET_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run, self.source, self.sampler, self.interval_s = run, source, sampler, interval_s
        self.budget_bytes = budget_bytes
        self.streams = RankFiles(run, clock)
        self.behind = False  # the last read stopped at the budget: more is waiting, read it without a pause
        self.tailers: dict[Path, JsonlTailer] = {}  # each follows its stream's rotations
        self.held: dict[Path, Record] = {}  # the record each stream read ahead when a turn ended
        self.system = JsonlWriter(run.system, segment_bytes)
        self._last_sample = 0.0

    def skip_backlog(self) -> None:
        """What the streams already hold is not read: a run resumed after it ended replays its history
        from the files (the detectors' rewind), and handled again here, its steps would count twice."""
        for path in self.streams():
            tailer = self.tailers[path] = JsonlTailer(path, chunk_bytes=CHUNK_BYTES, keep_open=True)
            for _ in tailer.records():
                pass

    def read(self) -> Iterator[Record]:
        """What is new, up to the budget of each stream, one record at a time: each is handled before
        the next is read."""
        self.behind = False
        yield from self.source.poll() or ()  # the engine's own records (ray_source.py), if any
        for path in self.streams():
            if path not in self.tailers:
                chunk = min(self.budget_bytes, CHUNK_BYTES)
                self.tailers[path] = JsonlTailer(path, chunk_bytes=chunk, keep_open=True)
        yield from in_step(self.tailers, self.held, self.budget_bytes)
        self.behind = bool(self.held) or any(t.stopped_at_budget for t in self.tailers.values())

    def sample(self, attempt: Attempt, now: float) -> SystemSample | None:
        """A sample of the system (and of the attempt's worker) once per interval; None in between."""
        if now - self._last_sample < self.interval_s:
            return None
        self._last_sample = now
        # Every process the attempt started, so none outlives it; the sample's RSS is theirs (the
        # process table walked once per sample, not twice).
        tree = attempt.tree.note() if attempt.tree is not None else None
        return self.sampler.sample(attempt.worker.pid if attempt.worker and attempt.running() else None, tree)

    def keep(self, sample: SystemSample) -> None:
        self.system.write(sample)

    def close(self) -> None:
        self.system.close()
        for tailer in self.tailers.values():
            tailer.close()


class RankFiles:
    """The live file of each rank's stream, listed again when the folder changed or a second passed."""

    def __init__(self, run: RunDir, clock: Callable[[], float], every_s: float = 1.0) -> None:
        self.run, self.clock, self.every_s = run, clock, every_s
        # Made once: the run's path property builds a new Path at each call, which cost more than the stat.
        self._dir = os.fspath(run.telemetry_dir)
        self._stamp: int | None = None
        self._listed_at = 0.0
        self._files: list[Path] = []

    def __call__(self) -> list[Path]:
        try:
            stamp = os.stat(self._dir).st_mtime_ns  # before the listing: a change after it shows
        except OSError:
            self._stamp, self._files = None, []
            return []
        now = self.clock()
        if stamp != self._stamp or now - self._listed_at >= self.every_s:
            self._stamp, self._listed_at = stamp, now
            self._files = self.run.telemetry_files()
        return self._files


def in_step(
    tailers: dict[Path, JsonlTailer], held: dict[Path, Record], budget_bytes: int
) -> Iterator[Record]:
    """The new records of every stream, merged by step (ties in the streams' order), each stream's
    own order kept; up to ``budget_bytes`` of each, and no further once one stream stops at its
    budget. The record a stream read ahead of that point is left in ``held``, to come first next time.
    """
    sources = {path: tailer.records(budget_bytes) for path, tailer in tailers.items()}
    heads: list[tuple[int, int, Record]] = []  # (step, stream's place, record): the merge's frontier
    paths = list(tailers)
    last_step = dict.fromkeys(paths, -1)

    def advance(i: int) -> bool:
        """Put stream ``i``'s next record in the frontier; False where its reading this turn is over."""
        path = paths[i]
        rec = held.pop(path, None)
        if rec is None:
            rec = next(sources[path], None)
        if rec is None:
            return False
        # A record with no step of its own (a heartbeat, the worker's exit) goes with its stream's last.
        if isinstance(rec, StepRecord):
            last_step[path] = rec.step
        heapq.heappush(heads, (last_step[path], i, rec))
        return True

    # A stream that spent its budget on lines that are no records (bad, too long) holds the turn up too.
    waits = [not advance(i) and tailers[paths[i]].stopped_at_budget for i in range(len(paths))]
    try:
        while heads and not any(waits):
            _, i, rec = heapq.heappop(heads)
            yield rec
            if not advance(i) and tailers[paths[i]].stopped_at_budget:
                break  # this stream waits for the next turn, so every other one does too
    finally:
        for _, i, rec in heads:
            held[paths[i]] = rec
        for source in sources.values():
            source.close()
