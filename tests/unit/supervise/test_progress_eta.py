"""The ETA after a rollback: the abandoned attempt's late lines must not move the step."""

from __future__ import annotations

import pytest

from steadytune.records import StepRecord
from steadytune.telemetry.progress import RunProgress


def step(s: int, attempt: int = 0, t: float = 2.0) -> StepRecord:
    return StepRecord(step=s, ts=float(s), attempt=attempt, loss=1.0, tokens=100, step_time_s=t)


def test_eta_after_a_rollback_counts_from_the_resume_step() -> None:
    p = RunProgress(max_steps=40)
    for s in range(1, 41):  # the first attempt reached the end (and ended non-finite)
        p.add(step(s))
    assert p.eta_s == 0
    p.rewind(10, attempt=1)  # rolled back to checkpoint-10: 25% of the run
    assert p.step == 10 and p.eta_s == pytest.approx(30 * 2.0)
    # Lines the first attempt wrote while it was being stopped, read after the restart.
    for s in (39, 40):
        p.add(step(s, attempt=0))
    assert p.step == 10 and p.eta_s == pytest.approx(30 * 2.0)
    p.add(step(11, attempt=1, t=4.0))
    assert p.step == 11 and p.eta_s == pytest.approx(29 * 2.0)  # the median of recent step times


def test_a_source_that_restarts_on_its_own_is_followed_from_its_first_step() -> None:
    # A Ray worker group restarts without the supervisor's rewind: its first record sets the step.
    p = RunProgress(max_steps=100)
    for s in range(1, 51):
        p.add(step(s))
    p.add(step(31, attempt=1))
    assert p.step == 31 and p.attempt == 1 and p.eta_s == pytest.approx(69 * 2.0)
