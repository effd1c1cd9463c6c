"""A rollback inside the running worker trains exactly what a restart-based rollback trains.

The same spike is injected into three real runs of the demo model: one rolls back in process
(the default), one with ``recover.in_process_rollback: false`` restarts the worker, and one
whose worker does not take the request in time falls back to the restart. The worker waits
after the spiking step for the supervisor's answer (the rollback's request, or the kill), so every
run leaves the old timeline at the same step boundary however late the supervisor reads it, and
the rollback's plan (checkpoint, skip list, LR scale) is the same; from there the losses,
the gradient norms, the final weights and the optimizer state must be bit-identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from steadytune.records import PlanRevision, StepRecord, from_json
from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events

from .runs import finish, run_dir, start_run, steps, write_config

pytestmark = pytest.mark.slow

# The LR burst at step 21 shows in step 22's loss; the worker then waits until the rollback's request is
# queued (a restart kills it there first), so the rollback lands after step 22 in every run however late
# the supervisor reads it. The 120 s are a backstop only.
FAULTS = {
    "lr_burst_at_step": 21,
    "lr_burst_factor": 1000.0,
    "hold_at_step": 22,
    "hold_s": 120.0,
    "hold_until_event": "control:rollback",
}


def spiked_run(
    tmp_path: Path, assets: Path, name: str, faults: dict[str, Any] = FAULTS, **recover: Any
) -> RunDir:
    base = tmp_path / name
    base.mkdir()
    sections = {"train": {"max_grad_norm": 0.0, "max_steps": 30}, "policy": {"spike_confirm_points": 1}}
    cfg = write_config(base, assets, **sections, recover=recover)
    rc, out = finish(start_run(cfg, name, faults=faults))
    assert rc == 0, out[-3000:]
    return run_dir(cfg, name)


def plans(run: RunDir) -> list[PlanRevision]:
    return [from_json(line) for line in run.plan.read_text().splitlines() if line.strip()]


def names(run: RunDir) -> list[str]:
    return [e.name for e in read_events(run.events)]


def after_rollback(run: RunDir, attempt: int) -> list[StepRecord]:
    return [r for r in steps(run) if r.attempt == attempt]


def rollback_plan(run: RunDir, attempt: int) -> tuple[str, tuple, float]:
    plan = next(p for p in plans(run) if p.attempt == attempt)
    return Path(plan.resume_checkpoint or "").name, plan.skip_ranges, plan.lr_scale


def assert_same_training(a: RunDir, attempt_a: int, b: RunDir, attempt_b: int) -> None:
    ra, rb = after_rollback(a, attempt_a), after_rollback(b, attempt_b)
    assert [r.step for r in ra] == [r.step for r in rb] == list(range(21, 31))
    assert [(r.loss, r.grad_norm, r.lr) for r in ra] == [(r.loss, r.grad_norm, r.lr) for r in rb]
    assert [r.batch.indices for r in ra] == [r.batch.indices for r in rb]
    wa, wb = (
        load_file(str(a.root / "final" / "model.safetensors")),
        load_file(str(b.root / "final" / "model.safetensors")),
    )
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    oa = torch.load(a.checkpoints / "checkpoint-30" / "optimizer.pt", weights_only=True)["state"]
    ob = torch.load(b.checkpoints / "checkpoint-30" / "optimizer.pt", weights_only=True)["state"]
    assert oa.keys() == ob.keys()
    assert all(torch.equal(oa[p][k], ob[p][k]) for p in oa for k in oa[p])


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory, demo_assets: Path) -> RunDir:
    run = spiked_run(tmp_path_factory.mktemp("restart"), demo_assets, "restart", in_process_rollback=False)
    events = names(run)
    assert events.count("worker_started") == 2 and "rolled_back" not in events
    return run


def test_in_process_rollback_is_bit_identical_to_a_restart(
    tmp_path: Path, demo_assets: Path, restarted: RunDir
) -> None:
    run = spiked_run(tmp_path, demo_assets, "inproc")
    events = read_events(run.events)
    started = [e for e in events if e.name == "worker_started"]
    assert len(started) == 1, "an in-process rollback started a new worker"
    done = next(e for e in events if e.name == "rolled_back")
    assert done.data["in_process"] is True and done.data["attempt"] == 1
    assert Path(done.data["checkpoint"]).name == "checkpoint-20" and done.data["reload_s"] > 0
    assert "rollback_in_process" in names(run) and "ack_rollback" in names(run)
    assert [p.attempt for p in plans(run)] == [0, 1]
    assert rollback_plan(run, 1) == rollback_plan(restarted, 1)
    assert rollback_plan(run, 1)[1], "the rollback skipped no samples"
    # The abandoned timeline's own records stay, under attempt 0; the rolled-back one is attempt 1.
    assert max(r.step for r in after_rollback(run, 0)) == 22
    # What cleared the abandoned timeline's anomalies is said as it was: no restart happened here.
    cleared = [e for e in events if e.kind == "resolved" and "cleared_by" in e.data]
    assert cleared and all(e.message.endswith("cleared by the rollback") for e in cleared)
    assert all(e.message.endswith("cleared by the restart") for e in read_events(restarted.events)
               if e.kind == "resolved" and "cleared_by" in e.data)  # fmt: skip
    assert_same_training(run, 1, restarted, 1)


def test_a_rollback_not_taken_in_time_restarts_the_worker_with_the_same_plan(
    tmp_path: Path, demo_assets: Path, restarted: RunDir
) -> None:
    # The worker sits in its hold until it is killed (the restart is filed after its end); the supervisor
    # waits 1 s for it to take the request. A hold of 6 s once stood for it: a supervisor that read the
    # spike more than 5 s late found the worker past its hold, and the rollback was taken in process.
    late = {**FAULTS, "hold_until_event": "restart"}
    run = spiked_run(tmp_path, demo_assets, "late", late, in_process_ack_timeout_s=1.0)
    events = read_events(run.events)
    assert [e.name for e in events].count("worker_started") == 2
    assert "rolled_back" not in [e.name for e in events]
    restart = next(e for e in events if e.name == "restart")
    assert "in-process rollback was not taken within" in restart.message
    assert [p.attempt for p in plans(run)] == [0, 1, 2]
    assert rollback_plan(run, 2) == rollback_plan(run, 1) == rollback_plan(restarted, 1)
    assert_same_training(run, 2, restarted, 1)
