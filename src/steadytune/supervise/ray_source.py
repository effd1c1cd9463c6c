"""A run on Ray Train (``run.engine: ray``): the supervisor's attempt is a Ray driver process.

The driver (``engines/ray_driver.py``) fits a Ray Train V2 ``TorchTrainer`` on an existing
cluster; each Ray worker runs steadytune's own worker path with the guard inside and writes
``telemetry/rank-N.jsonl`` itself, so this source has every ability a native worker has.
Ray resizes an elastic group and restarts it after a lost node on its own, inside one
attempt; each new group announces itself (``worker_group_started``), and
:func:`on_worker_group_started` makes it a plan revision with its world size, its resume
point and a fresh attempt number, and rewinds detection as a restart of the supervisor's does.

Torch-free and Ray-free: Ray is imported by the driver, never here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steadytune.checkpoint.store import clean_staging
from steadytune.records import Event, PlanRevision
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.restarts import resume_expectation
from steadytune.supervise.source import NativeSource

if TYPE_CHECKING:
    from steadytune.supervise.supervisor import Supervisor


def driver_command(run_root: Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "steadytune.engines.ray_driver", "--run-dir", str(run_root)]


class RaySource(NativeSource):
    """steadytune's worker in every Ray Train worker; the attempt's process is the Ray driver.

    Checkpoints, their manifest test and the resume copy are the native worker's. The run
    directory must be on storage every Ray node reaches (docs/ray.md). Stack dumps reach the
    driver only: Ray's workers are children of the raylets (``ray stack`` on a node shows them).
    """

    label = "Ray job"

    def start(self, plan: PlanRevision, log_path: Path) -> WorkerProcess:
        clean_staging(self.run.staging)
        env = {
            **self.env,
            "STEADYTUNE_ATTEMPT": str(plan.attempt),
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "RAY_TRAIN_V2_ENABLED": "1",
            "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # Ray's patched print repeats every log line in the log
        }
        return WorkerProcess(driver_command(self.run.root.resolve()), log_path, env=env)

    def describe(self) -> str:
        return f"{sys.executable} -m steadytune.engines.ray_driver (Ray Train)"


def group_revision(plan: PlanRevision, data: dict[str, Any], current_attempt: int) -> dict[str, Any] | None:
    """The plan changes a Ray worker group's start calls for; None when it changes nothing.

    Pure: the group's event data in, the revision's fields out (``reason`` among them).
    """
    world = int(data.get("world_size", 0)) or None
    attempt = int(data.get("attempt", current_attempt))
    reason = str(data.get("reason", "ray_start"))
    if attempt <= current_attempt:  # this attempt's first group: only its size is news
        if world is None or plan.world_size == world:
            return None
        return {"reason": "world_size", "world_size": world, "notes": f"Ray started {world} worker(s)"}
    resume = data.get("resume_checkpoint")
    before = data.get("previous_world_size")
    why = (
        f"Ray resized the worker group {before} → {world}"
        if reason == "ray_resize"
        else f"Ray restarted the worker group after a failure, with {world} worker(s)"
        + (f" (was {before})" if before and before != world else "")
    )
    where = Path(resume).name if resume else "the start"
    return {
        "reason": reason,
        "attempt": attempt,
        "world_size": world,
        "resume_checkpoint": resume,
        "notes": f"{why}; resuming from {where}",
    }


def on_worker_group_started(sup: Supervisor, ev: Event, filed: Event | None) -> None:
    """The supervisor's handler of ``worker_group_started`` (a method of it: see supervisor.py)."""
    changes = group_revision(sup.plan, ev.data, sup.attempt)
    if changes is None:
        return
    reason = changes.pop("reason")
    sup.revise(reason=reason, cause=filed, **changes)
    if "attempt" not in changes:
        return
    # A new group is a new timeline, as a restart by the supervisor is: its records carry the new attempt,
    # open anomalies of the old one are resolved, and its first step must continue the checkpoint.
    sup.attempt = changes["attempt"]
    resume = changes.get("resume_checkpoint")
    sup.rewind_detection(resume)
    sup.last_heartbeat = {0: sup.clock()}
    sup.worker_phase, sup.phase_since = "setup", sup.clock()
    sup.attempt_stepped = False
    sup._expect = resume_expectation(Path(resume)) if resume else None
