"""Offline detection: replay a finished run through the live engine.

There is one implementation of every detector. ``analyze`` and the benchmarks
call :func:`detect` on records read back from any log, and get the anomalies
the supervisor would have raised live, each with its final ``end_step``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from steadytune.config.detect import DetectConfig
from steadytune.detect.live import LiveDetector
from steadytune.records import Anomaly, StepRecord, SystemSample


@dataclass(frozen=True)
class Replay:
    """What a replayed run raised, and the objective its training signal was judged as."""

    anomalies: list[Anomaly]
    objective: str


def detect(
    records: Iterable[StepRecord],
    system: Iterable[SystemSample] = (),
    config: DetectConfig | None = None,
) -> list[Anomaly]:
    """Every anomaly in a run, in order of its first step (:func:`replay`'s anomalies)."""
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
    found: list[Anomaly] = []
    samples = sorted(system, key=lambda s: s.ts)
    i = 0
    for rec in records:
        while i < len(samples) and rec.ts and samples[i].ts <= rec.ts:
            found.extend(t.anomaly for t in det.observe_system(samples[i]) if t.state == "resolved")
            i += 1
        for t in det.observe_step(rec):
            if t.state == "resolved":
                found.append(t.anomaly)
    for s in samples[i:]:
        found.extend(t.anomaly for t in det.observe_system(s) if t.state == "resolved")
    found.extend(det.open_anomalies())
    found.sort(key=lambda a: (a.start_step, a.end_step, a.kind, a.metric))
    return Replay(found, det.objective)
