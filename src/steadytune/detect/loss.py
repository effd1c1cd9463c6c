"""Loss detectors: nan_loss, loss_spike, divergence, loss_collapse.

All work on log(loss) so a threshold means the same on a loss of 11 and one of
0.3. A point is a spike when it lies ``spike_z`` noise units (and at least
``spike_min_ratio`` times) above the recent level, unless the previous epoch
was as high at the same phase (the jump back up at an epoch boundary of a
multi-epoch run). Spike points are kept out of the baseline, so a loss that
stays up keeps being compared with where it was: still up after
``divergence_points`` points, it has diverged. A slow climb is caught by the
level rising ``divergence_rise`` above the best level of the segment, or sooner
by the last two level windows rising along a line (``climb_min_rise``, ``climb_t``).
"""

from __future__ import annotations

import math
import operator
from collections import deque
from dataclasses import dataclass

from steadytune.detect.base import Finding, Reporter, rounded
from steadytune.detect.stats import Tracker

_CLIMB_STRIDE = 2  # accepted points between two looks at the steady-climb line


@dataclass(frozen=True, slots=True)
class LossPoint:
    """What the loss watch learned about one point, for the trend and gradient watches."""

    step: int
    loss: float
    y: float
    accepted: bool
    in_spike: bool
    new_segment: bool


class LossWatch:
    """nan_loss, loss_spike, divergence and loss_collapse on one loss series."""

    def __init__(
        self,
        *,
        level_window: int,
        noise_window: int,
        gap_factor: float,
        noise_prior: float,
        noise_prior_weight: float,
        noise_floor: float,
        spike_z: float,
        spike_min_ratio: float,
        spike_min_ratio_confirmed: float,
        young_spike_z: float,
        resolve_z: float,
        suspect_z: float,
        divergence_points: int,
        divergence_rise: float,
        climb_min_rise: float,
        climb_t: float,
        early_rise: float,
        collapse_abs: float,
        collapse_drop: float,
        collapse_small: float,
        collapse_points: int,
        seasonal_margin: float,
        metric: str = "loss",
        rank: int | None = None,
    ) -> None:
        """Thresholds as ``detect.loss`` and ``detect.series`` name them (docs/detectors.md)."""
        self.metric = metric
        self.rep = Reporter(rank)
        self.tracker = Tracker(level_window, noise_window, noise_prior, noise_prior_weight, noise_floor)
        self._gap_factor = gap_factor
        self._noise_prior = noise_prior
        self._spike_z = spike_z
        self._young_spike_z = young_spike_z
        self._resolve_z = resolve_z
        self._suspect_z = suspect_z
        self._divergence_points = divergence_points
        self._divergence_rise = divergence_rise
        self._climb_min_rise = climb_min_rise
        self._climb_t = climb_t
        # The accepted points of this segment over two level windows: the steady-climb fit.
        self._recent: deque[float] = deque(maxlen=2 * level_window)
        self._recent_sxx = (2 * level_window) * ((2 * level_window) ** 2 - 1) / 12.0
        # Centred positions: Σ w·y is the fit's Σ(x - x̄)(y - ȳ) in one C-level pass.
        self._recent_w = tuple(i - 0.5 * (2 * level_window - 1) for i in range(2 * level_window))
        self._rising = False  # the last look at the recent window saw a steady climb
        self._rise_slope = climb_min_rise / (2 * level_window - 1)  # the least slope that is a climb
        self._early_rise = early_rise
        self._collapse_abs = collapse_abs
        self._collapse_drop = collapse_drop
        self._collapse_small = collapse_small
        self._collapse_points = collapse_points
        self._seasonal_margin = seasonal_margin
        self._min_jump = math.log(spike_min_ratio)
        self._small_jump = math.log(spike_min_ratio_confirmed)
        self._pending: tuple[int, float, float, float] | None = None
        # Half the smallest spike: a spike ends below it, so no point can end one and start the next.
        self._resolve_jump = math.log(1.0 + (min(spike_min_ratio, spike_min_ratio_confirmed) - 1.0) / 2.0)
        self._spike_start: int | None = None
        self._spike_points = 0
        self._spike_peak = 0.0
        self._spike_base = 0.0
        self._drop_run = 0
        self._climb_points = 0
        self._suspects: list[int] = []
        self._last_finite: float | None = None
        # This segment has diverged once: a young baseline after it is no evidence of health.
        self._unstable = False
        # How far this epoch's points so far sit from the previous epoch's at the same phases.
        self._season_epoch: int | None = None
        self._season_offsets: list[float] = []

    def observe(
        self, step: int, loss: float, epoch: float | None, out: list[Finding], corroborated: bool = False
    ) -> LossPoint | None:
        """Judge one loss value; ``corroborated``: the grad norm jumped past its own spike ratio here."""
        rep, m = self.rep, self.metric
        if not math.isfinite(loss):
            rep.report(
                out,
                "nan_loss",
                m,
                step,
                True,
                evidence={"value": str(loss), "last_finite": rounded(self._last_finite)},
            )
            return None
        if rep.on:
            rep.report(out, "nan_loss", m, step, False)
        self._last_finite = loss
        t = self.tracker
        last = t.last_step
        new_segment = t.begin(step, self._gap_factor)
        y = math.log(loss) if loss > 1e-12 else -27.6  # log space; a zero loss lands far down, not at -inf
        if new_segment:
            # A gap hides steps, not what they showed: a climb still under way at the gap whose
            # first point after it is back where the climb began came back, across the gap, and
            # arms the new segment as it would have armed the old one. Whether a stretch of
            # missing steps counts as a gap depends on the interval around it, so without this a
            # jitter of the logged steps would decide the verdict. Older evidence is not carried
            # over (a snippet log may resume after an intervention), nor across a restart.
            restart = last is not None and step <= last
            self._unstable = not restart and self._came_back(y)
            self._recent.clear()
            self._rising = False
            self._end_spike(out, step)
            self._pending = None
        if (loss <= self._collapse_small or self._drop_run or rep.on) and self._collapse(step, loss, y, out):
            # A collapsed point stays out of the baseline, as a spike does: the collapse lasts
            # as long as the loss stays down, judged against where it was.
            return LossPoint(step, loss, y, False, False, new_segment)
        if t.n_level == 0:
            t.accept(y, epoch)
            return LossPoint(step, loss, y, True, False, new_segment)
        level = t.level
        jump = y - level
        if self._pending is not None:
            held = self._pending
            self._pending = None
            # The point after a small jump decides it: a data outlier moves one batch's loss,
            # an instability moves the weights, so the next batch is up as well.
            if jump > t.threshold(self._resolve_z):
                p_step, p_loss, p_level, p_threshold = held
                self._start_spike(p_step, p_loss, p_level, p_threshold, out)
                self._continue_spike(step, loss, y, out)
                return LossPoint(step, loss, y, False, True, False)
        if self._spike_start is not None:
            back = max(t.threshold(self._resolve_z), self._resolve_jump)
            if jump <= back or self._seasonal(y, epoch):
                if self._came_back(y):
                    self._unstable = True  # came back to where it began: the instability may recur
                self._end_spike(out, step)
            else:
                self._continue_spike(step, loss, y, out)
                return LossPoint(step, loss, y, False, True, False)
        # Most points are well inside the minimum jump: the noise estimate is not even needed.
        if jump > self._small_jump:
            threshold = max(t.threshold(self._spike_z), self._small_jump)
            young = t.n_level < t.level_window
            if young:
                # A few lucky differences must not make one point a spike: a young baseline's
                # noise is never taken below the prior for a one-point alarm (held points,
                # below, still use it: three in a row are evidence enough). A grad norm that
                # spiked with it is the second witness that a short baseline lacks.
                # So is a divergence earlier in the segment: the loss came back from one climb
                # and jumps again, the same instability recurring rather than noise.
                floor = self._young_spike_z * self._noise_prior * math.sqrt(1.0 + 1.0 / t.n_level)
                if corroborated:
                    threshold = self._min_jump
                elif self._unstable:
                    threshold = max(self._min_jump, self._early_rise)
                else:
                    threshold = max(threshold, floor)
            if jump > threshold and not self._seasonal(y, epoch):
                if jump > self._min_jump:
                    self._start_spike(step, loss, level, threshold, out)
                    return LossPoint(step, loss, y, False, True, False)
                if not young:
                    self._pending = (step, loss, level, threshold)
                    return LossPoint(step, loss, y, False, False, False)
            # One point is no baseline to hold others against: from two up to a full level window.
            if (
                young
                and t.n_level > 1
                and jump > t.threshold(self._suspect_z)
                and not self._seasonal(y, epoch)
            ):
                return self._suspect(step, loss, y, level, out)
        if self._suspects:
            self._suspects.clear()
        if epoch is not None:
            self._season_offset_add(y, epoch)
        t.accept(y, epoch)
        ys = self._recent
        ys.append(y)
        best = t.best_level
        above = t.level - best if best is not None else 0.0
        # Both slow-climb tests need the level above its best (climb_min_rise < divergence_rise):
        # below it, nothing is computed unless a climb or an alarm is already under way.
        if above > self._climb_min_rise:
            # The line is looked at every second point. A line that rises climb_min_rise with
            # t >= climb_t has its last point at least half that above its first: the cheap
            # test first (a noisy flat run passes it a third of the time), the fit only then.
            if t.n_accepted % _CLIMB_STRIDE == 0:
                self._rising = y - ys[0] > 0.5 * self._climb_min_rise and self._steady_rise()
            if self._rising or above > self._divergence_rise or self._climb_points or rep.on:
                self._slow_climb(step, epoch, out)
        else:
            self._rising = False
            if self._climb_points or rep.on:
                self._slow_climb(step, epoch, out)
        return LossPoint(step, loss, y, True, False, False)

    def hold_climb(
        self, step: int, loss: float, first_rise: int, start_y: float, rises: int, out: list[Finding]
    ) -> None:
        """Hold a climb from the segment's first point (the short-rise rule saw it) as a divergence.

        Its points leave the baseline, as a spike's would: the level is the first point
        again, so the loss is judged against where it began until it comes back there.
        """
        self.tracker.restart_segment(start_y)
        self._recent.clear()  # the climb's points leave the fit as they leave the level
        self._rising = False
        self._pending = None
        self._suspects.clear()
        self._climb_points = 0
        self._spike_start, self._spike_points = first_rise, rises
        self._spike_peak, self._spike_base = loss, start_y
        self.rep.report(out, "divergence", self.metric, step, True)

    def _came_back(self, y: float) -> bool:
        """A divergence under way that this loss ends back where it began."""
        return self.rep.is_on("divergence", self.metric) and abs(y - self._spike_base) <= self._resolve_jump

    def _suspect(self, step: int, loss: float, y: float, level: float, out: list[Finding]) -> LossPoint:
        """A young baseline cannot tell a fat-tailed point from a jump: hold the point back.

        Held points stay out of the level and the noise. A few in a row mean the loss
        moved up and stayed there: a divergence from the first of them.
        """
        self._suspects.append(step)
        if len(self._suspects) >= self._divergence_points:
            self._spike_start, self._spike_points = self._suspects[0], len(self._suspects)
            self._spike_peak, self._spike_base = loss, level
            self.rep.report(
                out,
                "divergence",
                self.metric,
                self._suspects[0],
                True,
                evidence={
                    "value": rounded(loss),
                    "baseline": rounded(math.exp(level)),
                    "since_step": self._suspects[0],
                    "points_up": len(self._suspects),
                    "threshold_points": self._divergence_points,
                    "baseline_points": self.tracker.n_level,
                },
            )
            self._suspects.clear()
            return LossPoint(step, loss, y, False, True, False)
        return LossPoint(step, loss, y, False, False, False)

    def _seasonal(self, y: float, epoch: float | None) -> bool:
        """True when the previous epoch was this high at the same phase: a healthy sawtooth."""
        if epoch is None:
            return False
        ref = self.tracker.seasonal.reference(epoch)
        if ref is None:
            return False
        return (
            y
            <= ref + self._season_offset(epoch) + self._seasonal_margin + self._resolve_z * self.tracker.sigma
        )

    def _season_offset_add(self, y: float, epoch: float) -> None:
        """Note how far an accepted point of this epoch lies from the previous epoch's at its phase."""
        whole = math.floor(epoch)
        if whole != self._season_epoch:
            self._season_epoch, self._season_offsets = whole, []
        ref = self.tracker.seasonal.reference(epoch)
        if ref is not None:
            self._season_offsets.append(y - ref)

    def _season_offset(self, epoch: float) -> float:
        """How much lower than the previous epoch this one runs, at the phases seen so far (<= 0).

        A sawtooth repeats the previous epoch's shape, a little lower for what was learned: its
        points track the previous epoch's. A run that learned fast in its first epoch sits far
        below it at every phase, and the previous epoch's level unlowered would excuse any spike
        up to it (a 2.6x one-point spike five points into epoch 2 of a run falling 10.2 -> 2.3
        was explained away as seasonal). The epoch's first point has nothing to go by: 0.
        """
        if math.floor(epoch) != self._season_epoch or not self._season_offsets:
            return 0.0
        ordered = sorted(self._season_offsets)
        return min(0.0, ordered[len(ordered) // 2])

    def _start_spike(
        self, step: int, loss: float, level: float, threshold: float, out: list[Finding]
    ) -> None:
        self._spike_start, self._spike_points = step, 1
        self._spike_peak, self._spike_base = loss, level
        self.rep.report(
            out,
            "loss_spike",
            self.metric,
            step,
            True,
            evidence={
                "value": rounded(loss),
                "baseline": rounded(math.exp(level)),
                "ratio": rounded(loss / math.exp(level), 4),
                "threshold_ratio": rounded(math.exp(threshold), 4),
                "noise_log_sigma": rounded(self.tracker.sigma, 4),
                "baseline_points": self.tracker.n_level,
            },
        )

    def _continue_spike(self, step: int, loss: float, y: float, out: list[Finding]) -> None:
        self._spike_points += 1
        new_peak = loss > self._spike_peak
        self._spike_peak = max(self._spike_peak, loss)
        ev = {"peak": rounded(self._spike_peak), "points_up": self._spike_points} if new_peak else None
        if self.rep.is_on("loss_spike", self.metric):  # an episode of held points has no spike to extend
            self.rep.report(out, "loss_spike", self.metric, step, True, evidence=ev)
        if self._spike_points >= self._divergence_points:
            first = not self.rep.is_on("divergence", self.metric)
            self.rep.report(
                out,
                "divergence",
                self.metric,
                step,
                True,
                evidence={
                    "value": rounded(loss),
                    "baseline": rounded(math.exp(self._spike_base)),
                    "since_step": self._spike_start,
                    "points_up": self._spike_points,
                    "threshold_points": self._divergence_points,
                }
                if first or new_peak
                else None,
            )

    def _end_spike(self, out: list[Finding], step: int) -> None:
        if self._spike_start is None:
            return
        self._spike_start = None
        self.rep.report(out, "loss_spike", self.metric, step, False)
        if not self._climbing():
            self.rep.report(out, "divergence", self.metric, step, False)

    def _climb_threshold(self) -> float:
        """How far the level may sit above its best: the medians are noisy, the best one is the luckiest."""
        return self._divergence_rise + 0.5 * self._spike_z * self.tracker.sigma

    def _climbing(self) -> bool:
        t = self.tracker
        if t.best_level is None or not t.level_full:
            return False
        above = t.level - t.best_level
        # divergence_rise bounds the creeping threshold from below: the noise is asked only then.
        if above > self._divergence_rise and above > self._climb_threshold():
            return True
        return above > self._climb_min_rise and self._rising

    def _steady_rise(self) -> bool:
        """The last two level windows rise along a line: by ``climb_min_rise`` and with a t of ``climb_t``.

        A steady climb is known long before its level is 1.42x its best: noise rarely lines
        sixteen points up (t 8 with 14 degrees of freedom is a chance of 6 in 10 million; t 6,
        1.6 in 100,000, was reached by a healthy run in the synthetic suite), and healthy curves
        fall or stay flat between epochs. Only accepted points enter, so a spike cannot tilt
        the line.
        """
        ys = self._recent
        n = len(ys)
        if n < (ys.maxlen or 0):
            return False
        sxy = sum(map(operator.mul, self._recent_w, ys))
        slope = sxy / self._recent_sxx
        if slope < self._rise_slope:
            return False  # most looks end here
        my = sum(ys) / n
        resid = max(sum((y - my) ** 2 for y in ys) - slope * sxy, 0.0) / (n - 2)
        return slope * math.sqrt(self._recent_sxx) >= self._climb_t * math.sqrt(resid)

    def _slow_climb(self, step: int, epoch: float | None, out: list[Finding]) -> None:
        """The level creeping up, point by point, well above the best level of this segment."""
        t = self.tracker
        climbing = self._climbing() and not self._seasonal(t.level, epoch)
        self._climb_points = self._climb_points + 1 if climbing else 0
        if self._climb_points >= self._divergence_points:
            first = not self.rep.is_on("divergence", self.metric)
            ev = None
            if first:
                best = t.best_level or 0.0
                ev = {
                    "level": rounded(math.exp(t.level)),
                    "best_level": rounded(math.exp(best)),
                    "rise_ratio": rounded(math.exp(t.level - best), 4),
                    "threshold_ratio": rounded(math.exp(self._climb_threshold()), 4),
                }
            self.rep.report(out, "divergence", self.metric, step, True, evidence=ev)
        elif (
            self.rep.is_on("divergence", self.metric)
            and self._spike_start is None
            and t.level - (t.best_level or 0.0) < 0.5 * self._climb_threshold()
        ):
            self.rep.report(out, "divergence", self.metric, step, False)

    def _collapse(self, step: int, loss: float, y: float, out: list[Finding]) -> bool:
        """A loss at zero, or one that fell ``collapse_drop`` (log) below its level in one go.

        True when this point is (a candidate for) a collapse.
        """
        t = self.tracker
        drop = max(self._collapse_drop, self._spike_z * t.sigma)
        dropped = t.n_level > 0 and loss <= self._collapse_small and (t.level - y) > drop
        self._drop_run = self._drop_run + 1 if dropped else 0
        zero = loss <= self._collapse_abs
        active = zero or self._drop_run >= self._collapse_points
        if active:
            first = not self.rep.is_on("loss_collapse", self.metric)
            ev = None
            if first:
                ev = {
                    "value": rounded(loss),
                    "baseline": rounded(math.exp(t.level)) if t.n_level else None,
                    "threshold_abs": self._collapse_abs,
                    "threshold_drop_ratio": rounded(math.exp(self._collapse_drop), 4),
                }
            self.rep.report(out, "loss_collapse", self.metric, step, True, evidence=ev)
        elif not dropped:
            self.rep.report(out, "loss_collapse", self.metric, step, False)
        return dropped or zero
