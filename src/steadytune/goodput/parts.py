"""The words of the goodput account: its parts, their names, and the account itself.

``account.py`` computes an :class:`Account` from a :class:`RunHistory`; everything that shows
one (the summary line, ``steadytune goodput``, the dashboard, ``/metrics``, the drill) reads
these. Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from steadytune.records import Event, Heartbeat, PlanRevision, StepRecord, WorkerExit

StreamRecord = StepRecord | Heartbeat | Event | WorkerExit

PRODUCTIVE = "productive"
EVAL = "eval"
# Lost time, in the order a person reads it: before training, around it, after it.
LOST = (
    "queue",
    "preflight",
    "startup",
    "restart",
    "redone",
    "hang",
    "save",
    "recovery",
    "pause",
    "shutdown",
    "unattributed",
)
PARTS = (PRODUCTIVE, EVAL, *LOST)
LABELS: dict[str, str] = {
    PRODUCTIVE: "productive",
    EVAL: "evaluation",
    "queue": "queue wait",
    "preflight": "preflight",
    "startup": "start-up",
    "restart": "restarts",
    "redone": "redone",
    "hang": "hangs",
    "save": "saves",
    "recovery": "in-process recovery",
    "pause": "pauses",
    "shutdown": "shut-down",
    "unattributed": "unattributed",
}


@dataclass(frozen=True)
class RunHistory:
    """What the account reads of a run: its plan revisions, rank 0's stream, the supervisor's events."""

    plans: tuple[PlanRevision, ...] = ()
    stream: tuple[StreamRecord, ...] = ()  # rank 0's telemetry, in file order
    events: tuple[Event, ...] = ()  # events.jsonl
    run_id: str = ""
    gpus: int = 1  # devices the run holds: GPU-seconds are its seconds times this


@dataclass(frozen=True)
class Segment:
    """A stretch of the run's wall time and what it went to."""

    start: float
    end: float
    part: str

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Account:
    """A run's wall time, split into :data:`PARTS` (seconds); the parts add up to ``wall_s``."""

    run_id: str
    start_ts: float
    end_ts: float
    seconds: dict[str, float]
    ended: bool  # the run's end is recorded; else it ends at the reading (live, or its supervisor died)
    state: str | None  # how it ended: completed, failed, stopped (None while live)
    steps_kept: int  # optimizer steps that survive (last attempt of each)
    steps_redone: int  # step records a later attempt trained again
    interruptions: int  # attempts that lost work: restarts and rollbacks, not an operator's resume
    saves: int  # stretches the loop waited on a checkpoint
    step_s: float | None  # median step time of the kept steps
    gpus: int = 1
    segments: tuple[Segment, ...] = ()
    # Between the run's end and an operator's `steadytune resume`: the run was not running, so this
    # is no part of its wall time, neither productive nor lost.
    stopped_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.end_ts - self.start_ts - self.stopped_s

    @property
    def productive_s(self) -> float:
        return self.seconds[PRODUCTIVE]

    @property
    def lost_s(self) -> float:
        return sum(self.seconds[p] for p in LOST)

    @property
    def goodput(self) -> float | None:
        """Productive share of the wall time (None for a run with no time yet)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    def share(self, part: str) -> float:
        return self.seconds[part] / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def save_cost_s(self) -> float | None:
        """The mean time the loop waited for one checkpoint."""
        return self.seconds["save"] / self.saves if self.saves else None

    @property
    def exposure_s(self) -> float:
        """The time the run could be interrupted in: its wall time less the queue and the preflight."""
        return self.wall_s - self.seconds["queue"] - self.seconds["preflight"]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Account:
        """The account :meth:`to_dict` wrote (its segments only where :meth:`stored` wrote them)."""
        seconds = dict.fromkeys(PARTS, 0.0)
        seconds.update({k: float(v) for k, v in data.get("seconds", {}).items() if k in seconds})
        return cls(
            run_id=str(data.get("run", "")),
            start_ts=float(data["start_ts"]),
            end_ts=float(data["end_ts"]),
            seconds=seconds,
            ended=bool(data.get("ended")),
            state=data.get("state"),
            steps_kept=int(data.get("steps_kept", 0)),
            steps_redone=int(data.get("steps_redone", 0)),
            interruptions=int(data.get("interruptions", 0)),
            saves=int(data.get("saves", 0)),
            step_s=data.get("step_s"),
            gpus=int(data.get("gpus", 1)),
            stopped_s=float(data.get("stopped_s", 0.0)),
            segments=tuple(Segment(float(a), float(b), str(p)) for a, b, p in data.get("segments") or ()),
        )

    def stored(self) -> dict[str, Any]:
        """:meth:`to_dict` with the segments: what a finished run's account is kept as on disk."""
        return {**self.to_dict(), "segments": [[s.start, s.end, s.part] for s in self.segments]}

    def to_dict(self) -> dict[str, Any]:
        """The account as JSON: seconds and shares of every part, the counts behind them."""
        return {
            "run": self.run_id,
            "start_ts": self.start_ts,
            "end_ts": self.end_ts,
            "wall_s": self.wall_s,
            "goodput": self.goodput,
            "productive_s": self.productive_s,
            "eval_s": self.seconds[EVAL],
            "lost_s": self.lost_s,
            "seconds": dict(self.seconds),
            "shares": {p: self.share(p) for p in PARTS},
            "ended": self.ended,
            "state": self.state,
            "steps_kept": self.steps_kept,
            "steps_redone": self.steps_redone,
            "interruptions": self.interruptions,
            "saves": self.saves,
            "save_cost_s": self.save_cost_s,
            "step_s": self.step_s,
            "gpus": self.gpus,
            "stopped_s": self.stopped_s,
        }
