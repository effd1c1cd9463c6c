"""An operator's say in a run: signals, ``steadytune pause|resume|checkpoint|stop``, and the pause itself.

Requests arrive in the run's control queue (``protocol.RequestQueue``); each is filed once as a
``control`` event. A source that takes requests (steadytune's worker, an injected trainer) acts
on them itself; a job that takes none is stopped or paused from outside, by signal. The first
interrupt asks for a stop that saves; the second kills.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

from steadytune.protocol import RESERVED_ISSUERS, RequestQueue, clear_requests
from steadytune.supervise.source import CONTROL, PLAN
from steadytune.telemetry.progress import progress_line

if TYPE_CHECKING:
    from steadytune.supervise.supervisor import Supervisor


class OperatorControls:
    """The supervisor's side of the control queue and of SIGINT/SIGTERM."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self._queue = RequestQueue(sup.run.control)
        self.resume_requested = False

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        sup = self.sup
        sup.state.stop.interrupts += 1
        if sup.state.stop.interrupts == 1:
            sup.state.stop.signal = signum
            self.request_stop(f"signal {signal.Signals(signum).name}")
        elif sup.state.attempt.worker is not None:
            sup.out.say("second interrupt: killing the worker now", style="bold red")
            sup.state.attempt.worker.signal_tree(signal.SIGKILL)

    def request_stop(self, issuer: str) -> None:
        sup = self.sup
        sup.state.status = "stopping"
        label = sup.state.source.label
        if CONTROL in sup.state.source.abilities:
            from steadytune.supervise.control import send_control

            send_control(sup.run, "stop", issuer=issuer, attempt=sup.state.attempt.number, log=sup.out.events)
            how = f"the {label} will checkpoint at the next step and exit"
        else:
            grace = sup.state.stop.grace_s
            how = f"the {label} gets SIGTERM (its own handling may save) and {grace:.0f}s to exit"
        sup.out.emit(
            "lifecycle",
            "stop_requested",
            f"{issuer}: stopping; {how} (a second signal kills it)",
            severity="warning",
            step=sup.state.progress.step,
            data={"issuer": issuer, "grace_s": sup.state.stop.grace_s},
        )
        if sup.state.attempt.worker is not None and (
            PLAN in sup.state.source.abilities or CONTROL not in sup.state.source.abilities
        ):
            # steadytune's worker takes SIGTERM as "stop"; a job without the guard gets its own chance
            # to save. An injected trainer would die of it, so it gets the request alone.
            sup.state.attempt.worker.signal_tree(signal.SIGTERM)
        sup.state.stop.sent_at = sup.state.clock()

    def poll(self) -> None:
        """File operator requests (``steadytune pause|resume|checkpoint|stop``) once each, act on ``resume``.

        The supervisor's own requests (``policy:``, ``signal``) were filed when it sent them.
        """
        sup = self.sup
        requests = self._queue.new()
        for name, why in self._queue.refused:
            sup.out.emit(
                "control",
                "request_refused",
                f"control request {name} refused: it {why}",
                severity="warning",
                step=sup.state.progress.step,
                data={"file": name, "why": why},
            )
        self._queue.refused.clear()
        for request in requests:
            rid = str(request.get("id", ""))
            issuer = str(request.get("issuer", "?"))
            command = str(request.get("command", "?"))
            if not issuer.startswith(RESERVED_ISSUERS):
                sup.out.emit(
                    "control",
                    command,
                    f"{command} requested by {issuer}",
                    step=sup.state.progress.step,
                    data={"request_id": rid, "issuer": issuer, "args": request.get("args", {})},
                )
            if command == "resume" and sup.state.status == "paused":
                self.resume_requested = True
            elif CONTROL not in sup.state.source.abilities and not issuer.startswith(RESERVED_ISSUERS):
                self.carry_out_outside(command, issuer)

    def carry_out_outside(self, command: str, issuer: str) -> None:
        """An operator's request to a job that takes none: stop and pause are done from outside."""
        sup = self.sup
        if (
            sup.state.attempt.worker is None
            or sup.state.attempt.worker.poll() is not None
            or sup.state.status in {"stopping", "paused"}
        ):
            return
        if command == "stop":
            self.request_stop(issuer)
        elif command == "pause":
            # The job is stopped (it keeps the checkpoints it saved); `resume` restarts it from the newest.
            sup.state.stop.pause_requested = True
            sup.state.status = "stopping"
            sup.state.attempt.worker.signal_tree(signal.SIGTERM)
            sup.state.stop.sent_at = sup.state.clock()
        elif command in {"checkpoint", "memory_snapshot"}:
            sup.out.emit(
                "action",
                "alert_only",
                f"{command} requested by {issuer} is not available: {sup.actions.unable(command)}",
                severity="warning",
                step=sup.state.progress.step,
            )

    def drop_stale_requests(self) -> None:
        """Before a worker starts: file what is queued, then empty the queue (meant for the last one)."""
        self.poll()
        clear_requests(self.sup.run.control)

    def wait_while_paused(self, live: Any = None) -> bool:
        """The worker checkpointed and exited on ``pause``: hold the run until ``resume`` (True) or a stop."""
        sup = self.sup
        sup.state.status = "paused"
        sup.state.attempt.worker = None
        self.resume_requested = False
        sup.books.write_status(force=True)
        sup.out.say(
            f"paused at step {sup.state.progress.step}: the GPU is free; `steadytune resume {sup.run.root}` "
            "continues from the checkpoint",
            style="yellow",
        )
        while not self.resume_requested:
            if sup.state.stop.interrupts:
                return False
            sup.pump()
            if live is not None:
                live.update(progress_line(sup.state.progress, sup.state.planner.total, sup.state.status))
            time.sleep(sup.poll_s)
        return True
