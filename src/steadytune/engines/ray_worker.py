"""The training function of each Ray Train worker: the same guard and HF path as a native worker.

Ray starts it in every worker of a group, with ``torch.distributed`` already set up and
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment, so ``train/worker.py
train_attempt`` runs unchanged (DDP over gloo on CPU, NCCL on GPUs). Rank 0 decides which
attempt the group trains and from which checkpoint (``engines/groups.py``), tells the
others, and reports the group to the supervisor as a ``worker_group_started`` event in its
own stream. The run directory must be on storage every node reaches (docs/ray.md).
"""

from __future__ import annotations

import faulthandler
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

from steadytune.engines.groups import Group, GroupLog, accumulation_for, newest_own_checkpoint, next_group
from steadytune.protocol import WorkerEvent
from steadytune.records import PlanRevision, from_dict
from steadytune.rundir import RunDir


def _share(group: Group | None) -> Group:
    """Rank 0's decision, for every rank of the group."""
    import torch.distributed as dist

    box: list[Any] = [group]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def _nodes() -> int | None:
    try:
        import ray

        return sum(1 for n in ray.nodes() if n.get("Alive"))
    except Exception:  # a reading that is unavailable is a value, not a failed group
        return None


def with_accumulation(group: Group, base: PlanRevision, run: RunDir) -> Group:
    """The group with the accumulation that keeps the effective batch (``ray.keep_effective_batch``)."""
    from steadytune.config.load import load_config

    cfg = load_config(run.config, check_paths=False)
    if not cfg.ray.keep_effective_batch:
        return group
    accum = base.gradient_accumulation_steps or cfg.train.gradient_accumulation_steps
    # The plan's accumulation is for the world size it recorded; the config's, for the most workers.
    steps, _exact = accumulation_for(accum, base.world_size or cfg.ray.max_workers, group.world_size)
    return replace(group, gradient_accumulation_steps=steps)


def train_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker`` of the TorchTrainer; ``config`` holds the run directory and plan."""
    import ray.train

    from steadytune.train.worker import train_attempt

    run = RunDir(Path(config["run_dir"]))
    base: PlanRevision = from_dict(config["plan"])  # type: ignore[assignment]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    log = GroupLog(run.root, base.attempt)
    decided = None
    if rank == 0:
        earlier = log.read()
        newest = newest_own_checkpoint(run.checkpoints, base.attempt) if earlier else None
        decided = with_accumulation(
            next_group(earlier, base.attempt, base.resume_checkpoint, world, newest, _nodes()), base, run
        )
        log.append(decided)
    group = _share(decided)
    plan = replace(base, attempt=group.attempt, resume_checkpoint=group.resume_checkpoint)
    if group.gradient_accumulation_steps is not None:
        plan = replace(plan, gradient_accumulation_steps=group.gradient_accumulation_steps)

    run.stacks.mkdir(parents=True, exist_ok=True)
    stack_file = open(run.stacks / f"rank-{rank}-attempt-{plan.attempt}.txt", "a")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)

    def announce(guard: Any) -> None:
        what = {
            "ray_start": f"Ray worker group of {world} started",
            "ray_resize": f"Ray resized the worker group {group.previous_world_size} → {world}",
            "ray_restart": f"Ray restarted the worker group after a failure, with {world} worker(s)",
        }[group.reason]
        where = Path(group.resume_checkpoint).name if group.resume_checkpoint else "the start"
        guard.notify(
            "lifecycle",
            WorkerEvent.WORKER_GROUP_STARTED,
            f"{what}, from {where} (attempt {group.attempt})",
            severity="info" if group.reason == "ray_start" else "warning",
            **GroupLog.as_event_data(group),
        )

    code = train_attempt(run, plan, rank, announce=announce if rank == 0 else None, main_thread=False)
    if code != 0:
        # Ray counts this against FailureConfig(max_failures); the reason is in the rank's stream.
        raise RuntimeError(
            f"steadytune worker rank {rank} (attempt {plan.attempt}) exited {code}: "
            f"see {run.telemetry_dir / f'rank-{rank}.jsonl'}"
        )
