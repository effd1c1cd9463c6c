"""The run summary's goodput lines: the account, then the checkpoint advice when it is worth saying."""

from __future__ import annotations

from pathlib import Path

from steadytune.cli.run import goodput_lines
from steadytune.goodput.load import run_account
from steadytune.goodput.text import summary_line

from .history import Run
from .test_load import write


def saving_every_step(steps: int) -> Run:
    """1 s steps, a 2 s save after each, and one crash that costs a step: saves dwarf what they protect."""
    run = Run().plan(0, "start").event("run_started").launch(0, "startup")
    for n in range(1, steps + 1):
        run.step(n, 0).save(0, 2.0)
    run.spend("redone", 0.5).event("restart", "action", classification="killed")
    run.spend("restart", 1.0).plan(1, "killed", resume=steps).launch(1, "restart", resume=steps)
    run.step(steps + 1, 1)
    return run.exit(1, "completed").spend("shutdown", 1.0).event("run_completed")


def test_the_summary_says_the_goodput_and_advises_saving_less_often(tmp_path: Path) -> None:
    rd = write(tmp_path / "r", saving_every_step(40))
    first, advice = goodput_lines(rd, save_steps=1)
    assert first == summary_line(run_account(rd)) and first.startswith("goodput ")
    assert (
        advice.startswith("checkpoints: each save stalls training 2.0 s") and "save_steps 1 loses" in advice
    )


def test_no_advice_when_the_interval_is_near_the_optimum(tmp_path: Path) -> None:
    rd = write(tmp_path / "r", saving_every_step(40))
    best = int(goodput_lines(rd, save_steps=1)[1].split("interval at ")[1].split(" steps")[0])
    assert goodput_lines(rd, save_steps=best) == [summary_line(run_account(rd))]
    assert goodput_lines(rd, save_steps=None) == [summary_line(run_account(rd))]  # a watched command
