"""Downsampling for long series: min/max buckets and LTTB. Pure functions, no I/O.

The run store does the min/max bucketing in SQL for the dashboard; these are
the in-memory versions, used where a series is already in hand (``top``'s
sparklines, tests that check the SQL against them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def minmax(xs: Sequence[float], ys: Sequence[float], buckets: int) -> list[tuple[float, float]]:
    """Keep the min and the max of each of ``buckets`` equal-count buckets, in x order.

    A spike inside a bucket survives (unlike averaging), so a 1,000,000-point
    loss curve drawn from 2×``buckets`` points still shows every excursion.
    """
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"xs and ys differ in length: {n} != {len(ys)}")
    if buckets <= 0 or n <= 2 * buckets:
        return list(zip(xs, ys, strict=True))
    out: list[tuple[float, float]] = []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo >= hi:
            continue
        i_min = min(range(lo, hi), key=ys.__getitem__)
        i_max = max(range(lo, hi), key=ys.__getitem__)
        for i in sorted({i_min, i_max}):
            out.append((xs[i], ys[i]))
    return out


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
