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
from dataclasses import dataclass, replace
from typing import Any

from steadytune.detect.build import KINDS
from steadytune.detect.live import Transition, format_transition
from steadytune.policy.engine import Action
from steadytune.protocol import send_control
from steadytune.records import Anomaly, Event
from steadytune.supervise.inprocess import InProcessRollbacks
from steadytune.supervise.outbox import Outbox
from steadytune.supervise.publishing import Publishes
from steadytune.supervise.ranks import PROC, hung_ranks, read_proc
from steadytune.supervise.restarts import anomaly_event_data
from steadytune.supervise.runstate import RunState
from steadytune.supervise.scaling import SCALE_ACTIONS
from steadytune.supervise.source import CONTROL, DATA, PLAN, SKIP_STEP
from steadytune.supervise.source import unable as source_unable


@dataclass(frozen=True)
class Act:
    """An action a part of the supervisor decided, and the event it answers: for :class:`Actions`."""

    action: Action
    cause: Event | None = None


# Actions that end the running worker to start another attempt.
RESTARTING = frozenset({"rollback", "restart"}) | SCALE_ACTIONS

# What each action does, in the words an anomaly's line says it with when the policy takes it
# (format_transition): people are told what was done and what is left, not to do it themselves.
DONE = {
    "skip_step": "the update was not applied",
    "rollback": "the run goes back to an earlier checkpoint at a lower LR, past the samples that went "
    "wrong where they are known",
    "restart": "the worker's Python stacks are dumped into the run's stacks/ folder and it restarts from "
    "its last checkpoint",
    "checkpoint": "a checkpoint is saved now",
    "pause": "the run is paused",
    "stop": "the run is stopped (its newest checkpoint stays)",
    "reduce_microbatch": "a checkpoint is saved and the next attempt runs a smaller micro-batch",
}

# After these, the supervisor looks at the offending batch by itself (inspect-batch).
INSPECT_KINDS = frozenset({"nan_loss", "loss_spike", "loss_collapse", "divergence", "grad_explosion"})


class Actions:
    """Detection to policy to action: the one place where what the policy decides is carried out."""

    def __init__(
        self, state: RunState, out: Outbox, publishes: Publishes, in_process: InProcessRollbacks
    ) -> None:
        self.state, self.out, self.publishes, self.in_process = state, out, publishes, in_process
        self._inspected: set[int] = set()  # steps whose batch was looked at (at most 10 a run)
        self._filed: dict[tuple[str, str, int | None], Event] = {}  # each open episode's anomaly event
        self.proc = PROC  # where each process's rank and state are read (a fake tree in tests)
        # Each open episode's (what was done, what is left), said again when it escalates.
        self._advice: dict[tuple[str, str, int | None], tuple[str | None, str | None]] = {}

    def on_transition(self, t: Transition) -> None:
        """An episode changed. People hear of an episode once (raised), again when its severity rises,
        and when it is resolved; the policy acts on each firing (raised or recurred) and forgets a
        spike waiting for confirmation when its condition clears."""
        st = self.state
        t = _as_run(t, self.run_facts())
        a = t.anomaly
        if t.state in ("raised", "recurred") or t.took:
            self.on_firing(t)
        elif t.state == "escalated":
            done, left = self._advice.get(a.key, (None, None))
            self.out.emit(
                "anomaly",
                a.kind,
                format_transition(t, done, left),
                severity=a.severity,
                step=a.start_step,
                data={**_advised(a, done, left), "escalated_from": t.was},
            )
        elif t.state == "cleared":
            st.policy.on_resolved(a)
        else:
            st.policy.on_resolved(a)
            self._filed.pop(a.key, None)
            done, left = self._advice.pop(a.key, (None, None))
            self.out.emit(
                "resolved",
                a.kind,
                format_transition(t),
                severity="info",
                step=a.end_step,
                data=_advised(a, done, left),
            )

    def on_firing(self, t: Transition) -> None:
        """A condition fired: a new episode is filed; either way the policy judges the firing."""
        st = self.state
        a, fired = t.anomaly, t.fired
        if fired.severity in {"warning", "critical"}:
            st.history.trouble_steps.append(fired.start_step)
        action = self.decide(t)
        event: Event | None
        if t.state == "raised" or t.took:
            for part in t.took:  # the episode a graver kind grew out of: told on as this one
                st.policy.on_resolved(part)
                self._filed.pop(part.key, None)
                self._advice.pop(part.key, None)
            done, left = self._advice[a.key] = self.advice(a.kind, action)
            grew: dict[str, object] = {}
            if t.took:  # an update of the part's episode people were told of (alerts/router.py)
                grew = {"escalated_from": t.was, "grew_out_of": [[p.kind, p.metric] for p in t.took]}
            event = self._filed[a.key] = self.out.emit(
                "anomaly",
                a.kind,
                format_transition(t, done, left),
                severity=a.severity,
                step=a.start_step,
                data={**_advised(a, done, left), **grew},
            )
        else:  # the episode's event stands for it: what is done now is done about that episode
            event = self._filed.get(a.key)
        if (
            event is not None
            and DATA in st.source.abilities
            and a.kind in INSPECT_KINDS
            and fired.start_step not in self._inspected
            and len(self._inspected) < 10
        ):
            self._inspected.add(fired.start_step)
            threading.Thread(target=self.inspect_batch, args=(fired.start_step, event), daemon=True).start()
        if action is not None and not (t.state == "recurred" and action.name == "alert"):
            # An alert about a firing of an episode people were told of would be one per point.
            self.execute(action, cause=event)

    def decide(self, t: Transition) -> Action | None:
        """What the policy does about a firing, through what the run's source can do."""
        st = self.state
        a, fired = t.anomaly, t.fired
        # One incident often raises several anomalies at once (a spike, its gradients, its layers):
        # once one of them stopped the worker, the others are already being handled.
        action = st.policy.on_raised(fired, st.progress.step) if st.pending is None else None
        if (
            action is None
            and st.pending is None
            and SKIP_STEP not in st.source.abilities
            and st.policy.config.rule(a.kind).action == "skip_step"
        ):
            # The guard skips a NaN update inside the worker; a job without it has applied the
            # update already, so the weights must come from a checkpoint.
            action = st.policy.instead(
                fired,
                st.progress.step,
                "rollback",
                f"the {st.source.label} cannot skip the update",
            )
        return action

    def run_facts(self) -> frozenset[str]:
        """What is known of the run (detect.base.RUN_FACTS): where it trains, from its records; with
        the built-in worker, which trains as its config says, its precision and number of processes.
        A command's config is not steadytune's: only a second rank's records tell that it has ranks."""
        st = self.state
        facts = {st.progress.device} if st.progress.device else set()
        if PLAN in st.source.abilities:
            nproc = st.plan.nproc_per_node or st.cfg.run.nproc_per_node
            if nproc > 1 or st.progress.ranks > 1:
                facts.add("ranks")
            elif st.cfg.run.engine == "native":  # a Ray worker group's size is its own
                facts.add("one_rank")
            facts |= _precision(st.cfg.train.fp16, st.cfg.train.bf16, st.cfg.model.dtype)
        elif st.progress.ranks > 1:
            facts.add("ranks")
        return frozenset(facts)

    def advice(self, kind: str, action: Action | None) -> tuple[str | None, str | None]:
        """What ``action`` does about an anomaly of ``kind`` and what it leaves to people; (None, None)
        where nothing is done (an alert, an action the source cannot take): the kind's fix stands."""
        st = self.state
        name = action.name if action is not None else None
        if (
            name is None
            and SKIP_STEP in st.source.abilities
            and st.policy.config.rule(kind).action == "skip_step"
        ):
            # The worker's NaN guard skipped the update itself: the policy has no more to do.
            name = "skip_step"
        if name is None or name not in DONE or source_unable(st.source, name):
            return None, None
        info = KINDS.get(kind)
        # An action with no word of its own in the kind leaves its whole fix (a leak's smaller
        # micro-batch does not find the leak).
        return DONE[name], (info.after.get(name, info.suggestion) if info else None)

    def inspect_batch(self, step: int, cause: Event) -> None:
        """Which samples made the bad step: filed as an event beside the anomaly (no sample text)."""
        st = self.state
        try:
            from steadytune.forensics.inspect import inspect_step

            verdict = inspect_step(st.run, step)
        except Exception as exc:  # forensics must never take the supervisor down
            self.out.emit(
                "action", "batch_inspected", f"could not inspect the batch of step {step}: {exc}", step=step
            )
            return
        self.out.emit(
            "action",
            "batch_inspected",
            f"batch of step {step}: {verdict.summary}",
            step=step,
            data={**verdict.event_data(), "anomaly_seq": cause.seq},
        )

    def execute(self, action: Action, cause: Event | None = None) -> None:
        """Carry out what the policy decided. Restart-type actions stop the worker now."""
        if self._not_carried_out(action):
            return
        self.out.emit(
            "action",
            action.name,
            f"{action.name}: {action.reason}",
            severity="warning",
            step=action.step,
            data={"anomaly": action.anomaly.kind if action.anomaly else None, **action.params},
        )
        self._carry_out(action)

    def _not_carried_out(self, action: Action) -> bool:
        """An alert, an action the source cannot take, a pause or stop of a source that takes no
        requests (stopped from outside), or a restart while an operator's stop is under way: said, and
        True when nothing more is to be done."""
        st = self.state
        step = action.step
        unable = source_unable(st.source, action.name)
        if action.name == "alert" or unable:
            why = (
                action.reason if not unable else f"{action.name} is not available: {unable} ({action.reason})"
            )
            self.out.emit("action", "alert_only", why, severity="warning", step=step, data=action.params)
            return True
        if action.name in {"pause", "stop"} and CONTROL not in st.source.abilities:
            # A job that takes no requests is stopped from outside: what it saved is what there is.
            self.out.emit(
                "action",
                action.name,
                f"{action.name}: {action.reason}; the {st.source.label} takes no requests, so it is "
                "stopped (its newest checkpoint stays)",
                severity="warning",
                step=step,
                data={"anomaly": action.anomaly.kind if action.anomaly else None, **action.params},
            )
            if st.attempt.worker is not None and st.pending is None:
                st.pending = action
                st.attempt.worker.signal_tree(signal.SIGTERM)
                st.stop.sent_at = st.clock()
            return True
        if action.name in RESTARTING and st.stop.sent_at is not None:
            # An operator's stop (SIGTERM, SIGINT) is under way: the worker saves at its next step and
            # exits. Killing it for a new attempt would lose that checkpoint and the stop itself.
            self.out.emit(
                "action",
                "alert_only",
                f"{action.name} not carried out: the run is stopping, the {st.source.label} saving its "
                f"checkpoint to exit ({action.reason})",
                severity="warning",
                step=step,
                data={"anomaly": action.anomaly.kind if action.anomaly else None, **action.params},
            )
            return True
        return False

    def _carry_out(self, action: Action) -> None:
        """The request, the plan or the stop each action is."""
        st = self.state
        if action.name in {"checkpoint", "pause", "stop"}:
            send_control(
                st.run,
                action.name,
                issuer=f"policy:{action.anomaly.kind if action.anomaly else '-'}",
                attempt=st.attempt.number,
                log=self.out.events,
            )
        elif action.name == "reduce_microbatch":
            # Save what we have now; the next (re)start uses a smaller micro-batch.
            st.planner.shrink_next = True
            send_control(
                st.run,
                "checkpoint",
                issuer="policy:reduce_microbatch",
                attempt=st.attempt.number,
                log=self.out.events,
            )
            if action.anomaly is not None and action.anomaly.kind == "memory_leak":
                st.leak_snapshot_pending = True
        elif action.name in SCALE_ACTIONS and st.attempt.worker is not None and st.pending is None:
            # Like a stop: the worker checkpoints at the next step boundary and exits; the run then
            # relaunches in the new shape from that checkpoint (plan_after_action).
            st.pending = action
            send_control(
                st.run,
                "stop",
                issuer=f"policy:{action.name}",
                attempt=st.attempt.number,
                log=self.out.events,
            )
            st.stop.sent_at = st.clock()
        elif action.name in {"rollback", "restart"} and st.attempt.worker is not None and st.pending is None:
            if action.name == "rollback" and self.publishes.hold(action):
                return  # the checkpoint it would go back to is still being published: it waits for it
            self.stop_for(action)

    def stop_for(self, action: Action) -> None:
        """A rollback or a restart: in the worker where it can reload, else the worker is killed for it."""
        st = self.state
        if st.attempt.worker is None or st.stop.sent_at is not None:
            return  # a stop is under way (a rollback held for a publish meanwhile): the stop wins
        if action.name == "rollback" and self.in_process.want(action):
            return  # the worker reloads the checkpoint itself once these records are read: no new process
        st.pending = action
        if action.name == "restart" and (hung := self.dump_stacks()):
            st.pending = replace(action, reason=f"{action.reason} ({hung})")
        st.attempt.worker.signal_tree(signal.SIGKILL)

    def dump_stacks(self) -> str:
        """The Python stacks of every process of the attempt, into ``stacks/``, before it is killed.

        Returns which rank the hang is on, in words (:func:`hung_ranks`; ``""`` when nothing tells):
        read before the dump, which wakes a stopped process.
        """
        st = self.state
        if st.attempt.worker is None or st.attempt.tree is None:
            return ""
        now = st.clock()
        silent = {rank: max(0.0, now - ts) for rank, ts in st.attempt.heartbeats.items()}
        hung = hung_ranks([read_proc(pid, self.proc) for pid in st.attempt.tree.note()], silent)
        out = st.run.stacks / f"attempt-{st.attempt.number}.txt"
        pids = st.source.dump_stacks(st.attempt.tree, st.attempt.worker, out)
        if pids:
            where = out if out.exists() else st.run.stacks
            self.out.emit(
                "action",
                "stacks_dumped",
                f"Python stacks of {len(pids)} {st.source.label} process(es) written to {where}"
                + (f"; {hung}" if hung else ""),
                step=st.progress.step,
                data={"pids": pids, "dir": str(st.run.stacks), "file": str(where), "hung": hung or None},
            )
        return hung


def _advised(a: Anomaly, done: str | None, left: str | None) -> dict[str, Any]:
    """An anomaly's event data; where steadytune acted, what it did and, as the fix, what is left."""
    data = anomaly_event_data(a)
    if done is not None:
        data["done"] = done
        data["suggestion"] = left or ""
    return data


def _precision(fp16: bool, bf16: bool, dtype: str) -> set[str]:
    """The precision a built-in worker trains in, where its config says (dtype auto: the checkpoint's)."""
    if fp16 or dtype == "float16":
        return {"fp16"}
    if bf16 or dtype == "bfloat16":
        return {"bf16"}
    return {"fp32"} if dtype == "float32" else set()


def _as_run(t: Transition, facts: frozenset[str]) -> Transition:
    """``t`` with its episode's cause in the words of the run (KindInfo.cause_on), where the detector
    gave the kind's usual one."""
    a = t.anomaly
    info = KINDS.get(a.kind)
    if info is None or a.cause != info.cause:
        return t
    return replace(t, anomaly=replace(a, cause=info.cause_for(facts)))
