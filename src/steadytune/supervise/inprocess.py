"""A rollback carried out inside the running worker, where its process is healthy.

A restart-based rollback kills the worker and starts a new one from the plan revision:
imports, model load and checkpoint load, seconds on a model that loads in under one.
Where the worker's process can be trusted (it runs, alone, and the trouble was a spike
or a divergence, not a NaN/Inf that may have poisoned it), the supervisor writes the same
plan revision (with a new attempt number), rewinds detection as for a restart, and sends
the worker a ``rollback`` request; the worker reloads the checkpoint in place and goes on
(``train/rollback.py``). Its records carry the new attempt from then, so everything that
reads attempts (timelines, detection replays, the drill) sees the same run as after a
restart.

Where it cannot (``recover.in_process_rollback: false``, several processes, non-finite
state, no checkpoint to reload, the worker refuses or fails the reload, or it does not take
the request within ``recover.in_process_ack_timeout_s``), the rollback is the process
restart it always was, from the plan already computed.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.checkpoint.manifest import checkpoint_step
from steadytune.policy.engine import Action
from steadytune.protocol import send_control
from steadytune.records import Event, StepRecord
from steadytune.supervise.outbox import Outbox
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.publishing import Publishes
from steadytune.supervise.resuming import Resumes
from steadytune.supervise.runstate import RunState
from steadytune.supervise.source import RELOAD

# After these the process itself may hold non-finite state: only a new one is trusted.
NONFINITE_KINDS = frozenset({"nan_loss", "nonfinite_grad"})

Plan = tuple[dict[str, Any] | None, str, str]  # (changes, reason, why), as plan_after_action gives them


@dataclass
class Awaited:
    """An in-process rollback sent and not yet done."""

    action: Action
    worker: WorkerProcess
    sent_ts: float
    plan: Plan
    target: int
    acked: bool = False


class InProcessRollbacks:
    """The supervisor's side of in-process rollbacks: when, the request, and the fallback to a restart."""

    def __init__(self, state: RunState, out: Outbox, resumes: Resumes, publishes: Publishes) -> None:
        self.state, self.out, self.resumes, self.publishes = state, out, resumes, publishes
        self.awaited: Awaited | None = None
        self._fallback: Plan | None = None  # the plan a restart carries out instead
        self._queued: Action | None = None  # taken by want(), started by the next tick()

    def refusal(self, action: Action) -> str | None:
        """Why ``action`` must restart the worker's process (None: it may roll back inside it)."""
        st = self.state
        if not st.cfg.recover.in_process_rollback:
            return "recover.in_process_rollback is off"
        if RELOAD not in st.source.abilities:
            return f"the {st.source.label} cannot reload a checkpoint in process"
        if (st.plan.nproc_per_node or st.cfg.run.nproc_per_node) > 1:
            return "the worker runs several processes"
        if action.anomaly is not None and action.anomaly.kind in NONFINITE_KINDS:
            return f"{action.anomaly.kind}: non-finite state may have poisoned the process"
        if not st.attempt.running():
            return f"no {st.source.label} is running"
        if self.publishes.failed:
            return "a checkpoint publish failed in the worker, which stops at its next step"
        if self.awaited is not None:
            return "an in-process rollback is already under way"
        return None

    def want(self, action: Action) -> bool:
        """Whether ``action`` rolls back inside the worker (False: the caller restarts the process).

        It is held as the run's pending action until the records read with the one that raised it
        are handled, exactly as a restart's is, so the rest of the incident (a gradient explosion
        beside the spike) is filed and not acted on again; :meth:`tick` then starts it.
        """
        if self.refusal(action) is not None:
            return False
        self.state.pending = self._queued = action
        return True

    def _start(self, action: Action) -> None:
        st = self.state
        changes, reason, why = planned = self.resumes.plan_after_action(action)
        resume = changes.get("resume_checkpoint") if changes else None
        worker = st.attempt.worker
        if not resume or changes is None or worker is None or worker.poll() is not None:
            # Nothing to reload (the run ends, or starts over with fresh weights), or no worker left to
            # reload it: the restart path does it, with this very plan (computing it again would choose
            # an older checkpoint).
            self._fallback = planned
            self._kill_for(action)
            return
        now = st.clock()
        event = self.out.emit(
            "action",
            "rollback_in_process",
            f"rolling back inside the running {st.source.label} (pid {worker.pid}): {why}",
            severity="warning",
            step=st.progress.step,
            data={
                "classification": reason,
                "in_process": True,
                **{k: changes[k] for k in ("resume_checkpoint", "lr_scale") if changes.get(k) is not None},
            },
        )
        st.planner.action_restarts += 1
        previous = st.attempt.number
        st.attempt.number += 1
        st.plans.revise(
            reason=reason, cause=event, attempt=st.attempt.number, notes=f"{why}; in process", **changes
        )
        # The request goes out as soon as the plan it carries out is written; rewinding detection (a
        # replay of the run's records) happens while the worker reaches its step boundary.
        issuer = f"policy:{action.anomaly.kind if action.anomaly else 'rollback'}"
        send_control(st.run, "rollback", issuer=issuer, attempt=previous, log=self.out.events)
        self.awaited = Awaited(action, worker, now, planned, checkpoint_step(Path(resume)) or 0)
        self.resumes.rewind(resume, cleared_by="rollback")
        st.attempt.setup(now)

    def _kill_for(self, action: Action) -> None:
        """The restart path carries ``action`` out: the worker is killed, and the loop restarts it."""
        self.state.pending = action
        if self.state.attempt.worker is not None:
            self.state.attempt.worker.signal_tree(signal.SIGKILL)

    def stale(self, rec: StepRecord) -> bool:
        """A step of the timeline being left, read after the rollback was decided: not for detection."""
        return self.awaited is not None and rec.attempt < self.state.attempt.number

    def take_fallback(self) -> Plan | None:
        """The plan a restart carries out in place of an in-process rollback (once); None if none."""
        planned, self._fallback = self._fallback, None
        return planned

    def tick(self) -> None:
        """Start a rollback :meth:`want` took; restart a worker that has not taken its request in time."""
        st = self.state
        queued, self._queued = self._queued, None
        if queued is not None and st.pending is queued:
            st.pending = None
            self._start(queued)
            return
        awaited = self.awaited
        if awaited is None:
            return
        if awaited.worker is not st.attempt.worker:
            self.awaited = None  # that worker is gone (it crashed and was restarted): nothing to wait for
            return
        if awaited.worker.poll() is not None:
            # It ended first (its last step came before the request was seen, or it died reloading):
            # the rollback still has to happen, so the restart path carries it out.
            self.fall_back("did not happen: the worker exited first")
            return
        waited = st.clock() - awaited.sent_ts
        if not awaited.acked and waited > st.cfg.recover.in_process_ack_timeout_s:
            self.fall_back(f"was not taken within {waited:.0f}s (recover.in_process_ack_timeout_s)")

    def on_ack(self, ev: Event) -> None:
        if self.awaited is not None:
            self.awaited.acked = True

    def on_done(self, ev: Event) -> None:
        """The worker reloaded the checkpoint and trains on: what it saved meanwhile is abandoned too."""
        if self.awaited is None:
            return
        self.resumes.abandon_after(self.awaited.target)
        self.awaited = None

    def on_failed(self, ev: Event) -> None:
        if self.awaited is not None:
            self.fall_back(f"failed in the worker: {ev.data.get('reason') or ev.message}")

    def fall_back(self, why: str) -> None:
        """Restart the worker's process to carry out the rollback's plan (the supervisor's restart path)."""
        awaited, self.awaited = self.awaited, None
        if awaited is None or self.state.pending is not None:
            return
        changes, reason, planned_why = awaited.plan
        self._fallback = (changes, reason, f"{planned_why}; in a new process: the in-process rollback {why}")
        self._kill_for(awaited.action)
