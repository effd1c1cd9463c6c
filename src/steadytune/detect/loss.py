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
Early in a run (the noise window not yet full) a point that stands far above
both of its neighbours is a spike, raised one point late: the point after it
shows it was one batch, where the level and a noise measured from a few
differences cannot.

:class:`LossWatch` is the loss series: it keeps the level and the spike or
divergence under way, and hands each point to the part that serves its kind
(:mod:`.loss_rules`: the sudden collapse, the climb line, the seasonal excuse).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.loss_rules import (
    ClimbFit,
    LossLimits,
    RecoveredTail,
    SeasonalExcuse,
    SpikeChance,
    SuddenCollapse,
)
from steadytune.detect.nan_climb import climb_before_nan
from steadytune.detect.points import LossPoint, Signal
from steadytune.detect.stats import SeriesLimits, upper_factor
from steadytune.objectives import LOSS_OBJECTIVE

_CLIMB_STRIDE = 2  # accepted points between two looks at the steady-climb line

KINDS: dict[str, KindInfo] = {
    "nan_loss": KindInfo(
        "loss is NaN/Inf",
        "the forward pass overflowed or the weights already hold NaN/Inf (fp16 overflow, log of zero, "
        "a division by an empty mask, or a bad batch)",
        "skip the update, restore the last good checkpoint, use bf16 or a lower LR, and inspect the batch",
        "critical",
        cause_on=dict.fromkeys(
            ("cpu", "bf16", "fp32"),
            "the forward pass overflowed or the weights already hold NaN/Inf (log of zero, a division by "
            "an empty mask, a too-high LR, or a bad batch)",
        ),
        after={
            "skip_step": "a few in a row (policy.nan_rollback_after) roll the run back; to prevent it, use "
            "bf16 or a lower LR and inspect the batch",
            "rollback": "use bf16 or a lower LR, and inspect the batch",
        },
    ),
    "loss_spike": KindInfo(
        "loss spike",
        "a vertical jump: an exploding update, usually from a bad or unusual batch or a too-high LR",
        "clip gradients (max_grad_norm=1.0) and lower the LR; if it does not recover, roll back and "
        "skip the data window",
        "warning",
        after={
            "rollback": "if it comes back, clip gradients (max_grad_norm=1.0); look at the batch "
            "(inspect-batch)"
        },
    ),
    "divergence": KindInfo(
        "loss diverged",
        "the loss climbed away from its best level and has not come back: the LR is too high or the "
        "optimizer state is corrupted",
        "roll back to the last good checkpoint, lower the LR (x0.5), add warm-up and gradient clipping",
        "critical",
        after={"rollback": "add warm-up and gradient clipping if it comes back"},
    ),
    "loss_collapse": KindInfo(
        "loss collapsed to zero",
        "a sudden zero: the labels are empty or fully masked (all -100), or the loss reads the inputs",
        "check the label masking and the chat template; print one batch's labels",
        "critical",
        lasting=True,
    ),
}


class LossWatch:
    """nan_loss, loss_spike, divergence and loss_collapse on one loss series."""

    reports: ClassVar[tuple[str, ...]] = tuple(KINDS)

    def __init__(
        self, series: SeriesLimits, limits: LossLimits, metric: str = "loss", rank: int | None = None
    ) -> None:
        self.metric, self.rep, self.tracker = metric, Reporter(rank), series.tracker()
        self.s, self.lim = series, limits
        self.collapse = SuddenCollapse(limits, series.spike_z, self.rep, self.tracker, metric)
        self.fit = ClimbFit(series.level_window, limits.climb_min_rise, limits.climb_t)
        self.season = SeasonalExcuse(self.tracker, limits.seasonal_margin, limits.resolve_z)
        self.tail = RecoveredTail()
        self.chance = SpikeChance()
        self._min_jump = math.log(series.spike_min_ratio)
        self._small_jump = math.log(limits.spike_min_ratio_confirmed)
        # Half the smallest spike: a spike ends below it, so no point can end one and start the next.
        self._resolve_jump = math.log(
            1.0 + (min(series.spike_min_ratio, limits.spike_min_ratio_confirmed) - 1.0) / 2.0
        )
        self._pending: tuple[int, float, float, float] | None = None
        self._spike_start: int | None = None
        self._spike_points = 0
        self._spike_peak = 0.0
        self._spike_base = 0.0
        # The jump of a spike opened against a full level window: one that is over at the next
        # point joins the run's tail (None: opened on a young level, or no spike).
        self._spike_jump: float | None = None
        self._climb_points = 0
        self._suspects: list[int] = []
        # A young point held for the point after it to judge: (step, loss, log loss, log of the point
        # before it, its epoch, whether it is also the first of the suspects).
        self._cand: tuple[int, float, float, float, float | None, bool] | None = None
        self._last_finite: float | None = None
        # This segment has diverged once: a young baseline after it is no evidence of health.
        self._unstable = False
        # A spike or divergence that ended: (accepted points still to wait, its base), until the
        # loss is seen to have settled higher or not (:meth:`_settled`).
        self._settle: tuple[int, float] | None = None
        # The segment's last finite points (step, log loss): what a NaN is looked back on from.
        self._before: deque[tuple[int, float]] = deque(maxlen=2 * series.level_window)

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Judge the step's loss: every rule for the SFT loss, only NaN/Inf for an RL or preference one.

        The loss of an RL/preference objective is judged only for NaN/Inf; its own signals
        (reward, KL) and the gradient norm carry the rest. Leaves the verdict on the point.
        """
        rec = point.rec
        if rec.loss is None:
            return
        if point.objective not in (None, LOSS_OBJECTIVE):
            if not math.isfinite(rec.loss):
                self.judge(rec.step, rec.loss, rec.epoch, out)
            elif self.rep.on:
                # Whatever the SFT rules held before the run showed its objective (a loss that went
                # negative) was read with rules that do not apply to it: over, not left open.
                self.rep.end_all(out, rec.step)
            return
        lp = self.judge(rec.step, rec.loss, rec.epoch, out, point.corroborated)
        point.loss = lp
        if lp is not None:
            t = self.tracker
            point.held = lp.in_spike or (bool(self.rep.on) and self.rep.is_on("divergence", self.metric))
            # Read only where the short-climb rule reads it (a segment's first point): the noise
            # estimate is otherwise computed only for points that jump, and this runs for every point.
            point.run_noise = t.sigma_upper if lp.new_segment and t.n_noise else None

    def judge(
        self, step: int, loss: float, epoch: float | None, out: list[Finding], corroborated: bool = False
    ) -> LossPoint | None:
        """Judge one loss value; ``corroborated``: the grad norm jumped past its own spike ratio here."""
        if not math.isfinite(loss):
            self._nan(step, loss, out)
            return None
        rep = self.rep
        if rep.on:
            rep.report(out, "nan_loss", self.metric, step, False)
        self._last_finite = loss
        t = self.tracker
        y = math.log(loss) if loss > 1e-12 else -27.6  # log space; a zero loss lands far down, not at -inf
        last = t.last_step
        new_segment = t.begin(step, self.s.gap_factor)
        if new_segment:
            self._new_segment(step, last, y, out)
            self._before.clear()
        if loss > 1e-12:
            self._before.append((step, y))
        if (loss <= self.lim.collapse_small or self.collapse.drop_run or rep.on) and self.collapse.judge(
            step, loss, y, out
        ):
            # A collapsed point stays out of the baseline, as a spike does: the collapse lasts
            # as long as the loss stays down, judged against where it was.
            return LossPoint(step, loss, y, False, False, new_segment)
        if t.n_level == 0:
            t.accept(y, epoch)
            return LossPoint(step, loss, y, True, False, new_segment)
        if self._cand is not None:
            self._neighbour_verdict(step, y, out)
        jump = y - t.level - t.fall_ahead
        held = None if self._pending is None else self._confirm_pending(step, loss, y, jump, out)
        if held is None and self._spike_start is not None:
            held = self._spike_goes_on(step, loss, y, jump, epoch, out)
        if held is None and jump > self._small_jump:
            # Most points are well inside the minimum jump: the noise estimate is not even needed.
            held = self._new_jump(step, loss, y, jump, epoch, out, corroborated)
        if held is not None:
            return held
        self._accept(step, y, epoch, out)
        return LossPoint(step, loss, y, True, False, False)

    def _nan(self, step: int, loss: float, out: list[Finding]) -> None:
        rep = self.rep
        if (
            self._before
            and not rep.is_on("nan_loss", self.metric)
            and not rep.is_on("divergence", self.metric)
        ):
            # The first NaN of an episode may have ended a climb: told as the divergence it was,
            # from where it began (:mod:`.nan_climb`), and over at the NaN, which is told next.
            climb = climb_before_nan(list(self._before), self.lim.climb_min_rise)
            if climb is not None:
                rep.report(out, "divergence", self.metric, climb["start_step"], True, evidence=climb)
                rep.report(out, "divergence", self.metric, self._before[-1][0], True)
                rep.report(out, "divergence", self.metric, step, False)
        self._before.clear()
        ev = {"value": str(loss), "last_finite": rounded(self._last_finite)}
        rep.report(out, "nan_loss", self.metric, step, True, evidence=ev)

    def _new_segment(self, step: int, last: int | None, y: float, out: list[Finding]) -> None:
        """A gap or a restart before ``step`` (``last`` the step before it): the level starts again.

        A gap hides steps, not what they showed: a climb still under way at the gap whose
        first point after it is back where the climb began came back, across the gap, and
        arms the new segment as it would have armed the old one. Whether a stretch of
        missing steps counts as a gap depends on the interval around it, so without this a
        jitter of the logged steps would decide the verdict. Older evidence is not carried
        over (a snippet log may resume after an intervention), nor across a restart.
        """
        restart = last is not None and step <= last
        self._unstable = not restart and self._came_back(y)
        self.fit.clear()
        self._end_spike(out, step)
        self._pending = self._cand = None
        self._settle = None  # the new segment has a best level of its own

    def _confirm_pending(
        self, step: int, loss: float, y: float, jump: float, out: list[Finding]
    ) -> LossPoint | None:
        """The point after a small jump decides it: a data outlier moves one batch's loss,
        an instability moves the weights, so the next batch is up as well."""
        held = self._pending
        if held is None:
            return None
        self._pending = None
        p_step, p_loss, p_level, p_threshold = held
        if jump <= self.tracker.threshold(self.lim.resolve_z):
            self.tail.note(math.log(p_loss) - p_level)
            return None
        self._start_spike(p_step, p_loss, p_level, p_threshold, out)
        self._continue_spike(step, loss, y, out)
        return LossPoint(step, loss, y, False, True, False)

    def _spike_goes_on(
        self, step: int, loss: float, y: float, jump: float, epoch: float | None, out: list[Finding]
    ) -> LossPoint | None:
        """A spike under way: still up (kept out of the level), or over (None)."""
        back = max(self.tracker.threshold(self.lim.resolve_z), self._resolve_jump)
        if jump <= back or self.season.excuses(y, epoch):
            if self._spike_points == 1 and self._spike_jump is not None:
                self.tail.note(self._spike_jump)
            if self._came_back(y):
                self._unstable = True  # came back to where it began: the instability may recur
            self._end_spike(out, step)
            return None
        self._continue_spike(step, loss, y, out)
        return LossPoint(step, loss, y, False, True, False)

    def _new_jump(
        self,
        step: int,
        loss: float,
        y: float,
        jump: float,
        epoch: float | None,
        out: list[Finding],
        corroborated: bool,
    ) -> LossPoint | None:
        """A point past the smallest jump: a spike, a jump held for the next point to confirm,
        a suspect held over a young baseline, or (None) an ordinary point after all."""
        t, lim = self.tracker, self.lim
        level = t.level
        threshold = max(t.threshold(self.s.spike_z), self._small_jump)
        young = t.n_level < t.level_window
        if young:
            # A few lucky differences must not make one point a spike: a young baseline's
            # noise is never taken below the prior for a one-point alarm (held points,
            # below, still use it: three in a row are evidence enough). A grad norm that
            # spiked with it is the second witness that a short baseline lacks.
            # So is a divergence earlier in the segment: the loss came back from one climb
            # and jumps again, the same instability recurring rather than noise.
            floor = lim.young_spike_z * self.s.noise_prior * math.sqrt(1.0 + 1.0 / t.n_level)
            if corroborated:
                threshold = self._min_jump
            elif self._unstable:
                threshold = max(self._min_jump, lim.early_rise)
            else:
                threshold = max(threshold, floor)
        else:
            # Over a long log noise reaches further: the run's own tail says how far (SpikeChance).
            unit = t.threshold(1.0)
            threshold = max(threshold, self.chance.threshold(unit, self._small_jump))
        if jump > threshold and not self.season.excuses(y, epoch):
            # A jump no higher than the run's tail of one-batch excursions (two it came straight
            # back from) waits for the next point, as a small one does (RecoveredTail).
            if jump > self._min_jump and (young or not self.tail.covers(jump, t.threshold(lim.resolve_z))):
                self._start_spike(step, loss, level, threshold, out)
                return LossPoint(step, loss, y, False, True, False)
            if not young:
                self.chance.note(jump, unit, self._small_jump)
                self._pending = (step, loss, level, threshold)
                return LossPoint(step, loss, y, False, False, False)
        if not young:
            self.chance.note(jump, unit, self._small_jump)
        # One point is no baseline to hold others against: from two up to a full level window.
        if (
            young
            and t.n_level > 1
            and jump > t.threshold(lim.suspect_z)
            and not self.season.excuses(y, epoch)
        ):
            held = self._suspect(step, loss, y, level, out)
            if len(self._suspects) == 1 and t.last_y is not None:
                self._cand = (step, loss, y, t.last_y, epoch, True)
            return held
        # Until the noise window is full, the measured noise is taken one standard error up (x1.3 at
        # 16 differences): a point judged by its two neighbours needs no such margin.
        early = young or t.n_noise < self.s.noise_window
        if early and self._stands_out(y, jump) and not self.season.excuses(y, epoch):
            assert t.last_y is not None
            self._cand = (step, loss, y, t.last_y, epoch, False)
            return LossPoint(step, loss, y, False, False, False)
        return None

    def _neighbour_jump(self) -> float:
        """How far (log) a young point must stand above both of its neighbours to be a spike.

        ``young_spike_z`` sigmas of a two-point difference. The noise is the measured one shrunk
        towards the prior, taken one standard error up with the prior counted as the differences it
        is worth (``noise_prior_weight``), and never below the prior: a few quiet differences must
        not make one point a spike (the young level's floor, :meth:`_new_jump`), since the first
        batches of a healthy fine-tuning run are fat-tailed (one 1.5x its neighbours in the first
        ten is common). With the default prior a point must be 2.6x both neighbours; more in a run
        measured as noisy (batch size 1: 0.35 and fat-tailed), where a 3x point is ordinary.
        At least ``spike_min_ratio``, as any one-point spike.
        """
        t = self.tracker
        sigma = max(t.sigma * upper_factor(t.n_noise + round(self.s.noise_prior_weight)), self.s.noise_prior)
        return max(self._min_jump, self.lim.young_spike_z * sigma * math.sqrt(2.0))

    def _stands_out(self, y: float, jump: float) -> bool:
        """A young point that the point after it may show was a spike: that far above the point before."""
        last = self.tracker.last_y
        need = self._neighbour_jump()
        return last is not None and jump > need and y - last > need

    def _neighbour_verdict(self, step: int, y: float, out: list[Finding]) -> None:
        """The point after a held young point judges it: back down as far, it stood above both
        neighbours, a spike (dated at it, one point late); otherwise it was ordinary after all, or
        the first of a run of suspects, which the suspect rule goes on judging."""
        assert self._cand is not None
        c_step, c_loss, c_y, before, c_epoch, suspect = self._cand
        self._cand = None
        need = self._neighbour_jump()
        if c_y - y > need and c_y - before > need:
            if suspect:
                self._suspects.clear()
            ev = {
                "value": rounded(c_loss),
                "before": rounded(math.exp(before)),
                "after": rounded(math.exp(y)),
                "ratio": rounded(math.exp(c_y - max(before, y)), 4),
                "threshold_ratio": rounded(math.exp(need), 4),
            }
            self._open_spike(c_step, c_loss, before, ev, out, judged_by="neighbours")
            self._end_spike(out, step)
        elif not suspect:
            self._accept(c_step, c_y, c_epoch, out)

    def _accept(self, step: int, y: float, epoch: float | None, out: list[Finding]) -> None:
        """An ordinary point joins the level; the level's climb is looked at."""
        t, fit = self.tracker, self.fit
        if self._suspects:
            self._suspects.clear()
        if epoch is not None:
            self.season.note(y, epoch)
        t.accept(y, epoch)
        fit.ys.append(y)
        if self._settle is not None:
            self._settled()
        best = t.best_level
        above = t.level - best if best is not None else 0.0
        # Both slow-climb tests need the level above its best (climb_min_rise < divergence_rise):
        # below it, nothing is computed unless a climb or an alarm is already under way.
        if above > self.lim.climb_min_rise:
            # The line is looked at every second point.
            if t.n_accepted % _CLIMB_STRIDE == 0:
                fit.look(y)
            if fit.rising or above > self.lim.divergence_rise or self._climb_points or self.rep.on:
                self._slow_climb(step, epoch, out)
        else:
            fit.rising = False
            if self._climb_points or self.rep.on:
                self._slow_climb(step, epoch, out)

    def hold_climb(
        self, step: int, loss: float, first_rise: int, start_y: float, rises: int, out: list[Finding]
    ) -> None:
        """Hold a climb from the segment's first point (the short-rise rule saw it) as a divergence.

        Its points leave the baseline, as a spike's would: the level is the first point
        again, so the loss is judged against where it began until it comes back there.
        """
        self.tracker.restart_segment(start_y)
        self.fit.clear()  # the climb's points leave the fit as they leave the level
        self._pending = self._cand = None
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
        if len(self._suspects) >= self.lim.divergence_points:
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
                    "threshold_points": self.lim.divergence_points,
                    "baseline_points": self.tracker.n_level,
                },
            )
            self._suspects.clear()
            return LossPoint(step, loss, y, False, True, False)
        return LossPoint(step, loss, y, False, False, False)

    def _start_spike(
        self, step: int, loss: float, level: float, threshold: float, out: list[Finding]
    ) -> None:
        ev = {
            "value": rounded(loss),
            "baseline": rounded(math.exp(level)),
            "ratio": rounded(loss / math.exp(level), 4),
            "threshold_ratio": rounded(math.exp(threshold), 4),
        }
        self._open_spike(step, loss, level, ev, out)
        t = self.tracker
        self._spike_jump = math.log(loss) - level if t.n_level >= t.level_window else None

    def _open_spike(
        self,
        step: int,
        loss: float,
        base: float,
        evidence: dict[str, Any],
        out: list[Finding],
        judged_by: str | None = None,
    ) -> None:
        """A spike from ``step``, judged against ``base`` (log): the level, or the point before it."""
        self._spike_start, self._spike_points = step, 1
        self._spike_peak, self._spike_base = loss, base
        self._spike_jump = None
        evidence |= {
            "noise_log_sigma": rounded(self.tracker.sigma, 4),
            "baseline_points": self.tracker.n_level,
        }
        if judged_by is not None:
            evidence["judged_by"] = judged_by
        self.rep.report(out, "loss_spike", self.metric, step, True, evidence=evidence)

    def _continue_spike(self, step: int, loss: float, y: float, out: list[Finding]) -> None:
        self._spike_points += 1
        new_peak = loss > self._spike_peak
        self._spike_peak = max(self._spike_peak, loss)
        ev = {"peak": rounded(self._spike_peak), "points_up": self._spike_points} if new_peak else None
        if self.rep.is_on("loss_spike", self.metric):  # an episode of held points has no spike to extend
            self.rep.report(out, "loss_spike", self.metric, step, True, evidence=ev)
        if self._spike_points >= self.lim.divergence_points:
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
                    "threshold_points": self.lim.divergence_points,
                }
                if first or new_peak
                else None,
            )

    def _settled(self) -> None:
        """A loss that settled above where its ended episode began is judged from there on.

        An episode that ends while the loss stays up (one point dipped under the spike's end,
        the loss then held at its new height: a new stretch of data, an unshuffled
        data block) leaves the best level where it was before the jump. If the held level is
        short of the divergence threshold, nothing more is raised, but any later bump on top
        of it is measured from the old best and reported as the same shift once more (one
        trouble, two episodes). Once the loss has held its new height for a whole noise
        window with no divergence raised, that height is the run's level, told once already:
        the best level restarts there. A loss still climbing raises its divergence first
        (the threshold is unchanged), and one that came back has nothing to restart.
        """
        assert self._settle is not None
        left, base = self._settle
        if left > 1:
            self._settle = (left - 1, base)
            return
        self._settle = None
        t = self.tracker
        if self.rep.is_on("divergence", self.metric) or not t.level_full:
            return
        if t.level - base > self._resolve_jump and (t.best_level is None or t.level > t.best_level):
            t.best_level = t.level
            self.fit.clear()  # the line through the jump is the shift, not a climb

    def _end_spike(self, out: list[Finding], step: int) -> None:
        if self._spike_start is None:
            return
        self._spike_start = None
        self._settle = (self.s.noise_window, self._spike_base)
        self.rep.report(out, "loss_spike", self.metric, step, False)
        if not self._climbing():
            self.rep.report(out, "divergence", self.metric, step, False)

    def _climb_threshold(self, rise: float | None = None) -> float:
        """How far the level may sit above its best: the medians are noisy, the best one is the luckiest.

        ``rise``: the least rise asked (``divergence_rise`` unless given); the noise is added to it.
        """
        least = self.lim.divergence_rise if rise is None else rise
        return least + 0.5 * self.s.spike_z * self.tracker.sigma

    def _climbing(self) -> bool:
        t = self.tracker
        if t.best_level is None or not t.level_full:
            return False
        above = t.level - t.best_level
        # divergence_rise bounds the creeping threshold from below: the noise is asked only then.
        if above > self.lim.divergence_rise and above > self._climb_threshold():
            return True
        # The steady line is held to the same best level, so the level must clear the same luck:
        # a smoothed loss draws straight lines out of the data's wander (t 8-14 over 16 points,
        # several times in one healthy run), and only the height above the best tells them apart.
        # (The threshold is climb_min_rise plus that luck: the rise it asks is implied.)
        return above > self._climb_threshold(self.lim.climb_min_rise) and self.fit.rising

    def _slow_climb(self, step: int, epoch: float | None, out: list[Finding]) -> None:
        """The level creeping up, point by point, well above the best level of this segment."""
        t = self.tracker
        climbing = self._climbing() and not self.season.excuses(t.level, epoch)
        self._climb_points = self._climb_points + 1 if climbing else 0
        if self._climb_points >= self.lim.divergence_points:
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
