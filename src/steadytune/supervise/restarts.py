"""Restart plans and detection rewinds: what the supervisor changes when it starts a worker again.

Pure planning lives in :mod:`steadytune.policy.plan`; this module applies it to a
run's facts (verified checkpoints, the samples of each step, the config).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from steadytune.config.schema import SteadytuneConfig
from steadytune.layerwise import planned_group_lrs
from steadytune.policy.engine import Action
from steadytune.policy.plan import choose_rollback_checkpoint, onset_step, oom_escalation, rollback_plan
from steadytune.policy.restart import Decision
from steadytune.records import Anomaly, PlanRevision, StepRecord, to_dict
from steadytune.supervise.samples import samples_between


def first_plan(cfg: SteadytuneConfig, ts: float) -> PlanRevision:
    """Revision 0: the config as written, with the LR of each configured optimizer group."""
    return PlanRevision(revision=0, ts=ts, reason="start", attempt=0, lr_groups=planned_group_lrs(cfg.train))


def anomaly_event_data(a: Anomaly) -> dict[str, Any]:
    data = to_dict(a)
    data.pop("type", None)
    return data


def crash_restart(
    plan: PlanRevision, decision: Decision, resume: str | None, cfg: SteadytuneConfig
) -> tuple[dict[str, Any] | None, str, str]:
    """Changes for a restart after a crash: resume point, and after an OOM what ran out."""
    changes: dict[str, Any] = {"resume_checkpoint": resume}
    why = decision.reason
    if decision.classification == "oom":
        escalation = oom_escalation(plan, cfg.data.max_seq_length, cfg.train.gradient_checkpointing)
        if escalation is None:
            return (
                None,
                "oom",
                "out of memory with gradient checkpointing and a short sequence: nothing safe is left",
            )
        more, why = escalation
        changes.update(more)
    return changes, decision.classification, why


def rollback_restart(
    plan: PlanRevision,
    action: Action,
    verified_steps: list[int],
    previous_resumes: list[int | None],
    checkpoints: Path,
    current_step: int,
    samples_by_step: Mapping[int, Sequence[int]],
    lr_scale: float,
    came_back_within: int = 0,
) -> tuple[dict[str, Any] | None, str, str, int | None]:
    """Changes for a rollback: an earlier checkpoint, the data window skipped, a lower LR.

    ``came_back_within``: steps after the last rollback's checkpoint in which the trouble counts as
    come back (:func:`~steadytune.policy.plan.choose_rollback_checkpoint`).
    """
    anomaly = action.anomaly
    assert anomaly is not None
    kind = anomaly.kind
    end = max(anomaly.end_step, current_step)
    # A step's record (its loss, its gradient) is computed on the weights of the step before it, so the
    # checkpoint before the anomaly holds the very weights that produced it: resumed without skipping
    # the step's samples (a job whose samples are unknown), it computes the same record again, whatever
    # the LR. Only where they are skipped is it a way out.
    # Where a detector that confirms late names the step the trouble began (onset_step), from there.
    onset = onset_step(anomaly)
    near = samples_between(samples_by_step, onset - 1, end)
    skippable = any(near.get(s) for s in range(onset, end + 1))
    before = onset if skippable else onset - 1
    target = choose_rollback_checkpoint(before, verified_steps, previous_resumes, came_back_within)
    if target is None:
        return (
            None,
            kind,
            f"{kind} at step {anomaly.start_step} again and no earlier checkpoint is left to roll back to",
            None,
        )
    path = str(checkpoints / f"checkpoint-{target}") if target else None
    nxt = rollback_plan(
        plan,
        plan.revision + 1,
        plan.ts,
        plan.attempt + 1,
        anomaly.start_step,
        end,
        target,
        path,
        samples_between(samples_by_step, target, end),
        lr_scale,
        None,
        kind,
    )
    changes = {
        "resume_checkpoint": nxt.resume_checkpoint,
        "lr_scale": nxt.lr_scale,
        "lr_groups": nxt.lr_groups,
        "skip_ranges": nxt.skip_ranges,
        "skip_steps": nxt.skip_steps,
    }
    return changes, kind, nxt.notes, target


def own_resume_note(first_step: int, began: int, checkpoint_steps: Iterable[int]) -> str | None:
    """What a watched job's first step says when it is past where its attempt was started from
    (``began``: the plan's checkpoint step, 0 for none): the tool resumed by itself, from the newest of
    its own checkpoints before that step (a LLaMA-Factory or axolotl run in an output folder that holds
    one). None where it began where it was started: no checkpoint of its own lies between.
    """
    own = [s for s in checkpoint_steps if began < s < first_step]
    if not own:
        return None
    step = max(own)
    return (
        f"the job resumed from step {step} by itself (its own resume from checkpoint-{step}): its first "
        f"step is {first_step}, not {began + 1}"
    )


def resume_expectation(checkpoint: Path) -> dict[str, float] | None:
    """Step, epoch, loss and LR of the last log entry a checkpoint's ``trainer_state.json`` holds."""
    import json

    from steadytune.checkpoint.manifest import checkpoint_step

    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    step = state.get("global_step") or checkpoint_step(checkpoint)
    logged = [e for e in state.get("log_history") or [] if isinstance(e, dict) and "loss" in e]
    last = logged[-1] if logged else {}
    out = {
        "step": step or 0,
        "epoch": state.get("epoch") or last.get("epoch"),
        "loss": last.get("loss"),
        "lr": last.get("learning_rate"),
    }
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def resume_problems(rec: StepRecord, expect: dict[str, float], steps_are_real: bool) -> list[str]:
    """How the first step record after a resume fails to continue the checkpoint (empty: it does).

    A tool that ignored the resume argument starts over from epoch 0; one that resumed
    from elsewhere jumps; either way the run is not what the plan says.
    """
    problems = []
    exp_step = int(expect.get("step", 0))
    exp_epoch = expect.get("epoch")
    if rec.epoch is not None and exp_epoch and rec.epoch < 0.5 * exp_epoch:
        problems.append(f"epoch {rec.epoch:g} where checkpoint-{exp_step} was at epoch {exp_epoch:g}")
    if steps_are_real and rec.step <= exp_step:
        problems.append(f"step {rec.step}, not after the checkpoint's step {exp_step}")
    loss, exp_loss = rec.loss, expect.get("loss")
    if loss is not None and exp_loss and loss > 2.5 * exp_loss and loss - exp_loss > 0.5:
        problems.append(f"loss {loss:.4g} where the curve was at {exp_loss:.4g}: it does not continue")
    return problems
