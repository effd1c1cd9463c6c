"""Downsampling: min/max keeps spikes, LTTB keeps shape and endpoints, sparklines."""

from __future__ import annotations

import math

import pytest

from steadytune.web.downsample import lttb, minmax, sparkline


def test_minmax_keeps_every_spike_and_order() -> None:
    xs = list(range(100_000))
    ys = [math.sin(x / 1000) for x in xs]
    ys[12_345] = 50.0
    ys[67_890] = -50.0
    out = minmax(xs, ys, 500)
    assert len(out) <= 1000
    assert (12_345, 50.0) in out and (67_890, -50.0) in out
    assert [p[0] for p in out] == sorted(p[0] for p in out)


def test_minmax_small_input_is_unchanged() -> None:
    assert minmax([1, 2, 3], [4, 5, 6], 10) == [(1, 4), (2, 5), (3, 6)]
    with pytest.raises(ValueError, match="differ in length"):
        minmax([1], [], 3)


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
