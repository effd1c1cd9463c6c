"""The live engine: every detector over the telemetry stream, each anomaly raised once, resolved once.

The supervisor feeds it step records, system samples and the time; it returns
:class:`Transition` objects only when something changes. ``steadytune analyze``
replays an imported log through the very same engine (:mod:`.offline`).

Training-signal detectors (loss, gradients, eval) watch the primary rank (the
lowest rank seen): under data parallelism every rank sees the same update, so
one alarm per event is right. Memory and throughput are watched per rank, and
stragglers compare the ranks. Each step costs a few microseconds: every
detector is incremental, none looks back over the history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from steadytune.config.detect import DetectConfig
from steadytune.detect import build
from steadytune.detect.base import Finding
from steadytune.kinds import KINDS
from steadytune.objectives import LOSS_OBJECTIVE, is_rl, objective_of, without_learning_signal
from steadytune.records import SEVERITY_ORDER, Anomaly, Severity, StepRecord, SystemSample


@dataclass(frozen=True)
class Transition:
    """An anomaly that was just raised, or just resolved (with its final ``end_step``)."""

    state: Literal["raised", "resolved"]
    anomaly: Anomaly


class _Open:
    """An anomaly being tracked; mutable so a long episode costs nothing per step."""

    __slots__ = ("end_step", "evidence", "first", "severity")

    def __init__(self, first: Anomaly) -> None:
        self.first = first
        self.end_step = first.end_step
        self.severity: Severity = first.severity
        self.evidence: dict[str, Any] = dict(first.evidence)

    def snapshot(self) -> Anomaly:
        a = self.first
        return Anomaly(
            a.kind,
            self.severity,
            a.start_step,
            self.end_step,
            a.metric,
            dict(self.evidence),
            a.cause,
            a.suggestion,
            a.rank,
        )


class _Signal:
    """The training-signal detectors of the primary rank."""

    def __init__(self, cfg: DetectConfig) -> None:
        self.loss = build.loss_watch(cfg)
        self.plateau = build.plateau_watch(cfg)
        self.oscillation = build.oscillation_watch(cfg)
        self.overfit = build.overfit_watch(cfg)
        self.grad = build.grad_watch(cfg)
        self.flow = build.grad_flow_watch(cfg)
        self.short_rise = build.short_rise_watch(cfg)
        self.fall = build.fall_collapse_watch(cfg)
        self._prev_g_jump = 0.0
        self.objective = build.objective_watch(cfg)
        # Named by the first training record that carries extra fields (an evaluation's are the eval set's).
        self.objective_name: str | None = None

    def observe(self, rec: StepRecord, out: list[Finding]) -> None:
        lp = None
        if rec.lr is not None:
            self.plateau.observe_lr(rec.lr)
        g_jump = self.grad.jump(rec.grad_norm)
        corroborated = max(g_jump, self._prev_g_jump) >= self.grad.spike_jump
        self._prev_g_jump = g_jump
        if self.objective_name is None and rec.extra and not rec.extra.get("eval"):
            self.objective_name = objective_of(rec.extra) or LOSS_OBJECTIVE
            self.grad.gated = is_rl(self.objective_name)
        if self.objective_name not in (None, LOSS_OBJECTIVE):
            # The loss of an RL/preference objective is judged only for NaN/Inf; its own signals
            # (reward, KL) and the gradient norm carry the rest.
            if rec.loss is not None and not math.isfinite(rec.loss):
                self.loss.observe(rec.step, rec.loss, rec.epoch, out)
            elif rec.loss is not None and self.loss.rep.on:
                self.loss.rep.report(out, "nan_loss", self.loss.metric, rec.step, False)
            if rec.extra:
                self.objective.observe(rec.step, rec.extra, out)
        elif rec.loss is not None:
            lp = self.loss.observe(rec.step, rec.loss, rec.epoch, out, corroborated)
        g = rec.grad_norm
        if self.grad.gated and g is not None and math.isfinite(g) and without_learning_signal(rec.extra, g):
            # An RL batch whose groups all tied has no advantages: its norm is the KL term's (or
            # zero), a hole in the series, not a vanishing gradient nor the level spikes are
            # judged against (a healthy GRPO run alternates such batches with learning ones).
            g = None
        if g is not None and not (rec.skipped and math.isfinite(g)):
            spiking = lp is not None and lp.in_spike
            finite = rec.loss is None or math.isfinite(rec.loss)
            self.grad.observe(rec.step, g, spiking, finite, out)
        if rec.eval_loss is not None:
            self.fall.observe_eval(rec.eval_loss)
        if lp is not None:
            t = self.loss.tracker
            held = lp.in_spike or self.loss.rep.is_on("divergence", self.loss.metric)
            # Read only where the rule reads it (a segment's first point): the noise estimate is
            # otherwise computed only for points that jump, and this runs for every point.
            run_noise = t.sigma_upper if lp.new_segment and t.n_noise else None
            climb = self.short_rise.observe(lp, out, held, run_noise)
            if climb is not None and rec.loss is not None:
                self.loss.hold_climb(rec.step, rec.loss, *climb, out)
            self.fall.observe(lp, t.level, t.level_full, rec.epoch, out)
            self.plateau.observe(lp, t.level, self.grad.vanished, out)
            self.oscillation.observe(lp, out, rec.epoch)
        flow = rec.extra.get("gradflow") if rec.extra else None
        if isinstance(flow, dict):
            self.flow.observe(rec.step, flow, out)
        if rec.eval_loss is not None:
            t = self.loss.tracker
            level, noise = (t.level, t.sigma) if t.n_level else (None, 0.0)
            self.overfit.observe(rec.step, rec.eval_loss, level, out, noise)


class _Rank:
    """Memory and throughput detectors of one rank."""

    def __init__(self, cfg: DetectConfig, rank: int) -> None:
        self.leak = build.leak_watch(cfg, "mem_allocated_bytes", rank)
        self.host_leak = build.leak_watch(cfg, "rss_bytes", rank)
        self.headroom = build.headroom_watch(cfg, "mem_reserved_bytes", rank)
        self.pace = build.throughput_watch(cfg, rank)
        self.attempt = 0


class LiveDetector:
    """Runs every detector on records as they come; returns raised/resolved transitions.

    Args:
        config: thresholds; defaults work without tuning.

    Example:
        >>> det = LiveDetector()
        >>> for rec in records:
        ...     for t in det.observe_step(rec):
        ...         print(format_transition(t))
    """

    def __init__(self, config: DetectConfig | None = None) -> None:
        self.config = config or DetectConfig()
        cfg = self.config
        self._disabled = frozenset(cfg.disabled_kinds)
        self._enabled = cfg.enabled
        self._signal = _Signal(cfg)
        self._ranks: dict[int, _Rank] = {}
        self._primary: int | None = None
        self._straggler = build.straggler_watch(cfg)
        self._stall = build.stall_watch(cfg)
        self._system = build.system_watch(cfg)
        self._ram_total: int | None = None
        self._open: dict[tuple[str, str, int | None], _Open] = {}
        self.last_step = 0

    def observe_step(self, rec: StepRecord) -> list[Transition]:
        """Feed one step record (any rank); returns what was raised or resolved by it."""
        if not self._enabled:
            return []
        out: list[Finding] = []
        rank = rec.rank
        if self._primary is None or rank < self._primary:
            self._primary = rank
        if rank == self._primary:
            self.last_step = rec.step
            if rec.ts:  # imported logs carry no time: no stall to judge
                self._stall.progress(rec.step, rec.ts, out, rec.attempt)
            self._signal.observe(rec, out)
        if (
            rec.step_time_s is not None
            or rec.mem_allocated_bytes is not None
            or rec.mem_reserved_bytes is not None
            or rec.mem_peak_bytes is not None
            or rec.rss_bytes is not None
        ):
            self._per_rank(rec, out)
        return self._apply(out) if out else []

    def observe_system(self, sample: SystemSample) -> list[Transition]:
        """Feed one system sample (GPUs, RAM, disk)."""
        if not self._enabled:
            return []
        out: list[Finding] = []
        if sample.ram_total_bytes:
            self._ram_total = sample.ram_total_bytes
        self._system.observe(sample, self.last_step, out)
        return self._apply(out) if out else []

    def observe_time(
        self, now: float, last_heartbeat_ts: float | None, last_step: int | None
    ) -> list[Transition]:
        """Judge stalls and hangs at time ``now`` (the caller's clock; this class has none)."""
        if not self._enabled:
            return []
        out: list[Finding] = []
        self._stall.check(now, last_heartbeat_ts, last_step, out)
        return self._apply(out) if out else []

    def set_projected_disk_need(self, need_bytes: int | None) -> None:
        """What the run will still write (checkpoints to come): disk_low compares free space with it."""
        self._system.set_projected_need(need_bytes)

    @property
    def objective(self) -> str:
        """What the training signal is judged as: ``"preference (DPO)"``, ``"RL (GRPO/RLOO)"``, ... or
        :data:`~steadytune.objectives.LOSS_OBJECTIVE` (the SFT loss rules)."""
        return self._signal.objective_name or LOSS_OBJECTIVE

    def open_anomalies(self) -> list[Anomaly]:
        """Anomalies raised and not yet resolved, as they stand now."""
        return [o.snapshot() for o in self._open.values()]

    def _per_rank(self, rec: StepRecord, out: list[Finding]) -> None:
        cfg = self.config
        r = self._ranks.get(rec.rank)
        if r is None:
            r = self._ranks[rec.rank] = _Rank(cfg, rec.rank)
        if rec.attempt != r.attempt:
            # A restarted worker warms up again (and may run on another device): new pace baseline.
            r.attempt = rec.attempt
            r.pace = build.throughput_watch(cfg, rec.rank)
        total = cfg.memory.device_total_bytes or self._system.gpu_totals.get(rec.rank)
        if rec.mem_allocated_bytes is not None:
            r.leak.observe(rec.step, float(rec.mem_allocated_bytes), total, rec.step_time_s, out)
        if rec.rss_bytes is not None:
            r.host_leak.observe(rec.step, float(rec.rss_bytes), self._ram_total, rec.step_time_s, out)
        held = max(rec.mem_reserved_bytes or 0, rec.mem_peak_bytes or 0)
        if held and total:
            r.headroom.observe(rec.step, float(held), float(total), out)
        if rec.step_time_s is not None:
            r.pace.observe(rec, out)
            self._straggler.observe(rec, out)

    def _apply(self, findings: list[Finding]) -> list[Transition]:
        transitions: list[Transition] = []
        for f in findings:
            if f.kind in self._disabled:
                continue
            key = (f.kind, f.metric, f.rank)
            cur = self._open.get(key)
            if f.active:
                if cur is None:
                    info = KINDS[f.kind]
                    first = Anomaly(
                        f.kind,
                        f.severity or info.severity,
                        f.step,
                        f.step,
                        f.metric,
                        dict(f.evidence or {}),
                        f.cause or info.cause,
                        info.suggestion,
                        f.rank,
                    )
                    self._open[key] = _Open(first)
                    transitions.append(Transition("raised", first))
                    continue
                cur.end_step = max(cur.end_step, f.step)
                if f.evidence:
                    cur.evidence.update(f.evidence)
                if f.severity and SEVERITY_ORDER[f.severity] > SEVERITY_ORDER[cur.severity]:
                    cur.severity = f.severity
            elif cur is not None:
                del self._open[key]
                transitions.append(Transition("resolved", cur.snapshot()))
        return transitions


def format_transition(t: Transition) -> str:
    """One console line: what, where, the evidence, the likely cause and the fix."""
    a = t.anomaly
    info = KINDS.get(a.kind)
    title = info.title if info else a.kind
    where = f" (rank {a.rank})" if a.rank is not None else ""
    if t.state == "resolved":
        return f"resolved {a.kind}{where}: {title} on {a.metric}, steps {a.start_step}-{a.end_step}"
    facts = ", ".join(f"{k}={v}" for k, v in list(a.evidence.items())[:4])
    return (
        f"{a.severity.upper()} {a.kind}{where} at step {a.start_step}: {title} on {a.metric}"
        f"{f' ({facts})' if facts else ''}. Likely cause: {a.cause}. Try: {a.suggestion}."
    )
