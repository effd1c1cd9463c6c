"""Gradient-norm detectors: nonfinite_grad, grad_spike, grad_explosion, grad_vanishing.

- nonfinite_grad: a NaN/Inf norm with a finite loss is an overflow step (under fp16,
  one the loss scaler skipped): a warning, not a rollback. One episode lasts until
  ``_CLEAR_POINTS`` finite norms in a row, so a burst is one anomaly;
- grad_spike / grad_explosion: like loss spikes, in log space against the recent
  level. A jump the loss also makes, a jump ``explosion_ratio`` times the level,
  or one still up after ``explosion_points`` points is an explosion (critical);
  a lone jump the loss ignores is a spike (a warning about one batch). While the
  series has little history (until its noise window is full, or while the LR is
  still warming up) its measured noise says little, so a point is also judged
  against its two neighbours with the prior: ``spike_min_ratio`` above the point
  before and the point after is a spike, raised at the point after;
- grad_vanishing: the level ``vanishing_ratio`` times below the highest level it
  held after warm-up (or exactly zero after it was not), for
  ``vanishing_points`` points. Runs that log zero from the start (pipeline
  engines that do not compute the norm) have no established level, so they are
  not flagged here; a flat loss in such a run is the plateau detector's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.grad_policy import PolicyBump
from steadytune.detect.grad_tail import GradChance
from steadytune.detect.points import Signal
from steadytune.detect.stats import SeriesLimits
from steadytune.objectives import LOSS_OBJECTIVE, without_learning_signal

_CLEAR_POINTS = 5
_MIN_BASELINE = 2
_BURST = 2  # norms in a row spike_min_ratio above the level: a burst, whatever one point's z-score

KINDS: dict[str, KindInfo] = {
    "nonfinite_grad": KindInfo(
        "gradient norm is NaN/Inf",
        "the backward pass overflowed with a finite loss (under fp16, the loss scaler skips such a step "
        "and lowers its scale) or met a bad batch; harmless if rare",
        "nothing if it stays rare; if it repeats, use bf16, lower the LR or clip gradients",
        "warning",
        # A NaN norm from a NaN loss is that loss's NaN seen from the backward pass.
        part_of="nan_loss",
        cause_on={
            "fp16": "fp16 overflow: the loss scaler skipped the step and lowered the scale; harmless if rare",
            **dict.fromkeys(
                ("cpu", "bf16", "fp32"),
                "the backward pass overflowed with a finite loss (no loss scaler is at work here: a too-high "
                "LR, an unstable layer, or a bad batch); harmless if rare",
            ),
        },
        after={
            "skip_step": "nothing if it stays rare; if it repeats, use bf16, lower the LR or clip gradients"
        },
    ),
    "grad_explosion": KindInfo(
        "gradient explosion",
        "the gradient norm jumped and stayed up: a vertical jump that the updates will follow",
        "clip gradients (max_grad_norm=1.0) and lower the LR; roll back if the loss follows",
        "critical",
        after={"rollback": "clip gradients (max_grad_norm=1.0) if it is not set"},
    ),
    "grad_vanishing": KindInfo(
        "gradients vanished",
        "the gradient norm fell to a tiny fraction of its level: the model stopped learning "
        "(vanishing gradients, frozen layers, or an LR schedule at zero)",
        "check requires_grad and the LR schedule; check for saturated activations or a dead loss",
        "warning",
    ),
    "grad_spike": KindInfo(
        "gradient spike",
        "the gradient norm jumped: an unusual batch",
        "keep gradient clipping on; if it repeats, inspect the batches at these steps",
        "warning",
        part_of="grad_explosion",
    ),
}


@dataclass(frozen=True, slots=True)
class GradLimits:
    """The gradient-norm series' own thresholds, as ``detect.grad`` names them (docs/detectors.md)."""

    explosion_points: int
    explosion_ratio: float
    quiet_spike_ratio: float
    vanishing_ratio: float
    vanishing_points: int
    warmup_points: int


class GradWatch:
    """All gradient-norm detectors of one rank."""

    reports: ClassVar[tuple[str, ...]] = tuple(KINDS)

    def __init__(
        self, series: SeriesLimits, limits: GradLimits, metric: str = "grad_norm", rank: int | None = None
    ) -> None:
        self.metric, self.rep, self.tracker = metric, Reporter(rank), series.tracker()
        self.s, self.lim = series, limits
        self._min_jump = math.log(series.spike_min_ratio)
        self._quiet_jump = math.log(limits.quiet_spike_ratio)
        self.chance = GradChance()
        self._explode_jump = math.log(limits.explosion_ratio)
        self._vanish_log = math.log(limits.vanishing_ratio)
        self._bad = 0
        self._episode_loss_finite = True
        self._finite_run = 0
        self._spike_points = 0
        self._established: float | None = None
        self._start: float | None = None  # log of the run's first positive norm
        self._low = 0
        self._held: list[tuple[int, float]] = []  # (step, log norm) held over a one-point baseline, in a row
        # An RL run's batches may carry no learning signal (every group's rewards tied): their
        # norm is the KL term's, orders of magnitude down. Set by the caller once the run is known
        # as RL: such a hole is not the level, nor the first norm a storm is measured from.
        self.gated = False
        self._trusted = False  # the gated run's level is its learning batches' (see _gated_point)
        self._calm = 0  # points the gated level took since it last started again
        # Norms held out of the level, in a row, `spike_min_ratio` above the reference they are
        # judged against (the point before them while the series is young, else the level): step,
        # norm, log norm. The point after them decides what they were (_held_verdict).
        self._run: list[tuple[int, float, float]] = []
        self._run_ref = 0.0
        self._run_early = False
        self._run_need = self._min_jump  # how far above the reference the held norms stood
        self._early_diffs = series.noise_window  # the noise is measured from a full window only then
        self._lr_prev: float | None = None
        self._warming = False  # the LR rose at the last step: still warming up
        # An RL run's bump of a few points, told by the policy's KL or entropy moving with it.
        self.policy = PolicyBump(series.level_window, series.noise_window, series.gap_factor)
        self._policy_on = False
        self._policy_ref = (0.0, 0.0)  # the norm's level and the jump a bump needs, from its first point

    @property
    def spike_jump(self) -> float:
        """The log-space jump over the level that makes a grad-norm spike's minimum ratio."""
        return self._min_jump

    def jump(self, g: float | None) -> float:
        """How far (log space) a norm lies above the current level; 0 when it cannot be told."""
        t = self.tracker
        if g is None or not (g > 0.0) or math.isinf(g) or t.n_level == 0:
            return 0.0
        return math.log(g) - t.level

    @property
    def vanished(self) -> bool:
        return self.rep.is_on("grad_vanishing", self.metric)

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Judge the step's gradient norm, beside what the loss series made of the same step."""
        rec = point.rec
        g = rec.grad_norm
        gate = self.gated and g is not None and math.isfinite(g)
        tied = point.batch is not None and (point.batch.tied or 0.0) >= 1.0
        if gate and (tied or without_learning_signal(rec.extra, g)):
            # An RL batch whose groups all tied has no advantages: its norm is the KL term's (or
            # zero), a hole in the series, not a vanishing gradient nor the level spikes are
            # judged against (a healthy GRPO run alternates such batches with learning ones). So is a
            # further step on such a batch that logs no reward field (num_iterations > 1).
            g = None
        lr = rec.lr
        if lr is not None and math.isfinite(lr):
            self._warming = self._lr_prev is not None and lr > self._lr_prev * 1.0001
            self._lr_prev = lr
        # A further optimizer step on a rollout batch already learned from (num_iterations > 1)
        # logs that batch's KL and entropy again: no new batch to confirm a bump by.
        again = point.batch is not None and point.batch.again
        if point.objective not in (None, LOSS_OBJECTIVE) and not rec.skipped and not again:
            self._policy_bump(rec.step, g, rec.extra, out)
        if g is not None and not (rec.skipped and math.isfinite(g)):
            spiking = point.loss is not None and point.loss.in_spike
            finite = rec.loss is None or math.isfinite(rec.loss)
            self.judge(rec.step, g, spiking, finite, out)
        point.grad_vanished = bool(self.rep.on) and self.vanished

    def _policy_bump(
        self, step: int, g: float | None, extra: dict[str, object] | None, out: list[Finding]
    ) -> None:
        """A bump of the norm that the policy's KL or entropy confirms (:mod:`.grad_policy`).

        Judged against the level before this point joins it; a spike the one-point rules already
        hold is theirs to tell.
        """
        t = self.tracker
        ratio = None
        if g is not None and g > 0.0 and math.isfinite(g) and t.level_full and not self._spike_points:
            # A bump is measured from where the run stood before it: its own points, accepted into
            # the level and the recent noise, would otherwise raise the bar for the next ones.
            if not self.policy.run:
                self._policy_ref = (t.level, PolicyBump.grad_jump(t.threshold))
            level, need = self._policy_ref
            if math.log(g) - level > need:
                ratio = g / math.exp(level)
        confirmed = self.policy.observe(step, extra, ratio)
        on = self.rep.is_on("grad_spike", self.metric)
        if confirmed and (self._policy_on or not on):
            ev = None
            if not self._policy_on:
                run = self.policy.run
                top = max(run, key=lambda p: p[1])
                moved = [p[2] for p in run if p[2] is not None]
                policy = max(moved, key=lambda m: abs(math.log(m.ratio)))
                ev = {
                    "value": rounded(top[1] * math.exp(self._policy_ref[0])),
                    "baseline": rounded(math.exp(self._policy_ref[0])),
                    "ratio": rounded(top[1], 4),
                    "threshold_ratio": rounded(math.exp(self._policy_ref[1]), 4),
                    "points_up": len(run),
                    "policy_points": len(moved),
                    "judged_by": "policy",
                    "policy_signal": policy.key,
                    "policy_value": rounded(policy.value),
                    "policy_baseline": rounded(policy.level),
                    "policy_ratio": rounded(policy.ratio, 4),
                }
            if ev is not None:  # dated at the bump's first point, and held to this one
                self.rep.report(out, "grad_spike", self.metric, self.policy.run[0][0], True, evidence=ev)
            self._policy_on = True
            self.rep.report(out, "grad_spike", self.metric, step, True)
        elif self._policy_on:
            self._policy_on = False
            if on and not self._spike_points and not self._run:
                self.rep.report(out, "grad_spike", self.metric, step, False)

    def judge(self, step: int, g: float, loss_spiking: bool, loss_finite: bool, out: list[Finding]) -> None:
        """Judge one norm; ``loss_spiking``: the loss is in a spike at this step."""
        if not math.isfinite(g):
            self._nonfinite(step, g, loss_finite, out)
            return
        self._finite_run += 1
        if self._bad and self._finite_run >= _CLEAR_POINTS:
            self.rep.report(out, "nonfinite_grad", self.metric, step, False)
            self._bad = 0
        t = self.tracker
        new_segment = t.begin(step, self.s.gap_factor)
        if new_segment:
            self._end_spike(out, step)
            self._held.clear()
            self._end_run(step, out, accept=False)
        y = math.log(g) if g > 0.0 else None
        if self._run and self._held_verdict(step, g, y, out):
            return
        if y is None:
            self._vanishing(step, g, None, out)
            return
        if self._start is None:
            self._start = y
        # Where the run began is the one level a storm cannot drag along: a norm ``explosion_ratio``
        # times the first is an update that wrecked the model (an LR orders of magnitude too high),
        # even when earlier, smaller jumps of the same storm have already raised the recent level and
        # its noise. Healthy runs stay within a few times their first norm (docs/detectors.md).
        over_start = not self.gated and y - self._start > self._explode_jump
        # One point is too young a baseline to judge a spike by, but not an explosion.
        exploding = over_start or y - t.level > self._explode_jump
        young = 0 < t.n_level < _MIN_BASELINE and not self._spike_points
        if self.gated and self._gated_point(y):
            return
        if young and y - t.level > self._min_jump:
            self._hold(step, g, y, exploding, over_start, out)
            return
        if self._held:
            self._lone_held_came_back(step, y, out)
        judged = t.n_level >= _MIN_BASELINE or self._spike_points > 0
        if judged and self._spike(step, g, y, loss_spiking, over_start, out):
            return
        if judged and not self.gated and not exploding and self._start_run(step, g, y):
            return  # held for the points after it to judge (_held_verdict)
        self._accept(step, g, y, out)

    def _accept(self, step: int, g: float, y: float, out: list[Finding]) -> None:
        """An ordinary norm joins the level; the established level and the vanishing test follow."""
        t = self.tracker
        t.accept(y)
        if t.n_accepted >= self.lim.warmup_points and t.level_full:
            lvl = t.level
            if self._established is None or lvl > self._established:
                self._established = lvl
        est = self._established
        if self.gated and not self._trusted:
            return  # a level of batches without signal has not vanished: it never learned
        # The vanishing test matters only once the level sits far below where it was.
        if est is not None and (self._low or self.rep.on or t.level < est - self._vanish_log + 2.303):
            self._vanishing(step, g, y, out)

    def _start_run(self, step: int, g: float, y: float) -> bool:
        """Hold a norm ``spike_min_ratio`` above its reference that the z-score let pass; True if held.

        Two cases in which one point's z-score cannot judge, and the points around it can:

        - while the series is *young* (its noise window not yet full, or the LR still warming
          up), its measured noise says little: a few differences taken one standard error up,
          or differences that hold the warm-up's fast fall, put a 5-sigma jump at 15-30x the
          level, so jumps of 8-120x in short runs raised nothing. The prior does know: a
          healthy batch is not ``spike_min_ratio`` (8x) above *both* of its neighbours (4.9
          prior sigmas of a two-point difference on each side). The reference is the point
          before; the point after decides;
        - in an established series noisy enough that 8x is within 5 sigmas (a memorizing run's
          norm wanders 2-3x from batch to batch), one such point is the noise's tail, but
          ``_BURST`` of them in a row are not (each is a 1-in-700 event there): a burst. The
          reference is the level.
        """
        t = self.tracker
        early = t.n_noise < self._early_diffs or self._warming
        ref = t.last_y if early else t.level
        need = self._neighbour_jump() if early else self._min_jump
        if ref is None or y - ref <= need:
            return False
        self._run, self._run_ref, self._run_early, self._run_need = [(step, g, y)], ref, early, need
        return True

    def _neighbour_jump(self) -> float:
        """How far (log) a young norm must stand above both of its neighbours to be a spike.

        ``spike_z`` sigmas of a two-point difference, the noise measured so far shrunk towards the
        prior and taken one standard error up, between ``quiet_spike_ratio`` and ``spike_min_ratio``:
        a run whose first norms move 3 % apart has shown in a dozen points that a 5x batch is not its
        noise, while a noisy or barely measured one keeps the prior's 8x.
        """
        two_point = self.s.spike_z * self.tracker.sigma_upper * math.sqrt(2.0)
        return min(self._min_jump, max(self._quiet_jump, two_point))

    def _held_verdict(self, step: int, g: float, y: float | None, out: list[Finding]) -> bool:
        """What the held norms were, now that another came; True when this one joins them."""
        run, ref, need = self._run, self._run_ref, self._run_need
        if y is not None and y - ref > need and len(run) < self.tracker.level_window:
            run.append((step, g, y))
            if not self._run_early and len(run) == _BURST:
                self._run_spike(step, out, "burst")
            elif self.rep.is_on("grad_spike", self.metric):
                self.rep.report(out, "grad_spike", self.metric, step, True)
            return True
        # The run is over: back down, or up so long that the level itself has moved.
        low = min(p[2] for p in run)
        back = y is None or low - y > need
        if self._run_early and back and not self.rep.is_on("grad_spike", self.metric):
            self._run_spike(step, out, "neighbours", after=y)
            self._end_run(step, out, accept=False)
        else:
            # A lone point of the noise's tail, a level that moved, or a burst that is over.
            self._end_run(step, out, accept=not self.rep.is_on("grad_spike", self.metric))
        return False

    def _run_spike(self, step: int, out: list[Finding], judged_by: str, after: float | None = None) -> None:
        run, ref = self._run, self._run_ref
        top = max(run, key=lambda p: p[2])
        ev: dict[str, object] = {
            "value": rounded(top[1]),
            "before" if self._run_early else "baseline": rounded(math.exp(ref)),
            "ratio": rounded(math.exp(top[2] - ref), 4),
            "threshold_ratio": rounded(math.exp(self._run_need), 4),
            "points_up": len(run),
            "judged_by": judged_by,
        }
        if judged_by == "neighbours":
            ev["after"] = rounded(math.exp(after)) if after is not None else 0.0
        self.rep.report(out, "grad_spike", self.metric, run[0][0], True, evidence=ev)

    def _end_run(self, step: int, out: list[Finding], accept: bool) -> None:
        """Forget the held norms: into the level when they were ordinary, else the spike is over."""
        run, self._run = self._run, []
        if accept:
            for p_step, p_g, p_y in run:
                self._accept(p_step, p_g, p_y, out)
        elif run and self.rep.is_on("grad_spike", self.metric) and not self._spike_points:
            self.rep.report(out, "grad_spike", self.metric, step, False)

    def _lone_held_came_back(self, step: int, y: float, out: list[Finding]) -> None:
        """Norms held over a one-point baseline (:meth:`_hold`) that this one did not join.

        Fewer than ``explosion_points`` of them, and this norm ``spike_min_ratio`` below them: they
        stood that far above both of their neighbours, a spike by the prior (:meth:`_start_run`),
        dated at the first, one point late. Otherwise they stay out of the level, as before.
        """
        held, self._held = self._held, []
        low = min(p[1] for p in held)
        if low - y <= self._min_jump or self._spike_points or self.gated:
            return
        level = self.tracker.level
        top = max(p[1] for p in held)
        ev = {
            "value": rounded(math.exp(top)),
            "before": rounded(math.exp(level)),
            "after": rounded(math.exp(y)),
            "ratio": rounded(math.exp(top - max(level, y)), 4),
            "threshold_ratio": rounded(math.exp(self._min_jump), 4),
            "points_up": len(held),
            "judged_by": "neighbours",
        }
        self.rep.report(out, "grad_spike", self.metric, held[0][0], True, evidence=ev)
        self.rep.report(out, "grad_spike", self.metric, step, False)

    def _gated_point(self, y: float) -> bool:
        """Where a gated run's level comes from; True when the point is not judged.

        A run may *begin* with batches without signal, and then its first level is theirs. So
        until the level has taken ``2 x level_window`` points in a row with none ``spike_min_ratio``
        above it, such a norm is a batch that learned: the level starts again from it, and no
        spike is raised (a storm in an RL run's first points is left to the reward and KL rules).
        From then on the level is the learning batches', and a norm ``spike_min_ratio`` below it
        is a batch without signal: kept out of it, however many come in a row (one prompt group a
        step on a hard task ties three batches in four early on; a run that never earns a reward
        is the reward rules' to judge, not a vanishing gradient).
        """
        t = self.tracker
        if not t.n_level or self._spike_points:
            return False
        if self._trusted:
            return y < t.level - self._min_jump
        if y - t.level > self._min_jump:
            t.restart_segment(y)
            self._calm = 0
            return True
        self._calm += 1
        self._trusted = self._calm >= 2 * t.level_window
        return False

    def _nonfinite(self, step: int, g: float, loss_finite: bool, out: list[Finding]) -> None:
        if not self._bad:
            self._episode_loss_finite = True
        self._bad += 1
        self._finite_run = 0
        # The evidence speaks for the episode: a NaN loss at its first point stays said at its last.
        self._episode_loss_finite = self._episode_loss_finite and loss_finite
        ev = {"value": str(g), "nonfinite_points": self._bad, "loss_finite": self._episode_loss_finite}
        self.rep.report(
            out,
            "nonfinite_grad",
            self.metric,
            step,
            True,
            severity="warning" if loss_finite else "critical",
            evidence=ev,
        )

    def _spike(
        self, step: int, g: float, y: float, loss_spiking: bool, over_start: bool, out: list[Finding]
    ) -> bool:
        """Judge a jump; True when the point is part of a spike episode (kept out of the level)."""
        t = self.tracker
        jump = y - t.level
        full = t.n_level >= t.level_window
        if not self._spike_points and not over_start and jump <= min(self._min_jump, self._quiet_jump):
            if full:
                self.chance.note(jump)
            return False
        if self._spike_points:
            if jump <= max(t.threshold(3.0), self._min_jump / 2) and not over_start:
                self._end_spike(out, step)
                return False
            self._spike_points += 1
            self.rep.report(out, "grad_spike", self.metric, step, True)
            if self._spike_points >= self.lim.explosion_points or loss_spiking or over_start:
                self._explode(step, g, y, jump, out)
            return True
        threshold = self._one_point_threshold(full)
        if jump <= threshold and not over_start:
            if full:
                self.chance.note(jump)
            return False
        self._spike_points = 1
        ev = self._spike_evidence(g, y, threshold, over_start)
        ev["loss_spiking"] = loss_spiking
        self.rep.report(out, "grad_spike", self.metric, step, True, evidence=ev)
        if loss_spiking or jump > self._explode_jump or over_start:
            self._explode(step, g, y, jump, out)
        return True

    def _one_point_threshold(self, full: bool) -> float:
        """How far (log) over the level one norm must jump to be a spike by itself.

        Always ``spike_z`` noise units. Against a young level (under a level window), or before
        the run has shown its tail, also ``spike_min_ratio`` (the prior: healthy norms are
        fat-tailed). Then what noise of this run would not give by chance over its points so far
        (:class:`GradChance`, from its largest jumps), and never under ``quiet_spike_ratio``.
        """
        t = self.tracker
        z = t.threshold(self.s.spike_z)
        if not full:
            return max(z, self._min_jump)
        chance = self.chance.threshold(self._min_jump)
        if chance is None:
            return max(z, self._min_jump)  # too few points to know this run's tail: the prior
        return max(z, self._quiet_jump, chance)

    def _hold(
        self, step: int, g: float, y: float, exploding: bool, over_start: bool, out: list[Finding]
    ) -> None:
        """A jump past the spike ratio over a one-point baseline: held out of the level.

        One point cannot tell a fat-tailed batch from a wrecked model, so a lone jump raises
        nothing by itself (the point after it may: :meth:`_lone_held_came_back`); but it must
        not become the baseline either, or a storm that begins at the
        second step drags the level up with it and every later jump looks small (real ``trl
        dpo`` at LR 3.0: 1.5 -> 122 -> 144 -> 82 -> 488, nothing raised before the fifth step).
        ``explosion_points`` such points in a row are an explosion from the first of them, as a
        spike still up after that many points is: healthy runs stay within a few times their
        first norm (docs/detectors.md). One ``explosion_ratio`` over the level or the first norm
        (``exploding``) is one at once.
        """
        self._held.append((step, y))
        if len(self._held) < self.lim.explosion_points and not exploding:
            return
        first = self._held[0][0]
        self._spike_points = len(self._held)
        self._held.clear()
        ev = self._spike_evidence(g, y, self._min_jump, over_start)
        ev["points_up"] = self._spike_points
        self.rep.report(out, "grad_spike", self.metric, first, True, evidence=ev)
        self._explode(first, g, y, y - self.tracker.level, out)

    def _spike_evidence(self, g: float, y: float, threshold: float, over_start: bool) -> dict[str, object]:
        """What a grad spike's evidence says: the norm against its level, and against the run's
        first norm when that is what it passed."""
        ev: dict[str, object] = {
            "value": rounded(g),
            "baseline": rounded(math.exp(self.tracker.level)),
            "ratio": rounded(math.exp(y - self.tracker.level), 4),
            "threshold_ratio": rounded(math.exp(threshold), 4),
        }
        if over_start and self._start is not None:
            ev["first_norm"] = rounded(math.exp(self._start))
            ev["ratio_to_first"] = rounded(math.exp(y - self._start), 4)
        return ev

    def _explode(self, step: int, g: float, y: float, jump: float, out: list[Finding]) -> None:
        first = not self.rep.is_on("grad_explosion", self.metric)
        ev: dict[str, object] | None = None
        if first:
            ev = {
                "value": rounded(g),
                "baseline": rounded(math.exp(self.tracker.level)),
                "ratio": rounded(math.exp(jump), 4),
                "points_up": self._spike_points,
                "threshold_ratio": self.lim.explosion_ratio,
            }
            if self._start is not None:
                ev["first_norm"] = rounded(math.exp(self._start))
                ev["ratio_to_first"] = rounded(math.exp(y - self._start), 4)
        self.rep.report(out, "grad_explosion", self.metric, step, True, severity="critical", evidence=ev)

    def _end_spike(self, out: list[Finding], step: int) -> None:
        if self._spike_points:
            self._spike_points = 0
            self.rep.report(out, "grad_spike", self.metric, step, False)
            self.rep.report(out, "grad_explosion", self.metric, step, False)

    def _vanishing(self, step: int, g: float, y: float | None, out: list[Finding]) -> None:
        est = self._established
        if est is None:
            return
        limit = est - self._vanish_log
        t = self.tracker
        low = y is None or (t.n_level > 0 and t.level < limit)
        self._low = self._low + 1 if low else 0
        if self._low >= self.lim.vanishing_points:
            ev = None
            if not self.vanished:
                ev = {
                    "value": rounded(g),
                    "level": rounded(math.exp(t.level)) if t.n_level else None,
                    "established_level": rounded(math.exp(est)),
                    "threshold_ratio": self.lim.vanishing_ratio,
                }
            self.rep.report(out, "grad_vanishing", self.metric, step, True, evidence=ev)
        elif not low and t.n_level and t.level > limit + math.log(10.0):
            self.rep.report(out, "grad_vanishing", self.metric, step, False)
