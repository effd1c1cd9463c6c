"""Offline detection: replay a finished run through the live engine.

There is one implementation of every detector. ``analyze`` and the benchmarks
call :func:`detect` on records read back from any log, and get the anomaly
episodes the supervisor would have raised live, each with its final ``end_step``,
``count`` and ``peak``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from steadytune.config.detect import DetectConfig
from steadytune.detect.episodes import Transition
from steadytune.detect.live import LiveDetector
from steadytune.records import Anomaly, StepRecord, SystemSample


@dataclass(frozen=True)
class Replay:
    """What a replayed run raised, and the objective its training signal was judged as.

    ``firings[i]`` are the steps at which the condition of ``anomalies[i]`` fired: its
    start, and the start of each time it came back within the episode.
    """

    anomalies: list[Anomaly]
    objective: str
    firings: list[tuple[int, ...]]


def detect(
    records: Iterable[StepRecord],
    system: Iterable[SystemSample] = (),
    config: DetectConfig | None = None,
) -> list[Anomaly]:
    """Every anomaly episode in a run, in order of its first step (:func:`replay`'s anomalies)."""
    return replay(records, system, config).anomalies


def replay(
    records: Iterable[StepRecord],
    system: Iterable[SystemSample] = (),
    config: DetectConfig | None = None,
) -> Replay:
    """Every anomaly in a run, in order of its first step, and what its objective was judged as.

    Step records are replayed in the order given; system samples are
    interleaved by timestamp (samples with no step records around them go last).
    """
    det = LiveDetector(config)
    done: list[tuple[Anomaly, tuple[int, ...]]] = []
    fired: dict[tuple[str, str, int | None], list[int]] = {}

    def take(transitions: list[Transition]) -> None:
        for t in transitions:
            if t.state == "raised":
                fired[t.anomaly.key] = [t.anomaly.start_step]
            elif t.state == "recurred":
                fired[t.anomaly.key].append(t.fired.start_step)
            elif t.took:  # a graver kind grew out of its parts' episodes: theirs are its firings
                grown = [s for p in t.took for s in fired.pop(p.key)]
                fired[t.anomaly.key] = sorted([*grown, t.fired.start_step])
            elif t.state == "resolved":
                done.append((t.anomaly, tuple(fired.pop(t.anomaly.key))))

    samples = sorted(system, key=lambda s: s.ts)
    i = 0
    for rec in records:
        while i < len(samples) and rec.ts and samples[i].ts <= rec.ts:
            take(det.observe_system(samples[i]))
            i += 1
        changed = det.observe_step(rec)
        if changed:
            take(changed)
    for s in samples[i:]:
        take(det.observe_system(s))
    take(det.finish())  # the run is over: what only its whole length tells
    came_back = {id(a) for a, _ in done}
    done.extend((a, tuple(fired[a.key])) for a in det.open_anomalies())
    done = [(in_hindsight(a, id(a) in came_back, [b for b, _ in done]), f) for a, f in done]
    done.sort(key=lambda d: (d[0].start_step, d[0].end_step, d[0].kind, d[0].metric))
    return Replay([a for a, _ in done], det.objective, [f for _, f in done])


GRAD_SPIKE_ALONE = "the gradient norm jumped while the loss did not: an unusual batch"
GRAD_SPIKE_WITH_LOSS = (
    "the gradient norm jumped with the loss (a loss spike at the same steps): one bad batch or update"
)
GRAD_EXPLOSION_WITH_LOSS = (
    "the gradient norm jumped far over its level with the loss (a loss spike at the same steps): an "
    "update large enough to throw the model off"
)
DIVERGENCE_CAME_BACK = (
    "the loss climbed away from its best level (steps {start}-{end}), then came back: a passing instability "
    "(a run of hard batches, an LR near the edge) rather than a lasting divergence"
)


def _overlap(a: Anomaly, b: Anomaly) -> bool:
    return a.start_step <= b.end_step and b.start_step <= a.end_step


def in_hindsight(a: Anomaly, came_back: bool, found: Sequence[Anomaly]) -> Anomaly:
    """An anomaly's cause as the whole run tells it; live, it was written before the run went on.

    A gradient spike or explosion says whether the loss jumped at the same steps (a loss spike of the
    same rank overlapping it), and a divergence that ended (``came_back``) no longer says it did not
    come back.
    """
    if a.kind in ("grad_spike", "grad_explosion"):
        with_loss = any(b.kind == "loss_spike" and b.rank == a.rank and _overlap(a, b) for b in found)
        if a.kind == "grad_spike":
            return dataclasses.replace(a, cause=GRAD_SPIKE_WITH_LOSS if with_loss else GRAD_SPIKE_ALONE)
        if with_loss:  # the explosion a loss spike made, whether or not the norm stayed up
            return dataclasses.replace(a, cause=GRAD_EXPLOSION_WITH_LOSS)
    if a.kind == "divergence" and came_back:
        return dataclasses.replace(a, cause=DIVERGENCE_CAME_BACK.format(start=a.start_step, end=a.end_step))
    return a


class RunLike(Protocol):
    """One run of a log that may hold several (``importers.series.Run``)."""

    @property
    def records(self) -> list[StepRecord]: ...
    @property
    def report_from(self) -> int | None: ...
    @property
    def label(self) -> str: ...


def replay_runs(
    runs: Sequence[RunLike],
    system: Iterable[SystemSample] = (),
    config: DetectConfig | None = None,
) -> Replay:
    """:func:`replay` of each run a file holds, on its own (docs/detectors.md, *Several runs in one file*).

    A file with one run is replayed as it is. With several, each anomaly's evidence names its run
    (``"run": "run 2 of 3"``); a resumed attempt's findings before its resume point are left to the
    attempt before, which holds them. The objective is the one most runs were judged as.
    """
    if len(runs) == 1:
        return replay(runs[0].records, system, config)
    system = list(system)
    found: list[tuple[Anomaly, tuple[int, ...]]] = []
    objectives: Counter[str] = Counter()
    for run in runs:
        judged = replay(run.records, system, config)
        objectives[judged.objective] += 1
        for a, fired in zip(judged.anomalies, judged.firings, strict=True):
            if run.report_from is not None and a.start_step < run.report_from:
                continue
            found.append((dataclasses.replace(a, evidence={**a.evidence, "run": run.label}), fired))
    return Replay([a for a, _ in found], objectives.most_common(1)[0][0], [f for _, f in found])
