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


def test_after_a_rollback_the_live_line_shows_no_loss_of_the_abandoned_attempt() -> None:
    from steadytune.telemetry.progress import progress_line

    p = RunProgress(max_steps=40)
    for s in range(1, 24):
        p.add(StepRecord(step=s, ts=float(s), loss=2.0 if s < 22 else 69.2567, grad_norm=50.0))
    p.rewind(20, attempt=1)
    p.add(StepRecord(step=23, ts=24.0, loss=80.0, grad_norm=60.0))  # the stopped attempt's last line
    assert (p.step, p.last_loss, p.last_grad_norm) == (20, None, None)
    assert "step 20/40" in progress_line(p, 1) and "loss -" in progress_line(p, 1)
    p.add(StepRecord(step=21, ts=30.0, attempt=1, loss=1.9, grad_norm=1.0))
    assert (p.step, p.last_loss, p.first_loss) == (21, 1.9, 2.0)
