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

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steadytune.checkpoint.store import clean_staging
from steadytune.engines.groups import Group, GroupLog, failures_path
from steadytune.engines.requests import ResourceRequest, requested_path, worker_bundle, write_request
from steadytune.protocol import WorkerEvent
from steadytune.records import Event, PlanRevision, Record
from steadytune.rundir import RunDir
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.source import REQUEST, NativeSource

if TYPE_CHECKING:
    from steadytune.config.schema import RayConfig
    from steadytune.supervise.resuming import Resumes
    from steadytune.supervise.runstate import RunState


def driver_command(run_root: Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "steadytune.engines.ray_driver", "--run-dir", str(run_root)]


class RaySource(NativeSource):
    """steadytune's worker in every Ray Train worker; the attempt's process is the Ray driver.

    Checkpoints, their manifest test and the resume copy are the native worker's. The run
    directory must be on storage every Ray node reaches (docs/ray.md). On a hang no stacks are
    dumped: Ray's workers are children of the raylets, not of the driver (``ray stack`` on a
    node shows them), so the supervisor finds none of its own to ask.
    """

    label = "Ray job"
    abilities = NativeSource.abilities | {REQUEST}

    def __init__(self, run: RunDir, env: dict[str, str] | None = None) -> None:
        super().__init__(run, 1, env)
        self._driver_attempt: int | None = None  # the attempt the running driver was started for
        # What the driver writes beside the streams, and the bytes of each already turned into events.
        self._tails: dict[Path, int] = {}
        self._seq = 0

    def start(self, plan: PlanRevision, log_path: Path) -> WorkerProcess:
        clean_staging(self.run.staging)
        self.watch(plan.attempt)
        env = {
            **self.env,
            "STEADYTUNE_ATTEMPT": str(plan.attempt),
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "RAY_TRAIN_V2_ENABLED": "1",
            "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # Ray's patched print repeats every log line in the log
        }
        proc = WorkerProcess(driver_command(self.run.root.resolve()), log_path, env=env)
        proc.how = "a new process: a Ray job's driver starts its own worker group"
        return proc

    @property
    def driver_attempt(self) -> int | None:
        """The attempt the running driver was started for; its groups are logged in ray/attempt-<A>.jsonl."""
        return self._driver_attempt

    def watch(self, attempt: int) -> None:
        """Follow what the driver of ``attempt`` writes beside the streams, from the start of each file."""
        self._driver_attempt = attempt
        self._tails = {failures_path(self.run.root, attempt): 0, requested_path(self.run.root, attempt): 0}

    def poll(self) -> list[Record]:
        """Each failure Ray's controller recorded since the last tick, as a ``worker_group_failed`` event,
        and each resource request the driver made of Ray, as ``resources_requested``."""
        out: list[Record] = []
        for path in list(self._tails):
            as_event = failure_event if path.name.endswith("-failures.jsonl") else requested_event
            out += [as_event(line) for line in self._new_lines(path)]
        return out

    def _new_lines(self, path: Path) -> list[str]:
        if not path.exists():
            return []
        with open(path, "rb") as f:
            f.seek(self._tails[path])
            chunk = f.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next tick
        self._tails[path] += len(whole)
        return [line for line in whole.decode("utf-8", "replace").splitlines() if line.strip()]

    def request_workers(self, kind: str, workers: int, reason: str, ts: float, cfg: RayConfig) -> Path | None:
        """Ask the running driver to request ``workers`` workers' resources from Ray (engines/requests.py);
        None when no driver runs to ask."""
        if self._driver_attempt is None:
            return None
        self._seq += 1
        bundle = worker_bundle(dict(cfg.resources_per_worker), cfg.use_gpu)
        req = ResourceRequest(self._seq, kind, workers, (bundle,) * workers, reason, ts)
        return write_request(self.run.root, self._driver_attempt, req)

    def describe(self) -> str:
        return f"{sys.executable} -m steadytune.engines.ray_driver (Ray Train)"


def failure_event(line: str) -> Event:
    """One line of the failures file (``{"ts": .., "ranks": {rank: error}}``) as the event the supervisor
    files."""
    try:
        data = json.loads(line)
    except ValueError:
        data = {}
    ranks = data.get("ranks") if isinstance(data.get("ranks"), dict) else {}
    ts = data.get("ts") if isinstance(data.get("ts"), (int, float)) else time.time()
    lost = ", ".join(
        f"rank {r}: {str(e).splitlines()[0][:160] if e else '?'}" for r, e in sorted(ranks.items())
    )
    return Event(
        ts=float(ts),
        kind="lifecycle",
        name=WorkerEvent.WORKER_GROUP_FAILED,
        message=f"Ray's worker group failed ({lost or 'no detail'}); Ray is forming the next one",
        severity="warning",
        data={"ranks": ranks},
    )


def requested_event(line: str) -> Event:
    """One line the driver wrote after asking Ray for resources, as the event the supervisor files."""
    try:
        data = json.loads(line)
    except ValueError:
        data = {}
    workers, bundles = data.get("workers"), data.get("bundles") or []
    ts = data.get("requested_ts") if isinstance(data.get("requested_ts"), (int, float)) else time.time()
    shape = bundles[0] if bundles else {}
    return Event(
        ts=float(ts),
        kind="action",
        name=WorkerEvent.RESOURCES_REQUESTED,
        message=f"asked Ray's autoscaler for {workers} worker(s) of {shape} ({data.get('kind', '?')}: "
        f"{data.get('reason', '')}); Ray resizes the group once they are there",
        data={k: data.get(k) for k in ("seq", "kind", "workers", "bundles", "reason", "recorded")},
    )


def group_revision(plan: PlanRevision, data: dict[str, Any], current_attempt: int) -> dict[str, Any] | None:
    """The plan changes a Ray worker group's start calls for; None when it changes nothing.

    Pure: the group's event data in, the revision's fields out (``reason`` among them).
    """
    world = int(data.get("world_size", 0)) or None
    attempt = int(data.get("attempt", current_attempt))
    reason = str(data.get("reason", "ray_start"))
    accum = data.get("gradient_accumulation_steps")
    shape = {"gradient_accumulation_steps": int(accum)} if isinstance(accum, int) else {}
    if attempt <= current_attempt:  # this attempt's first group: only its size (and accumulation) is news
        same_shape = not shape or plan.gradient_accumulation_steps == shape["gradient_accumulation_steps"]
        if world is None or (plan.world_size == world and same_shape):
            return None
        return {
            "reason": "world_size",
            "world_size": world,
            **shape,
            "notes": f"Ray started {world} worker(s)",
        }
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
        **shape,
        "notes": f"{why}; resuming from {where}"
        + (f"; gradient accumulation {shape['gradient_accumulation_steps']}" if shape else ""),
    }


def on_worker_group_failed(state: RunState) -> None:
    """Until the next group starts, the job is re-forming: judged by setup_timeout_s, not by the step pace."""
    state.attempt.phase, state.attempt.phase_since = "setup", state.clock()


def unannounced(logged: list[Group], current_attempt: int, announced_attempt: int) -> list[Group]:
    """Groups rank 0 logged (``ray/attempt-<A>.jsonl``) that never announced themselves: between the
    supervisor's attempt and the one announced now. A node lost while a group starts takes the
    announcement with it (rank 0 logs its decision before the group trains, and announces once its
    guard is up), and the plan would skip that attempt."""
    return [g for g in logged if current_attempt < g.attempt < announced_attempt]


def on_worker_group_started(state: RunState, resumes: Resumes, ev: Event, filed: Event | None) -> None:
    """A new Ray group: its size, attempt and resume point go into the plan, as a restart's would.

    A group logged but never announced before it gets its revision first, said to have trained nothing.
    """
    driver = getattr(state.source, "driver_attempt", None)
    if driver is not None and isinstance(ev.data.get("attempt"), int):
        logged = GroupLog(state.run.root, driver).read()
        for lost in unannounced(logged, state.attempt.number, ev.data["attempt"]):
            data = GroupLog.as_event_data(lost)
            _start_group(state, resumes, data, filed, "; lost before it announced itself")
    _start_group(state, resumes, ev.data, filed)


def _start_group(
    state: RunState, resumes: Resumes, data: dict[str, Any], filed: Event | None, note: str = ""
) -> None:
    changes = group_revision(state.plan, data, state.attempt.number)
    if changes is None:
        return
    if note:
        changes["notes"] = changes.get("notes", "") + note
    reason = changes.pop("reason")
    state.plans.revise(reason=reason, cause=filed, **changes)
    if "attempt" not in changes:
        return
    # A new group is a new timeline, as a restart by the supervisor is: its records carry the new attempt,
    # open anomalies of the old one are resolved, and its first step must continue the checkpoint.
    state.attempt.number = changes["attempt"]
    # The ranks a smaller group no longer has are forgotten, not stragglers.
    resumes.rewind(changes.get("resume_checkpoint"), world_size=changes.get("world_size") or None)
    state.attempt.heartbeats = {0: state.clock()}
    state.attempt.setup(state.clock())
