"""Several runs in one file, resumed attempts, late lines, and a step logged per sub-batch."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from steadytune.cli.main import main
from steadytune.detect.offline import replay_runs
from steadytune.importers import SeriesBuilder, load


def _curve(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [2.0 + 4.0 * math.exp(-i / (n / 5)) * (1 + 0.01 * rng.gauss(0, 1)) for i in range(n)]


def _lines(losses: list[float], steps: range, nan_at: int | None = None) -> list[str]:
    return [
        f"step {s} | loss {'nan' if s == nan_at else f'{x:.4f}'} | lr 1.0e-04"
        for s, x in zip(steps, losses, strict=False)
    ]


@pytest.mark.parametrize("seed", range(3))
def test_a_run_restarted_from_scratch_is_judged_on_its_own(tmp_path: Path, seed: int) -> None:
    first = _lines(_curve(60, seed), range(0, 600, 10), nan_at=400)[:42]  # it blew up at 400, was killed
    second = _lines(_curve(80, seed + 9), range(0, 800, 10))  # restarted with a fix: logs 400 again
    p = tmp_path / "nohup.out"
    p.write_text("\n".join(["python train.py", *first, "Traceback: loss is nan", *second]) + "\n")
    s = load(p)
    runs = s.runs()
    assert [(r.records[0].step, r.records[-1].step, r.label) for r in runs] == [
        (0, 410, "run 1 of 2"),
        (0, 790, "run 2 of 2"),
    ]
    assert math.isnan(runs[0].records[40].loss) and not math.isnan(runs[1].records[40].loss)
    assert any("2 runs" in n for n in s.notes)
    found = {(a.kind, a.start_step, a.evidence["run"]) for a in replay_runs(runs).anomalies}
    assert ("nan_loss", 400, "run 1 of 2") in found  # last-value-per-step would have lost it


def test_analyze_says_it_saw_several_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "nohup.out"
    p.write_text(
        "\n".join(_lines(_curve(30, 1), range(1, 31), nan_at=20) + _lines(_curve(30, 2), range(1, 31))) + "\n"
    )
    assert main(["analyze", str(p)]) == 1
    out = capsys.readouterr().out
    assert "holds 2 runs one after another" in out and "20 (run 1 of 2)" in out
    assert main(["analyze", str(p), "--format", "json"]) == 1
    (f,) = json.loads(capsys.readouterr().out)["files"]
    assert any("2 runs" in n for n in f["notes"])
    assert {(a["kind"], a["start_step"], a["evidence"]["run"]) for a in f["anomalies"]} >= {
        ("nan_loss", 20, "run 1 of 2")
    }


def test_a_resumed_attempt_keeps_its_history_and_the_attempt_before_is_judged_too() -> None:
    b = SeriesBuilder("log", "test", in_order=True)
    for step in range(1, 121):
        b.add_numbers(step, {"loss": math.nan if step == 118 else 2.0 - step / 1000})
    for step in range(101, 201):  # resumed from the checkpoint at 100, with a lower LR: other values
        b.add_numbers(step, {"loss": 1.9 - step / 2000})
    s = b.build()
    (before, resumed) = s.runs()
    assert [r.step for r in before.records] == list(range(1, 121))
    assert [r.step for r in resumed.records] == list(range(1, 201)) and resumed.report_from == 101
    assert resumed.records[50].loss == before.records[50].loss  # its history is the attempt before's
    assert resumed.records[117].loss == pytest.approx(1.9 - 118 / 2000)
    assert "resumed at step 101 after logging up to step 120" in s.notes[0]


def test_a_late_line_or_the_same_values_again_are_no_second_run() -> None:
    b = SeriesBuilder("log", "test", in_order=True)
    for step in range(1, 31):
        b.add_numbers(step, {"loss": 2.0 - step / 100})
        if step % 10 == 0:
            b.add_numbers(step - 1, {"eval_loss": 2.1})  # an evaluation written after the next step
    for step in range(11, 21):
        b.add_numbers(step, {"loss": 2.0 - step / 100})  # a deterministic resume: the same values
    b.add_numbers(3, {"loss": 9.0})  # one line out of order
    s = b.build()
    assert len(s.runs()) == 1 and [r.step for r in s.records] == list(range(1, 31))
    assert s.records[8].eval_loss == 2.1 and s.records[2].loss == 9.0 and s.notes == []


def test_a_step_logged_per_sub_batch_is_their_mean_and_a_nan_stays() -> None:
    b = SeriesBuilder("log", "test", in_order=True)
    for step in range(3):
        for micro in range(4):
            b.add(step, "loss", math.nan if (step, micro) == (2, 1) else 1.0 + micro)
        b.add(step, "lr", 1e-4)
    s = b.build()
    assert [r.loss for r in s.records[:2]] == [2.5, 2.5] and math.isnan(s.records[2].loss)
    assert s.records[0].lr == 1e-4
    # Out of order (a reader that merges by step), the last value is kept, as before.
    b = SeriesBuilder("log", "test")
    b.add(1, "loss", 1.0)
    b.add(1, "loss", 3.0)
    assert b.build().records[0].loss == 3.0
