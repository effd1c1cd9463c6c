"""`steadytune supervise` around the real TRL and LLaMA-Factory CLIs, installed into venvs of their own.

Each test trains the demo model through the tool's own command line under
`supervise`, with a real fault: SIGKILL of the trainer, SIGKILL of the launcher, a
checkpoint cut short. The other faults (a hang, an LR far too high, SIGTERM) are in
test_supervise_tool_faults.py; the jobs and the supervise scaffolding in toolruns.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from steadytune.records import run_end

from .toolchain import KILL_LAUNCHER, KILL_TRAINER, chain, restart_events
from .toolruns import supervise, tool_job, trl_job

pytestmark = pytest.mark.slow


def test_trl_sft_survives_a_killed_trainer_then_a_killed_launcher(tmp_path: Path, demo_assets: Path) -> None:
    """One run for both faults (a TRL start costs tens of seconds: toolchain.py): the trainer SIGKILLed
    once the first attempt has saved a checkpoint, the launcher once the second has."""
    steps = 300
    job = trl_job(demo_assets, tmp_path, steps)
    with supervise(job, tmp_path) as sup:
        trainer, launcher = chain(sup, job, [KILL_TRAINER, KILL_LAUNCHER])
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events = sup.events()
    restarts = restart_events(events)
    assert len(restarts) == 2 and all("resuming from checkpoint-" in r.message for r in restarts)
    assert trainer.trainers and not any(_alive(p) for p in trainer.trainers + launcher.trainers)
    # The launcher's orphaned trainer was killed before the next attempt began: never two trainers at once.
    killed = {
        p for e in events if e.name == "tree_killed" and e.seq < restarts[1].seq for p in e.data["pids"]
    }
    assert launcher.trainers and set(launcher.trainers) <= killed
    assert run_end(events).name == "run_completed"
    # The log dicts behind TRL's progress bar were read, with their step numbers: every logged step
    # of each attempt, each resumed attempt from its checkpoint on, and no summary line.
    recs = sup.steps()
    first = [r.step for r in recs if r.attempt == 0]
    assert first[:3] == [5, 10, 15] and first == sorted(first)
    for attempt, restart in enumerate(restarts, 1):
        resumed_from = int(restart.message.split("checkpoint-")[1].split()[0])
        assert next(r.step for r in recs if r.attempt == attempt) == resumed_from + 5
    assert recs[-1].attempt == 2 and recs[-1].step == steps
    assert all(r.grad_norm is not None and r.lr is not None for r in recs)
    status = sup.status()
    assert status["state"] == "completed" and status["max_steps"] == steps and status["step"] == steps
    assert status["tokens_per_s"] and status["last_checkpoint"] == f"checkpoint-{steps}"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize("tool", ["llamafactory", "trl"])
def test_a_killed_trainer_with_a_truncated_checkpoint_resumes_an_older_one(
    tool: str, tmp_path: Path, demo_assets: Path
) -> None:
    steps = 400
    job = tool_job(tool, demo_assets, tmp_path, steps, save_steps=50)
    out = job.out
    with supervise(job, tmp_path) as sup:
        sup.wait_checkpoint(100)
        group = os.getpgid(sup.worker())
        os.killpg(group, signal.SIGSTOP)  # freeze it, so the newest checkpoint is the one we cut
        newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        weights = newest / job.weights_file
        weights.write_bytes(weights.read_bytes()[:-100])  # header intact, the file cut short
        os.killpg(group, signal.SIGKILL)
        rc = sup.finish()
    assert rc == 0, sup.stdout
    events = sup.events()
    corrupt = [e for e in events if e.name == "checkpoint_corrupt"]
    assert corrupt and newest.name in corrupt[0].message and "cut short" in corrupt[0].message
    (restart,) = restart_events(events)
    older = int(newest.name.split("-")[1]) - 50
    assert f"resuming from checkpoint-{older}" in restart.message
    resumed = [e for e in events if e.name == "worker_started"][1]
    path = str(out / f"checkpoint-{older}")
    want = (
        [f"resume_from_checkpoint={path}"] if tool == "llamafactory" else ["--resume_from_checkpoint", path]
    )
    assert resumed.data["cmd"][-len(want) :] == want
    assert run_end(events).name == "run_completed"
    recs = sup.steps()
    second = [r for r in recs if r.attempt == 1]
    assert second[0].step == older + 5 and second[-1].step == steps
    # LLaMA-Factory: trainer_log.jsonl gives the steps, the dict printed for the same step the grad norm.
    assert all(r.grad_norm is not None for r in recs)
    status = sup.status()
    assert status["max_steps"] == steps and status["state"] == "completed"
