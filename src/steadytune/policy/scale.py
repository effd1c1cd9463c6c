"""Autoscaling by rules: system readings and step times in, resize decisions out. Pure.

The supervisor feeds :class:`ScaleRules` one :class:`Reading` per system sample and
the timestamp of every training step, and carries out what comes back: a resize
(``grow``/``shrink``: checkpoint, stop, relaunch with another ``nproc_per_node``),
``more_workers`` (the input pipeline is the bottleneck: more dataloader workers, not
GPUs) or ``undo`` (the last resize did not pay off). No clock of its own: every
judgement runs on the timestamps it is given, so tests are exact.

Limits, so a run never thrashes: a rule must hold for its ``for_s``, and only while
the worker trains (loading and saving leave the GPUs idle and mean nothing); at most
one resize per ``cooldown_s``; no new resize while the last one is being measured;
and a change that was undone (a grow from 1 GPU, say) is not tried again from the same
size in the run. An undo itself waits for no cool-down: it goes back to a shape that was
measured to be better.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from steadytune.config.scale import ScaleConfig
from steadytune.records import GpuSample


@dataclass(frozen=True)
class Reading:
    """What the rules look at, at one moment. A reading that is unavailable is None and holds no rule."""

    ts: float
    gpu_util: float | None  # percent, the mean over the GPUs the job runs on
    cpu_util: float | None  # percent of the host's CPUs
    gpus_available: int | None = None  # GPUs the job may grow onto (None: not known)


@dataclass(frozen=True)
class Shape:
    """How a step is made: micro-batch per process x accumulation x processes, and the input workers."""

    micro_batch: int
    accumulation: int
    world: int
    workers: int = 0

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.world


@dataclass(frozen=True)
class ScaleDecision:
    """A change of shape, and why. ``refused`` says why the wanted change cannot be made."""

    kind: str  # grow / shrink / more_workers / undo
    before: Shape
    after: Shape
    reason: str
    refused: str | None = None

    @property
    def resizes(self) -> bool:
        return self.after.world != self.before.world


@dataclass(frozen=True)
class Measured:
    """A resize judged on throughput: samples/s before and after; ``undo`` when it did not pay off."""

    decision: ScaleDecision
    before_samples_per_s: float
    after_samples_per_s: float
    kept: bool
    reason: str
    undo: ScaleDecision | None = None


def keep_effective_batch(shape: Shape, world: int) -> tuple[int | None, str]:
    """The accumulation that keeps ``shape``'s effective batch on ``world`` processes, or None and why not."""
    per_step = shape.micro_batch * world
    eff = shape.effective_batch
    if eff % per_step:
        return None, (
            f"the effective batch {eff} ({shape.micro_batch} x {shape.accumulation} x {shape.world}) is "
            f"not a "
            f"multiple of {shape.micro_batch} x {world} processes, so {world} processes would change it"
        )
    return eff // per_step, ""


def job_reading(
    ts: float,
    cpu_ratio: float | None,
    gpus: Sequence[GpuSample],
    world: int,
    visible: Sequence[int] | None = None,
) -> Reading:
    """The job's view of a system sample: the mean utilisation of the first ``world`` GPUs it may use.

    ``visible`` is the job's ``CUDA_VISIBLE_DEVICES`` as device indices (None: every GPU seen).
    """
    by_index = {g.index: g for g in gpus}
    allowed = [i for i in visible if i in by_index] if visible is not None else sorted(by_index)
    mine = [by_index[i].util_ratio for i in allowed[:world]]
    util = None
    if len(mine) == world and all(u is not None for u in mine):
        util = 100.0 * sum(u for u in mine if u is not None) / world
    return Reading(
        ts=ts,
        gpu_util=util,
        cpu_util=100.0 * cpu_ratio if cpu_ratio is not None else None,
        gpus_available=len(allowed) if gpus else None,
    )


def parse_visible(value: str | None) -> list[int] | None:
    """``CUDA_VISIBLE_DEVICES`` as indices; None when unset or not plain indices (UUIDs)."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None


class ScaleRules:
    """Decides when to resize one run, within the cool-down, and judges each resize afterwards.

    Args:
        cfg: ``scale:`` of the run config.
        shape: the shape the run starts with.
        exact_batch: refuse a size that cannot keep the effective batch exactly; False where the
            engine derives each size's accumulation itself (Ray: the nearest, ``ray.keep_effective_batch``).
    """

    def __init__(self, cfg: ScaleConfig, shape: Shape, exact_batch: bool = True) -> None:
        self.cfg = cfg
        self.shape = shape
        self.exact_batch = exact_batch
        self._since: dict[str, float | None] = {"grow": None, "shrink": None, "more_workers": None}
        self._last_resize: float | None = None
        self._intervals: deque[float] = deque(maxlen=cfg.compare_steps)
        self._last_step: tuple[int, int, float] | None = None  # (attempt, step, ts)
        self._first_attempt_step: int | None = None
        self._judging: tuple[ScaleDecision, float | None] | None = None
        self._after: list[float] = []
        self._blocked: set[tuple[str, int]] = set()  # (kind, from world or workers): undone once
        self._refused: set[tuple[str, int]] = set()
        self._asked = False  # a decision is out: nothing new until it is applied or declined

    # -- inputs ----------------------------------------------------------------
    def set_micro_batch(self, micro_batch: int, accumulation: int) -> None:
        """The plan changed the micro-batch (auto search, OOM split): resizes keep the new effective batch."""
        self.shape = replace(self.shape, micro_batch=micro_batch, accumulation=accumulation)

    def set_world(self, world: int) -> None:
        """The engine sized the group itself (Ray): the rules judge the size it runs at.

        Steps measured for a resize before the group changed size were the old group's: dropped."""
        if world != self.shape.world:
            self._after = []
        self.shape = replace(self.shape, world=world)

    def observe(self, r: Reading, training: bool) -> ScaleDecision | None:
        """One reading; ``training``: the worker is in its training loop (else every rule starts over)."""
        if not training:
            self._since = dict.fromkeys(self._since)
            return None
        c = self.cfg
        held = {
            "grow": r.gpu_util is not None and r.gpu_util > c.grow.gpu_util_above,
            "shrink": r.gpu_util is not None and r.gpu_util < c.shrink.gpu_util_below,
            "more_workers": c.cpu_bound is not None
            and r.cpu_util is not None
            and r.gpu_util is not None
            and r.cpu_util > c.cpu_bound.cpu_util_above
            and r.gpu_util < c.cpu_bound.gpu_util_below,
        }
        for name, on in held.items():
            self._since[name] = (self._since[name] if self._since[name] is not None else r.ts) if on else None
        if self._judging is not None or self._asked:
            return None  # the last resize is still being carried out, or measured
        if self._last_resize is not None and r.ts - self._last_resize < c.cooldown_s:
            return None
        # The input pipeline first: GPUs that wait on data need workers, not more GPUs (nor fewer).
        decision = None
        if c.cpu_bound is not None and self._for(r.ts, "more_workers", c.cpu_bound.for_s):
            decision = self._more_workers(r)
        if decision is None and self._for(r.ts, "grow", c.grow.for_s):
            top = min(c.max_gpus, r.gpus_available if r.gpus_available is not None else c.max_gpus)
            decision = self._resize("grow", range(self.shape.world + 1, top + 1), r, c.grow.for_s)
        if decision is None and self._for(r.ts, "shrink", c.shrink.for_s):
            decision = self._resize(
                "shrink", range(self.shape.world - 1, c.min_gpus - 1, -1), r, c.shrink.for_s
            )
        self._asked = decision is not None and decision.refused is None
        return decision

    def shrink_onto(self, world: int, why: str) -> ScaleDecision:
        """A shrink asked from outside the rules (the server, for memory pressure): no ``for_s``, no
        cool-down.

        Refused, with the reason, when ``world`` processes cannot keep the effective batch
        or the scale range does not go that low.
        """
        if world < self.cfg.min_gpus or world >= self.shape.world:
            return ScaleDecision(
                "shrink", self.shape, self.shape, why,
                refused=f"{world} processes is outside scale.min_gpus {self.cfg.min_gpus} .. "
                f"{self.shape.world - 1}",
            )  # fmt: skip
        accum, problem = self._accumulation(world)
        if accum is None:
            return ScaleDecision("shrink", self.shape, self.shape, why, refused=problem)
        after = replace(self.shape, world=world, accumulation=accum)
        self._asked = True
        return ScaleDecision(
            "shrink",
            self.shape,
            after,
            f"{why}: {self.shape.world} -> {world} processes, gradient accumulation "
            f"{self.shape.accumulation} -> {accum} (effective batch {after.effective_batch} kept)",
        )

    def declined(self, ts: float) -> None:
        """The last decision was not carried out (observe mode): the cool-down runs as if it had been."""
        self._asked = False
        self._last_resize = ts
        self._since = dict.fromkeys(self._since)

    def observe_step(self, ts: float, step: int, attempt: int) -> Measured | None:
        """A training step of rank 0 ended at ``ts``; returns the verdict on a resize once it is measured."""
        last, self._last_step = self._last_step, (attempt, step, ts)
        if last is None or last[0] != attempt:
            self._first_attempt_step = step
            return None
        # A new attempt's first steps warm up (caches, allocator, compiled kernels): not its pace.
        if step != last[1] + 1 or step <= (self._first_attempt_step or 0) + 1:
            return None
        interval = ts - last[2]
        if interval <= 0:
            return None
        if self._judging is None:
            self._intervals.append(interval)
            return None
        self._after.append(interval)
        if len(self._after) < self.cfg.compare_steps:
            return None
        return self._verdict()

    def applied(self, decision: ScaleDecision, ts: float) -> None:
        """The run was relaunched with ``decision.after`` at ``ts``: the cool-down starts, and the
        measuring."""
        before = self._throughput(self._intervals, decision.before) if len(self._intervals) >= 2 else None
        self.shape = decision.after
        self._asked = False
        self._last_resize = ts
        self._since = dict.fromkeys(self._since)
        self._intervals.clear()
        self._after = []
        self._last_step = None
        # An undo restores a shape already measured: it is not judged again.
        self._judging = (decision, before) if decision.kind != "undo" else None

    # -- rules -----------------------------------------------------------------
    def _accumulation(self, world: int) -> tuple[int | None, str]:
        accum, problem = keep_effective_batch(self.shape, world)
        if accum is None and not self.exact_batch:
            per_step = self.shape.micro_batch * world
            return max(1, round(self.shape.effective_batch / per_step)), ""
        return accum, problem

    def _for(self, ts: float, name: str, for_s: float) -> bool:
        since = self._since[name]
        return since is not None and ts - since >= for_s

    def _more_workers(self, r: Reading) -> ScaleDecision | None:
        c = self.cfg.cpu_bound
        assert c is not None
        now = self.shape.workers
        target = min(c.max_workers, max(2, now * 2))
        if target <= now or ("more_workers", now) in self._blocked:
            return None
        return ScaleDecision(
            "more_workers",
            self.shape,
            replace(self.shape, workers=target),
            f"CPU {r.cpu_util:.0f}% > {c.cpu_util_above:g}% while the GPUs are at {r.gpu_util:.0f}% "
            f"< {c.gpu_util_below:g}% for {c.for_s:g}s: the input pipeline is the bottleneck; "
            f"dataloader workers {now} -> {target}",
        )

    def _resize(self, kind: str, sizes: range, r: Reading, for_s: float) -> ScaleDecision | None:
        if kind == "grow":
            why = f"GPU util {r.gpu_util:.0f}% > {self.cfg.grow.gpu_util_above:g}% for {for_s:g}s"
        else:
            why = f"GPU util {r.gpu_util:.0f}% < {self.cfg.shrink.gpu_util_below:g}% for {for_s:g}s"
        if (kind, self.shape.world) in self._blocked:
            return None  # it was tried from this size and did not pay off
        refusals = []
        for world in sizes:
            accum, problem = self._accumulation(world)
            if accum is None:
                refusals.append(problem)
                continue
            after = replace(self.shape, world=world, accumulation=accum)
            return ScaleDecision(
                kind,
                self.shape,
                after,
                f"{why}: {self.shape.world} -> {world} processes, gradient accumulation "
                f"{self.shape.accumulation} -> {accum} (effective batch {after.effective_batch} kept)",
            )
        key = (kind, self.shape.world)
        if not refusals or key in self._refused:
            return None  # at the limit, or already said
        self._refused.add(key)
        return ScaleDecision(kind, self.shape, self.shape, why, refused="; ".join(refusals))

    # -- judging ---------------------------------------------------------------
    @staticmethod
    def _throughput(intervals: Sequence[float], shape: Shape) -> float:
        # The median step interval: a checkpoint save or an eval inside the window is not the pace.
        return shape.effective_batch / statistics.median(intervals)

    def _verdict(self) -> Measured:
        assert self._judging is not None
        decision, before = self._judging
        self._judging = None
        after = self._throughput(self._after, decision.after)
        self._intervals.extend(self._after)
        if before is None:
            return Measured(decision, 0.0, after, True, "too few steps before it to judge the resize")
        gain = 1.0 + self.cfg.min_gain
        if decision.kind == "shrink":
            # A shrink frees GPUs: it pays off when each GPU left does more than before.
            per_before, per_after = before / decision.before.world, after / decision.after.world
            kept = per_after >= per_before * gain
            how = f"{per_before:.3g} -> {per_after:.3g} samples/s per GPU"
        else:
            kept = after >= before * gain
            how = f"{before:.3g} -> {after:.3g} samples/s"
        need = f"(needs +{self.cfg.min_gain:.0%})"
        if kept:
            return Measured(decision, before, after, True, f"{decision.kind} kept: {how} {need}")
        if not self.cfg.undo_if_slower:
            return Measured(
                decision, before, after, False, f"{decision.kind} did not pay off: {how} {need}; kept"
            )
        b, a = decision.before, decision.after
        self._blocked.add((decision.kind, b.world) if decision.resizes else (decision.kind, b.workers))
        # Back to the shape that was measured, with its accumulation re-derived for its world size.
        restored = replace(b, micro_batch=a.micro_batch)
        accum, _ = keep_effective_batch(a, b.world)
        restored = replace(restored, accumulation=accum or b.accumulation)
        undo = ScaleDecision("undo", a, restored, f"undo the {decision.kind}: {how} {need}")
        return Measured(
            decision, before, after, False, f"{decision.kind} did not pay off: {how} {need}", undo
        )
