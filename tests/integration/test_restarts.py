"""Where restarting ends, on real supervised runs: the restart budget, a second Ctrl-C, and the restart
after a worker killed while memory was short (SIGKILL, as the kernel's OOM killer sends it)."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest

from steadytune.checkpoint.manifest import verify
from steadytune.records import PlanRevision, from_json, run_end
from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events

from .runs import finish, kill_worker, run_dir, running, start_run, status, steps, wait_for, write_config

pytestmark = pytest.mark.slow


def plans(run: RunDir) -> list[PlanRevision]:
    return [from_json(line) for line in run.plan.read_text().splitlines() if line.strip()]


def worker_running(run: RunDir, attempt: int) -> bool:
    """The status names the worker of ``attempt`` and it has trained a step."""
    return status(run).get("attempt") == attempt and any(r.attempt == attempt for r in steps(run))


def test_the_restart_budget_runs_out(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(
        tmp_path, demo_assets, train={"max_steps": 400, "save_steps": 10}, run={"max_restarts": 1}
    )
    proc = start_run(cfg, "budget", faults={"step_sleep_s": 0.05})
    run = run_dir(cfg, "budget")
    for attempt in (0, 1):  # the first kill is restarted; the second finds the budget (1) spent
        wait_for(
            lambda a=attempt: running(proc) and worker_running(run, a), timeout=180, what=f"attempt {attempt}"
        )
        kill_worker(run)
    rc, out = finish(proc)
    assert rc == 1, out
    assert [p.reason for p in plans(run)] == ["start", "killed"]  # one restart, no more
    restarts = [e for e in read_events(run.events) if e.kind == "action" and e.name == "restart"]
    assert len(restarts) == 1 and "restart 1/1" in restarts[0].message
    final = run_end(read_events(run.events))
    assert final.name == "run_failed" and final.severity == "critical"
    assert final.data["classification"] == "killed" and "restart budget (1) is spent" in final.message
    assert (status(run)["state"], status(run)["restarts"]) == ("failed", 1)
    assert {r.attempt for r in steps(run)} == {0, 1} and steps(run)[-1].step < 400


def test_a_second_ctrl_c_kills_a_worker_stuck_in_a_save(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 30, "save_steps": 10})
    # The first save is held for an hour in its unsafe window: the worker cannot reach a step boundary,
    # where it would act on a stop, so only the second Ctrl-C can end it.
    proc = start_run(cfg, "ctrl-c", faults={"slow_save_s": 3600, "slow_save_step": 10})
    run = run_dir(cfg, "ctrl-c")
    held = run.checkpoints / "checkpoint-10"
    wait_for(
        lambda: held.is_dir() and not (held / "MANIFEST.json").exists(), what="the save held in its window"
    )
    worker = psutil.Process(status(run)["worker_pid"])
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: [e for e in read_events(run.events) if e.kind == "control" and e.name == "stop"],
             what="the stop request of the first Ctrl-C")  # fmt: skip
    assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE  # asked, still saving
    proc.send_signal(signal.SIGINT)
    rc, out = finish(proc, timeout=120)  # the held save would take an hour
    assert rc == 0, out
    assert "second interrupt: killing the worker now" in out
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    assert status(run)["state"] == "stopped" and len(plans(run)) == 1  # stopped, not restarted
    final = run_end(read_events(run.events))
    assert final.name == "run_stopped" and final.data["classification"] == "user_interrupt"
    assert not (held / "MANIFEST.json").exists() and not verify(held).ok  # the killed save was never sealed


def test_a_worker_killed_short_of_memory_restarts_with_a_smaller_micro_batch(
    tmp_path: Path, demo_assets: Path
) -> None:
    """A memory warning asks for a checkpoint and a smaller micro-batch at the next start; then the worker is
    SIGKILLed. The memory rules need device memory figures, which a CPU run has not, so the same action
    (reduce_microbatch) is given to the loss spike an LR burst makes."""
    cfg = write_config(
        tmp_path, demo_assets,
        train={"max_steps": 40, "save_steps": 40, "max_grad_norm": 0.0, "per_device_train_batch_size": 4},
        policy={"spike_confirm_points": 1, "rules": {"loss_spike": {"action": "reduce_microbatch"},
                                                     "divergence": {"action": "alert"},
                                                     "grad_explosion": {"action": "alert"}}},
    )  # fmt: skip
    # A probe in both attempts: from step 35 on, a micro-batch of more than 2 samples runs out of memory (and
    # would be split, with a reduce_microbatch event): the restarted worker must never hit it.
    faults = {"lr_burst_at_step": 21, "lr_burst_steps": 1, "lr_burst_factor": 1000.0, "step_sleep_s": 0.1,
              "oom_at_step": 35, "oom_above": 2, "fault_attempts": 2}  # fmt: skip
    proc = start_run(cfg, "shrink", faults=faults)
    run = run_dir(cfg, "shrink")

    def checkpointed_on_request() -> list:
        running(proc)
        events = read_events(run.events)
        asked = [e for e in events if e.name == "reduce_microbatch" and e.data.get("anomaly")]
        saved = [e for e in events if e.name == "checkpoint_saved"]
        return asked and saved

    wait_for(checkpointed_on_request, timeout=180, what="the checkpoint the memory action asks for")
    kill_worker(run)  # what the kernel's OOM killer does: SIGKILL, no last words
    rc, out = finish(proc)
    assert rc == 0, out
    events = read_events(run.events)
    # The policy's action names its anomaly; an in-worker OOM split names its split instead.
    (asked,) = [e for e in events if e.name == "reduce_microbatch" and e.data.get("anomaly")]
    (saved,) = [e for e in events if e.name == "checkpoint_saved" and e.step < 40]  # asked for, not periodic
    assert asked.data["anomaly"] == "loss_spike" and saved.step >= asked.step
    restart = plans(run)[-1]
    assert restart.reason == "killed" and restart.attempt == 1
    assert Path(restart.resume_checkpoint).name == f"checkpoint-{saved.step}"
    assert (restart.per_device_train_batch_size, restart.gradient_accumulation_steps) == (2, 2)
    (restarting,) = [e for e in events if e.kind == "action" and e.name == "restart"]
    assert "micro-batch 2 x accumulation 2 (same effective batch)" in restarting.message
    assert max(r.step for r in steps(run) if r.attempt == 0) < 35  # killed before the probe's steps
    resumed = [r for r in steps(run) if r.attempt == 1]
    assert [r.step for r in resumed] == list(range(saved.step + 1, 41))
    assert {r.samples for r in resumed} == {4}  # the effective batch is unchanged
    # The worker really trained micro-batches of 2: the probe (more than 2 samples from step 35) never fired.
    assert not [e for e in events if e.data.get("micro_batch_split")]
    assert max(r.step for r in resumed) >= 35  # ...though it trained through the steps where it would have
