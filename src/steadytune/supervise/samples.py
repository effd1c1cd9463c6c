"""The samples of each step, for rollback-and-skip: the recent steps held, older ones read back.

A rollback skips the samples of the steps between its checkpoint and the anomaly's end, so the
supervisor notes every step's batch fingerprint as it reads it. Held for the whole run, that
note grew with it (about 0.45 KB a step and rank: 450 MB at a million steps of one rank). The
stream already holds every fingerprint, so :class:`SampleLog` holds only the newest ``keep``
steps and reads older ones back from ``telemetry/rank-N.jsonl`` when a rollback reaches past
them: rare (a checkpoint from long ago, or the start), and no costlier than the detection
replay every restart already makes. What a rollback skips is the same either way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import iter_records

KEEP_STEPS = 10_000


class SampleLog(Mapping[int, list[int]]):
    """``step -> sample ids`` (every rank, every attempt of the step), as read; the newest steps only.

    ``run``: where older steps are read back from; without one, every step is held.
    Steps at or below :attr:`floor` are not held (a step below it noted later, by an attempt that
    went back, is in the stream and read back with the rest).
    """

    def __init__(self, run: RunDir | None = None, keep: int = KEEP_STEPS) -> None:
        self.run, self.keep = run, keep
        self.floor = 0
        self._by_step: dict[int, list[int]] = {}
        self._top = 0

    def add(self, step: int, indices: Sequence[int]) -> None:
        if step <= self.floor:
            return
        self._by_step.setdefault(step, []).extend(indices)
        self._top = max(self._top, step)
        if self.run is not None and self._top - self.floor > 2 * self.keep:  # amortised: once per keep steps
            self.floor = self._top - self.keep
            self._by_step = {s: ids for s, ids in self._by_step.items() if s > self.floor}

    def between(self, lo: int, hi: int) -> dict[int, list[int]]:
        """The samples of the steps ``lo < step <= hi``; those at or below the floor read back."""
        out = {s: ids for s, ids in self._by_step.items() if lo < s <= hi}
        if lo < self.floor and self.run is not None:
            top = min(hi, self.floor)
            for path in self.run.telemetry_files():
                for rec in iter_records(path):
                    if isinstance(rec, StepRecord) and lo < rec.step <= top and rec.batch is not None:
                        out.setdefault(rec.step, []).extend(rec.batch.indices)
        return out

    # Mapping: what is held (a rollback asks through samples_between, which reads back the rest).
    def __getitem__(self, step: int) -> list[int]:
        return self._by_step[step]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_step)

    def __len__(self) -> int:
        return len(self._by_step)


def samples_between(samples: Mapping[int, Sequence[int]], lo: int, hi: int) -> Mapping[int, Sequence[int]]:
    """The samples of the steps ``lo < step <= hi``: a :class:`SampleLog` reads back what it no longer
    holds; any other mapping is taken as whole."""
    if isinstance(samples, SampleLog):
        return samples.between(lo, hi)
    return {s: ids for s, ids in samples.items() if lo < s <= hi}
