"""A long backlog (a supervisor adopting a run far along) is taken a budget at a time, each part
handled, stored and counted before the next is read, and nothing of it is lost."""

from __future__ import annotations

import json
import os
from itertools import pairwise
from pathlib import Path

from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.supervise.intake import RankFiles
from steadytune.supervise.supervisor import Supervisor
from steadytune.telemetry.stream import JsonlWriter
from tests.unit.supervise.build import supervisor

BUDGET = 16 << 10


def test_a_long_backlog_is_taken_a_budget_a_turn_and_wholly(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, train={"max_steps": 10_000})
    sup.intake.budget_bytes = BUDGET
    path = sup.run.telemetry(0)
    with JsonlWriter(path) as w:
        for n in range(1, 5001):
            w.write(StepRecord(step=n, ts=float(n), loss=1.0, grad_norm=1.0, step_time_s=0.1))
    line = path.stat().st_size / 5000
    taken, turns = [0], 0
    while True:
        sup.pump()
        turns += 1
        tailer = sup.intake.tailers[path]
        new = sup.state.progress.step - taken[-1]
        assert new <= 2 * BUDGET / line  # the budget, and at most one chunk past it
        assert tailer.offset <= 2 * BUDGET * turns
        taken.append(sup.state.progress.step)
        if not sup.intake.behind:
            break
    assert sup.state.progress.step == 5000 and sup.state.progress.steps_seen == 5000
    assert turns >= path.stat().st_size // (2 * BUDGET)
    assert all(b > a for a, b in pairwise(taken[:-1]))  # every turn but the last took some


def test_a_stream_within_the_budget_is_read_in_one_turn(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    with JsonlWriter(sup.run.telemetry(0)) as w:
        for n in range(1, 51):
            w.write(StepRecord(step=n, ts=float(n), loss=1.0, grad_norm=1.0))
    sup.pump()
    assert sup.state.progress.step == 50
    assert not sup.intake.behind


def _backlog(sup: Supervisor, ranks: int, steps: int, lagging: int | None = None, lag: int = 0) -> None:
    """Every rank's stream written ahead of the supervisor, as a run it adopts has them: ranks in step,
    or ``lagging`` one ``lag`` steps short of the others (a real straggler, still behind at the end)."""
    for rank in range(ranks):
        last = steps - (lag if rank == lagging else 0)
        with JsonlWriter(sup.run.telemetry(rank)) as w:
            for n in range(1, last + 1):
                w.write(StepRecord(step=n, ts=float(n), rank=rank, loss=2.0, grad_norm=1.0, step_time_s=0.1))


def _take_all(sup: Supervisor) -> list[str]:
    """Every turn until the backlog is taken in; the names of the events filed."""
    while True:
        sup.pump()
        if not sup.intake.behind:
            break
    return [e["name"] for e in map(json.loads, sup.run.events.read_text().splitlines())]


def test_ranks_taken_in_from_a_backlog_keep_in_step_and_none_is_a_straggler(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, train={"max_steps": 10_000})
    sup.intake.budget_bytes = BUDGET  # ~100 steps of a stream a turn: rank 0 alone would run ahead
    _backlog(sup, ranks=4, steps=1200)
    assert "straggler" not in _take_all(sup)
    assert sup.state.progress.step == 1200


def test_a_rank_that_is_behind_at_the_backlogs_end_is_still_a_straggler(tmp_path: Path) -> None:
    """The same backlog with rank 2 200 steps short: it trails the leader where the streams end."""
    sup = supervisor(tmp_path, train={"max_steps": 10_000})
    sup.intake.budget_bytes = BUDGET
    _backlog(sup, ranks=4, steps=1200, lagging=2, lag=200)
    assert "straggler" in _take_all(sup)


def test_a_new_rank_file_is_seen_at_once_or_within_the_listing_interval(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r").create()
    run.telemetry_dir.mkdir(parents=True, exist_ok=True)
    now = [0.0]
    files = RankFiles(run, clock=lambda: now[0], every_s=1.0)
    assert files() == []
    run.telemetry(0).touch()
    assert files() == [run.telemetry(0)]  # the folder changed: listed again at once
    # A file made within the same tick of the folder's clock as the last listing leaves its mtime as it
    # was: it is found when the listing interval has passed.
    before = run.telemetry_dir.stat()
    run.telemetry(1).touch()
    (run.telemetry_dir / "rank-0.00001.jsonl").touch()  # a sealed segment is no live stream
    run.telemetry(10).touch()
    os.utime(run.telemetry_dir, ns=(before.st_atime_ns, before.st_mtime_ns))
    now[0] = 0.5
    assert files() == [run.telemetry(0)]
    now[0] = 1.0
    assert files() == [run.telemetry(0), run.telemetry(1), run.telemetry(10)]  # by rank, not by name
