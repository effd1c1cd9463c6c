"""Autoscaling a run by rules (``scale:`` in the config; docs/server.md, docs/ray.md), for the supervisor.

The rules themselves are pure (:mod:`steadytune.policy.scale`): system samples and step
timestamps in, a decision out. This module carries a decision out through the supervisor
it belongs to. For a native run a resize is an action like a rollback — the worker
checkpoints and stops, and the run relaunches in the new shape from that checkpoint, with
the effective batch unchanged. For an engine that sizes the job itself (Ray: the source's
``REQUEST`` ability) a resize is a resource request to it, and the engine's own resize of
the group follows as its plan revision. Either way it files what each resize cost and
whether it paid.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from steadytune.policy.engine import Action
from steadytune.policy.scale import Measured, ScaleDecision, ScaleRules, Shape, job_reading, parse_visible
from steadytune.records import Event, StepRecord, SystemSample
from steadytune.supervise.outbox import Outbox
from steadytune.supervise.runstate import RunState
from steadytune.supervise.server_link import ServerLink
from steadytune.supervise.source import CONTROL, PLAN, REQUEST, SizesItself

# Each checkpoints, stops and relaunches the worker in a new shape.
SCALE_ACTIONS = frozenset({"grow", "shrink", "more_workers", "undo"})
# The Ray driver looks for a request every second; one not taken in this long found no driver.
REQUEST_TAKEN_S = 60.0


class Autoscaler:
    """The scale rules of one run and the resize in progress."""

    def __init__(
        self,
        state: RunState,
        out: Outbox,
        rules: ScaleRules,
        visible: list[int] | None,
        link: ServerLink | None = None,
    ) -> None:
        self.state, self.out, self.rules, self.visible = state, out, rules, visible
        self.link = link  # a server job: GPUs come from the server's ledger, not from what the host has
        self.onto: list[int] | None = None  # the GPUs the resize in progress relaunches on
        self.scaling: ScaleDecision | None = None  # the resize the worker was stopped for
        self.asked_at = 0.0
        self.resized: tuple[ScaleDecision, float, float | None] | None = None  # (it, when, last save ts)
        self.asked_for: tuple[int, int] | None = None  # Ray: (workers asked for, the group's size then)

    @classmethod
    def for_run(cls, state: RunState, out: Outbox, worker_env: dict[str, str] | None) -> Autoscaler | None:
        """The rules, for a source whose shape steadytune sets; the first plan records the world size."""
        s, cfg, plans = state.cfg.scale, state.cfg, state.plans
        if s is None or not {PLAN, CONTROL} <= state.source.abilities:
            return None
        env = {**os.environ, **(worker_env or {})}
        # With Ray, config validation made scale.min_gpus..max_gpus ray.num_workers' range.
        if REQUEST not in state.source.abilities:
            plans.current = replace(plans.current, nproc_per_node=cfg.run.nproc_per_node)
        plans.current = replace(plans.current, dataloader_num_workers=cfg.train.dataloader_num_workers)
        visible = parse_visible(env.get("CUDA_VISIBLE_DEVICES"))
        requests = REQUEST in state.source.abilities
        rules = ScaleRules(s, shape_of(state), exact_batch=not requests)
        return cls(state, out, rules, visible, ServerLink.from_env(env))

    @property
    def requests(self) -> bool:
        """A resize is a resource request to the engine, which resizes the group itself (Ray)."""
        return REQUEST in self.state.source.abilities

    def on_sample(self, rec: SystemSample) -> Action | None:
        """A system sample meets the rules; the resize they decide, as an action to carry out (or None)."""
        st = self.state
        if self.requests and self.scaling is not None and st.clock() - self.asked_at > REQUEST_TAKEN_S:
            # The driver asked for it is gone (the attempt ended): the rules may decide again.
            d, self.scaling = self.scaling, None
            self.rules.declined(st.clock())
            self.out.emit(
                "action", "resize_refused",
                f"{d.kind} not made: the Ray driver did not take the request in {REQUEST_TAKEN_S:g}s",
                severity="warning", step=st.progress.step,
                data={**scale_data(d), "refused": "not taken"},
            )  # fmt: skip
        shape = shape_of(st)
        # An OOM split or the auto search may have changed the micro-batch.
        self.rules.set_micro_batch(shape.micro_batch, shape.accumulation)
        if self.requests:
            self.rules.set_world(shape.world)  # the group Ray runs now, whatever was asked for
        training = (
            st.status == "running"
            and st.attempt.phase == "train"
            and st.attempt.stepped
            and st.attempt.worker is not None
            and st.attempt.worker.poll() is None
        )
        if self.requests:
            # Ray places the workers on GPUs of its choosing: the host's GPUs the supervisor may see are the
            # job's signal (a one-machine cluster's all), and the room to grow is the cluster's, not theirs.
            seen = len([g for g in rec.gpus if self.visible is None or g.index in self.visible])
            reading = job_reading(rec.ts, rec.cpu_ratio, rec.gpus, max(seen, 1), self.visible)
            reading = replace(reading, gpus_available=None)
        else:
            reading = job_reading(rec.ts, rec.cpu_ratio, rec.gpus, shape.world, self.visible)
        if self.link is not None:
            # What it may grow onto is the server's to say, when asked.
            reading = replace(reading, gpus_available=None)
            if training and self.scaling is None:
                want = self.link.wanted()
                if want is not None:
                    return self.decide(
                        self.rules.shrink_onto(len(want), "the server asks for room"), onto=want
                    )
        decision = self.rules.observe(reading, training)
        return self.decide(decision) if decision is not None else None

    def on_step(self, rec: StepRecord) -> Action | None:
        """Rank 0's step: the first after a resize says what it cost; later ones measure whether it paid
        (a resize that did not is undone: that action, to carry out, or None)."""
        if self.resized is not None:
            d, decided, saved = self.resized
            self.resized = None
            lost = rec.ts - saved if saved is not None else None
            self.out.emit(
                "action",
                "resized",
                f"running on {d.after.world} process(es) from step {rec.step}"
                + (f", dataloader workers {d.after.workers}" if d.after.workers != d.before.workers else "")
                + (f": {lost:.1f}s from the checkpoint to the first step" if lost is not None else ""),
                step=rec.step,
                data={
                    "kind": d.kind,
                    "world": d.after.world,
                    "dataloader_num_workers": d.after.workers,
                    "gradient_accumulation_steps": d.after.accumulation,
                    "effective_batch": d.after.effective_batch,
                    "checkpoint_to_first_step_s": lost,
                    "decision_to_first_step_s": rec.ts - decided,
                    "gpus": self.visible,  # the CUDA_VISIBLE_DEVICES it runs on (None: all it sees)
                },
            )
        measured = self.rules.observe_step(rec.ts, rec.step, rec.attempt)
        return self.on_measured(measured, rec.step) if measured is not None else None

    def decide(self, d: ScaleDecision, onto: list[int] | None = None) -> Action | None:
        """File a refusal, or what observe mode would do, or ask the engine (Ray); a relaunch in the new
        shape is returned, as an action for the actions to carry out like a rollback."""
        st = self.state
        data = scale_data(d)
        if d.refused is None and self.link is not None and st.policy.config.mode != "observe":
            d, onto = self._with_server(d, onto)
        if d.refused is not None:
            if onto is not None and self.link is not None:
                self.link.refuse(d.refused)  # the server pauses the job instead
            self.out.emit(
                "action",
                "resize_refused",
                f"{d.kind} refused: {d.reason}, but {d.refused}",
                severity="warning",
                step=st.progress.step,
                data={**data, "refused": d.refused},
            )
            return None
        if st.policy.config.mode == "observe":
            if onto is not None and self.link is not None:
                self.link.refuse("observe mode: the run's policy makes no resize")
            self.out.emit(
                "action",
                "alert_only",
                f"observe mode: would {d.kind} ({d.reason})",
                step=st.progress.step,
            )
            self.rules.declined(st.clock())
            return None
        self.scaling, self.asked_at, self.onto = d, st.clock(), onto
        if self.requests:
            self._request(d, data)
            return None
        return Action(d.kind, d.reason, st.progress.step, params=data)

    def _request(self, d: ScaleDecision, data: dict[str, Any]) -> None:
        """Ask the engine for ``d.after.world`` workers; the training goes on meanwhile (no stop)."""
        st = self.state
        n = d.after.world
        if self.asked_for == (n, d.before.world):
            # Ray holds it already and the group has not changed since: asking again changes nothing.
            self.scaling = None
            self.rules.declined(st.clock())
            return
        source = cast(SizesItself, st.source)
        asked = source.request_workers(d.kind, n, d.reason, st.clock(), st.cfg.ray)
        if asked is None:
            self.scaling = None
            self.rules.declined(st.clock())
            self.out.emit(
                "action", "resize_refused", f"{d.kind} refused: {d.reason}, but no Ray driver runs to ask",
                severity="warning", step=st.progress.step, data={**data, "refused": "no driver"},
            )  # fmt: skip
            return
        self.asked_for = (n, d.before.world)
        self.out.emit(
            "action",
            d.kind,
            f"{d.kind}: {d.reason}; asking Ray for {n} worker(s)",
            severity="warning",
            step=st.progress.step,
            data={**data, "workers": n, "request": str(asked)},
        )

    def on_requested(self, ev: Event, filed: Event | None) -> None:
        """The driver asked Ray: a plan revision with the request as its cause; the cool-down starts.

        The group keeps training as it is; Ray resizes it once the resources are there, and that resize
        is Ray's own plan revision (``ray_resize``)."""
        d, self.scaling = self.scaling, None
        workers = ev.data.get("workers")
        kind = str(ev.data.get("kind") or (d.kind if d else "request"))
        self.state.plans.revise(
            reason=f"scale_{kind}",
            cause=filed,
            notes=f"{kind}: asked Ray for {workers} worker(s) of {(ev.data.get('bundles') or [{}])[0]}"
            + (f" ({d.reason})" if d else ""),
        )
        if d is not None and d.after.world == workers:
            self.rules.applied(d, self.state.clock())

    def _with_server(
        self, d: ScaleDecision, onto: list[int] | None
    ) -> tuple[ScaleDecision, list[int] | None]:
        """A grow's GPUs are reserved by the server before the worker stops; a shrink keeps the first
        (or the server's choice). A refused grow becomes a refusal with the server's reason, and the
        cool-down starts."""
        assert self.link is not None
        if d.after.world > d.before.world:
            gpus, why = self.link.grow(d.after.world, d.reason)
            if gpus is None:
                self.rules.declined(self.state.clock())
                return replace(d, after=d.before, refused=f"the server refused: {why}"), None
            return d, gpus
        if d.after.world < d.before.world and onto is None:
            onto = (self.visible or list(range(d.before.world)))[: d.after.world]
        return d, onto

    def on_measured(self, m: Measured, step: int) -> Action | None:
        self.out.emit(
            "action",
            "resize_measured",
            m.reason,
            severity="info" if m.kept else "warning",
            step=step,
            data={
                **scale_data(m.decision),
                "before_samples_per_s": round(m.before_samples_per_s, 4),
                "after_samples_per_s": round(m.after_samples_per_s, 4),
                "kept": m.kept,
            },
        )
        return self.decide(m.undo) if m.undo is not None and self.state.pending is None else None

    def plan_after_resize(self, resume: str | None) -> tuple[dict[str, Any] | None, str, str]:
        """Relaunch in the new shape from ``resume``, the checkpoint the stop wrote; the effective batch
        is the same."""
        st = self.state
        d, self.scaling = self.scaling, None
        assert d is not None
        onto, self.onto = self.onto, None
        if resume is None and st.progress.step > 0:
            if self.link is not None and d.after.world > d.before.world:
                self.link.release(d.before.world, f"{d.kind} not made: no checkpoint")  # the reservation back
            return (
                None,
                f"scale_{d.kind}",
                f"{d.kind}: the worker stopped without a checkpoint to resume from",
            )
        if onto is not None:
            self._place(onto, d)
        self.rules.applied(d, st.clock())
        self.resized = (d, self.asked_at, st.history.last_save_ts)
        changes = {
            "resume_checkpoint": resume,
            "nproc_per_node": d.after.world,
            "per_device_train_batch_size": d.after.micro_batch,
            "gradient_accumulation_steps": d.after.accumulation,
            "dataloader_num_workers": d.after.workers,
        }
        where = Path(resume).name if resume else "the start"
        return changes, f"scale_{d.kind}", f"{d.kind}: {d.reason}; resuming from {where}"

    def _place(self, onto: list[int], d: ScaleDecision) -> None:
        """The relaunch runs on ``onto``; GPUs a shrink leaves go back to the server now the worker is
        gone."""
        if self.link is not None and d.after.world < d.before.world:
            kept = self.link.release(d.after.world, d.reason)
            onto = kept if kept is not None else onto
        self.visible = onto
        env = getattr(self.state.source, "env", None)
        if isinstance(env, dict):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in onto)


def shape_of(state: RunState) -> Shape:
    """The run's shape now: micro-batch, accumulation, world size, dataloader workers."""
    p, cfg = state.plan, state.cfg
    if REQUEST in state.source.abilities:  # the engine's group: its size is what it last started with
        world = p.world_size or cfg.ray.min_workers
    else:
        world = p.nproc_per_node or cfg.run.nproc_per_node
    return Shape(
        micro_batch=state.planner.batch(state.plan),
        accumulation=p.gradient_accumulation_steps or cfg.train.gradient_accumulation_steps,
        world=world,
        workers=p.dataloader_num_workers
        if p.dataloader_num_workers is not None
        else cfg.train.dataloader_num_workers,
    )


def scale_data(d: ScaleDecision) -> dict[str, Any]:
    return {
        "kind": d.kind,
        "world_from": d.before.world,
        "world_to": d.after.world,
        "gradient_accumulation_from": d.before.accumulation,
        "gradient_accumulation_to": d.after.accumulation,
        "dataloader_workers_from": d.before.workers,
        "dataloader_workers_to": d.after.workers,
        "effective_batch": d.after.effective_batch,
    }
