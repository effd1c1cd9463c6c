"""The samples of each step: the newest held, older ones read back, and a rollback skips the same ones."""

from __future__ import annotations

import random
from pathlib import Path

from steadytune.records import BatchFingerprint, StepRecord
from steadytune.rundir import RunDir
from steadytune.supervise.samples import SampleLog, samples_between
from steadytune.telemetry.stream import JsonlWriter


def feed(run: RunDir, log: SampleLog, steps: list[tuple[int, int]], ranks: int = 2) -> dict[int, list[int]]:
    """Write ``(step, attempt)`` records of every rank to the streams and note them in ``log``, as the
    supervisor does; returns what a log that holds every step would hold."""
    whole: dict[int, list[int]] = {}
    rng = random.Random(7)
    writers = [JsonlWriter(run.telemetry(r)) for r in range(ranks)]
    for step, attempt in steps:
        for r, w in enumerate(writers):
            ids = tuple(rng.randrange(10**6) for _ in range(4))
            w.write(
                StepRecord(
                    step=step, ts=float(step), rank=r, attempt=attempt, batch=BatchFingerprint(ids, ())
                )
            )
            log.add(step, ids)
            whole.setdefault(step, []).extend(ids)
    for w in writers:
        w.close()
    return whole


def test_the_log_holds_the_newest_steps_only(tmp_path: Path) -> None:
    log = SampleLog(RunDir(tmp_path / "r").create(), keep=500)
    feed(log.run, log, [(s, 0) for s in range(1, 5001)])
    assert 500 <= len(log) <= 1000  # not 5,000: bounded whatever the run's length
    assert min(log) > 5000 - 1000 and max(log) == 5000


def test_a_window_reaching_past_the_held_steps_is_read_back_whole(tmp_path: Path) -> None:
    log = SampleLog(RunDir(tmp_path / "r").create(), keep=300)
    # A rollback to step 400 at step 1,500: attempt 1 trains 401.. again, then goes on to 2,000.
    steps = [(s, 0) for s in range(1, 1501)] + [(s, 1) for s in range(401, 2001)]
    whole = feed(log.run, log, steps)
    assert log.floor > 1000
    for lo, hi in ((0, 2000), (400, 900), (1200, 1800), (1900, 2000)):
        got = samples_between(log, lo, hi)
        want = {s: ids for s, ids in whole.items() if lo < s <= hi}
        assert {s: sorted(ids) for s, ids in got.items()} == {s: sorted(ids) for s, ids in want.items()}


def test_without_a_run_every_step_is_held(tmp_path: Path) -> None:
    log = SampleLog(keep=10)
    for s in range(1, 101):
        log.add(s, (s,))
    assert len(log) == 100 and samples_between(log, 0, 100) == {s: [s] for s in range(1, 101)}


def test_a_rollback_to_the_start_skips_the_same_samples_as_with_every_step_held(tmp_path: Path) -> None:
    from steadytune.policy.engine import Action
    from steadytune.records import Anomaly, PlanRevision
    from steadytune.supervise.restarts import rollback_restart

    log = SampleLog(RunDir(tmp_path / "r").create(), keep=200)
    whole = feed(log.run, log, [(s, 0) for s in range(1, 3001)])
    plan = PlanRevision(revision=0, ts=0, reason="start")
    spike = Action("rollback", "loss_spike", 2990, Anomaly("loss_spike", "warning", 2990, 2990, "loss"))
    # Every checkpoint tried already (or none kept): back to the start, every sample since skipped.
    for verified, tried in (([], []), ([1000, 2500], [2500, 1000])):
        held = rollback_restart(plan, spike, verified, tried, tmp_path / "ck", 2990, log, 0.5)
        every = rollback_restart(plan, spike, verified, tried, tmp_path / "ck", 2990, whole, 0.5)
        assert held == every and held[3] == 0 and held[0] is not None
        assert len(held[0]["skip_ranges"]) > 1000  # 2,990 steps of 8 random ids each
