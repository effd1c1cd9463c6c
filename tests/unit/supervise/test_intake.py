"""A long backlog (a supervisor adopting a run far along) is taken a budget at a time, each part
handled, stored and counted before the next is read, and nothing of it is lost."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from steadytune.records import StepRecord
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
