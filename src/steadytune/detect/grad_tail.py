"""How far one gradient norm must jump for this run's noise not to give it by chance (``grad_spike``).

A grad norm is heavier-tailed than the loss it comes from, and runs differ more in their
tails than in their noise: a quiet QLoRA or pretraining norm moves 3 % from batch to batch
and never doubles, while a memorizing or RL run wanders 2-3x and meets a 4x batch every few
hundred. One fixed ratio cannot serve both: 8x misses a 6x spike in the quiet run (40 of its
noise units), and over ten million points of a fat-tailed one it is passed by chance.

The run's own largest jumps say which run this is (peaks over a threshold): of the points
judged so far, the ``_TOP`` largest jumps over the level lie above the ``_TOP + 1``-th, ``low``,
and above it a tail falls off no slower than exponentially, at their mean excess ``beta``.
Noise then passes ``low + x`` about ``_TOP x exp(-x / beta)`` times over the run so far, so
``low + beta x ln(_TOP / chance)`` is passed by chance once in a hundred runs of this length
(``chance`` 1 %, as the loss's :class:`~steadytune.detect.loss_rules.SpikeChance`). The run's
length is in ``low``: the 31st largest of a million points lies further out than of a thousand.

Taking the tail as exponential is the cautious reading, and far too cautious for a run whose
top jumps are a crowd of 3-5x batches: the exponential through them puts chance at 20-50x,
while a 15x norm among them is still a batch like no other (the real A13 log). So the run's
tail only *lowers* the prior ratio (``spike_min_ratio``, 8x), down to ``quiet_spike_ratio``:
a quiet run, whose largest jumps are a few of its noise units, is judged by what its noise
allows. Past ``_PRIOR_POINTS`` points (the longest real logs the 8x was set on) the prior
grows with the run's length, by ``beta x ln(n / _PRIOR_POINTS)``, the growth of an exponential
tail's maximum, and is no longer lowered: there the top 30 are the run's far tail, where 30
points say least (after 5.5 million points of norms 1.5-3x up one batch in a hundred under 20 %
noise, the exponential through them asked 7.5x, and a healthy 8.0x point came).

The top jumps are raw log jumps over the level: a heap of 31 numbers that most points pass
by with one comparison. Until ``_TOP + 1`` points are judged the run has no tail to speak of,
and the prior ratio holds.
"""

from __future__ import annotations

import heapq
import math

_CHANCE = 0.01  # a jump noise of this run gives this often over the points so far is chance (as the loss's)
_TOP = 30  # the largest jumps whose mean excess is the tail's scale
_PRIOR_POINTS = 100_000  # the longest runs the prior ratio was chosen on


class GradChance:
    """The run's largest one-point jumps, and the jump it takes to stand out of them."""

    __slots__ = ("_top", "n")

    def __init__(self) -> None:
        self._top: list[float] = []  # a min-heap of the _TOP + 1 largest jumps (log) so far
        self.n = 0  # points judged

    def note(self, jump: float) -> None:
        """A point judged against a full level window and not raised: part of the run's noise."""
        self.n += 1
        top = self._top
        if len(top) <= _TOP:
            heapq.heappush(top, jump)
        elif jump > top[0]:
            heapq.heapreplace(top, jump)

    def threshold(self, prior: float) -> float | None:
        """The jump (log) a point must clear, given the prior ratio's jump ``prior``; None until known.

        What noise of this run gives with a chance of 1 % over its points so far, never above the
        prior; past ``_PRIOR_POINTS`` points, the prior grown with the run's length at the tail's scale.
        """
        top = self._top
        if len(top) <= _TOP:
            return None
        low = top[0]
        beta = (sum(top) - low) / _TOP - low
        if self.n > _PRIOR_POINTS:
            return prior + beta * math.log(self.n / _PRIOR_POINTS)
        return min(low + beta * math.log(_TOP / _CHANCE), prior)
