"""Young/Daly: the checkpoint interval from a save's cost and the time between interruptions."""

from __future__ import annotations

import math

import pytest

from steadytune.goodput.advice import advise, daly_interval, lost_share


def test_daly_is_youngs_square_root_when_a_save_is_cheap() -> None:
    save, mtbf = 30.0, 86400.0  # a 30 s save, an interruption a day
    young = math.sqrt(2 * save * mtbf)
    assert daly_interval(save, mtbf) == pytest.approx(young, rel=0.02)


def test_the_interval_is_where_saves_and_redone_work_cost_least() -> None:
    save, mtbf = 12.0, 3 * 3600.0
    best = daly_interval(save, mtbf)
    grid = [best * f for f in (0.25, 0.5, 0.8, 0.9, 1.1, 1.25, 2.0, 4.0)]
    assert all(lost_share(best, save, mtbf) <= lost_share(t, save, mtbf) for t in grid)


def test_a_save_longer_than_two_mtbfs_saves_once_per_mtbf() -> None:
    assert daly_interval(500.0, 200.0) == 200.0


def test_advice_to_save_less_often_when_saves_cost_more_than_they_protect() -> None:
    # 2 s saves, 1 s steps, one interruption in 10,000 s: the optimum is near √(2·2·10000) = 200 steps.
    a = advise(save_cost_s=2.0, step_s=1.0, interruptions=1, exposure_s=10_000.0, save_steps=10)
    assert a is not None and 196 <= a.best_steps <= 204
    assert a.current_loss == pytest.approx(2 / 12 + 12 / 20_000)
    assert a.worth_saying and "save_steps 10 loses" in a.line()


def test_advice_to_save_more_often_when_interruptions_are_frequent() -> None:
    a = advise(save_cost_s=1.0, step_s=1.0, interruptions=10, exposure_s=3600.0, save_steps=2000)
    assert a is not None and a.best_steps < 2000 and a.worth_saying


def test_an_interval_near_the_optimum_is_left_alone() -> None:
    a = advise(save_cost_s=2.0, step_s=1.0, interruptions=1, exposure_s=10_000.0, save_steps=180)
    assert a is not None and not a.worth_saying


def test_without_interruptions_it_only_ever_says_save_less_often() -> None:
    # No interruption in 10,000 s: the MTBF is at least that, so the optimum is at least ~200 steps.
    rare = advise(save_cost_s=2.0, step_s=1.0, interruptions=0, exposure_s=10_000.0, save_steps=5)
    assert rare is not None and rare.mtbf_is_bound and rare.worth_saying and "at least" in rare.line()
    long = advise(save_cost_s=2.0, step_s=1.0, interruptions=0, exposure_s=10_000.0, save_steps=5000)
    assert long is not None and not long.worth_saying  # the optimum may be longer still


def test_the_interval_never_passes_the_run_itself() -> None:
    a = advise(save_cost_s=2.0, step_s=1.0, interruptions=1, exposure_s=10_000.0, save_steps=10, max_steps=50)
    assert a is not None and a.best_steps == 50


def test_no_advice_without_a_measured_save_or_step() -> None:
    assert advise(None, 1.0, 1, 100.0, 10) is None
    assert advise(2.0, None, 1, 100.0, 10) is None
