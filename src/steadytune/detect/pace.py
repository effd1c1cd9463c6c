"""Pace detectors: throughput_drop, dataloader_bottleneck, straggler, stall.

- throughput_drop: tokens/s (else samples/s, else steps/s) below
  ``1 - throughput_drop`` of its median for ``throughput_points`` points in a
  row. One slow step (a checkpoint save, an eval) is not a drop. Slow points are
  kept out of the baseline so a lasting drop stays visible;
- dataloader_bottleneck: ``extra["data_time_s"]`` (time waiting for the batch)
  over ``data_wait_ratio`` of the step time, ``data_wait_points`` in a row;
- straggler: one rank's step time (``extra["compute_time_s"]`` when the
  worker reports it, since collectives make every rank's wall time equal) over
  ``straggler_ratio`` times the median of the other ranks' latest times for
  ``straggler_points`` points in a row, or a rank trailing the leader by
  ``straggler_lag_points`` logging intervals;
- stall: no new step for ``stall_factor`` times the longest recent interval
  (and at least ``stall_min_s``), or no heartbeat (a hang) for
  max(``hang_floor_s``, ``hang_factor`` x the p95 step interval), or ``heartbeat_timeout_s`` when set.
  The time comes from the caller; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.points import RankStep, Signal, Tick
from steadytune.detect.stats import SortedWindow
from steadytune.records import StepRecord

KINDS: dict[str, KindInfo] = {
    "throughput_drop": KindInfo(
        "throughput dropped",
        "steps got much slower: thermal throttling, a competing process, a slower data source or swap",
        "check the device's clocks and other processes (nvidia-smi on a GPU, top on a CPU), "
        "and the data loader",
        "warning",
    ),
    "stall": KindInfo(
        "training stalled",
        "no step for far longer than usual: a hang (a collective a rank never joined, a dead data "
        "worker, a deadlock)",
        "dump the stacks (py-spy dump), check the data loader (and NCCL on a multi-GPU run); restart from "
        "the last checkpoint",
        "critical",
        cause_on={
            "one_rank": "no step for far longer than usual: a hang (a dead data worker, a deadlock, a "
            "blocked read or write)",
            "cpu": "no step for far longer than usual: a hang (a gloo collective a rank never joined, a dead "
            "data worker, a deadlock)",
            "gpu": "no step for far longer than usual: a hang (an NCCL collective a rank never joined, a "
            "dead data worker, a deadlock)",
        },
        after={
            "restart": "read the stacks in the run's stacks/ folder for where it hung; check the data "
            "loader (and NCCL on a multi-GPU run)",
        },
    ),
    "straggler": KindInfo(
        "straggler rank",
        "one rank is much slower than the others, and every collective waits for it",
        "check that rank's GPU (clocks, temperature, PCIe/NVLink) and host load",
        "warning",
    ),
    "dataloader_bottleneck": KindInfo(
        "data loader starves the GPU",
        "a large share of each step is spent waiting for data",
        "raise dataloader_num_workers, pin memory, pre-tokenize the dataset",
        "warning",
    ),
}


# What to check for a drop where the records tell the device (a GPU's memory, or a process's only).
DROP_SUGGESTION = {
    "gpu": "check nvidia-smi for clocks, throttling and other processes, and the data loader",
    "cpu": "check top for other processes and swap, the CPU's frequency, and the data loader",
}


def device_of(rec: StepRecord) -> str | None:
    """``gpu`` when the record reports device memory, ``cpu`` when only the process's, else unknown."""
    if rec.mem_allocated_bytes is not None:
        return "gpu"
    return "cpu" if rec.rss_bytes is not None else None


def throughput_of(rec: StepRecord) -> tuple[str, float] | None:
    """The best throughput figure a record allows, with its name."""
    if not rec.step_time_s or rec.step_time_s <= 0:
        return None
    if rec.tokens:
        return "tokens_per_s", rec.tokens / rec.step_time_s
    if rec.samples:
        return "samples_per_s", rec.samples / rec.step_time_s
    return "steps_per_s", 1.0 / rec.step_time_s


@dataclass(frozen=True, slots=True)
class ThroughputLimits:
    """As ``detect.pace`` names them (docs/detectors.md)."""

    warmup_points: int
    window: int
    throughput_drop: float
    throughput_points: int
    throughput_min_s: float
    data_wait_ratio: float
    data_wait_points: int


class ThroughputWatch:
    """throughput_drop and dataloader_bottleneck for one rank."""

    reports: ClassVar[tuple[str, ...]] = ("throughput_drop", "dataloader_bottleneck")

    def __init__(self, limits: ThroughputLimits, rank: int | None = None) -> None:
        self.rep = Reporter(rank)
        self.lim = limits
        self._base = SortedWindow(limits.window)
        self._n = 0
        self._slow = 0
        self._slow_since: float | None = None
        self._waiting = 0

    def observe(self, point: RankStep, out: list[Finding]) -> None:
        if point.rec.step_time_s is not None:
            self.judge(point.rec, out)

    def judge(self, rec: StepRecord, out: list[Finding]) -> None:
        tp = throughput_of(rec)
        if tp is None:
            return
        name, value = tp
        self._n += 1
        self._data_wait(rec, out)
        if self._n <= self.lim.warmup_points:
            return
        if len(self._base) < self.lim.throughput_points:
            self._base.push(value)
            return
        base = self._base.median()
        slow = value < base * (1.0 - self.lim.throughput_drop)
        self._slow = self._slow + 1 if slow else 0
        if not slow:
            self._base.push(value)
            self._slow_since = None
        elif self._slow_since is None:
            self._slow_since = rec.ts
        # A slowdown nobody could act on (a few fast steps hit by a save or a neighbour) is noise:
        # it must also last throughput_min_s of wall time.
        lasted = rec.ts - (self._slow_since if self._slow_since is not None else rec.ts)
        if self._slow >= self.lim.throughput_points and lasted >= self.lim.throughput_min_s:
            ev = None
            if not self.rep.is_on("throughput_drop", name):
                ev = {
                    "value": rounded(value),
                    "baseline": rounded(base),
                    "ratio": rounded(value / base, 4),
                    "threshold_ratio": rounded(1.0 - self.lim.throughput_drop, 4),
                    "points": self._slow,
                }
            device = device_of(rec)
            self.rep.report(
                out,
                "throughput_drop",
                name,
                rec.step,
                True,
                evidence=ev,
                suggestion=DROP_SUGGESTION.get(device or ""),
            )
        elif value > base * (1.0 - self.lim.throughput_drop / 2):
            self.rep.report(out, "throughput_drop", name, rec.step, False)

    def _data_wait(self, rec: StepRecord, out: list[Finding]) -> None:
        wait = rec.extra.get("data_time_s") if rec.extra else None
        if not isinstance(wait, (int, float)) or not rec.step_time_s:
            return
        share = wait / rec.step_time_s
        self._waiting = self._waiting + 1 if share > self.lim.data_wait_ratio else 0
        if self._waiting >= self.lim.data_wait_points:
            ev = None
            if not self.rep.is_on("dataloader_bottleneck", "data_time_s"):
                ev = {
                    "data_time_s": rounded(wait),
                    "step_time_s": rounded(rec.step_time_s),
                    "wait_ratio": rounded(share, 4),
                    "threshold_ratio": self.lim.data_wait_ratio,
                }
            self.rep.report(out, "dataloader_bottleneck", "data_time_s", rec.step, True, evidence=ev)
        elif share < self.lim.data_wait_ratio / 2:
            self.rep.report(out, "dataloader_bottleneck", "data_time_s", rec.step, False)


_NOW_POINTS = 3  # a rank's latest times: their median is its time "now"
_MIN_ADVANCES = 8  # leader advances before the logging interval, and so a lag, is judged


@dataclass(frozen=True, slots=True)
class StragglerLimits:
    """As ``detect.pace`` names them (docs/detectors.md)."""

    straggler_ratio: float
    straggler_points: int
    straggler_lag_points: int


class StragglerWatch:
    """straggler: compares the ranks with each other."""

    reports: ClassVar[tuple[str, ...]] = ("straggler",)

    def __init__(self, limits: StragglerLimits) -> None:
        self.lim = limits
        self._times: dict[int, SortedWindow] = {}
        self._last_step: dict[int, int] = {}
        self._slow: dict[int, int] = {}  # slow points in a row, per rank
        self._first_slow: dict[int, int] = {}  # the step of the first of them
        self._now: dict[int, float] = {}  # each rank's median of its last _NOW_POINTS times
        self._lagging: set[int] = set()  # ranks whose lag was reported and not yet reported over
        self._reps: dict[int, Reporter] = {}
        self._leader = 0
        self._advances = SortedWindow(16)  # how far the leading step moves per record: the logging interval

    def _rep(self, rank: int) -> Reporter:
        rep = self._reps.get(rank)
        if rep is None:
            rep = self._reps[rank] = Reporter(rank)
        return rep

    def observe(self, point: RankStep, out: list[Finding]) -> None:
        if point.rec.step_time_s is not None:
            self.judge(point.rec, out)

    def judge(self, rec: StepRecord, out: list[Finding]) -> None:
        r = rec.rank
        self._last_step[r] = max(rec.step, self._last_step.get(r, rec.step))
        if rec.step > self._leader:
            if self._leader:
                self._advances.push(float(rec.step - self._leader))
            self._leader = rec.step
        t = rec.extra.get("compute_time_s") if rec.extra else None
        t = float(t) if isinstance(t, (int, float)) else rec.step_time_s
        if t and t > 0:
            w = self._times.setdefault(r, SortedWindow(16))
            w.push(float(t))
            # This rank's side of every other rank's yardstick, kept as it changes: worked out from
            # each peer's window at every record, it cost 64 ranks 64 x 64 window copies a step.
            self._now[r] = _middle(sorted(list(w.values)[-_NOW_POINTS:]))
        if len(self._last_step) < 2:
            return
        self._lag(rec.step, out)
        self._slowness(rec, t, out)

    def _lag(self, step: int, out: list[Finding]) -> None:
        if len(self._advances) < _MIN_ADVANCES:
            return  # the logging interval is not known yet: a median of two small advances is no yardstick
        lead = self._leader
        interval = self._advances.median()
        limit = self.lim.straggler_lag_points * interval
        if not self._lagging and lead - min(self._last_step.values()) < limit:
            return  # no rank lags and none did: every verdict below would be "still fine" (one per rank)
        for rank, last in self._last_step.items():
            behind = lead - last
            rep = self._rep(rank)
            if behind >= limit:
                ev = None if rep.is_on("straggler", "step") else {"rank_step": last, "leader_step": lead}
                rep.report(out, "straggler", "step", last, True, evidence=ev)
                self._lagging.add(rank)
            elif behind <= limit / 2:
                rep.report(out, "straggler", "step", step, False)
                self._lagging.discard(rank)

    def _slowness(self, rec: StepRecord, t: float | None, out: list[Finding]) -> None:
        mine = self._times.get(rec.rank)
        if mine is None or len(mine) < 8 or not t or t <= 0:
            return
        # A rank that stopped reporting (its group shrank, its node was lost) is no yardstick:
        # its last times were those of another world size.
        recent = (
            rec.step - self.lim.straggler_lag_points * self._advances.median() if self._advances else None
        )
        peers = [
            r
            for r, w in self._times.items()
            if r != rec.rank and len(w) >= 8 and (recent is None or self._last_step[r] >= recent)
        ]
        if not peers:
            return
        # Each point counts on its own time against the other ranks' latest times (each rank's
        # median of its last 3, so one peer's jitter is not the yardstick), so a rank that turns
        # slow is known after straggler_points slow points (not after its median of 16 has
        # turned first), and a slowdown of every rank at once (longer batches, a slower phase)
        # moves the yardstick within a point or two. The yardstick leaves the rank out: with two
        # ranks, a median over both would move halfway to the slow one and hide it.
        now = _middle(sorted(self._now[r] for r in peers))
        slow = now > 0 and t / now > self.lim.straggler_ratio
        count = self._slow[rec.rank] = self._slow.get(rec.rank, 0) + 1 if slow else 0
        if count == 1:
            self._first_slow[rec.rank] = rec.step
        rep = self._rep(rec.rank)
        typical = _middle(sorted(self._times[r].median() for r in peers))
        if count >= self.lim.straggler_points:
            ev, at = None, rec.step
            if not rep.is_on("straggler", "step_time_s"):
                at = self._first_slow[rec.rank]  # dated from the first slow point
                slow_median = _middle(sorted(list(mine.values)[-count:]))
                ev = {
                    "rank_step_time_s": rounded(slow_median),
                    "median_rank_step_time_s": rounded(typical),
                    "ratio": rounded(slow_median / typical, 4) if typical > 0 else None,
                    "threshold_ratio": self.lim.straggler_ratio,
                    "ranks": len(peers) + 1,
                    "slow_points": count,
                }
            rep.report(out, "straggler", "step_time_s", at, True, evidence=ev)
        elif typical > 0 and mine.median() / typical < 1.0 + (self.lim.straggler_ratio - 1.0) / 2:
            rep.report(out, "straggler", "step_time_s", rec.step, False)


def _middle(ordered: list[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


@dataclass(frozen=True, slots=True)
class StallLimits:
    """As ``detect.pace`` names them (docs/detectors.md)."""

    stall_factor: float
    stall_min_s: float
    heartbeat_timeout_s: float | None
    hang_floor_s: float
    hang_factor: float


class StallWatch:
    """stall: time without progress, judged from timestamps the caller passes in.

    Fed the primary rank's steps (progress, which clears a stall) and the clock
    (silence, which raises one).
    """

    reports: ClassVar[tuple[str, ...]] = ("stall",)
    needs: ClassVar[tuple[str, ...]] = ("ts",)  # of a step: an imported log's carry no time

    def __init__(self, limits: StallLimits) -> None:
        self.rep = Reporter(None)
        self.lim = limits
        self._intervals = SortedWindow(32)
        self._last_ts: float | None = None
        self.last_step = 0
        self._attempt: int | None = None
        self._hinted_step: int | None = None

    def observe(self, point: Signal | Tick, out: list[Finding]) -> None:
        if type(point) is Signal:
            if point.rec.ts:  # imported logs carry no time: no stall to judge
                self.progress(point.rec.step, point.rec.ts, out, point.rec.attempt)
        elif isinstance(point, Tick):
            self.check(point.now, point.heartbeat_ts, point.last_step, out)

    def progress(self, step: int, ts: float, out: list[Finding], attempt: int | None = None) -> None:
        """A new step arrived at ``ts``: clears a stall.

        The time since a step of another attempt is a restart (a new process, its imports, a
        checkpoint loaded), not the pace of training: it sets no limit. Counted, one restart made
        the hang limit ten times its length, and a hang after a few restarts went unseen for minutes.
        """
        if step <= self.last_step and self._last_ts is not None:
            return
        same = attempt is None or self._attempt is None or attempt == self._attempt
        if self._last_ts is not None and ts > self._last_ts and same:
            self._intervals.push(ts - self._last_ts)
        self._last_ts = max(ts, self._last_ts or ts)
        self.last_step = step
        if attempt is not None:
            self._attempt = attempt
        if self.rep.on:
            self.rep.report(out, "stall", "step", step, False)

    def limit_s(self) -> float:
        longest = self._intervals.quantile(1.0) if len(self._intervals) else 0.0
        return max(self.lim.stall_min_s, self.lim.stall_factor * longest)

    def hang_limit_s(self) -> float:
        """Silence that is a hang: a fixed timeout if configured, else scaled to the step pace."""
        if self.lim.heartbeat_timeout_s is not None:
            return self.lim.heartbeat_timeout_s
        p95 = self._intervals.quantile(0.95) if len(self._intervals) else 0.0
        return max(self.lim.hang_floor_s, self.lim.hang_factor * p95)

    def check(
        self, now: float, heartbeat_ts: float | None, last_step: int | None, out: list[Finding]
    ) -> None:
        if last_step is not None and last_step > self.last_step and last_step != self._hinted_step:
            # The caller saw progress we have no record of (a heartbeat step): count it as progress now.
            self._hinted_step = last_step
            self.progress(last_step, now, out)
        step = self.last_step
        hang_s = self.hang_limit_s()
        if heartbeat_ts is not None and now - heartbeat_ts > hang_s:
            beat = {"silent_s": rounded(now - heartbeat_ts, 4), "threshold_s": rounded(hang_s, 4)}
            self.rep.report(out, "stall", "heartbeat", step, True, evidence=beat)
        elif heartbeat_ts is not None:
            self.rep.report(out, "stall", "heartbeat", step, False)
        if self._last_ts is None:
            return
        waited, limit = now - self._last_ts, self.limit_s()
        if waited > limit:
            ev = None
            if not self.rep.is_on("stall", "step"):
                ev = {
                    "seconds_since_step": rounded(waited, 4),
                    "threshold_s": rounded(limit, 4),
                    "last_step": step,
                }
            self.rep.report(out, "stall", "step", step, True, evidence=ev)
