"""A rollback inside the running worker: the checkpoint reloaded, the plan revision applied, training on.

The supervisor writes the rollback's plan revision (checkpoint, skip list, LR scale, a new
attempt number) and sends the worker a ``rollback`` request. At the next step boundary the
guard's callback stops the HF training loop without saving; :func:`train_with_rollbacks`
then makes the trainer what a new worker process built for that plan would be (the
optimizer and scheduler rebuilt at the plan's LR, the sampler without the skipped samples)
and trains again from the checkpoint, which reloads the model weights, the optimizer and
scheduler state and the RNG state exactly as a resume in a new process does. So the
update after the rollback is the one a restart would make, without a new interpreter,
imports or model load.

A worker refuses (``rollback_failed``, then it exits and the supervisor restarts it from
the same plan) when its own state is not to be trusted (non-finite weights or optimizer
state), when the plan changes what only a new process can change (batch shape, sequence
length, processes), or when the reload itself fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from steadytune.protocol import RESERVED_ISSUERS, WorkerEvent
from steadytune.records import PlanRevision
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import latest_plan

if TYPE_CHECKING:
    from steadytune.config.schema import SteadytuneConfig
    from steadytune.guard.core import Guard
    from steadytune.guard.hf import GuardCallback
    from steadytune.train.runner import GuardedTrainer

# What a running trainer cannot change: its data loader, its model's memory shape, its processes.
PROCESS_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "gradient_checkpointing",
    "dataloader_num_workers",
    "nproc_per_node",
)


class RollbackFailed(RuntimeError):
    """The worker could not roll back in process; the supervisor restarts it from the same plan."""

    for_a_new_process = True  # the worker's exit says so: a new process may well succeed


def skip_ids(plan: PlanRevision) -> set[int]:
    """The sample ids the plan's skip ranges name."""
    return {i for a, b in plan.skip_ranges for i in range(a, b + 1)}


def nonfinite_state(model: Any, optimizer: Any) -> str | None:
    """The first trainable weight or optimizer state tensor holding a NaN/Inf; None when all are finite.

    Frozen weights are left out: no update touches them, so a rollback cannot have to undo them.
    """
    for name, p in model.named_parameters():
        if p.requires_grad and p.is_floating_point() and not bool(torch.isfinite(p).all()):
            return f"the weight {name!r}"
    for state in getattr(optimizer, "state", {}).values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"the optimizer state {key!r}"
    return None


def refusal(request: dict[str, Any], current: PlanRevision, new: PlanRevision, trainer: Any) -> str | None:
    """Why this worker must not roll back in process to ``new`` (None: it may)."""
    if not str(request.get("issuer", "")).startswith(RESERVED_ISSUERS):
        return f"the request came from {request.get('issuer')!r}, not from the supervisor"
    if new.attempt <= current.attempt or not new.resume_checkpoint:
        return f"the newest plan revision ({new.revision}) is no rollback to a checkpoint for a later attempt"
    changed = [f for f in PROCESS_FIELDS if getattr(new, f) != getattr(current, f)]
    if changed:
        return "the plan changes what only a new process can: " + ", ".join(changed)
    bad = nonfinite_state(trainer.model, trainer.optimizer)
    if bad is not None:
        return f"{bad} is not finite: the process may be poisoned"
    return None


def apply_plan(trainer: GuardedTrainer, cfg: SteadytuneConfig, plan: PlanRevision) -> None:
    """Make ``trainer`` what ``build_trainer`` makes for ``plan``, keeping its model and data.

    The optimizer and scheduler are dropped, so the next ``train()`` builds them at the plan's
    LR and loads the checkpoint's state into them (keeping the plan's LR, ``guard/hf.py``).
    """
    from steadytune.train.runner import lr_plan

    trainer.args.learning_rate = cfg.train.learning_rate * plan.lr_scale
    trainer.st_lr_plan = lr_plan(cfg, plan, trainer.args.learning_rate)
    trainer.st_skip = skip_ids(plan)
    trainer.st_split = max(1, plan.micro_batch_split)
    trainer.optimizer = None
    trainer.lr_scheduler = None


def train_with_rollbacks(
    trainer: GuardedTrainer,
    callback: GuardCallback,
    guard: Guard,
    run: RunDir,
    cfg: SteadytuneConfig,
    plan: PlanRevision,
) -> PlanRevision:
    """Train ``plan``, then each in-process rollback the supervisor asks for; the plan trained last.

    Raises :class:`RollbackFailed` (after telling the supervisor) where a rollback must restart
    the process instead; anything else the training raised, as it was.
    """
    resume = plan.resume_checkpoint
    reloading = False
    while True:
        try:
            trainer.train(resume_from_checkpoint=resume)
        except Exception as exc:
            if not reloading or guard.steps_this_attempt:
                raise
            raise _failed(guard, f"reloading {resume} failed: {type(exc).__name__}: {exc}") from exc
        request = callback.take_rollback()
        if request is None:
            return plan
        new = latest_plan(run)
        why = refusal(request, plan, new, trainer)
        if why is not None:
            raise _failed(guard, why)
        callback.wait_for_saves()  # the abandoned timeline's save is sealed and reported before the reload
        guard.begin_attempt(new.attempt)
        apply_plan(trainer, cfg, new)
        callback.expect_reload(new)
        plan, resume, reloading = new, new.resume_checkpoint, True


def _failed(guard: Guard, why: str) -> RollbackFailed:
    guard.notify(
        "action",
        WorkerEvent.ROLLBACK_FAILED,
        f"in-process rollback refused: {why}",
        severity="warning",
        reason=why,
    )
    return RollbackFailed(why)
