"""Checkpoints still being published, and the rollbacks that wait for one.

The worker publishes a checkpoint beside its next steps (fsync, hash, rename, manifest:
``guard/hf.py``). It writes ``checkpoint_publishing`` into its stream once the trainer's save
is written, before the next step's record, then ``checkpoint_saved`` or
``checkpoint_publish_failed``. A rollback decided on a step read in between would pass that
checkpoint over for the newest *verified* one, a whole save interval further back. So it is
held (as the supervisor's pending action, which keeps the rest of the incident from acting
again) until the checkpoint is verified, its publish fails, the worker exits, or
``recover.publish_wait_s`` passes; then it goes its way (in the worker, or by a restart) and
the choice sees what became of the checkpoint, and the plan says why it was passed over.
"""

from __future__ import annotations

from dataclasses import dataclass

from steadytune.policy.engine import Action
from steadytune.policy.plan import onset_step, publish_to_await
from steadytune.supervise.outbox import Outbox
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.runstate import RunState


@dataclass
class Held:
    """A rollback waiting for the publish of ``step``."""

    action: Action
    step: int
    worker: WorkerProcess
    since: float


class Publishes:
    """The supervisor's view of the worker's checkpoint publishes, and the rollback held for one."""

    def __init__(self, state: RunState, out: Outbox) -> None:
        self.state, self.out = state, out
        self.in_flight: set[int] = set()  # steps whose publish the worker began and has not ended
        self.why_not: dict[int, str] = {}  # why a checkpoint a rollback waited for did not become one
        self.failed = False  # a publish failed in the running worker: it stops at its next step
        self.held: Held | None = None

    # -- what the worker reports ---------------------------------------------------------------------
    def on_publishing(self, step: int) -> None:
        self.in_flight.add(step)
        self.why_not.pop(step, None)

    def on_saved(self, step: int) -> None:
        self.in_flight.discard(step)
        self.why_not.pop(step, None)

    def on_failed(self, step: int, error: str) -> None:
        self.in_flight.discard(step)
        self.why_not[step] = f"its publish failed ({error})"
        self.failed = True

    def on_worker_start(self) -> None:
        """A new worker wipes the staging folder: what the last one had on its way never arrives."""
        self.in_flight.clear()
        self.why_not.clear()
        self.failed = False
        self.held = None

    def unfinished(self, step: int) -> bool:
        """Whether checkpoint ``step`` is on its way: being published by a worker that still runs."""
        return step in self.in_flight and self.state.attempt.running()

    # -- the rollback that waits ----------------------------------------------------------------------
    def hold(self, action: Action) -> bool:
        """Hold ``action`` (a rollback) while the checkpoint it would go back to is being published.

        True: held, as the run's pending action; :meth:`tick` gives it back once that is settled. False:
        nothing to wait for, and the caller carries it out now.
        """
        st = self.state
        wait_s = st.cfg.recover.publish_wait_s
        worker = st.attempt.worker
        if wait_s <= 0 or worker is None or worker.poll() is not None or self.held is not None:
            return False
        start = onset_step(action.anomaly) if action.anomaly is not None else action.step
        # The checkpoints whose publish was read to end (verifying them again is the choice's job).
        verified = [s for s in st.history.checkpoint_steps if s < start]
        step = publish_to_await(start, verified, st.history.rollback_resumes, self.in_flight)
        if step is None:
            return False
        st.pending = action
        self.held = Held(action, step, worker, st.clock())
        self.out.emit(
            "action",
            "publish_awaited",
            f"the rollback waits for checkpoint-{step}, still being published, up to {wait_s:g}s "
            "(recover.publish_wait_s)",
            severity="warning",
            step=st.progress.step,
            data={"checkpoint": f"checkpoint-{step}", "wait_s": wait_s},
        )
        return True

    def tick(self) -> Action | None:
        """The held rollback, to be carried out now that its checkpoint is verified, failed, or waited on
        long enough; None while it waits, or when there is none (or its worker is gone)."""
        held = self.held
        st = self.state
        if held is None:
            return None
        if held.worker is not st.attempt.worker:
            self.held = None
            return None
        if held.worker.poll() is not None:
            # The worker ended first: its publish is over, whichever way it went. The rollback stays the
            # pending action, and the restart the loop now makes chooses from what is on disk.
            self.held = None
            if held.step in self.in_flight:
                self.why_not[held.step] = "the worker exited before its publish finished"
            return None
        waited = st.clock() - held.since
        if held.step in self.in_flight:
            if waited < st.cfg.recover.publish_wait_s:
                return None
            self.why_not[held.step] = f"still being published after {waited:.0f}s (recover.publish_wait_s)"
        self.held = None
        if st.pending is held.action:
            st.pending = None
        return held.action

    def passed_over(self, target: int, before: int) -> list[str]:
        """Why each checkpoint between ``target`` and step ``before`` that a rollback waited for is not it."""
        return [
            f"not checkpoint-{step}: {why}"
            for step, why in sorted(self.why_not.items(), reverse=True)
            if target < step < before
        ]
