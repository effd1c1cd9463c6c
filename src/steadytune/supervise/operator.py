"""An operator's say in a run: signals, ``steadytune pause|resume|checkpoint|stop``, and the pause itself.

Requests arrive in the run's control queue (``protocol.RequestQueue``); each is filed once as a
``control`` event. A source that takes requests (steadytune's worker, an injected trainer) acts
on them itself; a job that takes none is stopped or paused from outside, by signal. The first
interrupt asks for a stop that saves; the second kills.
"""

from __future__ import annotations

import signal
from typing import Any

from steadytune.protocol import RESERVED_ISSUERS, RequestQueue, clear_requests, send_control
from steadytune.supervise.outbox import Outbox
from steadytune.supervise.runstate import RunState
from steadytune.supervise.source import CONTROL, PLAN, unable


def paused_line(step: int, run_root: str, standby_pid: int | None) -> str:
    """What the console says of a released pause: the worker's GPU memory is free, and a standby
    worker waiting for the resume is named with what it holds (its imports, no model, no device)."""
    line = f"paused at step {step}: the worker has exited and freed the GPU memory it held"
    if standby_pid is not None:
        # train/standby.py asks for no device; its log's "CUDA initialized:" says whether an import did.
        line += (
            f"; the standby worker (pid {standby_pid}) waits for the resume with its libraries imported, "
            "no model loaded (its log in logs/standby-N.log says its memory and whether CUDA was initialized)"
        )
    return f"{line}; `steadytune resume {run_root}` continues from the checkpoint"


class OperatorControls:
    """The supervisor's side of the control queue and of SIGINT/SIGTERM."""

    def __init__(self, state: RunState, out: Outbox) -> None:
        self.state, self.out = state, out
        self._queue = RequestQueue(state.run.control)
        self.resume_requested = False
        self._signalled = self._killed_said = False  # what take_signals has done of the signals noted

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        """SIGINT/SIGTERM, noted for the loop to act on (:meth:`take_signals`).

        A handler runs in the main thread between two bytecodes, possibly inside the event log's
        lock (held while an event is written, fsynced and anchored) or the console's: one that filed
        the stop hung the supervisor on its own lock, after the request had reached the worker. So
        it files and prints nothing; the second signal's kill is a bare ``killpg``, at once.
        """
        st = self.state
        st.stop.interrupts += 1
        if st.stop.interrupts == 1:
            st.stop.signal = signum
        elif st.attempt.worker is not None:
            st.attempt.worker.signal_tree(signal.SIGKILL)

    def take_signals(self) -> None:
        """The loop's side of :meth:`on_signal`: the first signal's stop is requested (and filed) now,
        the second one's kill said."""
        st = self.state
        if st.stop.interrupts and st.stop.signal is not None and not self._signalled:
            self._signalled = True
            self.request_stop(f"signal {signal.Signals(st.stop.signal).name}")
        if st.stop.interrupts >= 2 and not self._killed_said:
            self._killed_said = True
            self.out.say("second interrupt: killing the worker now", style="bold red")

    def request_stop(self, issuer: str) -> None:
        st = self.state
        st.status = "stopping"
        label, grace = st.source.label, st.stop.grace_s
        if CONTROL in st.source.abilities:
            send_control(st.run, "stop", issuer=issuer, attempt=st.attempt.number, log=self.out.events)
            how = f"the {label} will checkpoint at the next step and exit"
        else:
            how = f"the {label} gets SIGTERM (its own handling may save) and {grace:.0f}s to exit"
        self.out.emit(
            "lifecycle",
            "stop_requested",
            f"{issuer}: stopping; {how} (a second signal kills it)",
            severity="warning",
            step=st.progress.step,
            data={"issuer": issuer, "grace_s": grace},
        )
        if st.attempt.worker is not None and (
            PLAN in st.source.abilities or CONTROL not in st.source.abilities
        ):
            # steadytune's worker takes SIGTERM as "stop"; a job without the guard gets its own chance
            # to save. An injected trainer would die of it, so it gets the request alone.
            st.attempt.worker.signal_tree(signal.SIGTERM)
        st.stop.sent_at = st.clock()

    def poll(self) -> None:
        """File operator requests (``steadytune pause|resume|checkpoint|stop``) once each, act on ``resume``.

        The supervisor's own requests (``policy:``, ``signal``) were filed when it sent them.
        """
        st = self.state
        requests = self._queue.new()
        for name, why in self._queue.refused:
            self.out.emit(
                "control",
                "request_refused",
                f"control request {name} refused: it {why}",
                severity="warning",
                step=st.progress.step,
                data={"file": name, "why": why},
            )
        self._queue.refused.clear()
        for request in requests:
            rid = str(request.get("id", ""))
            issuer = str(request.get("issuer", "?"))
            command = str(request.get("command", "?"))
            if not issuer.startswith(RESERVED_ISSUERS):
                self.out.emit(
                    "control",
                    command,
                    f"{command} requested by {issuer}",
                    step=st.progress.step,
                    data={"request_id": rid, "issuer": issuer, "args": request.get("args", {})},
                )
            if command == "resume" and st.status == "paused":
                self.resume_requested = True
            elif CONTROL not in st.source.abilities and not issuer.startswith(RESERVED_ISSUERS):
                self.carry_out_outside(command, issuer)

    def carry_out_outside(self, command: str, issuer: str) -> None:
        """An operator's request to a job that takes none: stop and pause are done from outside."""
        st = self.state
        worker = st.attempt.worker
        if worker is None or worker.poll() is not None or st.status in {"stopping", "paused"}:
            return
        if command == "stop":
            self.request_stop(issuer)
        elif command == "pause":
            # The job is stopped (it keeps the checkpoints it saved); `resume` restarts it from the newest.
            st.stop.pause_requested = True
            st.status = "stopping"
            worker.signal_tree(signal.SIGTERM)
            st.stop.sent_at = st.clock()
        elif command in {"checkpoint", "memory_snapshot"}:
            self.out.emit(
                "action",
                "alert_only",
                f"{command} requested by {issuer} is not available: {unable(st.source, command)}",
                severity="warning",
                step=st.progress.step,
            )

    def drop_stale_requests(self) -> None:
        """Before a worker starts: file what is queued, then empty the queue (meant for the last one)."""
        self.poll()
        clear_requests(self.state.run.control)

    def paused(self) -> None:
        """The worker checkpointed and exited on ``pause``: the run waits for ``resume``."""
        self.state.status = "paused"
        self.state.attempt.worker = None
        self.resume_requested = False
