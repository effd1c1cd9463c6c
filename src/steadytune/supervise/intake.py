"""What comes in at each turn of the supervisor's loop, in the order it is handled.

First the records the source itself makes (a Ray driver's reports), then what is new in
every rank's stream (``telemetry/rank-N.jsonl``), then, once per ``run.sample_interval_s``,
a sample of the system. System samples are kept in ``system.jsonl`` as they are handled.

A stream is read at most ``budget_bytes`` a turn: a supervisor that adopts a run a million steps
in finds a backlog of gigabytes, and read in one go it was held whole, with every record of it
waiting in the store's batch until the turn ended (and ``status.json`` standing still meanwhile).
Taken a budget at a time, each part is handled, stored and counted before the next is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from steadytune.records import Record, SystemSample
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
    ) -> None:
        self.run, self.source, self.sampler, self.interval_s = run, source, sampler, interval_s
        self.budget_bytes = budget_bytes
        self.behind = False  # the last read stopped at the budget: more is waiting, read it without a pause
        self.tailers: dict[Path, JsonlTailer] = {}  # each follows its stream's rotations
        self.system = JsonlWriter(run.system, segment_bytes)
        self._last_sample = 0.0

    def read(self) -> Iterator[Record]:
        """What is new, up to the budget of each stream, one record at a time: each is handled before
        the next is read."""
        self.behind = False
        yield from self.source.poll() or ()  # the engine's own records (ray_source.py), if any
        for path in self.run.telemetry_files():
            tailer = self.tailers.get(path)
            if tailer is None:
                chunk = min(self.budget_bytes, CHUNK_BYTES)
                tailer = self.tailers[path] = JsonlTailer(path, chunk_bytes=chunk)
            yield from tailer.records(self.budget_bytes)
            self.behind |= tailer.stopped_at_budget

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
