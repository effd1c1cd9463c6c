"""Seeded generators of the loss and grad-norm shapes the detector tests assert on.

The unit tests must not copy a development log's numbers (that would make the
detectors look good on exactly the data they were tuned on): a behaviour seen in
a real log is written here as a *shape*, drawn from a seed and stretched over a
grid of loss scale, log-space noise and length, so a rule that holds only at the
one scale, noise and length of a particular file fails here.

Every generator works in log space (multiplicative noise), returns plain lists
and is a pure function of its arguments.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

SCALES = (0.3, 2.0, 11.0)  # a fine-tuning loss, a mid-run LM loss, a fresh LM's loss at init
NOISES = (0.005, 0.03, 0.1)  # log-space sigma per logged point: smooth, typical, a small-batch run
LENGTHS = (12, 120, 1200)  # logged points
SEEDS = (0, 1, 2)


Case = Callable[[float, float, int, int], object]


def grid(
    scales: tuple[float, ...] = SCALES,
    noises: tuple[float, ...] = NOISES,
    lengths: tuple[int, ...] = LENGTHS,
    seeds: tuple[int, ...] = SEEDS,
    skip: Case | None = None,
    xfail: Case | None = None,
) -> list:
    """``pytest.param(scale, noise, length, seed)`` over the grid, ids like ``s2.0-n0.03-l120-r1``.

    ``skip(scale, noise, length, seed)`` true drops a combination: a test that
    restricts its grid says why next to it. ``xfail(...)`` returning a reason marks
    a combination the current detectors get wrong (strict: it must keep failing
    until they are fixed, then the mark goes).
    """
    out = []
    for scale, noise, length, seed in itertools.product(scales, noises, lengths, seeds):
        if skip is not None and skip(scale, noise, length, seed):
            continue
        reason = xfail(scale, noise, length, seed) if xfail is not None else None
        marks = [pytest.mark.xfail(strict=True, reason=str(reason))] if reason else []
        out.append(
            pytest.param(scale, noise, length, seed, id=f"s{scale}-n{noise}-l{length}-r{seed}", marks=marks)
        )
    return out


GRID = "scale, noise, length, seed"


def rng_for(seed: int, stream: str) -> random.Random:
    """Independent streams per seed (loss noise, grad noise, positions) that do not shift each other."""
    return random.Random(f"{stream}:{seed}")


def _jitter(rng: random.Random, sigma: float) -> float:
    return math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else 1.0


def learning(n: int, scale: float, noise: float, seed: int, fall: float = 0.4) -> list[float]:
    """A healthy curve: from ``scale`` down by ``fall`` in log space, fast at first, with noise.

    The fall is spread over the run whatever its length (``1 - e^-3t`` in the run's
    fraction ``t``), so a short run falls as far as a long one, only in fewer points.
    """
    rng = rng_for(seed, "loss")
    out = []
    for i in range(n):
        t = i / max(1, n - 1)
        drop = fall * (1.0 - math.exp(-3.0 * t)) / (1.0 - math.exp(-3.0))
        out.append(scale * math.exp(-drop) * _jitter(rng, noise))
    return out


def flat(n: int, scale: float, noise: float, seed: int) -> list[float]:
    """No learning at all: the loss stays at ``scale``, noise only."""
    rng = rng_for(seed, "loss")
    return [scale * _jitter(rng, noise) for _ in range(n)]


def per_sample(n: int, scale: float, seed: int, noise: float = 0.35) -> list[float]:
    """A batch-size-1 run: each logged loss is one sample's, log noise ``noise`` with fat tails (one
    point in ten drawn twice as wide), falling slowly. Points 3x their neighbours are ordinary here."""
    rng = rng_for(seed, "sample")
    out = []
    for i in range(n):
        sigma = noise * (2.0 if rng.random() < 0.1 else 1.0)
        out.append(scale * math.exp(-0.3 * i / max(1, n - 1) + rng.gauss(0.0, sigma)))
    return out


def coarse_eval(
    points: int, every: int, best_at: float, rise: float, noise: float, seed: int, epochs: int
) -> tuple[list[float], list[float | None], list[float]]:
    """A coarse log (one point per logging interval, however many steps that is): training loss,
    evaluation loss every ``every`` points, epoch.

    The training loss falls all run (log noise 3%, up 8% at each epoch start when ``epochs`` > 1);
    the eval loss falls over the first ``best_at`` of its evaluations, then climbs ``rise`` (log) in
    all, evenly, to the last (0: stays flat), with log noise ``noise`` (a small eval set: 1%).
    """
    rng = rng_for(seed, "coarse-eval")
    losses: list[float] = []
    evals: list[float | None] = []
    epoch: list[float] = []
    n_evals = points // every
    k_best = max(1, int(best_at * n_evals))
    k = 0
    for i in range(points):
        e = epochs * (i + 1) / points
        restart = epochs > 1 and i > 0 and e % 1 < epochs / points
        losses.append(
            1.6 * math.exp(-1.5 * (i + 1) / points) * (1.08 if restart else 1.0) * _jitter(rng, 0.03)
        )
        epoch.append(e)
        if (i + 1) % every:
            evals.append(None)
            continue
        y = 1.5 * math.exp(-0.3 * (1.0 - math.exp(-4.0 * min(k, k_best) / k_best)))
        if k > k_best:
            y *= math.exp(rise * (k - k_best) / (n_evals - 1 - k_best))
        evals.append(y * _jitter(rng, noise))
        k += 1
    return losses, evals, epoch


def high_first(n: int, scale: float, noise: float, seed: int, ratio: float) -> list[float]:
    """A first logged loss ``ratio`` times the settled one, gone within two or three points, then learning.

    (A model whose head starts far off: the first logging interval averages the
    steps before it settles.) The excess decays by a factor of ~7 per point.
    """
    base = learning(n, scale, noise, seed)
    excess = math.log(ratio)
    return [x * math.exp(excess * 0.15**i) for i, x in enumerate(base)]


def fp16_skips(n: int, seed: int, where: str) -> list[int]:
    """Indices of a burst of overflow-skipped steps: 2-4 of them, 1-3 points apart.

    ``where="start"`` puts the first at index 0 (the loss scaler calibrating, the
    usual place); ``"middle"`` halfway through the run (the scaler growing back).
    The gaps are shorter than the five finite norms that end an episode, so the
    burst is one episode.
    """
    rng = rng_for(seed, "skips")
    first = 0 if where == "start" else n // 2
    out = [first]
    for _ in range(rng.randint(1, 3)):
        out.append(out[-1] + rng.randint(1, 4))
    return [i for i in out if i < n]


def grad_norms(n: int, level: float, sigma: float, seed: int) -> list[float]:
    """Healthy gradient norms: log-normal around ``level``."""
    rng = rng_for(seed, "grad")
    return [level * _jitter(rng, sigma) for _ in range(n)]


def warmup_grad_norms(n: int, level: float, sigma: float, seed: int, warm: int) -> list[float]:
    """Healthy gradient norms of a run with an LR warm-up of ``warm`` points: high at first (up to 5x
    the later level), falling fast over the warm-up, log-normal around ``level`` after it, and fat-tailed
    (one batch in a hundred 1.5-3x up)."""
    rng = rng_for(seed, "grad")
    out = []
    for i in range(n):
        g = level * (1.0 + 4.0 * math.exp(-i / max(1.0, warm / 2))) * _jitter(rng, sigma)
        if rng.random() < 0.01:
            g *= rng.uniform(1.5, 3.0)
        out.append(g)
    return out


def texture_saw(n: int, scale: float, noise: float, seed: int, period: int, amplitude: float) -> list[float]:
    """A learning curve with a regular saw from the very first point (length-grouped or fixed-order batches).

    Each period the loss ramps down by ``2 * amplitude`` (log) and jumps back, the
    whole run long: a texture the run always had, not a swing that began.
    """
    base = learning(n, scale, noise, seed)
    return [x * math.exp(amplitude * (1.0 - 2.0 * (i % period) / (period - 1))) for i, x in enumerate(base)]


def staircase(
    n: int,
    scale: float,
    noise: float,
    seed: int,
    epochs: int,
    per_epoch: float = 0.7,
    within: float = 0.05,
    initial: float = 0.25,
) -> tuple[list[float], list[float]]:
    """Multi-epoch fine-tuning: a level that drops ``per_epoch`` times at each epoch boundary.

    The run opens with the fast fall every fine-tuning run has (``initial`` in log,
    over the first 2% of the run); after it, within an epoch the loss falls only
    by ``within`` (log), and at a boundary the model meets data it has already
    seen and the level steps down. Returns the losses and the epoch of each point
    (fractional, as trainers log it).
    """
    rng = rng_for(seed, "loss")
    tau = max(1.0, 0.02 * n)
    losses, epoch_of = [], []
    for i in range(n):
        e = i * epochs / n
        whole = int(e)
        level = scale * per_epoch**whole * math.exp(-within * (e - whole) + initial * math.exp(-i / tau))
        losses.append(level * _jitter(rng, noise))
        epoch_of.append(e)
    return losses, epoch_of


def epoch_sawtooth(
    n: int, scale: float, noise: float, seed: int, epochs: int, rise: float = 1.5, per_epoch: float = 0.9
) -> tuple[list[float], list[float]]:
    """Data in a fixed order: the loss falls ``rise`` times through each epoch and jumps back up at the
    boundary.

    Each epoch starts ``per_epoch`` times lower than the one before. Returns the
    losses and the epoch of each point.
    """
    rng = rng_for(seed, "loss")
    losses, epoch_of = [], []
    for i in range(n):
        e = i * epochs / n
        whole = int(e)
        phase = e - whole
        level = scale * per_epoch**whole * rise ** (1.0 - phase) / rise
        losses.append(level * _jitter(rng, noise))
        epoch_of.append(e)
    return losses, epoch_of


def epoch_starts(n: int, epochs: int) -> list[int]:
    """Indices of the first point of each epoch after the first (the points the saw jumps at)."""
    return [i for i in range(1, n) if int(i * epochs / n) != int((i - 1) * epochs / n)]


def dpo(n: int, seed: int, spread: float, ramp: float = 0.3, min_ramp: int = 30) -> list[float]:
    """A DPO loss: ``log(1 + e^-margin)``, ln 2 while the policy equals the reference, then noisy.

    The reward margin's mean grows to 3 and its spread to ``spread`` over the
    first ``ramp`` of the run (and never fewer than ``min_ramp`` logged points);
    per-batch margins are drawn around them, so the loss leaves ln 2 and spreads
    out over an order of magnitude and more.
    """
    rng = rng_for(seed, "dpo")
    steps = max(float(min_ramp), ramp * n)
    out = []
    for i in range(n):
        t = min(1.0, i / steps)
        margin = rng.gauss(3.0 * t, 0.05 + spread * t) if i else 0.0
        out.append(math.log1p(math.exp(-margin)))
    return out


def jump_and_stay(
    n_before: int, n_after: int, scale: float, noise: float, seed: int, ratio: float, frozen: bool
) -> list[float]:
    """A healthy start, then one step ``ratio`` times up, and the loss stays there.

    ``frozen``: every later point repeats the same value (the weights stopped
    changing: a blown-up optimizer state, an LR so high that the update is
    NaN-clipped to nothing); otherwise the loss wanders at the new level with the
    same noise.
    """
    before = learning(n_before, scale, noise, seed, fall=0.1)
    rng = rng_for(seed, "after")
    up = before[-1] * ratio
    after = [up] * n_after if frozen else [up * _jitter(rng, noise) for _ in range(n_after)]
    return before + after


def climb(
    n_before: int, n_after: int, scale: float, noise: float, seed: int, double_in: float
) -> list[float]:
    """A healthy start, then the loss doubles every ``double_in`` points, with the same noise: a slow blow-up
    (an LR too high for the late phase, a bad data shard mixed in), no single jump to see."""
    before = learning(n_before, scale, noise, seed, fall=0.3)
    rng = rng_for(seed, "climb")
    after = [before[-1] * 2.0 ** ((i + 1) / double_in) * _jitter(rng, noise) for i in range(n_after)]
    return before + after


def bump(n: int, scale: float, noise: float, seed: int, at: int, rise: float, width: int) -> list[float]:
    """A learning curve with a smooth temporary rise of ``rise`` (log space) over ``width`` points and back:
    a harmless bump (a harder stretch of data, a warm restart of the LR) that is no divergence."""
    out = learning(n, scale, noise, seed, fall=0.2)
    for i in range(at, min(n, at + 2 * width)):
        out[i] *= math.exp(rise * math.sin(math.pi * (i - at) / (2 * width)))
    return out


def smoothed(n: int, scale: float, noise: float, seed: int, beta: float) -> list[float]:
    """A learning curve logged as a running average: each point an EMA (``beta``) of per-batch losses whose
    log noise is ``noise``. Successive points then differ by far less than the batches do."""
    raw = learning(n, scale, noise, seed, fall=0.2)
    out, s = [], math.log(raw[0])
    for x in raw:
        s = beta * s + (1.0 - beta) * math.log(x)
        out.append(math.exp(s))
    return out


def batch_tail(
    n: int, scale: float, noise: float, seed: int, every: int, until: int | None = None
) -> tuple[list[float], list[int]]:
    """A per-step learning curve whose data holds a few hard batches: one point up, back at the next.

    About one point in ``every`` (at random, never in the first fifth) is one batch
    ``J`` to ``1.1 J`` up in log space and the point after it is ordinary again, where
    ``J`` is 12 noise sigmas and at least log 1.3: the 1.3-1.6x single-batch excursions of a
    pretraining run over a mix of sources. None at or after ``until`` (default: the end).
    Returns the losses and the excursions' indices.
    """
    losses = learning(n, scale, noise, seed)
    rng = rng_for(seed, "tail")
    big = tail_jump(noise)
    at: list[int] = []
    i = n // 5
    while True:
        i += rng.randint(every // 2, 3 * every // 2)
        if i >= min(n - 1, until if until is not None else n):
            return losses, at
        losses[i] *= math.exp(big * rng.uniform(1.0, 1.1))
        at.append(i)


def tail_jump(noise: float) -> float:
    """The log size of :func:`batch_tail`'s excursions at this noise (the smallest of them)."""
    return max(12.0 * noise, math.log(1.3))


def short_warm_run(
    n: int, sigma: float, warm: float, level: float, seed: int
) -> tuple[list[float], list[float], list[float]]:
    """A short run's losses, grad norms warming up over ``warm`` of it at ``level`` (log noise ``sigma``),
    and its LR warming up linearly over the same points."""
    w = max(1, int(warm * n))
    grads = warmup_grad_norms(n, level, sigma, seed, w)
    lr = [1e-4 * min(1.0, (i + 1) / w) for i in range(n)]
    return learning(n, 2.0, 0.03, seed), grads, lr


FRESH_KL = ("saturating", "linear", "quadratic", "warmup")  # how a fresh policy's KL leaves 0


def fresh_kl(n: int, end: float, noise: float, seed: int, shape: str, first: str = "small") -> list[float]:
    """A fresh RL policy's KL to its reference, point by point: it starts at ~0 (the policy is the
    reference) and rises towards ``end`` with log-space ``noise``.

    ``shape``: ``saturating`` (1 - exp(-t/tau): the run's usual curve), ``linear``, ``quadratic``
    (a steady drift: the KL is second order in it) or ``warmup`` (the drift of a linearly
    warming LR, t**4), each reaching ``end`` within the run or a few dozen points.
    ``first``: the first point as loggers show it: ``small`` (the curve's own), ``zero`` (exactly
    0), ``tiny`` (1e-7 to 1e-5: the reference's rounding, a thousandfold under the next point).
    """
    rng = rng_for(seed, f"fresh-kl-{n}-{end}-{noise}-{shape}-{first}")
    reach = rng.uniform(0.3, 1.0) * min(n, 40)  # points to (about) end
    out = []
    for i in range(n):
        t = (i + 1) / reach
        if shape == "saturating":
            f = 1 - math.exp(-3 * t)
        else:
            f = min(1.0, t) ** {"linear": 1, "quadratic": 2, "warmup": 4}[shape]
        out.append(end * f * _jitter(rng, noise))
    if first == "zero":
        out[0] = 0.0
    elif first == "tiny":
        out[0] = 10 ** rng.uniform(-7, -5)
    return out
