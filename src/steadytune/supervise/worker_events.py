"""What a worker reports, filed and acted on: one handler per :class:`~steadytune.protocol.WorkerEvent`.

The worker (or the guard in another tool's trainer, or a log adapter) writes events into its
stream beside its step records; the supervisor's loop reads them and passes each here. Each is
filed in ``events.jsonl`` (except ``train_begin``, which only carries the run's length), then its
handler, ``on_<name>``, updates the run: the checkpoints LAST_GOOD may name, a plan revision that
keeps an OOM split or an auto micro-batch, the policy's view of skipped updates, an in-process
rollback's progress. An anomaly a worker reports meets the policy as the detectors' own do; what
the policy decides comes back from :meth:`WorkerEvents.on_event` as actions, for the actions to
carry out.
"""

from __future__ import annotations

from steadytune.protocol import WorkerEvent, send_control
from steadytune.records import Anomaly, Event
from steadytune.supervise.actions import Act
from steadytune.supervise.inprocess import InProcessRollbacks
from steadytune.supervise.outbox import Outbox
from steadytune.supervise.publishing import Publishes
from steadytune.supervise.ray_source import on_worker_group_failed, on_worker_group_started
from steadytune.supervise.resuming import Resumes
from steadytune.supervise.runstate import RunState
from steadytune.supervise.scaling import Autoscaler
from steadytune.supervise.status import RunBooks

# train_begin only carries the run's length, and worker_started already marks the attempt;
# checkpoint_publishing only says a publish is under way: checkpoint_saved (or its failure) files its end.
_NOT_FILED = frozenset({WorkerEvent.TRAIN_BEGIN, WorkerEvent.CHECKPOINT_PUBLISHING})


class WorkerEvents:
    """What a worker reports, filed, and handed to the part it concerns."""

    def __init__(
        self,
        state: RunState,
        out: Outbox,
        publishes: Publishes,
        resumes: Resumes,
        in_process: InProcessRollbacks,
        books: RunBooks,
        scaling: Autoscaler | None,
    ) -> None:
        self.state, self.out = state, out
        self.publishes, self.resumes, self.in_process = publishes, resumes, in_process
        self.books, self.scaling = books, scaling

    def on_event(self, ev: Event) -> list[Act]:
        """File what a worker reported, then act on it: one lookup, ``on_<name>`` of its WorkerEvent.

        A name outside the protocol is filed all the same; an anomaly, whatever its name, meets the
        policy. Returns what the policy decided, for the actions to carry out.
        """
        st = self.state
        known = WorkerEvent.get(ev.name)
        if ev.severity in {"warning", "critical"} and ev.step is not None:
            st.history.trouble_steps.append(ev.step)
        filed = (
            None
            if known in _NOT_FILED
            else self.out.emit(ev.kind, ev.name, ev.message, severity=ev.severity, step=ev.step, data=ev.data)
        )
        decided: list[Act] = []
        if known is not None:
            decided += getattr(self, known.handler)(ev, filed) or []
        if (
            ev.kind == "anomaly"
            and ev.severity in {"warning", "critical"}
            and st.pending is None
            and not decided
        ):
            # What the worker itself found (a save refused for lack of disk) meets the same policy
            # as what the detectors find: `policy.rules.disk_low.action: stop` must stop the run.
            step = ev.step if ev.step is not None else st.progress.step
            found = Anomaly(
                ev.name, ev.severity, step, step, str(ev.data.get("metric", ev.name)), dict(ev.data)
            )
            action = st.policy.on_raised(found, st.progress.step)
            if action is not None:
                decided.append(Act(action, cause=filed))
        return decided

    # -- one handler per WorkerEvent, called after the event is filed; it may return actions ----------
    def on_train_begin(self, ev: Event, filed: Event | None) -> None:
        if ev.data.get("max_steps"):
            self.state.progress.max_steps = int(ev.data["max_steps"])

    def on_checkpoint_publishing(self, ev: Event, filed: Event | None) -> None:
        if ev.step is not None:
            self.publishes.on_publishing(ev.step)

    def on_checkpoint_publish_failed(self, ev: Event, filed: Event | None) -> None:
        if ev.step is not None:
            self.publishes.on_failed(ev.step, str(ev.data.get("error") or ev.message))

    def on_checkpoint_saved(self, ev: Event, filed: Event | None) -> None:
        history = self.state.history
        history.last_save_ts = ev.ts
        if ev.step is not None:
            self.publishes.on_saved(ev.step)
            history.checkpoint_steps.append(ev.step)
            self.books.update_disk_need(ev.step)
            self.resumes.keep_replay_state()

    def on_ack_checkpoint(self, ev: Event, filed: Event | None) -> None:
        st = self.state
        if st.leak_snapshot_pending:
            # A leak alarm also wants the allocator's view (CUDA only): ask once the checkpoint is taken.
            st.leak_snapshot_pending = False
            send_control(
                st.run,
                "memory_snapshot",
                issuer="policy:memory_leak",
                attempt=st.attempt.number,
                log=self.out.events,
            )

    def on_reduce_microbatch(self, ev: Event, filed: Event | None) -> None:
        if ev.data.get("micro_batch_split"):
            # Remember the split, so a later restart starts with it instead of rediscovering the OOM.
            self.state.plans.revise(
                reason="oom",
                cause=filed,
                micro_batch_split=int(ev.data["micro_batch_split"]),
                notes=f"in-process OOM split to {ev.data['micro_batch_split']} chunks",
            )

    def on_auto_micro_batch(self, ev: Event, filed: Event | None) -> None:
        if ev.data.get("per_device_train_batch_size"):
            # Keep what the auto search found: a restart trains the same shape without searching again.
            self.state.plans.revise(
                reason="auto_micro_batch",
                cause=filed,
                per_device_train_batch_size=int(ev.data["per_device_train_batch_size"]),
                gradient_accumulation_steps=int(ev.data["gradient_accumulation_steps"]),
            )

    def on_skip_step(self, ev: Event, filed: Event | None) -> list[Act]:
        st = self.state
        if ev.step is not None and st.pending is None:
            action = st.policy.on_skipped_update(ev.step, int(ev.data.get("consecutive", 1)))
            if action is not None:
                return [Act(action)]
        return []

    def _filed_only(self, ev: Event, filed: Event | None) -> None:
        """Filing it is all: an acknowledgement, or a warning the policy does not act on."""

    # disk_low is an anomaly: the policy meets it in on_event, as any anomaly a worker reports.
    on_disk_low = on_grad_norm_after_clipping = on_inject_failed = on_guard_injected = on_guard_off = (
        _filed_only
    )
    on_ack_pause = on_ack_resume = on_ack_stop = on_ack_memory_snapshot = on_optimizer_groups = _filed_only
    on_lr_from_command = on_loss_field_ignored = on_rollback_lr = on_no_steps_read = _filed_only
    on_fault_injected = _filed_only

    # An in-process rollback (supervise/inprocess.py): taken, done, or refused (then a restart does it).
    def on_ack_rollback(self, ev: Event, filed: Event | None) -> None:
        self.in_process.on_ack(ev)

    def on_rolled_back(self, ev: Event, filed: Event | None) -> None:
        self.in_process.on_done(ev)

    def on_rollback_failed(self, ev: Event, filed: Event | None) -> None:
        self.in_process.on_failed(ev)

    # Ray's worker group re-forms the job by itself (supervise/ray_source.py).
    def on_worker_group_started(self, ev: Event, filed: Event | None) -> None:
        on_worker_group_started(self.state, self.resumes, ev, filed)

    def on_worker_group_failed(self, ev: Event, filed: Event | None) -> None:
        on_worker_group_failed(self.state)

    def on_resources_requested(self, ev: Event, filed: Event | None) -> None:
        """Ray was asked for the scale rules' resources: a plan revision with the request as its cause."""
        if self.scaling is not None:
            self.scaling.on_requested(ev, filed)
