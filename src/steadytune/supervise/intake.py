"""What comes in at each turn of the supervisor's loop, in the order it is handled.

First the records the source itself makes (a Ray driver's reports), then what is new in
every rank's stream (``telemetry/rank-N.jsonl``), then, once per ``run.sample_interval_s``,
a sample of the system. System samples are kept in ``system.jsonl`` as they are handled.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from steadytune.records import Record, SystemSample
from steadytune.rundir import RunDir
from steadytune.supervise.runstate import Attempt
from steadytune.supervise.source import WorkerSource
from steadytune.telemetry.sampler import SystemSampler
from steadytune.telemetry.stream import JsonlTailer, JsonlWriter


class Intake:
    """The run's incoming records: the source's own, every rank's stream, the system sampler."""

    def __init__(
        self,
        run: RunDir,
        source: WorkerSource,
        sampler: SystemSampler,
        interval_s: float,
        segment_bytes: int = 0,
    ) -> None:
        self.run, self.source, self.sampler, self.interval_s = run, source, sampler, interval_s
        self.tailers: dict[Path, JsonlTailer] = {}  # each follows its stream's rotations
        self.system = JsonlWriter(run.system, segment_bytes)
        self._last_sample = 0.0

    def read(self) -> Iterator[Record]:
        """Everything new, one record at a time: each is handled before the next is read."""
        yield from self.source.poll() or ()  # the engine's own records (ray_source.py), if any
        for path in self.run.telemetry_files():
            tailer = self.tailers.get(path)
            if tailer is None:
                tailer = self.tailers[path] = JsonlTailer(path)
            yield from tailer.read()

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
