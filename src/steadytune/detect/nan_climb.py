"""Whether a NaN loss ended a climb: the ``divergence`` that the NaN overflowed.

A loss turns NaN when something in the forward or backward pass overflows. Often that is
the last step of a divergence: an LR too high for the model lets the loss climb for a few
updates, the logits and the activations grow with it, and then they no longer fit the
number format. The NaN is told at once (``nan_loss``); what this adds is *when the trouble
began*. A run rolled back to the last checkpoint before the NaN is rolled back to weights
that were already climbing, and a short run that climbs for eight points before its NaN
is too short for the rules that judge a climb as it happens (two level windows of points,
a level 1.42x its best).

So at a NaN the finite points before it are looked at once: the last two level windows of
the segment, from their lowest point on. If the points after that low rise along a
least-squares line whose slope is significant (Student's t at the one-sided 5 % level for
its degrees of freedom: the question is asked once per NaN, not at every point, so a single
test's level is the right one) and the last of them stands ``climb_min_rise`` (1.1x, the
steady climb's own) above the low, the NaN ended a divergence from the point after the low.
At least ``_MIN_POINTS`` points after the low: fewer leave the line no degrees of freedom to
be judged by. The low itself is left out of the fit: chosen as the lowest, it would tilt any
line that starts from it upwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from steadytune.detect.base import rounded

_MIN_POINTS = 4  # points after the low: a line through them keeps 2 degrees of freedom
# Student's t, one-sided 5 %, for 1..14 degrees of freedom (two level windows hold at most 16 points).
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761)


def climb_before_nan(points: Sequence[tuple[int, float]], min_rise: float) -> dict[str, Any] | None:
    """The evidence of a climb that the NaN ended, or None.

    Args:
        points: the finite (step, log loss) points before the NaN, oldest first, of one segment.
        min_rise: the least rise (log) of the last point over the low (``climb_min_rise``).
    """
    if len(points) < _MIN_POINTS + 1:
        return None
    low = min(range(len(points)), key=lambda i: points[i][1])
    climb = points[low + 1 :]
    n = len(climb)
    if n < _MIN_POINTS or climb[-1][1] - points[low][1] < min_rise:
        return None
    mx = (n - 1) / 2.0
    my = sum(y for _, y in climb) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    sxy = sum((i - mx) * (y - my) for i, (_, y) in enumerate(climb))
    slope = sxy / sxx
    resid = max(sum((y - my) ** 2 for _, y in climb) - slope * sxy, 0.0) / (n - 2)
    dof = n - 2
    need = _T95[min(dof, len(_T95)) - 1]
    if slope <= 0.0 or slope * math.sqrt(sxx) < need * math.sqrt(resid):
        return None
    t = math.inf if resid == 0.0 else slope * math.sqrt(sxx / resid)
    return {
        "value": rounded(math.exp(climb[-1][1])),
        "low": rounded(math.exp(points[low][1])),
        "low_step": points[low][0],
        "start_step": climb[0][0],
        "rise_ratio": rounded(math.exp(climb[-1][1] - points[low][1]), 4),
        "threshold_ratio": rounded(math.exp(min_rise), 4),
        "points": n,
        "t": rounded(t, 3) if math.isfinite(t) else None,
        "threshold_t": need,
        "reason": "the loss climbed from its low until it turned NaN",
    }
