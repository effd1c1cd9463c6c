"""Small exact series for detector tests: build records, feed them, collect what was raised."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

from steadytune.detect import DetectConfig, LiveDetector, Transition
from steadytune.records import Anomaly, StepRecord


def records(
    losses: Sequence[float | None],
    grads: Sequence[float | None] | None = None,
    *,
    interval: int = 1,
    epochs: Sequence[float | None] | None = None,
    lr: Sequence[float] | None = None,
    **fields: Sequence[object],
) -> list[StepRecord]:
    """One StepRecord per point, steps ``interval`` apart starting at ``interval``."""
    out = []
    for i, loss in enumerate(losses):
        kw = {k: v[i] for k, v in fields.items()}
        out.append(
            StepRecord(
                step=(i + 1) * interval,
                ts=float(i + 1),
                loss=loss,
                grad_norm=grads[i] if grads is not None else None,
                epoch=epochs[i] if epochs is not None else None,
                lr=lr[i] if lr is not None else None,
                **kw,
            )
        )
    return out


def feed(recs: Iterable[StepRecord], config: DetectConfig | None = None) -> list[Transition]:
    """The transitions of a run fed record by record, then ended (what only its whole length tells)."""
    det = LiveDetector(config)
    out: list[Transition] = []
    for r in recs:
        out.extend(det.observe_step(r))
    out.extend(det.finish())
    return out


def raised(transitions: Iterable[Transition], severe_only: bool = True) -> list[Anomaly]:
    return [
        t.anomaly
        for t in transitions
        if t.state == "raised" and (not severe_only or t.anomaly.severity != "info")
    ]


def final(recs: Iterable[StepRecord], config: DetectConfig | None = None) -> list[Anomaly]:
    """Warning/critical anomalies as they stand at the end of the run (offline replay)."""
    from steadytune.detect import detect

    return [a for a in detect(list(recs), config=config) if a.severity != "info"]


def kinds(transitions: Iterable[Transition]) -> list[str]:
    return [a.kind for a in raised(transitions)]


def severe(transitions: Iterable[Transition]) -> list[tuple[str, int, str]]:
    """(kind, start_step, severity) of every warning or critical anomaly raised: [] on a healthy run."""
    return [(a.kind, a.start_step, a.severity) for a in raised(transitions)]


def noisy(n: int, level: float = 2.0, sigma: float = 0.03, seed: int = 0, decay: float = 0.0) -> list[float]:
    """A loss around ``level`` with log-normal noise, optionally decaying towards half of it."""
    rng = random.Random(seed)
    return [(level * (0.5 + 0.5 * math.exp(-decay * i))) * math.exp(rng.gauss(0.0, sigma)) for i in range(n)]


def grad_noise(n: int, level: float = 1.0, sigma: float = 0.2, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [level * math.exp(rng.gauss(0.0, sigma)) for _ in range(n)]
