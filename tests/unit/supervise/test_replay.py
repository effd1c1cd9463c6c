"""A restart's detection replay: the detector it rebuilds decides what one uninterrupted run over the
same timeline decides, whatever else the streams hold (earlier attempts, evals, other records, a torn
line), and each stream is parsed once."""

from __future__ import annotations

import math
import random
from pathlib import Path

from steadytune.config.detect import DetectConfig
from steadytune.detect.episodes import Transition
from steadytune.detect.live import LiveDetector
from steadytune.records import Heartbeat, StepRecord, step_head, to_json
from steadytune.rundir import RunDir
from steadytune.supervise.replay import latest_attempts, replay_detector
from steadytune.telemetry.stream import JsonlWriter


def _healthy(n: int) -> float:
    return 2.0 / (1.0 + n / 300) + 0.5 + random.Random(n).gauss(0.0, 0.02)


def _step(n: int, attempt: int, rank: int = 0, *, loss: float | None = None, **extra: object) -> StepRecord:
    rng = random.Random(n * 7 + attempt)
    level = _healthy(n) if loss is None else loss
    return StepRecord(
        step=n, ts=100.0 + n, rank=rank, attempt=attempt, loss=level, grad_norm=1.0 + 0.1 * math.sin(n),
        lr=1e-4, step_time_s=0.5 + 0.01 * rng.random(), extra=dict(extra),
    )  # fmt: skip


def _spiky(n: int, attempt: int) -> StepRecord:
    """Attempt 0's timeline: a loss spike at 150, and from 201 a loss four times as high (the trouble
    a rollback leaves behind: its steps must not be the baseline the restarted detector judges by)."""
    if n == 150:
        return _step(n, attempt, loss=9.0)
    return _step(n, attempt, loss=4.0 * _healthy(n)) if n > 200 else _step(n, attempt)


def _write(run: RunDir) -> list[StepRecord]:
    """Attempt 0 to step 300, attempt 1 from checkpoint 200 to 280 (it died mid-line), attempt 2 from
    240 to 320, its first line lost to the torn one; evals and heartbeats between. Returns the
    timeline one uninterrupted run has."""
    path = run.telemetry(0)
    with JsonlWriter(path) as w:
        for n in range(1, 301):
            w.write(_spiky(n, 0))
            if n % 50 == 0:
                w.write(_step(n, 0, loss=5.0, eval=True))  # an eval at the same step is no train step
                w.write(Heartbeat(ts=100.0 + n, rank=0, attempt=0, step=n))
        for n in range(201, 281):
            w.write(_step(n, 1))
    with path.open("a") as f:  # attempt 1 died mid-line; attempt 2's first line is written onto it
        f.write(to_json(_step(281, 1))[:60])
    with JsonlWriter(path) as w:
        for n in range(241, 321):
            w.write(_step(n, 2))
    return (
        [_spiky(n, 0) for n in range(1, 201)]
        + [_step(n, 1) for n in range(201, 242)]
        + [_step(n, 2) for n in range(242, 321)]
    )


def _decisions(det: LiveDetector, after: list[StepRecord]) -> list[Transition]:
    return [t for rec in after for t in det.observe_step(rec)]


def test_the_replayed_detector_decides_as_one_uninterrupted_run(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    timeline = _write(run)
    for upto in (120, 240, 320):
        replayed = replay_detector(run, DetectConfig(), upto)
        straight = LiveDetector(DetectConfig())
        for rec in timeline:
            if rec.step <= upto:
                straight.observe_step(rec)
        assert replayed.open_anomalies() == straight.open_anomalies()
        # What both decide next: the same transitions, a spike and a climb among them.
        after = [_step(n, 3) for n in range(upto + 1, upto + 40)] + [_step(upto + 40, 3, loss=30.0)]
        after += [_step(n, 3, loss=20.0 + n) for n in range(upto + 41, upto + 80)]
        got, want = _decisions(replayed, after), _decisions(straight, after)
        assert got == want and want


def test_the_look_for_each_steps_latest_attempt_reads_what_parsing_every_record_reads(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    timeline = _write(run)
    assert latest_attempts(run.telemetry(0), 320) == {rec.step: rec.attempt for rec in timeline}
    assert max(latest_attempts(run.telemetry(0), 250)) == 250


def test_a_step_records_head_is_read_only_where_it_is_to_jsons() -> None:
    line = to_json(_step(12, 3, rank=5)).encode()
    assert step_head(line) == (12, 3)
    assert step_head(to_json(_step(12, 3, eval=True)).encode()) is None  # parsed, and left out
    assert step_head(to_json(Heartbeat(ts=1.0, rank=0, attempt=0, step=12)).encode()) == ()
    assert step_head(line[:40] + line) is None  # torn: the parser refuses it
    assert step_head(b'{"step":12,"type":"step","attempt":3}') is None  # another writer's order: parsed
