"""Rollback-and-skip in real runs: the skipped samples never reach the model again, across a later restart,
and every other sample keeps its place in the order a clean run trains them in.

The order a clean run trains is the reference (a second, fault-free run with the same seed); the guard's
batch fingerprints (the ids of the samples each step trained on) are what reached the model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from steadytune.goodput.load import run_account
from steadytune.goodput.text import summary_line
from steadytune.records import PlanRevision, StepRecord, from_json
from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events

from .runs import STEADYTUNE, finish, kill_worker, run_dir, start_run, status, steps, wait_for, write_config

pytestmark = pytest.mark.slow


def plans(run: RunDir) -> list[PlanRevision]:
    return [from_json(line) for line in run.plan.read_text().splitlines() if line.strip()]


def ids_of(ranges: tuple[tuple[int, int], ...]) -> set[int]:
    return {i for a, b in ranges for i in range(a, b + 1)}


def timeline(records: list[StepRecord]) -> list[StepRecord]:
    """Each step as it finally stood: the latest attempt's record (the one whose weights survived)."""
    latest: dict[int, StepRecord] = {}
    for r in records:
        if r.step not in latest or r.attempt >= latest[r.step].attempt:
            latest[r.step] = r
    return [latest[s] for s in sorted(latest)]


def trained_order(records: list[StepRecord]) -> list[int]:
    return [i for r in timeline(records) for i in r.batch.indices]


def clean_order(tmp_path: Path, assets: Path, max_steps: int, **sections: dict) -> list[int]:
    """The samples a fault-free run with the same seed trains, in order."""
    ref = tmp_path / "reference"
    ref.mkdir()
    cfg = write_config(
        ref, assets, **{**sections, "train": {**sections.get("train", {}), "max_steps": max_steps}}
    )
    rc, out = finish(start_run(cfg, "clean"))
    assert rc == 0, out
    return trained_order(steps(run_dir(cfg, "clean")))


def check_skip(run: RunDir, resume_step: int) -> tuple[set[int], list[PlanRevision]]:
    """The rollback's skip list is exactly the samples of the steps from its checkpoint into the spike."""
    revisions = plans(run)
    rollback = next(p for p in revisions if p.skip_ranges)
    assert Path(rollback.resume_checkpoint).name == f"checkpoint-{resume_step}"
    skip = ids_of(rollback.skip_ranges)
    first = [r for r in steps(run) if r.attempt == 0 and r.step > resume_step]
    window = [r for r in first if set(r.batch.indices) <= skip]
    assert [r.step for r in window] == list(range(resume_step + 1, resume_step + 1 + len(window)))
    assert len(window) >= 2  # at least the step of the LR burst and the spiking step after it
    assert skip == {i for r in window for i in r.batch.indices}
    # The steps those samples came from are named with them (the dashboard's "N samples (steps a–b)").
    assert rollback.skip_steps == ((window[0].step, window[-1].step),)
    return skip, revisions


def test_rollback_skips_its_samples_for_good_and_keeps_the_order(tmp_path: Path, demo_assets: Path) -> None:
    sections = {"train": {"max_grad_norm": 0.0, "max_steps": 40}, "policy": {"spike_confirm_points": 1}}
    cfg = write_config(tmp_path, demo_assets, **sections)  # checkpoints every 10 steps
    launched = time.time()
    proc = start_run(
        cfg, "skip", faults={"lr_burst_at_step": 21, "lr_burst_factor": 1000.0, "step_sleep_s": 0.1}
    )
    run = run_dir(cfg, "skip")
    # After the rollback, kill the resumed worker too: the skip list must survive that restart.
    wait_for(
        lambda: status(run).get("attempt") == 1 and any(r.attempt == 1 and r.step >= 25 for r in steps(run)),
        timeout=180,
        what="the resumed worker at step 25",
    )
    live = run_account(run)  # while it trains: up to now
    assert not live.ended and live.wall_s <= time.time() - launched
    assert sum(live.seconds.values()) == pytest.approx(live.wall_s)
    kill_worker(run)
    rc, out = finish(proc)
    measured = time.time() - launched
    assert rc == 0, out
    check_goodput(run, out, measured, tmp_path)

    skip, revisions = check_skip(run, 20)
    assert [p.reason for p in revisions][-1] == "killed" and revisions[-1].attempt == 2
    first_skip = next(n for n, p in enumerate(revisions) if p.skip_ranges)
    assert all(ids_of(p.skip_ranges) == skip for p in revisions[first_skip:])  # every later plan keeps it
    records = steps(run)
    assert {r.attempt for r in records} == {0, 1, 2}
    after = [i for r in records if r.attempt >= 1 for i in r.batch.indices]
    assert after and not skip & set(after), "a skipped sample reached the model after the rollback"
    # Every other sample keeps its place: the clean order with the skipped ones taken out.
    trained = trained_order(records)
    assert [r.step for r in timeline(records)] == list(range(1, 41))
    reference = clean_order(tmp_path, demo_assets, 45, **sections)
    assert trained == [i for i in reference if i not in skip][: len(trained)]


# 48 samples, 4 per step: 12 steps per epoch, a checkpoint every 8 steps.
EPOCHS = {
    "data": {"max_samples": 48},
    "train": {"max_grad_norm": 0.0, "save_steps": 8},
    "policy": {"spike_confirm_points": 1},
}


@pytest.fixture(scope="module")
def epoch_reference(tmp_path_factory: pytest.TempPathFactory, demo_assets: Path) -> list[int]:
    """Four epochs of 48 as a clean run trains them: one run for both epoch tests, since an epoch's order
    depends on the seed and the epoch alone (train/sampling.py), not on how the run counts its end."""
    return clean_order(tmp_path_factory.mktemp("epochs"), demo_assets, 48, **EPOCHS)


def rollback_in_the_second_epoch(
    tmp_path: Path, demo_assets: Path, reference: list[int], **train: int
) -> tuple[list[int], list[int], int]:
    """A rollback resumes from step 16, inside the second epoch. What the run trained, and what it
    should have: the clean ``reference`` order, the skipped samples taken out from the rollback on."""
    sections = {**EPOCHS, "train": {**EPOCHS["train"], **train}}
    cfg = write_config(tmp_path, demo_assets, **sections)
    # The pause per step keeps the supervisor abreast of the worker, so the skip window ends at the spike.
    faults = {"lr_burst_at_step": 17, "lr_burst_factor": 1000.0, "step_sleep_s": 0.1}
    rc, out = finish(start_run(cfg, "epochs", faults=faults))
    assert rc == 0, out
    run = run_dir(cfg, "epochs")
    skip, _ = check_skip(run, 16)
    records = steps(run)
    assert not skip & {i for r in records if r.attempt >= 1 for i in r.batch.indices}
    epochs = [reference[48 * e : 48 * (e + 1)] for e in range(4)]
    expected = epochs[0] + [i for e in epochs[1:] for i in e if i not in skip]
    return trained_order(records), expected, len(skip)


def check_goodput(run: RunDir, out: str, measured_s: float, tmp_path: Path) -> None:
    """A crash and a rollback in one real run: the account of its folder, in the summary, the CLI, a copy."""
    acct = run_account(run)
    assert acct.ended and acct.state == "completed"
    assert sum(acct.seconds.values()) == pytest.approx(acct.wall_s, rel=0.01)
    # From the process's start to its run_completed: not more than the test saw, and not much less.
    assert measured_s - max(3.0, 0.03 * measured_s) <= acct.wall_s <= measured_s
    assert acct.seconds["unattributed"] <= 0.01 * acct.wall_s
    records = steps(run)
    superseded = [r for r in records if any(o.step == r.step and o.attempt > r.attempt for o in records)]
    assert (acct.steps_kept, acct.steps_redone, acct.interruptions) == (40, len(superseded), 2)
    rolled_in_process = any(e.name == "rolled_back" for e in read_events(run.events))
    assert acct.seconds["redone"] > 0 and acct.seconds["restart"] > 0  # the spike's steps; the kill
    assert acct.seconds["recovery" if rolled_in_process else "restart"] > 0  # the rollback's reload
    assert summary_line(acct) in out  # the run's own summary says the same
    shown = subprocess.run([STEADYTUNE, "goodput", str(run.root), "--format", "json"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["runs"] == [acct.to_dict()]
    copy = RunDir(Path(shutil.copytree(run.root, tmp_path / "copied" / run.run_id)))
    assert run_account(copy).to_dict() == acct.to_dict()


@pytest.mark.xdist_group("rollback-epochs")  # one worker builds epoch_reference for both
def test_rollback_in_a_later_epoch_keeps_the_order(
    tmp_path: Path, demo_assets: Path, epoch_reference: list[int]
) -> None:
    trained, expected, _ = rollback_in_the_second_epoch(tmp_path, demo_assets, epoch_reference, max_steps=36)
    assert len(trained) == 36 * 4
    assert trained == expected[: len(trained)]


@pytest.mark.xdist_group("rollback-epochs")  # one worker builds epoch_reference for both
def test_an_epoch_based_run_trains_its_epochs_to_the_end_after_a_rollback(
    tmp_path: Path, demo_assets: Path, epoch_reference: list[int]
) -> None:
    # With 8 samples skipped, the epochs after the rollback are 10 steps, the one before it 12: three
    # epochs are 16 + 6 + 10 steps, not the 3 x 10 the HF count (epochs x steps an epoch) stops at.
    trained, expected, skipped = rollback_in_the_second_epoch(
        tmp_path, demo_assets, epoch_reference, max_steps=-1, num_train_epochs=3
    )
    assert trained == expected[: 48 + 2 * (48 - skipped)]
