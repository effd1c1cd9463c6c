"""What the supervisor does about what it sees: detector transitions meet the policy, actions are carried out.

A raised anomaly is filed, may send the supervisor to look at the offending batch (inspect-batch,
in a thread), and meets the policy; what the policy decides is carried out here, through what
the run's source can do: a control request (checkpoint, pause, stop), a stop from outside for a
job that takes none, a stop and relaunch in a new shape, or a rollback or restart (in process
where the worker can reload, otherwise by killing it; the loop then restarts it from the plan).
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

from steadytune.detect.live import Transition, format_transition
from steadytune.policy.engine import Action
from steadytune.records import Event
from steadytune.supervise.restarts import anomaly_event_data
from steadytune.supervise.scaling import SCALE_ACTIONS
from steadytune.supervise.source import CONTROL, DATA, PLAN, SKIP_STEP

if TYPE_CHECKING:
    from steadytune.supervise.supervisor import Supervisor

# After these, the supervisor looks at the offending batch by itself (inspect-batch).
INSPECT_KINDS = frozenset({"nan_loss", "loss_spike", "loss_collapse", "divergence", "grad_explosion"})


class Actions:
    """Detection to policy to action; the run state an action changes stays the supervisor's."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self._inspected: set[int] = set()  # steps whose batch was looked at (at most 10 a run)

    def on_transition(self, t: Transition) -> None:
        a = t.anomaly
        if t.state == "raised":
            if a.severity in {"warning", "critical"}:
                self.sup.trouble_steps.append(a.start_step)
            event = self.sup.emit(
                "anomaly",
                a.kind,
                format_transition(t),
                severity=a.severity,
                step=a.start_step,
                data=anomaly_event_data(a),
            )
            if (
                DATA in self.sup.source.abilities
                and a.kind in INSPECT_KINDS
                and a.start_step not in self._inspected
                and len(self._inspected) < 10
            ):
                self._inspected.add(a.start_step)
                threading.Thread(target=self.inspect_batch, args=(a.start_step, event), daemon=True).start()
            # One incident often raises several anomalies at once (a spike, its gradients, its layers):
            # once one of them stopped the worker, the others are already being handled.
            action = (
                self.sup.policy.on_raised(a, self.sup.progress.step) if self.sup.pending is None else None
            )
            if (
                action is None
                and self.sup.pending is None
                and SKIP_STEP not in self.sup.source.abilities
                and self.sup.policy.config.rule(a.kind).action == "skip_step"
            ):
                # The guard skips a NaN update inside the worker; a job without it has applied the
                # update already, so the weights must come from a checkpoint.
                action = self.sup.policy.instead(
                    a,
                    self.sup.progress.step,
                    "rollback",
                    f"the {self.sup.source.label} cannot skip the update",
                )
            if action is not None:
                self.execute(action, cause=event)
        else:
            self.sup.policy.on_resolved(a)
            self.sup.emit(
                "resolved",
                a.kind,
                format_transition(t),
                severity="info",
                step=a.end_step,
                data=anomaly_event_data(a),
            )

    def inspect_batch(self, step: int, cause: Event) -> None:
        """Which samples made the bad step: filed as an event beside the anomaly (no sample text)."""
        try:
            from steadytune.forensics.inspect import inspect_step

            verdict = inspect_step(self.sup.run, step)
        except Exception as exc:  # forensics must never take the supervisor down
            self.sup.emit(
                "action", "batch_inspected", f"could not inspect the batch of step {step}: {exc}", step=step
            )
            return
        self.sup.emit(
            "action",
            "batch_inspected",
            f"batch of step {step}: {verdict.summary}",
            step=step,
            data={**verdict.event_data(), "anomaly_seq": cause.seq},
        )

    def execute(self, action: Action, cause: Event | None = None) -> None:
        """Carry out what the policy decided. Restart-type actions stop the worker now."""
        step = action.step
        unable = self.unable(action.name)
        if action.name == "alert" or unable:
            why = (
                action.reason if not unable else f"{action.name} is not available: {unable} ({action.reason})"
            )
            self.sup.emit("action", "alert_only", why, severity="warning", step=step, data=action.params)
            return
        if action.name in {"pause", "stop"} and CONTROL not in self.sup.source.abilities:
            # A job that takes no requests is stopped from outside: what it saved is what there is.
            self.sup.emit(
                "action",
                action.name,
                f"{action.name}: {action.reason}; the {self.sup.source.label} takes no requests, so it is "
                "stopped (its newest checkpoint stays)",
                severity="warning",
                step=step,
                data={"anomaly": action.anomaly.kind if action.anomaly else None, **action.params},
            )
            if self.sup.worker is not None and self.sup.pending is None:
                self.sup.pending = action
                self.sup.worker.signal_tree(signal.SIGTERM)
                self.sup.stop_sent_at = self.sup.clock()
            return
        self.sup.emit(
            "action",
            action.name,
            f"{action.name}: {action.reason}",
            severity="warning",
            step=step,
            data={"anomaly": action.anomaly.kind if action.anomaly else None, **action.params},
        )
        from steadytune.supervise.control import send_control

        if action.name in {"checkpoint", "pause", "stop"}:
            send_control(
                self.sup.run,
                action.name,
                issuer=f"policy:{action.anomaly.kind if action.anomaly else '-'}",
                attempt=self.sup.attempt,
                log=self.sup.events,
            )
        elif action.name == "reduce_microbatch":
            # Save what we have now; the next (re)start uses a smaller micro-batch.
            self.sup.shrink_next_restart = True
            send_control(
                self.sup.run,
                "checkpoint",
                issuer="policy:reduce_microbatch",
                attempt=self.sup.attempt,
                log=self.sup.events,
            )
            if action.anomaly is not None and action.anomaly.kind == "memory_leak":
                self.sup.leak_snapshot_pending = True
        elif action.name in SCALE_ACTIONS and self.sup.worker is not None and self.sup.pending is None:
            # Like a stop: the worker checkpoints at the next step boundary and exits; the run then
            # relaunches in the new shape from that checkpoint (plan_after_action).
            self.sup.pending = action
            send_control(
                self.sup.run,
                "stop",
                issuer=f"policy:{action.name}",
                attempt=self.sup.attempt,
                log=self.sup.events,
            )
            self.sup.stop_sent_at = self.sup.clock()
        elif (
            action.name in {"rollback", "restart"}
            and self.sup.worker is not None
            and self.sup.pending is None
        ):
            if action.name == "rollback" and self.sup.in_process.want(action):
                return  # the worker reloads the checkpoint itself once these records are read: no new process
            self.sup.pending = action
            if action.name == "restart":
                self.dump_stacks()
            self.sup.worker.signal_tree(signal.SIGKILL)

    def unable(self, action: str) -> str | None:
        """Why this run's source cannot carry out ``action`` (None: it can)."""
        label = self.sup.source.label
        if action in {"checkpoint", "memory_snapshot"} and CONTROL not in self.sup.source.abilities:
            return f"the {label} takes no control requests (supervise --inject gives an HF-based tool them)"
        if action == "reduce_microbatch" and PLAN not in self.sup.source.abilities:
            return f"the {label}'s batch shape is its own"
        return None

    def dump_stacks(self) -> None:
        """The Python stacks of every process of the attempt, into ``stacks/``, before it is killed."""
        if self.sup.worker is None or self.sup.tree is None:
            return
        out = self.sup.run.stacks / f"attempt-{self.sup.attempt}.txt"
        pids = self.sup.source.dump_stacks(self.sup.tree, self.sup.worker, out)
        if pids:
            where = out if out.exists() else self.sup.run.stacks
            self.sup.emit(
                "action",
                "stacks_dumped",
                f"Python stacks of {len(pids)} {self.sup.source.label} process(es) written to {where}",
                step=self.sup.progress.step,
                data={"pids": pids, "dir": str(self.sup.run.stacks), "file": str(where)},
            )
