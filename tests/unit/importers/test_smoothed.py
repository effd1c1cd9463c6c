"""A loss printed as a running average: its known start-up bias divided out, nothing else changed.

The logs are generated here the way nanochat's scripts print them: an exponential average of
each step's loss (decay 0.9), divided by ``1 - 0.9^(k+1)`` at the printed step ``k``, counted
from 0 (its pretraining script) or from 1 (its mid-training and SFT scripts, which advance the
step before the line: one step too many in the division).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from steadytune.detect.offline import detect
from steadytune.importers import load
from steadytune.importers.smoothed import beta_of, debiased

BETA = 0.9


def printed(losses: list[float], first_step: int) -> list[tuple[int, float]]:
    """(step, printed value) as the script prints them: the average over the steps so far, debiased
    by ``1 - beta^(step + 1)`` whatever the step counted from."""
    out, avg = [], 0.0
    for i, loss in enumerate(losses):
        step = first_step + i
        avg = BETA * avg + (1 - BETA) * loss
        out.append((step, round(avg / (1 - BETA ** (step + 1)), 6)))
    return out


def healthy(n: int, seed: int) -> list[float]:
    """A fine-tuning loss falling from 2.4 to about 1.4 under 4 % noise."""
    rng = random.Random(seed)
    return [(1.4 + 1.0 * math.exp(-i / 150)) * math.exp(rng.gauss(0, 0.04)) for i in range(n)]


def write_log(path: Path, points: list[tuple[int, float]], total: int | None = None) -> Path:
    lines = []
    for step, value in points:
        at = f"{step:05d}/{total:05d}" if total else f"{step:05d}"
        pct = 100 * step / (total or len(points))
        lines.append(
            f"step {at} ({pct:.2f}%) | loss: {value:.6f} | lrm: 1.00 | dt: 470.12ms | "
            f"tok/sec: 1,115,000 | mfu: 49.20 | total time: {step * 0.008:.2f}m"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_only_the_averaged_lines_are_known() -> None:
    assert beta_of("step 00003 (0.54%) | loss: 1.991005 | lrm: 0.01 | dt: 468.19ms | mfu: 49.42") == BETA
    assert beta_of("[rank0]: step 00003/21400 (0.01%) | loss: 10.179082 | lrm: 1.00 | dt: 467.12ms") == BETA
    assert beta_of("Step 00001/00650 | Training loss: 1.234567| lrm: 1.000000| num_tokens: 9,801") is None
    assert beta_of("step 3 | loss: 1.99 | lr: 1e-4") is None


@pytest.mark.parametrize("level", [0.05, 1.0, 11.0])
def test_a_run_counted_from_one_is_divided_by_what_it_averaged(level: float) -> None:
    shown = printed([level] * 40, first_step=1)
    assert shown[0][1] == pytest.approx(level * 0.1 / 0.19, rel=1e-5)  # what the script prints: half of it
    fixed = debiased(shown, BETA)
    assert fixed == pytest.approx([level] * 40, rel=1e-5, abs=1e-5)  # six decimals printed


def test_a_run_counted_from_zero_or_resumed_is_left_as_printed() -> None:
    from_zero = printed([2.0] * 30, first_step=0)
    assert debiased(from_zero, BETA) == [v for _, v in from_zero]
    resumed = [(s, v * 1.01) for s, v in printed([2.0] * 30, first_step=500)]
    assert debiased(resumed, BETA) == [v for _, v in resumed]


def test_each_run_of_a_file_is_judged_by_its_own_first_step() -> None:
    base = printed([3.0] * 20, first_step=0)  # pretraining, then mid-training starting over at 1
    mid = printed([2.0] * 20, first_step=1)
    fixed = debiased(base + mid, BETA)
    assert fixed[:20] == [v for _, v in base]
    assert fixed[20:] == pytest.approx([2.0] * 20, rel=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_mid_training_log_raises_nothing(tmp_path: Path, seed: int) -> None:
    log = write_log(tmp_path / "midtrain.log", printed(healthy(600, seed), first_step=1))
    series = load(log)
    first = next(r for r in series.records if r.loss is not None)
    assert first.loss == pytest.approx(healthy(600, seed)[0], rel=1e-4)  # the step's own, not 0.53x it
    assert detect(list(series.records)) == []


def test_a_spike_in_a_pretraining_log_is_still_found(tmp_path: Path) -> None:
    losses = healthy(3000, 7)
    for i in range(2000, 2004):  # the loss doubles for four steps: the average shows it
        losses[i] *= 3.0
    log = write_log(tmp_path / "base.log", printed(losses, first_step=0), total=3000)
    found = detect(list(load(log).records))
    assert any(a.kind in ("loss_spike", "divergence") and 1995 <= a.start_step <= 2010 for a in found), found
