"""The baseline's goodput, counted the way steadytune counts its own runs.

benchmarks/_baseline_trainer.py logs, per process (torchrun's restart count is its attempt): its
launch, each training loop's begin, each optimizer step with its own time, each checkpoint saved,
and its end (done, or an error). The benchmark adds what only it knows: when it killed a process,
and when it gave up on a run that made no progress. :func:`history` turns that into the records a
steadytune run writes (heartbeats with phases, step records, worker events, last words, the
supervisor's run_started, restart and end events), and ``steadytune.goodput.account`` does the
rest: both sides of the table are one computation over one vocabulary.
"""

from __future__ import annotations

from typing import Any

from steadytune.goodput.parts import RunHistory
from steadytune.records import Event, Heartbeat, PlanRevision, StepRecord, WorkerExit


def history(
    events: list[dict[str, Any]],
    started_ts: float,
    ended_ts: float,
    completed: bool,
    killed_ts: float | None = None,
    gave_up: bool = False,
) -> RunHistory:
    """The baseline run's records, from its log and the benchmark's own knowledge.

    Args:
        events: the lines of its ``--bench_log``, in order.
        started_ts: when the benchmark launched torchrun; ``ended_ts``: when it was over.
        completed: it trained every step and exited 0.
        killed_ts: when the benchmark SIGKILLed its worker (the kill and corrupt faults).
        gave_up: the run was killed at the time limit, making no progress (a hang).
    """
    stream: list[Any] = []
    plans: list[PlanRevision] = []
    attempt, process = -1, None
    began = False  # this process has begun a training loop already (auto_find_batch_size begins again)
    last_step_ts = started_ts
    for ev in events:
        kind, ts = ev.get("ev"), float(ev["ts"])
        if kind == "launch" or ev.get("attempt") != process:
            attempt, process, began = attempt + 1, ev.get("attempt"), False
            reason = "start" if attempt == 0 else "torchrun"
            plans.append(PlanRevision(revision=attempt, ts=ts, reason=reason, attempt=attempt))
            stream.append(Heartbeat(ts=float(ev.get("started", ts)), attempt=attempt, phase="setup"))
        if kind == "begin":
            if began:  # the loop begins again in the same process, after an out-of-memory error
                attempt += 1
                plans.append(
                    PlanRevision(revision=attempt, ts=ts, reason="auto_find_batch_size", attempt=attempt)
                )
                stream.append(Event(ts=ts, kind="lifecycle", name="rolled_back", data={"attempt": attempt}))
            began = True
            stream.append(
                Event(
                    ts=ts,
                    kind="lifecycle",
                    name="train_begin",
                    data={"attempt": attempt, "start_step": ev["step"]},
                )
            )
            stream.append(Heartbeat(ts=ts, attempt=attempt, phase="train"))
        elif kind == "step":
            stream.append(
                StepRecord(step=ev["step"], ts=ts, attempt=attempt, step_time_s=ev.get("step_time_s"))
            )
            last_step_ts = ts
        elif kind == "saved":  # the trainer saves right after the step's end: the loop waited from there
            stream.append(Heartbeat(ts=last_step_ts, attempt=attempt, phase="save"))
            stream.append(Heartbeat(ts=ts, attempt=attempt, phase="train"))
        elif kind in ("done", "exit"):
            status = "completed" if kind == "done" else "error"
            stream.append(WorkerExit(ts=ts, attempt=attempt, status=status))  # type: ignore[arg-type]
    supervisor = [
        Event(
            ts=started_ts, kind="lifecycle", name="run_started", data={"launch": {"launched_ts": started_ts}}
        )
    ]
    if killed_ts is not None:
        supervisor.append(
            Event(ts=killed_ts, kind="action", name="restart", data={"classification": "killed"})
        )
    if gave_up:
        supervisor.append(Event(ts=ended_ts, kind="anomaly", name="stall"))
    supervisor.append(
        Event(ts=ended_ts, kind="lifecycle", name="run_completed" if completed else "run_failed")
    )
    return RunHistory(tuple(plans), tuple(stream), tuple(supervisor), "baseline")
