"""no_learning_signal: the updates carry nothing, so the run cannot learn, whatever its objective.

Each logged point says how much of its batch could teach the model anything:

- a gradient norm of zero (``rl.zero_grad_norm``): no parameter moved, whatever the
  objective (a frozen or detached model, a loss without a graph; in RL, a batch
  without advantages at ``beta`` 0). Nothing;
- an RL batch whose groups' rewards tied (:func:`~steadytune.objectives.tied_share`:
  TRL's ``frac_reward_zero_std``, a ``reward_std`` of 0, a highest reward equal to
  the lowest, verl's advantage range of 0): a group-relative trainer learns from
  the reward differences inside a group, so a tied group teaches nothing. The
  share of groups that did not tie;
- where no field tells the groups apart, an RL reward exactly the same at every
  point of the window: every completion scored alike, batch after batch. Nothing;
- an RL reward **pinned**: exactly one value on more than half the window's batches,
  each of them tied (or not known to differ), and the others on balance no better
  (their mean at or below it). A batch mean that repeats exactly is a batch whose
  completions all scored alike: a policy that emits one answer (a fixed completion,
  every completion truncated at the length limit) and gets no advantage from it; the
  batches where it strays do no better, so nothing pulls it off. Nothing, for the
  whole window. A hard task ties too, but at its floor, and its other batches lie
  above it (they are where the learning is); a solved one ties at its top after the
  reward rose to it (said as ``info`` below). Where no field says the pinned batches
  tied, the reward must also never have been above the pinned value, and the window
  hold three values or more (a reward of one completion a step, 0 or 1, repeats by
  chance). Once told, the episode holds while a quarter of the window still sits at
  the value (a policy that strays more for a while has not found anything better);
- a preference batch whose margins and chosen rewards are exactly 0: the policy is
  still its reference, no update has reached it. Nothing;
- otherwise a reward that moved, or a nonzero norm: everything (an update happened);
  but not an RL step that logged none of its fields: its norm may be the KL term's
  alone, so it is not counted at all; nor a further step on a rollout batch counted
  already (``num_iterations`` > 1: :mod:`~steadytune.detect.rollouts`).

Over the last ``rl.signal_window`` (16) such points, two level windows, the mean
share of learning groups at or below ``rl.no_signal_share`` (0.05) is one episode
of ``no_learning_signal``: at one group a step that is no batch in 16 with a
learning group, at sixteen a step under one group in twenty. A healthy GRPO run on
a hard task ties three batches in four at one group a step early on (0.75^16: one
window in a hundred runs all tied); one that never earns a reward ties them all. The
episode clears once a quarter of the window learns again.

A window without signal is chance, not trouble, when the run's own rate of batches
without signal, known from a window's worth of points before the current stretch of
them (one standard error up), gives a stretch that long ``reward.CHANCE`` (1e-4) of the
time or more: a reward that
fires on a few completions in a hundred at two completions a group leaves nine
batches in ten without signal (sixteen in a row one time in five), and is learning,
slowly; one that fired on half its batches and then on none for sixteen is not (0.5^16).
A run without signal from its first batch has no such rate and is told at 16 points;
a reward pinned with strays below it (above) is no chance at any rate.

Two runs that log a zero norm are not this: an SFT or pretraining run whose loss
falls (a pipeline engine that logs 0.0 for a norm it does not compute is learning:
the loss says so), and a run whose gradient already vanished from an established
level (``grad_vanishing`` told it: one trouble, one episode). Whether the loss
falls is judged over every point since the run (or its last nonzero norm) began,
not over the window: a converged run's loss is flat over 16 points, yet it learned.
It falls when a least-squares line through its logarithm slopes down with a t of
``_FALL_T`` (2), or its level lies ``_LOSS_MOVED`` (5 %) from where it began.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.points import Signal
from steadytune.detect.reward import CHANCE
from steadytune.objectives import LOSS_OBJECTIVE, REWARD_KEYS, first, is_rl, tied_share
from steadytune.records import Severity

KINDS: dict[str, KindInfo] = {
    "no_learning_signal": KindInfo(
        "no learning signal: no update is happening",
        "the updates carry nothing: a reward function that never fires (always the same value), a policy "
        "that emits one answer every completion scores alike (completions cut at the length limit), a task "
        "too hard (or too easy) for the group size, a frozen or detached model, or an LR of 0",
        "look at a few completions and the rewards they got; check that the reward function can fire, "
        "raise num_generations or use easier prompts; check requires_grad, the optimizer's parameters "
        "and the LR schedule. A restart will not fix it",
        "warning",
    ),
}

_BEFORE = 4  # windows of rewards kept from before the window: where the run stood
_FLOOR_SHARE = 0.5  # ties at a reward the run was at or below less often than this before: it fell
_FIRST_POINTS = 8  # the run's first reward level: the median of its first level window
_CLEAR_SHARE = 0.25  # a quarter of the window's groups learned: the signal is back
# The loss of an SFT run that logs a zero norm moved by more than this (log space) over the window:
# the norm is a placeholder, the model learns (the loss plateau rule's minimum gain, 5 %).
_LOSS_MOVED = 0.05
_FALL_T = 2.0  # a fall of the log loss this many standard errors of its slope: the model learns
_MARGIN_KEYS = ("rewards/margins", "rewards/chosen")
_SFT = (None, LOSS_OBJECTIVE)
_HOLD_SHARE = 0.25  # a pinned episode holds while this share of the window or more still sits at its value
# The share of a batch's completions cut at the length limit: TRL's and verl's names for it.
_CLIPPED_KEYS = ("completions/clipped_ratio", "response_length/clip_ratio")
_CLIPPED_CAUSE = 0.9  # nearly every completion cut short: named first among the causes


@dataclass(frozen=True, slots=True)
class SignalLimits:
    """As ``detect.rl`` names them (docs/detectors.md)."""

    signal_window: int
    no_signal_share: float
    zero_grad_norm: float


@dataclass(slots=True)
class _Point:
    """What one logged point carried: its share of learning groups, and why."""

    step: int
    share: float
    zero_grad: bool
    tied: float | None
    lr_zero: bool
    loss_level: float | None
    reward: float | None = None


class LearningSignalWatch:
    """no_learning_signal over the last ``signal_window`` points of any run."""

    reports: ClassVar[tuple[str, ...]] = (*KINDS, "reward_collapse")

    def __init__(
        self,
        limits: SignalLimits,
        collapsed: Callable[[], bool] | None = None,
        rank: int | None = None,
    ) -> None:
        self.lim = limits
        # A collapsed policy scores every completion alike: its ties are the collapse's, told once.
        self._collapsed = collapsed or (lambda: False)
        # The rewards of the points before the window: where the run stood before its signal went.
        self._before: deque[float] = deque(maxlen=_BEFORE * limits.signal_window)
        self.rep = Reporter(rank)
        self._window: deque[_Point] = deque(maxlen=limits.signal_window)
        self._sum = 0.0
        self._metric = "grad_norm"
        self._kind = "no_learning_signal"
        self._reward_key: str | None = None
        self._first_rewards: list[float] = []
        self._peak: float | None = None  # the highest reward logged so far
        self._fit = _LineFit()  # the log loss since the norms turned (or began) zero
        self._first_level: float | None = None
        self._streak = _Streak()
        self._ever = False  # whether this rule raised anything on the run

    def told(self) -> bool:
        """Whether this rule raised anything on the run (the whole-run rule leaves such a run to it)."""
        return self._ever

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Note what the step's batch carried; judge the window once it is full."""
        if point.rec.grad_norm is None and point.batch is None and point.objective in _SFT:
            return  # an SFT step without a norm tells nothing of its batch (_share: None)
        p = self._carried(point)
        if p is None:
            return
        w = self._window
        if len(w) == w.maxlen:
            self._sum -= w[0].share
            if w[0].reward is not None:
                self._before.append(w[0].reward)
            self._streak.leave(w[0].share <= self.lim.no_signal_share)
        w.append(p)
        self._sum += p.share
        if len(w) < self.lim.signal_window:
            return
        on = self.rep.is_on(self._kind, self._metric)
        pinned = self._pinned(_HOLD_SHARE if on else 0.5)
        # Pinned with strays below it: no rate of silent batches gives that (a constant reward may be one).
        alike = pinned is not None and pinned[1] < len(w)
        share = 0.0 if alike or self._reward_constant() else self._sum / len(w)
        step = point.rec.step
        self._streak.low = share <= self.lim.no_signal_share
        if self._streak.low and not on:
            silent = sum(q.share <= self.lim.no_signal_share for q in w)
            if not self._excused(point) and (alike or not self._streak.by_chance(len(w), silent)):
                self._raise(point, share, out)
        elif on and share < _CLEAR_SHARE:
            self.rep.report(out, self._kind, self._metric, step, True)
        elif on:
            self.rep.report(out, self._kind, self._metric, step, False)

    def _raise(self, point: Signal, share: float, out: list[Finding]) -> None:
        """A window without signal: dated at its first point, as what the reward says it is.

        Ties at a reward far below what the run used to earn are its policy collapsed to a floor
        (``reward_collapse``: a reward too noisy batch by batch to show the fall in a few points
        shows it here); ties at the top of what it came up to are a solved task (``info``); any
        other is ``no_learning_signal``.
        """
        self._metric = self._metric_of(point)
        self._ever = True
        ev, cause = self._evidence(point, share)
        rewards = [p.reward for p in self._window if p.reward is not None]
        mean = sum(rewards) / len(rewards) if rewards else None
        if (pinned := self._pinned()) is not None:
            mean = pinned[0]  # where the ties are: the batches that strayed below are no floor
        severity: Severity | None = None
        self._kind = "no_learning_signal"
        below = self._share_below(mean)
        if below is not None and below < _FLOOR_SHARE and mean is not None:
            self._kind, self._metric = "reward_collapse", self._reward_key or "reward"
            before = sorted(self._before)[len(self._before) // 2]
            ev.update(
                level=rounded(mean), level_before=rounded(before), share_before_as_low=rounded(below, 3)
            )
            cause = (
                f"the reward fell from {before:.4g} (the median of the {len(self._before)} logged steps "
                f"before) to {mean:.4g}, and every completion now scores alike: the policy collapsed to a "
                f"floor the run was down at only {below:.0%} of the time before ({cause})"
            )
        elif (saturated := self._saturated()) is not None:
            ev["saturated"] = True
            severity = "info"
            cause = (
                f"the reward saturated at {saturated:.4g}, up from {ev['first_reward']:.4g}: every "
                "completion earns it, so nothing is left to learn from these prompts (stop the run, or "
                "give it harder prompts)"
            )
        start, ev["to_step"] = self._window[0].step, point.rec.step
        if pinned is not None:  # the pin began where the reward first sat at its value
            start = next(p.step for p in self._window if p.reward == pinned[0])
        kind, metric = self._kind, self._metric
        self.rep.report(out, kind, metric, start, True, severity=severity, evidence=ev, cause=cause)

    def _carried(self, point: Signal) -> _Point | None:
        """The share of the point's batch that could teach the model (None when it cannot be told),
        and its reward, noted for the run's first level and its peak."""
        p = self._share(point)
        if p is not None and point.objective not in (None, LOSS_OBJECTIVE) and point.rec.extra:
            found = first(point.rec.extra, REWARD_KEYS)
            if found is not None:
                self._reward_key, p.reward = found
                if len(self._first_rewards) < _FIRST_POINTS:
                    self._first_rewards.append(found[1])
                self._peak = found[1] if self._peak is None else max(self._peak, found[1])
        return p

    def _share(self, point: Signal) -> _Point | None:
        rec, extra = point.rec, point.rec.extra
        g = rec.grad_norm
        zero = g is not None and math.isfinite(g) and g <= self.lim.zero_grad_norm
        lr_zero = rec.lr == 0.0
        level = point.level_of.level if point.loss is not None and point.loss.accepted else None
        rl = is_rl(point.objective)
        batch = point.batch
        if batch is not None and batch.again:
            return None  # a further step on a rollout batch counted already (detect/rollouts.py)
        if batch is not None:
            tied = batch.tied
        else:
            tied = tied_share(extra) if point.objective not in (None, LOSS_OBJECTIVE) else None
        if zero:
            if rec.loss is not None and math.isfinite(rec.loss) and rec.loss > 0.0:
                self._fit.add(math.log(rec.loss))
            if self._first_level is None:
                self._first_level = level
            return _Point(rec.step, 0.0, True, tied, lr_zero, level)
        if g is not None and math.isfinite(g):
            self._fit, self._first_level = _LineFit(), None  # a real norm: the zeros begin again
        if tied is not None:
            return _Point(rec.step, 1.0 - tied, False, tied, lr_zero, level)
        if extra and point.objective not in (None, LOSS_OBJECTIVE):
            if rl and _value(extra, REWARD_KEYS) is not None:
                # Unless the window's reward is constant (see _reward_constant).
                return _Point(rec.step, 1.0, False, None, lr_zero, level)
            if not rl and all(_value(extra, (k,)) == 0.0 for k in _MARGIN_KEYS):
                return _Point(rec.step, 0.0, False, None, lr_zero, level)
        if rl:
            # A step the RL trainer did not log its fields at (``logging_steps`` > 1 under the guard, a
            # second iteration on the same rollouts): its nonzero norm may be the KL term's alone.
            return None
        if g is not None and math.isfinite(g):
            return _Point(rec.step, 1.0, False, None, lr_zero, level)
        return None

    def _excused(self, point: Signal) -> bool:
        """A window that carried nothing, but which another rule told already, or whose only sign is a
        zero norm that the SFT loss's moving belies."""
        if self._collapsed():
            return True  # reward_collapse told it: a collapsed policy scores every completion alike
        if point.grad_vanished:
            return True  # grad_vanishing already told it: the norm fell from its level to nothing
        w = self._window
        if any(not p.zero_grad for p in w if p.share == 0.0):
            return False  # the fields themselves say the batches had nothing to learn from
        if point.objective not in (None, LOSS_OBJECTIVE):
            return False
        level, first = w[-1].loss_level, self._first_level
        if level is not None and first is not None and abs(level - first) > _LOSS_MOVED:
            return True
        return self._fit.t() <= -_FALL_T

    def _share_below(self, mean: float | None) -> float | None:
        """How often the run's reward was at or below ``mean`` before the window (None: too few known).

        Whether a window of ties is a floor the run fell to or where it always was, without assuming
        how the reward is spread: a binary reward averaged over four completions is too coarse for a
        fall of a few sigmas to show, but a reward exactly at a value the run was at once in sixteen
        steps before, sixteen steps running, is far below where it was."""
        if mean is None or len(self._before) < self.lim.signal_window:
            return None
        tol = 1e-9 * max(1.0, abs(mean))
        return sum(r <= mean + tol for r in self._before) / len(self._before)

    def _reward_constant(self) -> bool:
        """Where no field tells the groups apart: the same reward at every point of the window, which
        only a batch whose completions all scored alike gives, again and again."""
        rewards = [p.reward for p in self._window if p.tied is None and not p.zero_grad]
        return len(rewards) == len(self._window) and None not in rewards and len(set(rewards)) == 1

    def _pinned(self, share: float = 0.5) -> tuple[float, int] | None:
        """The value the window's reward is pinned at and on how many of its batches (more than
        ``share`` of them: see the module docstring), or None."""
        w = self._window
        rewards = [p.reward for p in w]
        if None in rewards or not w:
            return None
        counts = Counter(p.reward for p in w if p.tied is None or p.tied >= 1.0)
        if not counts:
            return None
        value, count = counts.most_common(1)[0]
        assert value is not None
        tol = 1e-9 * max(1.0, abs(value))
        known = [r for r in rewards if r is not None]
        if count <= share * len(w) or sum(known) / len(known) > value + tol:
            return None
        unsure = any(p.tied is None for p in w if p.reward == value)
        if unsure and (len(set(known)) < 3 or (self._peak is not None and self._peak > value + tol)):
            return None
        return value, count

    def _saturated(self) -> float | None:
        """The window's mean reward when it sits in the upper half of what the run has come up by
        (the groups tie at the top: the task is solved, not broken); None otherwise."""
        rewards = [p.reward for p in self._window if p.reward is not None]
        if not rewards or len(self._first_rewards) < _FIRST_POINTS or self._peak is None:
            return None
        first = sorted(self._first_rewards)[_FIRST_POINTS // 2]
        mean = sum(rewards) / len(rewards)
        return mean if self._peak > first and mean >= (first + self._peak) / 2 else None

    def _metric_of(self, point: Signal) -> str:
        w = self._window
        if any(p.tied is not None for p in w):
            return (
                "frac_reward_zero_std" if "frac_reward_zero_std" in (point.rec.extra or {}) else "reward_std"
            )
        if all(p.zero_grad for p in w):
            return "grad_norm"
        return "reward" if is_rl(point.objective) else "rewards/margins"

    def _evidence(self, point: Signal, share: float) -> tuple[dict[str, Any], str]:
        w = self._window
        n = len(w)
        zeros = sum(p.zero_grad for p in w)
        tied = [p.tied for p in w if p.tied is not None]
        lr_zero = sum(p.lr_zero for p in w)
        ev: dict[str, Any] = {"points": n, "learning_share": rounded(share, 3), "zero_grad_points": zeros}
        if tied:
            ev["tied_share"] = rounded(sum(tied) / len(tied), 3)
        if lr_zero:
            ev["lr_zero_points"] = lr_zero
        reward = _value(point.rec.extra or {}, REWARD_KEYS)
        if reward is not None:
            ev["reward"] = rounded(reward)
        if len(self._first_rewards) == _FIRST_POINTS:
            ev["first_reward"] = rounded(sorted(self._first_rewards)[_FIRST_POINTS // 2])
        parts = []
        clipped = first(point.rec.extra, _CLIPPED_KEYS) if point.rec.extra else None
        if clipped is not None:
            ev["clipped_ratio"] = rounded(clipped[1], 3)
            if clipped[1] >= _CLIPPED_CAUSE:
                parts.append(
                    f"{clipped[1]:.0%} of the last batch's completions were cut at the length limit "
                    f"(`{clipped[0]}`): a completion cut before its answer seldom earns the reward; raise "
                    "the completion length limit (max_completion_length) or ask for shorter answers"
                )
        pinned = self._pinned()
        if pinned is not None and pinned[1] < n:  # all n alike: the reward never fires, said below
            ev["pinned_reward"], ev["pinned_points"] = rounded(pinned[0]), pinned[1]
            parts.append(
                f"the reward was exactly {pinned[0]:.4g} on {pinned[1]} of the last {n} logged batches, "
                "every completion scoring alike, and the other batches did no better: the policy repeats one "
                "answer and gets no advantage from it (completions truncated at the length limit, a "
                "reward function that cannot tell them apart, a policy collapsed to one completion)"
            )
        elif tied:
            parts.append(
                f"in {len(tied)} of the last {n} logged batches {ev['tied_share']:.0%} of the prompt groups "
                "earned the same reward for every completion: their advantages are zero, the policy gets "
                "no gradient from them (a reward function that never fires or always returns the same "
                "value, or a task too hard or too easy for the group size)"
            )
        elif is_rl(point.objective) and zeros < n:
            parts.append(
                f"the reward was exactly {ev.get('reward')} at each of the last {n} logged steps: every "
                "completion scored alike (a reward function that never fires or returns a constant)"
            )
        elif point.objective not in (None, LOSS_OBJECTIVE) and not is_rl(point.objective) and zeros < n:
            parts.append(
                f"the reward margins stayed exactly 0 on {n - zeros} of the last {n} logged batches: the "
                "policy is still its reference model"
            )
        if zeros:
            parts.append(
                f"the gradient norm was 0 on {zeros} of the last {n} logged steps: no parameter moved "
                "(a frozen or detached model: nothing requires grad, an adapter not attached, a loss "
                "computed without its graph or over fully masked labels)"
            )
        if lr_zero:
            parts.append(f"the LR was 0 on {lr_zero} of them")
        return ev, "; ".join(parts)


class _Streak:
    """How often the run's batches went without signal before its current stretch of windows without.

    A point that leaves the window joins the run's rate while the window is not low; while it is,
    the point joins the stretch instead, so the stretch is never measured by its own points."""

    def __init__(self) -> None:
        self.n = self.silent = 0  # points before the stretch, and how many of them were silent
        self.stretch = 0  # points that left the window during the current stretch
        self.low = False  # whether the window was low when last judged

    def leave(self, silent: bool) -> None:
        if self.low:
            self.stretch += 1
        else:
            self.n, self.silent, self.stretch = self.n + 1, self.silent + silent, 0

    def by_chance(self, window: int, silent_in_window: int) -> bool:
        """Whether the run's own rate of silent batches, known from a window's worth of points before
        the stretch, gives one this long ``CHANCE`` of the time or more."""
        if self.n < window:
            return False
        # One standard error up from a Laplace estimate: a rate read from a few dozen points runs low.
        rate = (self.silent + 1) / (self.n + 2)
        rate = min(1.0, rate + math.sqrt(rate * (1 - rate) / self.n))
        return bool(rate ** (self.stretch + silent_in_window) >= CHANCE)


class _LineFit:
    """A least-squares line through y against its index, kept as sums: the t of its slope."""

    def __init__(self) -> None:
        self.n = 0
        self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0

    def add(self, y: float) -> None:
        x = float(self.n)
        self.n += 1
        self.sx, self.sy, self.sxx = self.sx + x, self.sy + y, self.sxx + x * x
        self.sxy, self.syy = self.sxy + x * y, self.syy + y * y

    def t(self) -> float:
        """The slope over its standard error (0 while fewer than 4 points or no spread)."""
        n = self.n
        if n < 4:
            return 0.0
        vx = self.sxx - self.sx**2 / n
        vy = self.syy - self.sy**2 / n
        cxy = self.sxy - self.sx * self.sy / n
        if vx <= 0.0:
            return 0.0
        slope = cxy / vx
        resid = max(vy - slope * cxy, 0.0) / (n - 2)
        if resid <= 0.0:
            return 0.0 if slope == 0.0 else math.copysign(math.inf, slope)
        return slope / math.sqrt(resid / vx)


def _value(extra: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    found = first(extra, keys)
    return found[1] if found else None
