"""Sparklines: LTTB keeps shape and endpoints."""

from __future__ import annotations

import math

from steadytune.web.sparkline import lttb, sparkline


def test_lttb_count_endpoints_and_peak() -> None:
    xs = list(range(10_000))
    ys = [0.0] * 10_000
    ys[5000] = 9.0
    out = lttb(xs, ys, 100)
    assert len(out) == 100
    assert out[0] == (0, 0.0) and out[-1] == (9999, 0.0)
    assert (5000, 9.0) in out
    assert lttb([1, 2], [3, 4], 100) == [(1, 3), (2, 4)]


def test_sparkline() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8], 8) == "▁▂▃▄▅▆▇█"
    assert sparkline([], 8) == "" and sparkline([math.nan], 8) == ""
    assert len(sparkline(list(range(1000)), 20)) == 20
