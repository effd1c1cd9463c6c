"""The goodput account of one run: its wall time, split into training kept and time lost, by cause.

Pure: a :class:`RunHistory` (the run's records, as its directory holds them) in, an
:class:`Account` out; no clock, no I/O. ``goodput/load.py`` reads a run directory into a
history, live or after the fact, so the summary line, ``steadytune goodput``, the dashboard,
``/metrics`` and the drill all say the same numbers.

The account walks one timeline: the supervisor's events (``events.jsonl``), the plan
revisions and rank 0's stream, merged in time order. Every moment from the run's start to its
end is in exactly one *activity*, which the records switch:

- before the first attempt: ``queue`` (a server job, from submission to its process's start),
  ``preflight`` (the check ``run`` makes first), ``startup`` (the rest: imports, model and data
  load, until the first step begins);
- a heartbeat's phase: ``save`` (the loop waits for a checkpoint), ``eval``, ``pause`` (held in
  memory), ``setup`` (an attempt loading: the attempt's *start cause*, below), ``train``;
- ``train`` time is held until the record that ends it: a step record makes it that step's
  work (``productive`` when that record is the last attempt of its step, ``redone`` when a later
  attempt trained the step again, ``recovery`` when the NaN guard dropped the update; the part
  of a step before an in-process OOM split is ``recovery`` too); the death of its attempt makes it
  the attempt's *end cause*.

An attempt starts for a cause: ``startup`` (the first), ``pause`` (an operator's resume),
``recovery`` (a rollback inside the running worker) or ``restart`` (any new process after a
crash, a hang, a rollback or a resize); from the end of the attempt before it to its first
step's start is that cause. The first step's own time is its ``step_time_s`` (or the attempt's
median step time): the rest before it was loading. An attempt ends (dies) at its exit record,
at the acknowledgement of an in-process rollback, or at the supervisor's ``restart`` event;
the training that was under way is then its end cause: ``shutdown`` (it completed or was
stopped), ``pause`` (paused), ``hang`` (the supervisor called it a stall) or ``redone`` (the
work in progress was thrown away). After the last attempt, until the run's end, is
``shutdown``. A step whose work took far longer than the step itself (over 4x its own time and
30 s beyond it) with no phase to say why leaves the excess ``unattributed``.

A run that ended (stopped, failed, or its supervisor died) and was taken up again by
``steadytune resume`` did not run in between: nothing held the machine for it, so that time is
no part of its wall time (``stopped_s``), neither productive nor lost. It runs from the last
record before the ``run_resumed`` that names what the run ``after`` (the resume of a stopped run,
not of a pause) to that event; the old attempt's wind-down before it is ``shutdown``, and the
resumed supervisor's start-up, to its first step, ``startup``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from steadytune.goodput.parts import (
    EVAL,
    PARTS,
    PRODUCTIVE,
    Account,
    RunHistory,
    Segment,
    StreamRecord,
)
from steadytune.records import RUN_END_NAMES, Event, Heartbeat, PlanRevision, StepRecord, WorkerExit, run_end

TRAIN = "train"  # the activity whose time waits for the record that says what it was
STOPPED = "stopped"  # the run not running, between its end and an operator's `steadytune resume`
FINISH = "finish"  # the worker's phase after its training loop: the last publish, the final model
_PHASES = {"save": "save", "eval": EVAL, "paused": "pause"}
# Worker events the account reads from rank 0's stream (its own clock, not the supervisor's filing time).
STREAM_EVENTS = frozenset({"train_begin", "reduce_microbatch", "ack_rollback", "rolled_back"})
# Supervisor events it reads from events.jsonl.
SUPERVISOR_EVENTS = frozenset({"run_started", "restart", "stall", "run_resumed", *RUN_END_NAMES})
HANG_CLASSES = frozenset({"stall", "hang"})
OPERATOR_RESUME = "resume"  # the plan reason of an attempt started by an operator's resume
# Plan reasons of attempts started on purpose, not to recover: they lose no work to an interruption.
PLANNED = frozenset({OPERATOR_RESUME, "ray_resize", "world_size"})
PLANNED_PREFIX = "scale_"
# A step's work past max(SILENT_FACTOR x its own time, its own time + SILENT_FLOOR_S) is unexplained.
SILENT_FACTOR = 4.0
SILENT_FLOOR_S = 30.0


def relevant(record: Any) -> bool:
    """Whether the account reads ``record``: a loader may drop every other one before keeping a history."""
    if isinstance(record, (StepRecord, Heartbeat, WorkerExit, PlanRevision)):
        return True
    # An alert's delivery record bears the name of the event it tells of: it is none of these.
    return (
        isinstance(record, Event)
        and record.kind != "alert"
        and (record.name in STREAM_EVENTS or record.name in SUPERVISOR_EVENTS)
    )


# --------------------------------------------------------------------------- the facts, looked up once


def _attempt_of(rec: StreamRecord) -> int | None:
    if isinstance(rec, Event):
        value = rec.data.get("attempt")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
    return rec.attempt


def _checkpoint_step(path: str | None) -> int | None:
    if not path:
        return None
    tail = path.rstrip("/").rsplit("/", 1)[-1]
    number = tail.rsplit("-", 1)[-1]
    return int(number) if tail.startswith("checkpoint-") and number.isdigit() else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class _Attempt:
    """What the walk needs to know about one attempt before it gets there."""

    number: int
    first_ts: float
    last_ts: float
    last_step_ts: float | None = None
    steps: list[float] = field(default_factory=list)  # step_time_s of its steps
    exit: WorkerExit | None = None
    ack_rollback_ts: float | None = None
    rolled_back: bool = False  # it began as an in-process rollback
    reason: str | None = None  # its plan revision's reason
    start_step: int | None = None  # where its training began (train_begin)
    start: str = "restart"
    end: str = "redone"
    death: float | None = None
    after_stop: bool = False  # it began a supervisor that resumed the run after it had ended


@dataclass(frozen=True)
class _Mark:
    ts: float
    order: int  # ties: the run's own marks, then the records in file order, then deaths
    kind: str
    record: Any = None
    index: int = 0  # a record's place in the stream


class _Facts:
    """The history looked up once: which step records survive, each attempt's causes and death."""

    def __init__(self, history: RunHistory, now: float | None) -> None:
        events = history.events
        started = next((e for e in events if e.name == "run_started"), None)
        launch = started.data.get("launch") if started is not None else None
        launch = launch if isinstance(launch, dict) else {}
        self.submitted = _float(launch.get("submitted_ts"))
        self.launched = _float(launch.get("launched_ts"))
        pre = launch.get("preflight")
        self.preflight = (
            (float(pre[0]), float(pre[1]))
            if isinstance(pre, (list, tuple)) and len(pre) == 2 and all(_float(x) is not None for x in pre)
            else None
        )
        self.end_event = run_end(events)
        self.restarts = [e for e in events if e.name == "restart" and "classification" in e.data]
        self.stalls = [e.ts for e in events if e.kind == "anomaly" and e.name == "stall"]
        all_ts = [r.ts for r in history.stream] + [p.ts for p in history.plans] + [e.ts for e in events]
        candidates = [t for t in (self.submitted, self.launched, started.ts if started else None) if t]
        candidates += [p.ts for p in history.plans[:1]]
        if self.preflight:
            candidates.append(self.preflight[0])
        self.start = min(candidates + all_ts, default=0.0)
        if self.end_event is not None:
            self.end = self.end_event.ts
        elif now is not None:
            self.end = now
        else:
            self.end = max(all_ts, default=self.start)
        self.end = max(self.end, self.start)
        self.stopped = stopped_spans(events, history.stream)
        self._kept(history.stream)
        self._attempts(history)

    def _kept(self, stream: Iterable[StreamRecord]) -> None:
        """The index in the stream of the record that survives for each step: its last attempt's last."""
        best: dict[int, tuple[int, int]] = {}
        for i, rec in enumerate(stream):
            if isinstance(rec, StepRecord) and not rec.extra.get("eval"):
                have = best.get(rec.step)
                if have is None or rec.attempt >= have[0]:
                    best[rec.step] = (rec.attempt, i)
        self.kept = {i for _, i in best.values()}

    def _attempts(self, history: RunHistory) -> None:
        found: dict[int, _Attempt] = {}
        for rec in history.stream:
            number = _attempt_of(rec)
            if number is None:
                continue
            a = found.get(number)
            if a is None:
                a = found[number] = _Attempt(number, rec.ts, rec.ts)
            a.first_ts, a.last_ts = min(a.first_ts, rec.ts), max(a.last_ts, rec.ts)
            if isinstance(rec, StepRecord) and not rec.extra.get("eval"):
                a.last_step_ts = rec.ts
                if rec.step_time_s:
                    a.steps.append(rec.step_time_s)
            elif isinstance(rec, WorkerExit):
                a.exit = rec
            elif isinstance(rec, Event) and rec.name == "ack_rollback":
                a.ack_rollback_ts = rec.ts
            elif isinstance(rec, Event) and rec.name == "rolled_back":
                a.rolled_back = True
            elif isinstance(rec, Event) and rec.name == "train_begin" and a.start_step is None:
                start_step = rec.data.get("start_step")
                a.start_step = start_step if isinstance(start_step, int) else None
        started: dict[int, PlanRevision] = {}
        for revision in history.plans:  # the first revision of an attempt is the one it started with
            started.setdefault(revision.attempt, revision)
        self.attempts = [found[n] for n in sorted(found)]
        all_steps = [t for a in self.attempts for t in a.steps]
        self.run_step_s = statistics.median(all_steps) if all_steps else None
        for i, a in enumerate(self.attempts):
            nxt = self.attempts[i + 1] if i + 1 < len(self.attempts) else None
            plan = started.get(a.number)
            a.reason = plan.reason if plan is not None else None
            if a.start_step is None and plan is not None:
                a.start_step = _checkpoint_step(plan.resume_checkpoint) if plan.resume_checkpoint else 0
            prev = self.attempts[i - 1] if i > 0 else None
            a.after_stop = prev is not None and any(
                prev.last_ts <= start and end <= a.first_ts for start, end in self.stopped
            )
            if i == 0 or a.after_stop:
                a.start = "startup"  # a new supervisor, its process, the model and data loaded again
            elif a.reason == OPERATOR_RESUME:
                a.start = "pause"
            elif a.rolled_back:
                a.start = "recovery"
            a.death = self._death(a, nxt)
            a.end = self._end_cause(a, nxt)

    def _death(self, a: _Attempt, nxt: _Attempt | None) -> float | None:
        """When the attempt stopped training for good; None while it still runs."""
        restart = next((e.ts for e in self.restarts if e.ts >= a.last_ts), None)
        if a.exit is not None:
            death: float | None = a.exit.ts
        elif a.ack_rollback_ts is not None and nxt is not None and nxt.rolled_back:
            death = a.ack_rollback_ts
        elif restart is not None and (nxt is None or restart <= nxt.first_ts):
            death = restart
        elif nxt is not None:
            death = nxt.first_ts
        else:
            death = self.end if self.end_event is not None else None
        if death is None:
            return None
        death = max(death, a.last_ts)
        return min(death, nxt.first_ts) if nxt is not None else death

    def _end_cause(self, a: _Attempt, nxt: _Attempt | None) -> str:
        """What the training under way when the attempt died was, now that it is gone."""
        status = a.exit.status if a.exit is not None else None
        if status in ("completed", "stopped") or (
            nxt is None
            and status is None
            and self.end_event is not None
            and self.end_event.name != "run_failed"
        ):
            return "shutdown"
        if status == "paused":
            return "pause"
        since = a.last_step_ts if a.last_step_ts is not None else a.first_ts
        until = a.death if a.death is not None else self.end
        if any(since <= t <= until for t in self.stalls):
            return "hang"
        restart = next((e for e in self.restarts if e.ts >= a.last_ts), None)
        if restart is not None and restart.data.get("classification") in HANG_CLASSES:
            return "hang"
        return "redone"


# --------------------------------------------------------------------------- the walk


class _Walk:
    """Charges every stretch between two marks to the activity in force; holds train time for its step."""

    def __init__(self, facts: _Facts) -> None:
        self.facts = facts
        self.t = facts.start
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.segments: list[Segment] = []
        self.activity = "queue" if facts.submitted is not None else "startup"
        self.bucket: list[tuple[float, float]] = []  # train time not yet said what it was
        self.ooms: list[float] = []  # in-process OOM splits inside the bucket
        self.by_number = {a.number: a for a in facts.attempts}
        self.attempt: _Attempt | None = None
        self.dead = False
        self.stepped = False
        self.last_step: int | None = None
        self.saves = 0
        self.redone = 0
        self.index = 0  # the stream position of the record being read
        self.kept_times: list[float] = []
        self.stopped = 0.0  # seconds the run was not running (ended, then resumed)

    # -- charging ----------------------------------------------------------------------
    def charge(self, start: float, end: float, part: str) -> None:
        if end <= start:
            return
        self.seconds[part] += end - start
        self.segments.append(Segment(start, end, part))

    def timeline(self) -> tuple[Segment, ...]:
        """The segments in time order, neighbours of one part joined (held train time is charged late)."""
        out: list[Segment] = []
        for seg in sorted(self.segments, key=lambda s: s.start):
            last = out[-1] if out else None
            if last is not None and last.part == seg.part and seg.start - last.end < 1e-6:
                out[-1] = Segment(last.start, max(last.end, seg.end), seg.part)
            else:
                out.append(seg)
        return tuple(out)

    def advance(self, ts: float) -> None:
        ts = min(max(ts, self.t), self.facts.end)
        if ts <= self.t:
            return
        if self.activity == STOPPED:  # no part of the wall time
            self.stopped += ts - self.t
        elif self.activity == TRAIN:
            self.bucket.append((self.t, ts))
        else:
            self.charge(self.t, ts, self.activity)
        self.t = ts

    def set_activity(self, activity: str) -> None:
        if activity == "save" and self.activity != "save":
            self.saves += 1
        self.activity = activity

    def flush(self, part: str, until: float | None = None) -> None:
        """Charge the held train time (all of it, or the part before ``until``) to ``part``."""
        keep: list[tuple[float, float]] = []
        for start, end in self.bucket:
            cut = end if until is None else min(end, until)
            self.charge(start, cut, part)
            if cut < end:
                keep.append((max(start, cut), end))
        self.bucket = keep

    def take(self, seconds: float, part: str) -> None:
        """Charge the first ``seconds`` of the held train time to ``part``."""
        keep: list[tuple[float, float]] = []
        for start, end in self.bucket:
            cut = min(end, start + max(0.0, seconds))
            self.charge(start, cut, part)
            seconds -= cut - start
            if cut < end:
                keep.append((cut, end))
        self.bucket = keep

    # -- marks -------------------------------------------------------------------------
    def mark(self, m: _Mark) -> None:
        self.advance(m.ts)
        if m.kind == "launch":
            self.set_activity("startup")
        elif m.kind == "preflight_start":
            self.set_activity("preflight")
        elif m.kind == "preflight_end":
            self.set_activity("startup")
        elif m.kind == "death":
            self.die(m.record)
        elif m.kind == "stopped":
            self.activity = STOPPED
        elif m.kind == "resumed":
            self.activity = "startup"  # a new supervisor starting, until its worker's records say more
        elif m.kind == "record":
            self.index = m.index
            self.record(m.record)

    def begin(self, a: _Attempt) -> None:
        if self.attempt is not None and not self.dead:
            self.die(self.attempt)
        self.attempt, self.dead, self.stepped, self.last_step = a, False, False, a.start_step
        self.bucket, self.ooms = [], []
        # Held until its first step says how long that step took: the time before it was loading.
        self.set_activity(TRAIN)

    def die(self, a: _Attempt) -> None:
        if self.attempt is not a or self.dead:
            return
        self.flush(a.end if self.stepped else a.start)
        self.ooms = []
        self.dead = True
        i = self.facts.attempts.index(a)
        nxt = self.facts.attempts[i + 1] if i + 1 < len(self.facts.attempts) else None
        if nxt is not None and nxt.after_stop:
            self.set_activity("shutdown")  # the supervisor winds down: the run ends, to be resumed later
        elif nxt is not None:
            self.set_activity(nxt.start)
        elif a.end == "pause":
            self.set_activity("pause")  # paused until an operator resumes it (or the run is stopped)
        else:
            # Nothing more trains: the supervisor winds down; while it still runs, it is restarting.
            self.set_activity("shutdown" if self.facts.end_event is not None else "restart")

    def record(self, rec: StreamRecord) -> None:
        number = _attempt_of(rec)
        current = self.attempt.number if self.attempt is not None else None
        if number is not None and (current is None or number > current):
            self.begin(self.by_number[number])
        elif number is not None and number < (current or 0):
            return  # a line of an attempt already left
        if self.dead:
            return
        if isinstance(rec, Heartbeat):
            if rec.phase in (TRAIN, FINISH):  # after the loop, held for the attempt's end cause
                self.set_activity(TRAIN)
            elif rec.phase == "setup":
                # A watched command's adapter says setup until its first log: held like train time.
                self.set_activity(self.attempt.start if self.stepped and self.attempt is not None else TRAIN)
            elif rec.phase in _PHASES:
                self.set_activity(_PHASES[rec.phase])
        elif isinstance(rec, StepRecord) and not rec.extra.get("eval"):
            self.step(rec)
        elif isinstance(rec, Event) and rec.name == "reduce_microbatch":
            self.ooms.append(rec.ts)

    def step(self, rec: StepRecord) -> None:
        a = self.attempt
        assert a is not None
        own = rec.step_time_s or (statistics.median(a.steps) if a.steps else self.facts.run_step_s)
        covered = max(1, rec.step - self.last_step) if self.last_step is not None else 1
        expected = covered * own if own else None
        if not self.stepped and expected is not None:
            # Before the attempt's first step began, it was loading: the attempt's start cause.
            self.flush(a.start, until=rec.ts - expected)
        self.stepped, self.last_step = True, rec.step
        work = sum(end - start for start, end in self.bucket)
        if expected is not None:
            silent = work - max(SILENT_FACTOR * expected, expected + SILENT_FLOOR_S)
            if silent > 0:
                self.take(silent, "unattributed")
        if self.ooms:
            self.flush("recovery", until=max(self.ooms))  # the step's try that ran out of memory
            self.ooms = []
        if rec.skipped:
            part = "recovery"
        elif self.index in self.facts.kept:
            part = PRODUCTIVE
            if rec.step_time_s:
                self.kept_times.append(rec.step_time_s)
        else:
            part = "redone"
            self.redone += 1
        self.flush(part)
        self.set_activity(TRAIN)

    def run(self, marks: list[_Mark]) -> None:
        for m in marks:
            self.mark(m)
        self.advance(self.facts.end)
        if self.attempt is not None and not self.dead:
            # Still training at the reading: what runs now is the step under way (a stall once called).
            a = self.attempt
            stalled = any(t >= (a.last_step_ts or a.first_ts) for t in self.facts.stalls)
            self.flush(("hang" if stalled else PRODUCTIVE) if self.stepped else a.start)


def _marks(history: RunHistory, facts: _Facts) -> list[_Mark]:
    marks: list[_Mark] = []
    if facts.submitted is not None and facts.launched is not None:
        marks.append(_Mark(facts.launched, 0, "launch"))
    if facts.preflight is not None:
        marks.append(_Mark(facts.preflight[0], 1, "preflight_start"))
        marks.append(_Mark(facts.preflight[1], 2, "preflight_end"))
    for i, rec in enumerate(history.stream):
        marks.append(_Mark(rec.ts, 3, "record", rec, i))
    for a in facts.attempts:
        if a.death is not None:
            marks.append(_Mark(a.death, 4, "death", a))
    for start, end in facts.stopped:  # after the deaths and records of its moment, before those of its end
        marks.append(_Mark(start, 5, "stopped"))
        marks.append(_Mark(end, -1, "resumed"))
    marks.sort(key=lambda m: (m.ts, m.order, m.index))
    return marks


def stopped_spans(events: Iterable[Event], stream: Iterable[StreamRecord] = ()) -> list[tuple[float, float]]:
    """The stretches a run was not running: from its last record before each ``run_resumed`` that a
    resume of an ended run wrote (its ``data.after``: stopped, failed, crashed) to that event."""
    events = list(events)
    seen = sorted([e.ts for e in events if e.kind != "alert"] + [r.ts for r in stream])
    spans: list[tuple[float, float]] = []
    for e in events:
        if e.kind == "lifecycle" and e.name == "run_resumed" and e.data.get("after"):
            before = [t for t in seen if t < e.ts]
            if before:
                spans.append((before[-1], e.ts))
    return spans


def lost_work(reason: str | None, start: str = "restart") -> bool:
    """Whether an attempt that began for ``reason`` was an interruption: a restart or a rollback, not
    an operator's resume or a planned resize."""
    planned = reason in PLANNED or (reason or "").startswith(PLANNED_PREFIX)
    return start in ("restart", "recovery") and not planned


def interruption_record(plans: Iterable[PlanRevision], events: Iterable[Event]) -> tuple[int, float]:
    """``(interruptions, exposure seconds)`` of a run from its plan revisions and events alone.

    What a machine's interruption rate needs from each of its runs, without reading their
    training records (``check`` asks it of many runs): the attempts that began after an
    interruption, and the time from the run's launch to its end, less the preflight.
    """
    firsts: dict[int, PlanRevision] = {}
    for plan in plans:
        firsts.setdefault(plan.attempt, plan)
    count = sum(1 for n, plan in firsts.items() if n > 0 and lost_work(plan.reason))
    events = list(events)
    started = next((e for e in events if e.name == "run_started"), None)
    if started is None or not events:
        return count, 0.0
    found = started.data.get("launch")
    launch: dict[str, Any] = found if isinstance(found, dict) else {}
    start = _float(launch.get("launched_ts")) or started.ts
    pre = launch.get("preflight")
    preflight = float(pre[1]) - float(pre[0]) if isinstance(pre, list) and len(pre) == 2 else 0.0
    ended = run_end(events)
    end = ended.ts if ended is not None else events[-1].ts
    stopped = sum(b - a for a, b in stopped_spans(events))
    return count, max(0.0, end - start - preflight - stopped)


def account(history: RunHistory, now: float | None = None) -> Account:
    """The goodput account of ``history``.

    Args:
        history: the run's records (``goodput.load.read_history`` reads them from its directory).
        now: the time of the reading, for a run whose end is not recorded yet (live); without it,
            such a run ends at its last record.

    Returns:
        An :class:`Account` whose parts add up to its wall time.
    """
    facts = _Facts(history, now)
    walk = _Walk(facts)
    walk.run(_marks(history, facts))
    end = facts.end_event
    state = end.name.removeprefix("run_") if end is not None else None
    return Account(
        run_id=history.run_id,
        start_ts=facts.start,
        end_ts=facts.end,
        seconds=walk.seconds,
        ended=end is not None,
        state=state,
        steps_kept=len(facts.kept),
        steps_redone=walk.redone,
        interruptions=sum(1 for a in facts.attempts if a.number > 0 and lost_work(a.reason, a.start)),
        saves=walk.saves,
        step_s=statistics.median(walk.kept_times) if walk.kept_times else None,
        gpus=history.gpus,
        segments=walk.timeline(),
        stopped_s=walk.stopped,
    )
