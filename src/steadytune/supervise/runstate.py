"""The state of a supervised run, as the supervisor's parts receive it.

The supervisor builds one :class:`RunState` and hands it to each of its parts (the
actions, the operator's controls, the resume and publish bookkeeping, the books, the
autoscaler); a part reads what it needs and changes what it owns, and never reaches back
into the supervisor. The state is grouped by concern: the :class:`Attempt` in progress,
a :class:`Stopping` under way, the run's :class:`History` that later decisions read, and
its :class:`Plans` (the revision in force and the budgets that shape the next).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.config.schema import SteadytuneConfig
from steadytune.detect.live import LiveDetector
from steadytune.policy.engine import Action, Policy
from steadytune.records import Event, PlanRevision, Record, WorkerExit, to_json
from steadytune.rundir import RunDir
from steadytune.supervise.next_attempt import RestartPlanner
from steadytune.supervise.process import ProcessTree, WorkerProcess
from steadytune.supervise.samples import SampleLog
from steadytune.supervise.source import WorkerSource
from steadytune.telemetry.progress import RunProgress


@dataclass
class Attempt:
    """The attempt in progress: its number, its processes, and how far it got."""

    number: int = 0
    worker: WorkerProcess | None = None
    tree: ProcessTree | None = None
    phase: str = "setup"  # rank 0's heartbeat phase: setup, train, save, eval, paused, finish
    phase_since: float = 0.0
    stepped: bool = False  # pace is judged only once this attempt has made a step
    heartbeats: dict[int, float] = field(default_factory=dict)  # rank -> when it last said anything

    def running(self) -> bool:
        return self.worker is not None and self.worker.poll() is None

    def setup(self, now: float) -> None:
        """A new timeline begins: judged by ``setup_timeout_s`` until its first step."""
        self.phase, self.phase_since, self.stepped = "setup", now, False


@dataclass
class Stopping:
    """A stop under way: who asked, when, and what it took."""

    grace_s: float = 120.0  # how long a worker asked to stop may take before it is killed
    interrupts: int = 0  # SIGINT/SIGTERM received: the first stops, the second kills
    signal: int | None = None  # the first of them
    sent_at: float | None = None  # when the worker was asked to stop (a request or a signal)
    pause_requested: bool = False  # a job that takes no requests was stopped on an operator's pause
    killed: bool = False  # the worker outlived its grace period
    reaped: list[int] = field(default_factory=list)  # what the last attempt left behind, killed


@dataclass
class History:
    """What the run went through that later decisions read."""

    checkpoint_steps: list[int] = field(default_factory=list)  # saves the worker reported, in order
    trouble_steps: list[int] = field(default_factory=list)  # steps of warnings/criticals, for LAST_GOOD
    samples_by_step: SampleLog = field(default_factory=SampleLog)  # for rollback-and-skip
    rollback_resumes: list[int | None] = field(default_factory=list)  # where each rollback went
    exits: list[WorkerExit] = field(default_factory=list)  # every rank's last words, every attempt
    last_save_ts: float | None = None


class Plans:
    """The run's plan revisions: the one in force, the restart budgets that shape the next, plan.jsonl."""

    def __init__(
        self, first: PlanRevision, planner: RestartPlanner, path: Path, record: Callable[[Record], None]
    ) -> None:
        self.current = first
        self.planner = planner
        self.path = path
        self.record = record  # the observers follow every revision written

    def write(self, plan: PlanRevision | None = None) -> None:
        """Append ``plan`` (default: the one in force) to plan.jsonl, synced: a worker reads it next."""
        plan = plan or self.current
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(to_json(plan) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.record(plan)

    def revise(self, reason: str, cause: Event | None = None, **changes: Any) -> PlanRevision:
        """Write the next plan revision, inheriting everything the last one said."""
        self.current = self.planner.revision(self.current, reason, cause.seq if cause else None, **changes)
        self.write()
        return self.current


@dataclass
class RunState:
    """One run's state, grouped by concern; the parts of the supervisor are handed it."""

    cfg: SteadytuneConfig
    run: RunDir
    source: WorkerSource
    clock: Callable[[], float]
    plans: Plans
    progress: RunProgress
    detector: LiveDetector
    policy: Policy
    status: str = "starting"  # running, restarting, stopping, paused; at the end the run's outcome
    pending: Action | None = None  # an action that stopped (or holds) the worker on purpose
    attempt: Attempt = field(default_factory=Attempt)
    stop: Stopping = field(default_factory=Stopping)
    history: History = field(default_factory=History)
    leak_snapshot_pending: bool = False  # a leak's checkpoint, once taken, asks for an allocator snapshot
    started_ts: float = 0.0
    launch: dict[str, Any] = field(default_factory=dict)  # when the run was asked for (run_started)

    @property
    def plan(self) -> PlanRevision:
        return self.plans.current

    @property
    def planner(self) -> RestartPlanner:
        return self.plans.planner
