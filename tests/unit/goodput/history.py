"""A run history built span by span, each span named with the part it is meant to be.

The builder writes the records a supervisor and a worker would write at each moment, and
tallies, beside them, the seconds the test means for each part: the expectation is the
construction's, never a number read back from the account.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from steadytune.goodput.parts import RunHistory
from steadytune.records import Event, Heartbeat, PlanRevision, StepRecord, WorkerExit


class Run:
    """A timeline under construction: ``spend`` moves the clock on, the other methods write records."""

    def __init__(self, t0: float = 1000.0) -> None:
        self.t0 = self.t = t0
        self.plans: list[PlanRevision] = []
        self.stream: list[Any] = []
        self.events: list[Event] = []
        self.want: Counter[str] = Counter()
        self.step_started: float | None = None
        self.off = 0.0

    # -- time -------------------------------------------------------------------------
    def spend(self, part: str, seconds: float) -> Run:
        self.want[part] += seconds
        self.t += seconds
        return self

    def not_running(self, seconds: float) -> Run:
        """Time the run does not run (ended, not resumed yet): no part of its wall time."""
        self.off += seconds
        self.t += seconds
        return self

    @property
    def wall(self) -> float:
        return self.t - self.t0 - self.off

    # -- the supervisor's records ----------------------------------------------------------
    def plan(self, attempt: int, reason: str, resume: int | None = None) -> Run:
        ckpt = f"/runs/r/checkpoints/checkpoint-{resume}" if resume is not None else None
        self.plans.append(
            PlanRevision(
                revision=len(self.plans), ts=self.t, reason=reason, attempt=attempt, resume_checkpoint=ckpt
            )
        )
        return self

    def event(self, name: str, kind: str = "lifecycle", **data: Any) -> Run:
        self.events.append(Event(ts=self.t, kind=kind, name=name, data=data))  # type: ignore[arg-type]
        return self

    # -- the worker's records --------------------------------------------------------------
    def worker_event(self, name: str, attempt: int, kind: str = "lifecycle", **data: Any) -> Run:
        self.stream.append(
            Event(ts=self.t, kind=kind, name=name, data={"rank": 0, "attempt": attempt, **data})
        )  # type: ignore[arg-type]
        return self

    def beat(self, phase: str, attempt: int) -> Run:
        self.stream.append(Heartbeat(ts=self.t, attempt=attempt, phase=phase))
        return self

    def step(
        self,
        n: int,
        attempt: int,
        seconds: float = 1.0,
        part: str = "productive",
        skipped: bool = False,
        step_time: float | None = -1.0,
    ) -> Run:
        """A step that takes ``seconds``, meant as ``part``; its step_time_s is that (or ``step_time``)."""
        self.spend(part, seconds)
        own = seconds if step_time == -1.0 else step_time
        self.stream.append(StepRecord(step=n, ts=self.t, attempt=attempt, step_time_s=own, skipped=skipped))
        return self

    def logged(self, n: int, attempt: int, step_time: float | None = None) -> Run:
        """A step record written now, its time already spent (a log line every few steps)."""
        self.stream.append(StepRecord(step=n, ts=self.t, attempt=attempt, step_time_s=step_time))
        return self

    def eval_record(self, n: int, attempt: int) -> Run:
        self.stream.append(
            StepRecord(step=n, ts=self.t, attempt=attempt, eval_loss=1.0, extra={"eval": True})
        )
        return self

    def exit(self, attempt: int, status: str) -> Run:
        self.stream.append(WorkerExit(ts=self.t, attempt=attempt, status=status))  # type: ignore[arg-type]
        return self

    # -- common stretches -----------------------------------------------------------------
    def launch(self, attempt: int, start: str, load_s: float = 4.0, resume: int = 0) -> Run:
        """A worker loading (``load_s`` in all, meant as ``start``) up to its training loop."""
        self.spend(start, load_s / 2).beat("setup", attempt).spend(start, load_s / 2)
        return self.worker_event("train_begin", attempt, start_step=resume).beat("train", attempt)

    def save(self, attempt: int, seconds: float = 0.5) -> Run:
        return self.beat("save", attempt).spend("save", seconds).beat("train", attempt)

    def history(self, gpus: int = 1) -> RunHistory:
        return RunHistory(tuple(self.plans), tuple(self.stream), tuple(self.events), "r", gpus)
