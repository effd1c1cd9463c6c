"""Restart plans and detection rewinds: what the supervisor changes when it starts a worker again.

Pure planning lives in :mod:`steadytune.policy.plan`; this module applies it to a
run's facts (verified checkpoints, the samples of each step, the config).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from steadytune.config.schema import SteadytuneConfig
from steadytune.detect.live import LiveDetector
from steadytune.layerwise import planned_group_lrs
from steadytune.policy.engine import Action
from steadytune.policy.plan import choose_rollback_checkpoint, onset_step, oom_escalation, rollback_plan
from steadytune.policy.restart import Decision
from steadytune.records import Anomaly, PlanRevision, StepRecord, from_dict, step_head, to_dict
from steadytune.rundir import RunDir
from steadytune.supervise.samples import samples_between


def replay_detector(run: RunDir, config: Any, upto_step: int, world_size: int | None = None) -> LiveDetector:
    """A detector fed the run's step records up to ``upto_step``, latest attempt of each step.

    Each stream is parsed once: which attempt of a step is the latest is known only at the end of
    the stream (a later attempt may go back to any checkpoint), so a first look finds it from each
    line's head (:func:`latest_attempts`), one int per step, and only then are the records parsed
    and the latest attempt of each fed, in the stream's order (each attempt continues its lineage).
    With ``world_size``, ranks at or past it are left out: a job that shrank no longer
    has them, and a rank that is gone must not read as one that trails (a straggler).
    """
    from steadytune.telemetry.stream import iter_records

    det = LiveDetector(config)
    for path in run.telemetry_files():
        if world_size is not None and int(path.stem.split("-")[1]) >= world_size:
            continue
        latest = latest_attempts(path, upto_step)
        for rec in iter_records(path):
            if (
                isinstance(rec, StepRecord)
                and latest.get(rec.step) == rec.attempt
                and not rec.extra.get("eval")
            ):
                det.observe_step(rec)
    return det


def latest_attempts(path: Path, upto_step: int) -> dict[int, int]:
    """The latest attempt of each (non-eval) step up to ``upto_step`` in the stream ``path``.

    Most lines are step records as :func:`~steadytune.records.to_json` writes them, whose step and
    attempt are read off the line's head (:func:`~steadytune.records.step_head`) without parsing
    the rest: parsed whole, this look cost as much as the replay's own parse. Any other line is
    parsed, so the answer is that of reading every record.
    """
    from steadytune.telemetry.jsonl import JsonlReader, parse_line

    latest: dict[int, int] = {}
    for raw in JsonlReader(path).raw_lines():
        if raw is None:
            continue
        head = step_head(raw)
        if head is None:
            value = parse_line(raw)
            try:
                rec = from_dict(value) if isinstance(value, dict) else None
            except (ValueError, TypeError):
                continue
            if not isinstance(rec, StepRecord) or rec.extra.get("eval"):
                continue
            head = rec.step, rec.attempt
        elif not head:
            continue  # surely no step record
        step, attempt = head
        if step <= upto_step:
            latest[step] = max(attempt, latest.get(step, -1))
    return latest


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
