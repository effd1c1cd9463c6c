"""A rollback decided while the checkpoint before its trouble is still being published goes back to it.

Real runs of the demo model: the publish of checkpoint-20 is held in its unsafe window (after the
rename, before the manifest) until the supervisor has filed that its rollback waits for it, a
rollback decided on step 22, whose loss an LR burst at step 21 spikes and which the worker then sits
on until the rollback's request is queued (or the worker is killed for it). So the supervisor reads
the spike, decides the rollback, and only later reads that checkpoint-20 is verified (or that its
publish failed, or that its worker died): the race that once sent a rollback back to checkpoint-10,
skipping 48 samples instead of 8. Nothing here is timed: a publish held for 6 s after step 22 once
stood for it, and a supervisor slower than that to read the spike saw checkpoint-20 verified first.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from steadytune.checkpoint.manifest import verify
from steadytune.records import Event, PlanRevision, from_json
from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events

from .runs import finish, run_dir, running, start_run, status, wait_for, write_config

pytestmark = pytest.mark.slow

# The publish of checkpoint-20 ends (or fails) once the rollback decided on step 22 has said it waits for
# it; the worker sits on step 22 until the rollback's request is queued (a restart kills it there first),
# so once the publish is settled it is still there to take the rollback (or be killed for it) at the same
# step boundary. The 120 s are backstops only.
RACE = {
    "lr_burst_at_step": 21,
    "lr_burst_factor": 1000.0,
    "hold_at_step": 22,
    "hold_s": 120.0,
    "hold_until_event": "control:rollback",
    "slow_save_step": 20,
    "slow_save_until_event": "publish_awaited",
}


def config(tmp_path: Path, assets: Path, **recover: object) -> Path:
    sections = {"train": {"max_grad_norm": 0.0, "max_steps": 30}, "policy": {"spike_confirm_points": 1}}
    return write_config(tmp_path, assets, **sections, recover=recover)


def plans(run: RunDir) -> list[PlanRevision]:
    return [from_json(line) for line in run.plan.read_text().splitlines() if line.strip()]


def first(events: list[Event], name: str, step: int | None = None) -> Event:
    return next(e for e in events if e.name == name and (step is None or e.step == step))


def rollback_revision(run: RunDir) -> PlanRevision:
    return next(p for p in plans(run) if p.reason == "loss_spike")


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "restart"])
def test_the_rollback_waits_for_the_checkpoint_being_published_and_resumes_from_it(
    tmp_path: Path, demo_assets: Path, in_process: bool
) -> None:
    cfg = config(tmp_path, demo_assets, in_process_rollback=in_process)
    rc, out = finish(start_run(cfg, "race", faults=RACE))
    assert rc == 0, out[-3000:]
    run = run_dir(cfg, "race")
    events = read_events(run.events)
    spike, saved = first(events, "loss_spike"), first(events, "checkpoint_saved", 20)
    assert spike.seq < saved.seq, "the race did not happen: checkpoint-20 was verified before the spike"
    awaited = first(events, "publish_awaited")
    assert awaited.data["checkpoint"] == "checkpoint-20" and spike.seq < awaited.seq < saved.seq
    plan = rollback_revision(run)
    assert Path(plan.resume_checkpoint or "").name == "checkpoint-20"
    assert "rollback to step 20" in plan.notes and "not checkpoint-20" not in plan.notes
    assert "checkpoint_corrupt" not in [e.name for e in events]
    assert ("rolled_back" in [e.name for e in events]) is in_process


def test_a_publish_that_fails_sends_the_rollback_to_the_checkpoint_before_it_and_says_why(
    tmp_path: Path, demo_assets: Path
) -> None:
    cfg = config(tmp_path, demo_assets)
    rc, out = finish(start_run(cfg, "failed", faults={**RACE, "fail_save_step": 20}))
    assert rc == 0, out[-3000:]
    run = run_dir(cfg, "failed")
    events = read_events(run.events)
    failed = first(events, "checkpoint_publish_failed", 20)
    assert "InjectedSaveFailure" in failed.data["error"]
    assert first(events, "publish_awaited").seq < failed.seq
    plan = rollback_revision(run)
    assert Path(plan.resume_checkpoint or "").name == "checkpoint-10"
    assert "not checkpoint-20: its publish failed (InjectedSaveFailure" in plan.notes
    # The worker stops at its next step for the failed publish: a new process carries the rollback out.
    assert [p.reason for p in plans(run)] == ["start", "loss_spike"]
    assert "rolled_back" not in [e.name for e in events]
    assert verify(run.checkpoints / "checkpoint-20").ok  # the retrained one is whole


def test_a_worker_killed_mid_publish_never_has_its_half_published_checkpoint_resumed(
    tmp_path: Path, demo_assets: Path
) -> None:
    cfg = config(tmp_path, demo_assets)
    # The publish stays torn after the rollback has said it waits for it, until the worker is killed.
    proc = start_run(cfg, "killed", faults={**RACE, "slow_save_s": 120.0})
    run = run_dir(cfg, "killed")
    wait_for(
        lambda: running(proc) and "publish_awaited" in [e.name for e in read_events(run.events)],
        timeout=180,
        what="the rollback waiting for checkpoint-20",
    )
    torn = run.checkpoints / "checkpoint-20"
    assert torn.is_dir() and not verify(torn).ok
    os.kill(status(run)["worker_pid"], signal.SIGKILL)
    rc, out = finish(proc)
    assert rc == 0, out[-3000:]
    events = read_events(run.events)
    plan = rollback_revision(run)
    assert Path(plan.resume_checkpoint or "").name == "checkpoint-10"
    assert "not checkpoint-20: the worker exited before its publish finished" in plan.notes
    assert first(events, "checkpoint_corrupt").step == 20
    assert [p.resume_checkpoint for p in plans(run)].count(str(torn)) == 0
