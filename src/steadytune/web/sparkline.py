"""``top``'s sparklines: a loss tail drawn as one line of block characters. Pure, no I/O.

The dashboard's charts are bucketed in one place only, the run store's SQL
(:meth:`steadytune.telemetry.store.queries.Queries.step_series`: min/max/mean per
bucket); the page draws those buckets as they come. A sparkline is a 20-character
shape of a series already in hand, so it keeps shape and endpoints (LTTB) instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def lttb(xs: Sequence[float], ys: Sequence[float], threshold: int) -> list[tuple[float, float]]:
    """Largest-Triangle-Three-Buckets: ``threshold`` points that keep the shape of the line.

    Keeps the first and last point; from each bucket in between keeps the point
    that makes the largest triangle with the previous kept point and the mean of
    the next bucket (Steinarsson, 2013).
    """
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"xs and ys differ in length: {n} != {len(ys)}")
    if threshold >= n or threshold < 3:
        return list(zip(xs, ys, strict=True))
    out = [(xs[0], ys[0])]
    every = (n - 2) / (threshold - 2)
    a = 0
    for i in range(threshold - 2):
        start = math.floor((i + 1) * every) + 1
        end = min(math.floor((i + 2) * every) + 1, n)
        # Mean of the next bucket: the third corner of the triangle.
        if end > start:
            avg_x = sum(xs[start:end]) / (end - start)
            avg_y = sum(ys[start:end]) / (end - start)
        else:
            avg_x, avg_y = xs[n - 1], ys[n - 1]
        lo = math.floor(i * every) + 1
        hi = math.floor((i + 1) * every) + 1
        best, best_area = lo, -1.0
        ax, ay = xs[a], ys[a]
        for j in range(lo, hi):
            area = abs((ax - avg_x) * (ys[j] - ay) - (ax - xs[j]) * (avg_y - ay))
            if area > best_area:
                best, best_area = j, area
        out.append((xs[best], ys[best]))
        a = best
    out.append((xs[n - 1], ys[n - 1]))
    return out


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 20) -> str:
    """A one-line chart of ``values`` (NaN/None shown as a space), LTTB-reduced to ``width``."""
    finite = [(float(i), float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    pts = lttb([p[0] for p in finite], [p[1] for p in finite], width)
    lo = min(p[1] for p in pts)
    hi = max(p[1] for p in pts)
    span = hi - lo or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((y - lo) / span * (len(SPARK) - 1) + 0.5))] for _, y in pts)
