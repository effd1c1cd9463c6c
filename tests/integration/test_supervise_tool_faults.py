"""The fault matrix under the real `trl sft` and `llamafactory-cli train`, each in a venv of its own.

Every test trains the demo model through the tool's own command line under
`steadytune supervise`, injects one real fault — a stopped trainer (a hang), an LR far
too high, SIGTERM to the supervisor — and asserts from the run directory what the
supervisor did about it.

Each test prints a ``FAULT-ROW`` line (fault, detected as, action, steps redone,
seconds to recover, final weights finite): ``pytest -s ... | grep FAULT-ROW`` gives
the fault table.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest

from steadytune.checkpoint.external import check_external_checkpoint
from steadytune.records import Event, run_end
from tests.servers import Hook

from .runs import wait_for
from .toolruns import Supervised, ToolJob, alerts_config, all_finite, supervise, tool_job

pytestmark = pytest.mark.slow

# Anomalies an LR far too high raises on these tools (the first one depends on the tool and the method).
LR_ANOMALIES = ("loss_spike", "divergence", "grad_explosion", "nonfinite_grad", "nan_loss")


@pytest.fixture
def hook() -> Hook:
    h = Hook()
    yield h
    h.close()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _newest_complete(job: ToolJob) -> int:
    """The step of the newest checkpoint a restart may resume (whole weights, readable state)."""
    return max(s for s in job.checkpoints() if check_external_checkpoint(job.checkpoint(s))[0])


def _fault_row(
    sup: Supervised, fault: str, detected: str | None, weights: Path | None, **more: object
) -> dict:
    """One row of the fault table, from the run directory; printed, so `-s` collects it.

    Steps redone: the last step the first attempt logged, less the step the second one resumed
    from. Seconds to recover: from the anomaly event to the second attempt's first logged step.
    """
    events = sup.events()
    actions = [e for e in events if e.kind == "action" and e.name in ("rollback", "restart")]
    recs = sup.steps()
    row: dict = {"tool": sup.job.tool, "fault": fault, "detected_as": detected,
                 "action": actions[0].name if actions else None, "actions": len(actions),
                 "final": end.name if (end := run_end(events)) else None,
                 "final_loss": recs[-1].loss if recs else None, **more}  # fmt: skip
    if actions:
        first = [r for r in recs if r.attempt == 0]
        later = [r for r in recs if r.attempt == 1]
        plan = [json.loads(line) for line in (sup.run / "plan.jsonl").read_text().splitlines()]
        resumed = plan[1].get("resume_checkpoint") if len(plan) > 1 else None
        resumed_step = int(Path(resumed).name.split("-")[1]) if resumed else 0
        row["resumed_from"] = resumed_step
        row["steps_redone"] = (max(r.step for r in first) - resumed_step) if first else None
        cause = next((e for e in events if e.kind == "anomaly" and e.name == detected), None)
        if later and cause is not None:
            row["recover_s"] = round(later[0].ts - cause.ts, 1)
    row["weights_finite"] = all_finite(weights) if weights is not None and weights.exists() else None
    print("FAULT-ROW " + json.dumps(row))
    return row


def _preset_args(tool: str, key: str, value: str) -> list[str]:
    """How the tool takes ``key`` on its command line: --flags for TRL, key=value after LLaMA-Factory's
    YAML."""
    return [f"--{key}", value] if tool == "trl" else [f"{key}={value}"]


def _names(events: list[Event]) -> list[str]:
    return [e.name for e in events]


# -- 1. SIGSTOP of the trainer: a hang ------------------------------------------------------------


@pytest.mark.parametrize("tool", ["trl", "llamafactory"])
def test_a_stopped_trainer_is_a_stall_its_stacks_are_dumped_and_it_resumes(
    tool: str, tmp_path: Path, demo_assets: Path
) -> None:
    steps = 400
    job = tool_job(tool, demo_assets, tmp_path, steps, save_steps=50)
    with supervise(job, tmp_path, "--hang-floor", "6") as sup:
        sup.wait_checkpoint(100)
        trainer = sup.trainer()
        first_tree = {sup.worker(), *sup.pids}
        os.kill(trainer.pid, signal.SIGSTOP)
        # Frozen now: the newest whole checkpoint is the one the restart must take.
        resume = _newest_complete(job)
        wait_for(
            lambda: sup.alive() and len(sup.named("worker_started")) == 2, timeout=120, what="the restart"
        )
        left_at_restart = [p for p in first_tree if _alive(p)]
        rc = sup.finish()
    _fault_row(sup, "SIGSTOP trainer", "stall", job.out / job.weights_file)
    assert rc == 0, sup.stdout
    events = sup.events()
    names = _names(events)
    # The whole first tree (launcher and trainer) was gone before the second attempt began.
    assert left_at_restart == [], f"still running when attempt 1 started: {left_at_restart}"
    restart = next(e for e in events if e.name == "restart" and "classification" in e.data)
    assert names.index("stall") < events.index(restart)
    assert restart.data["classification"] == "stall"
    assert f"resuming from checkpoint-{resume}" in restart.message
    resume_arg = _preset_args(tool, "resume_from_checkpoint", str(job.checkpoint(resume)))
    cmd = events[names.index("worker_started", events.index(restart))].data["cmd"]
    assert cmd[-len(resume_arg) :] == resume_arg
    second = [r.step for r in sup.steps() if r.attempt == 1]
    assert second[0] == resume + 5 and second[-1] == steps
    assert run_end(events).name == "run_completed" and sup.status()["state"] == "completed"
    assert all_finite(job.out / job.weights_file)
    # Where it hung, in the run directory: the trainer's Python stack, from inside the Trainer.
    dumped = [e for e in events if e.name == "stacks_dumped"]
    assert dumped and names.index("stall") < names.index("stacks_dumped") < events.index(restart)
    dump = Path(dumped[0].data["file"])
    assert dump.parent == sup.run / "stacks" and trainer.pid in dumped[0].data["pids"]
    text = dump.read_text()
    # The stop lands wherever the trainer is: mostly inside the Trainer, but sometimes in a generator
    # that C code iterates (torch's named_parameters), where Python 3.11's dump of the main thread
    # shows that frame alone. Either way it is the training stack, not the launcher's: `trl` runs its
    # trainer under accelerate's launcher, which passes on the trainer's stderr only while it lives
    # (aborted first, it left a dump of accelerate/ and trl/cli/ frames alone).
    assert "Fatal Python error" in text
    trainer_libs = ("transformers/", "torch/", "trl/trainer/", "llamafactory/train/")
    assert any(f"site-packages/{lib}" in text for lib in trainer_libs), text[:3000]


# -- 2. An LR far too high --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "target"),
    [("trl", "start"), ("llamafactory", "start"), ("llamafactory", "checkpoint")],
)
def test_lr_far_too_high_is_rolled_back_with_a_lower_lr_and_alerted(
    tool: str, target: str, tmp_path: Path, demo_assets: Path, hook: Hook
) -> None:
    """LR 3.0 blows the demo model up within a few steps. ``target`` start: the first checkpoint comes
    after that, so the rollback starts over; checkpoint: one is saved every step, and the rollback
    resumes one from before the checkpoint that made the first bad step (a step's loss and gradient
    are computed on the previous step's weights, and without --inject its samples cannot be skipped).
    LLaMA-Factory's LoRA first goes wrong a few steps in. TRL's full fine-tuning does at its first
    update (the loss of step 2 is in the hundreds): with a checkpoint every step it starts over too,
    as its start row does, so it has no checkpoint row (it cost three minutes of saves)."""
    steps, lr, scale = 40, 3.0, 0.001
    save = 1 if target == "checkpoint" else 10
    job = tool_job(tool, demo_assets, tmp_path, steps, save_steps=save, logging_steps=1, lr=lr,
                   **({"save_total_limit": steps} if tool == "trl" else {}))  # fmt: skip
    cfg = alerts_config(tmp_path, "TEST_HOOK_URL", rollback_lr_scale=scale)
    with supervise(
        job, tmp_path, "--config", str(cfg), "--base-lr", str(lr), env={"TEST_HOOK_URL": hook.url}
    ) as sup:
        rc = sup.finish()
    events = sup.events()
    first_bad = next((e for e in events if e.kind == "anomaly" and e.name in LR_ANOMALIES), None)
    _fault_row(
        sup, f"LR {lr:g} (rollback to {target})", first_bad and first_bad.name, job.out / job.weights_file
    )
    assert rc == 0, sup.stdout
    assert first_bad is not None, _names(events)
    names = _names(events)
    rollback = events[names.index("rollback")]
    assert events.index(first_bad) < names.index("rollback")
    restart = next(e for e in events if e.name == "restart" and e.seq > rollback.seq)
    assert restart.data["lr_scale"] == pytest.approx(scale)
    # The lowered LR went in through the tool's own LR argument, and the plan says so.
    restarted = events[names.index("worker_started", names.index("rollback"))]
    lr_arg = _preset_args(tool, "learning_rate", f"{lr * scale:g}")
    assert restarted.data["cmd"][-len(lr_arg) :] == lr_arg
    plan = [json.loads(line) for line in (sup.run / "plan.jsonl").read_text().splitlines()]
    assert plan[1]["reason"] in LR_ANOMALIES and plan[1]["lr_scale"] == pytest.approx(scale)
    if target == "checkpoint":
        ck = restart.data.get("resume_checkpoint")
        resumed = int(Path(ck).name.split("-")[1]) if ck else 0
        assert ck is not None and resumed < first_bad.step - 1, (ck, first_bad.step)
    # The tool itself trained at the lowered LR after the rollback: its own logged LR says so.
    after = [r for r in sup.steps() if r.attempt >= 1]
    assert after and all(r.lr is not None and r.lr <= lr * scale * 1.0001 for r in after), [
        (r.attempt, r.step, r.lr) for r in after[:5]
    ]
    assert run_end(events).name == "run_completed" and sup.status()["state"] == "completed"
    assert all_finite(job.out / job.weights_file)
    # The alert reached the local webhook.
    wait_for(
        lambda: any(first_bad.name in json.dumps(b) for b in hook.bodies), timeout=30, what="webhook alert"
    )


def test_a_rollback_runs_trl_sfts_resumed_steps_at_half_the_lr_they_ran_at(
    tmp_path: Path, demo_assets: Path
) -> None:
    """TRL's linear decay lowers the LR it logs; the rollback halves the command's --learning_rate,
    which the schedule then lowers as before: each resumed step at 0.5x, not 0.5x of 0.5x."""
    job = tool_job("trl", demo_assets, tmp_path, 40, save_steps=10, logging_steps=1, lr=2e-3)
    faults = {"STEADYTUNE_FAULTS": json.dumps({"lr_burst_at_step": 22})}
    with supervise(job, tmp_path, "--inject", env=faults) as sup:
        rc = sup.finish()
    events = sup.events()
    _fault_row(sup, "LR x1000 at 22 (injected)", "rollback", job.out / job.weights_file)
    assert rc == 0, sup.stdout
    [said] = [e for e in events if e.name == "rollback_lr"]
    assert "x0.5 of the command's --learning_rate (0.002)" in said.message, said.message
    lr = {(r.attempt, r.step): r.lr for r in sup.steps() if r.lr is not None}
    resumed = min(step for attempt, step in lr if attempt == 1)
    assert resumed in (11, 21), resumed  # checkpoint-20, or -10 when the trouble is near 20
    assert lr[(1, resumed)] == pytest.approx(0.5 * lr[(0, resumed)], rel=0.02)


def test_a_nan_loss_injected_into_trl_sft_lands_and_its_update_is_skipped(
    tmp_path: Path, demo_assets: Path
) -> None:
    """TRL's SFTTrainer.compute_loss does not call Trainer.compute_loss: the drill's NaN fault must
    land in the loss its training_step backpropagates all the same, and the guard skip that update."""
    job = tool_job("trl", demo_assets, tmp_path, 16, save_steps=8, logging_steps=1)
    faults = {"STEADYTUNE_FAULTS": json.dumps({"nan_at_step": 11})}
    with supervise(job, tmp_path, "--inject", env=faults) as sup:
        rc = sup.finish()
    events = sup.events()
    _fault_row(sup, "NaN loss (injected)", "nan_loss", job.out / job.weights_file)
    assert rc == 0, sup.stdout
    landed = [e for e in events if e.name == "fault_injected"]
    assert [e.step for e in landed] == [11], _names(events)
    skipped = [e for e in events if e.name == "skip_step"]
    assert skipped and skipped[0].step == 11, _names(events)
    assert not sup.named("rollback") and len(sup.named("worker_started")) == 1  # handled in the trainer
    assert run_end(events).name == "run_completed" and all_finite(job.out / job.weights_file)


# -- 3. SIGTERM to the supervisor ---------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["trl", "llamafactory"])
def test_sigterm_to_the_supervisor_stops_the_tool_which_checkpoints_first(
    tool: str, tmp_path: Path, demo_assets: Path
) -> None:
    """Both tools' transformers have TrainingArguments.enable_jit_checkpoint: on SIGTERM the Trainer
    waits 3 s, saves checkpoint-<step> at the next step boundary and ends training."""
    steps, save = 2000, 1000  # a regular save never comes: the checkpoint at stop is the JIT one
    job = tool_job(tool, demo_assets, tmp_path, steps, save_steps=save, enable_jit_checkpoint="true")
    with supervise(job, tmp_path, "--stop-grace", "60") as sup:
        wait_for(lambda: sup.alive() and (sup.status().get("step") or 0) >= 20, timeout=300, what="step 20")
        sup.trainer()
        sent_at = sup.status()["step"]
        sup.proc.send_signal(signal.SIGTERM)
        rc = sup.finish(timeout=180)
    stopped_at = [s for s in job.checkpoints() if s > sent_at]
    _fault_row(
        sup, "SIGTERM supervisor", None, None, checkpoint_at_stop=stopped_at[-1] if stopped_at else None
    )
    assert rc == 128 + signal.SIGTERM, sup.stdout
    events = sup.events()
    stopped = run_end(events)
    assert stopped.name == "run_stopped" and stopped.data["signal"] == "SIGTERM"
    assert events[events.index(stopped) - 1].name == "stop_requested"
    status = sup.status()
    assert status["state"] == "stopped" and status["worker_pid"] is None
    assert sup.survivors() == [], "processes of the job outlived the stop"
    # The Trainer saved a whole checkpoint of where it had got to, and only then exited.
    saved = [s for s in job.checkpoints() if s > sent_at]
    assert saved, f"no checkpoint after step {sent_at}: {job.checkpoints()}"
    ckpt = job.checkpoint(saved[-1])
    assert saved[-1] % save and check_external_checkpoint(ckpt) == (True, "")
    assert not (ckpt / "checkpoint-is-incomplete.txt").exists()
    assert stopped.data["graceful"] is True and stopped.data["killed_pids"] == []
