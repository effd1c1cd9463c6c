"""The live engine: every detector over the telemetry stream, each anomaly one episode.

The supervisor feeds it step records, system samples and the time; it returns
:class:`~.episodes.Transition` objects only when an episode changes (raised,
escalated, cleared, recurred, resolved: :mod:`.episodes`). ``steadytune analyze``
replays an imported log through the very same engine (:mod:`.offline`).

Training-signal detectors (loss, gradients, eval) watch the primary rank (the
lowest rank seen): under data parallelism every rank sees the same update, so
one alarm per event is right. Memory and throughput are watched per rank, and
stragglers compare the ranks. Each step costs a few microseconds: every
detector is incremental, none looks back over the history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import pairwise
from typing import cast

from steadytune.config.detect import DetectConfig
from steadytune.detect import build
from steadytune.detect.base import NEEDS, Detector, Finding
from steadytune.detect.build import KINDS
from steadytune.detect.episodes import Episodes, Transition
from steadytune.detect.grad import GradWatch
from steadytune.detect.loss import LossWatch
from steadytune.detect.points import RankStep, Signal, SystemPoint, Tick
from steadytune.detect.rollouts import RolloutBatches
from steadytune.detect.system import SystemWatch
from steadytune.objectives import LOSS_OBJECTIVE, SIGNED_OBJECTIVE, is_rl, objective_of
from steadytune.records import Anomaly, StepRecord, SystemSample


class _Feeds:
    """The run's detectors, sorted by what they observe (registry order within a feed)."""

    def __init__(self, cfg: DetectConfig, registry: tuple[build.Entry, ...]) -> None:
        built = build.run_detectors(cfg, registry)
        feeds = {e.name: e.feeds for e in registry}
        on = {feed: [d for name, d in built.items() if feed in feeds[name]] for feed in _FEEDS}
        self.signal: list[Detector[Signal]] = on[Signal]
        self.rank: list[Detector[RankStep]] = on[RankStep]
        self.system: list[Detector[SystemPoint]] = on[SystemPoint]
        self.tick: list[Detector[Tick]] = on[Tick]
        # What the engine itself reads: the grad series before it judges a step (its jump
        # corroborates a loss spike), the loss series' level for the rules after it, and the
        # GPU totals the system samples report.
        self.loss = cast(LossWatch, built["loss"])
        self.grad = cast(GradWatch, built["grad"])
        self.sys = cast(SystemWatch, built["system"])
        self._needs = [frozenset(getattr(d, "needs", ())) for d in self.signal]
        unknown = set().union(*self._needs) - set(NEEDS)
        if unknown:
            raise ValueError(f"a detector needs {sorted(unknown)}: not one of {', '.join(NEEDS)}")

    def signal_observers(self, has: tuple[bool, ...]) -> list[Callable[[Signal, list[Finding]], None]]:
        """The signal detectors to show a point that has what ``has`` says (one flag per NEEDS item)."""
        present = {need for need, there in zip(NEEDS, has, strict=True) if there}
        return [d.observe for d, needs in zip(self.signal, self._needs, strict=True) if needs <= present]


_FEEDS = (Signal, RankStep, SystemPoint, Tick)
_SFT = (None, LOSS_OBJECTIVE)  # the objectives the SFT loss rules judge (Signal.by_loss_rules)


class _Rank:
    """The detectors of one rank's own steps (memory, throughput)."""

    def __init__(self, cfg: DetectConfig, rank: int, registry: tuple[build.Entry, ...]) -> None:
        self.detectors: dict[str, Detector[RankStep]] = build.rank_detectors(cfg, rank, registry=registry)
        self.attempt = 0


class LiveDetector:
    """Runs every detector on records as they come; returns the transitions of their episodes.

    Args:
        config: thresholds; defaults work without tuning.
        registry: the detectors to run (:data:`~steadytune.detect.build.REGISTRY`, all of them).

    Example:
        >>> det = LiveDetector()
        >>> for rec in records:
        ...     for t in det.observe_step(rec):
        ...         print(format_transition(t))
    """

    def __init__(
        self, config: DetectConfig | None = None, registry: tuple[build.Entry, ...] = build.REGISTRY
    ) -> None:
        self.config = config or DetectConfig()
        cfg = self.config
        self._registry = registry
        self._enabled = cfg.enabled
        self._feeds = _Feeds(cfg, registry)
        # By what a point has (NEEDS): the detectors to show it, their observe bound once.
        self._on_signal: dict[tuple[bool, ...], list[Callable[[Signal, list[Finding]], None]]] = {}
        self._spike_jump = self._feeds.grad.spike_jump
        self._ranks: dict[int, _Rank] = {}
        self._primary: int | None = None
        self._ram_total: int | None = None
        self._episodes = Episodes(KINDS, cfg.episode_gap_points, frozenset(cfg.disabled_kinds))
        # The primary rank's latest steps: episodes' gaps are counted in its logging interval.
        self._steps: deque[int] = deque(maxlen=17)
        self._prev_g_jump = 0.0
        self._batches = RolloutBatches()  # an RL step's rollout batch (reused over num_iterations)
        # Named by the first training record that carries extra fields (an evaluation's are the eval set's).
        self._objective: str | None = None
        self._rl = False  # is_rl(self._objective), kept as the objective is named
        self.last_step = 0

    def observe_step(self, rec: StepRecord) -> list[Transition]:
        """Feed one step record (any rank); returns the episode transitions it makes."""
        if not self._enabled:
            return []
        out: list[Finding] = []
        done: list[Transition] = []
        rank = rec.rank
        if self._primary is None or rank < self._primary:
            self._primary = rank
        if rank == self._primary:
            self.last_step = rec.step
            self._steps.append(rec.step)
            if self._episodes.quiet:
                done = self._episodes.expire(rec.step, self._interval())
            point = self._signal_point(rec)
            has = (point.objective not in _SFT, bool(rec.extra), rec.eval_loss is not None, bool(rec.ts))
            observers = self._on_signal.get(has)
            if observers is None:
                observers = self._on_signal[has] = self._feeds.signal_observers(has)
            for observe in observers:
                observe(point, out)
        if (
            rec.step_time_s is not None
            or rec.mem_allocated_bytes is not None
            or rec.mem_reserved_bytes is not None
            or rec.mem_peak_bytes is not None
            or rec.rss_bytes is not None
        ):
            self._per_rank(rec, out)
        if out:
            done += self._episodes.apply(out, self.last_step)
        return done

    def _interval(self) -> float:
        """The primary rank's logging interval: the median step between its recent records."""
        gaps = sorted(b - a for a, b in pairwise(self._steps) if b > a)
        n = len(gaps)
        if not n:
            return 1.0
        return float(gaps[n // 2]) if n % 2 else 0.5 * (gaps[n // 2 - 1] + gaps[n // 2])

    def _signal_point(self, rec: StepRecord) -> Signal:
        """The step as the signal detectors see it: the objective named, the grad jump read."""
        grad = self._feeds.grad
        g_jump = 0.0 if rec.grad_norm is None else grad.jump(rec.grad_norm)
        corroborated = max(g_jump, self._prev_g_jump) >= self._spike_jump
        self._prev_g_jump = g_jump
        if self._objective is None and rec.extra and not rec.extra.get("eval"):
            self._objective = objective_of(rec.extra) or LOSS_OBJECTIVE
            grad.gated = self._rl = is_rl(self._objective)
        if self._objective in _SFT and rec.loss is not None and rec.loss < 0.0:
            # No cross-entropy goes below zero: the SFT loss rules have nothing to say about this one.
            self._objective = SIGNED_OBJECTIVE
            self._rl = is_rl(self._objective)
        point = Signal(rec, self._objective, corroborated, self._feeds.loss.tracker)
        if self._rl and not (rec.extra and rec.extra.get("eval")):
            # Set apart, not passed by name: a keyword argument made the point cost twice as much.
            point.batch = self._batches.see(rec.extra)
        return point

    def observe_system(self, sample: SystemSample) -> list[Transition]:
        """Feed one system sample (GPUs, RAM, disk)."""
        if not self._enabled:
            return []
        out: list[Finding] = []
        if sample.ram_total_bytes:
            self._ram_total = sample.ram_total_bytes
        point = SystemPoint(sample, self.last_step)
        for d in self._feeds.system:
            d.observe(point, out)
        return self._episodes.apply(out, self.last_step) if out else []

    def observe_time(
        self, now: float, last_heartbeat_ts: float | None, last_step: int | None
    ) -> list[Transition]:
        """Judge stalls and hangs at time ``now`` (the caller's clock; this class has none)."""
        if not self._enabled:
            return []
        out: list[Finding] = []
        point = Tick(now, last_heartbeat_ts, last_step)
        for d in self._feeds.tick:
            d.observe(point, out)
        return self._episodes.apply(out, self.last_step) if out else []

    def set_projected_disk_need(self, need_bytes: int | None) -> None:
        """What the run will still write (checkpoints to come): disk_low compares free space with it."""
        self._feeds.sys.set_projected_need(need_bytes)

    @property
    def objective(self) -> str:
        """What the training signal is judged as: ``"preference (DPO)"``, ``"RL (GRPO/RLOO)"``, ... or
        :data:`~steadytune.objectives.LOSS_OBJECTIVE` (the SFT loss rules)."""
        return self._objective or LOSS_OBJECTIVE

    def open_anomalies(self) -> list[Anomaly]:
        """Episodes raised and not yet resolved (quiet ones included), as they stand now."""
        return self._episodes.open()

    def settle_episodes(self) -> None:
        """The run was rewound: the open episodes a replay rebuilt have been told (raised, then resolved
        or cleared by the rewind), so they go on without a word and end in silence; what the detectors
        learnt stays (:meth:`~.episodes.Episodes.settle`)."""
        self._episodes.settle()

    def finish(self) -> list[Transition]:
        """The run is over: what only its whole length tells (each signal detector's ``finish``, where it
        has one: see base.Detector). Told once; a second call adds nothing."""
        if not self._enabled:
            return []
        out: list[Finding] = []
        for d in self._feeds.signal:
            done = getattr(d, "finish", None)
            if done is not None:
                done(out)
        return self._episodes.apply(out, self.last_step) if out else []

    def close(self) -> list[Transition]:
        """The run is over: what its whole length tells (:meth:`finish`), then its quiet episodes are
        resolved (one still holding stays open)."""
        return [*self.finish(), *self._episodes.close()]

    def _per_rank(self, rec: StepRecord, out: list[Finding]) -> None:
        cfg = self.config
        r = self._ranks.get(rec.rank)
        if r is None:
            r = self._ranks[rec.rank] = _Rank(cfg, rec.rank, self._registry)
        if rec.attempt != r.attempt:
            # A restarted worker warms up again (and may run on another device): new pace baseline.
            r.attempt = rec.attempt
            r.detectors.update(build.rank_detectors(cfg, rec.rank, fresh_only=True, registry=self._registry))
        total = cfg.memory.device_total_bytes or self._feeds.sys.gpu_totals.get(rec.rank)
        point = RankStep(rec, total, self._ram_total)
        for d in r.detectors.values():
            d.observe(point, out)
        for d in self._feeds.rank:
            d.observe(point, out)


def format_transition(t: Transition, done: str | None = None, left: str | None = None) -> str:
    """One console line: what, where, the evidence, the likely cause and the fix.

    ``done`` is what steadytune does about a raised anomaly, in words, and ``left`` what that leaves
    to people: the line then says both instead of the kind's usual fix, which would tell people to do
    what was just done (skip the update, dump the stacks and restart).
    """
    a = t.anomaly
    info = KINDS.get(a.kind)
    title = info.title if info else a.kind
    where = f" (rank {a.rank})" if a.rank is not None else ""
    times = f", {a.count} times" if a.count > 1 else ""
    peak = f", peak {a.peak:g}" if a.peak is not None else ""
    if t.state == "resolved":
        steps = f"steps {a.start_step}-{a.end_step}"
        return f"resolved {a.kind}{where}: {title} on {a.metric}, {steps}{times}{peak}"
    if t.state == "cleared":
        return f"cleared {a.kind}{where}: {title} on {a.metric} holds no more at step {a.end_step}"
    if t.state == "recurred":
        return (
            f"{t.fired.severity.upper()} {a.kind}{where} again at step {t.fired.start_step}: {title} on "
            f"{a.metric} (episode from step {a.start_step}{times}{peak})"
        )
    facts = ", ".join(f"{k}={v}" for k, v in list(a.evidence.items())[:4])
    at, rose = a.start_step, f" (severity rose from {t.was})" if t.state == "escalated" else ""
    if t.took:  # a graver kind grew out of a part's episode: say which, and that it is one episode
        grew = ", ".join(f"the {p.kind} raised at step {p.start_step}" for p in t.took)
        at = t.fired.start_step
        rose = f" (grew out of {grew}: one episode from step {a.start_step}{times}{peak})"
    return (
        f"{a.severity.upper()} {a.kind}{where} at step {at}{rose}: {title} on {a.metric}"
        f"{f' ({facts})' if facts else ''}. Likely cause: {a.cause}. {_advice(a.suggestion, done, left)}"
    )


def _advice(suggestion: str, done: str | None, left: str | None) -> str:
    if done is None:
        return f"Try: {suggestion}."
    return f"Done: {done}." + (f" Left to you: {left}." if left else "")
