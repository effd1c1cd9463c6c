"""Summaries of gradient-flow recordings that merge in any grouping: the heat map's columns and levels.

A heat-map column stands for many recordings (every 50 steps, 20,000 in a 1M-step run). What
the page shows of one layer there is judged by the run's own limits (``detect.grad.layer_*``),
which this module does not know; so a summary keeps, per layer, every recording that could
decide the column under *any* limits, and merging two summaries keeps them again:

- the first non-finite norm (with the most zeros), the largest and the smallest finite norm
  (with the most zeros among equals): exploding and vanishing are a norm above or below a limit;
- the recordings no other beats in both norm and zero fraction (the Pareto front, zero fraction
  first): a dead layer is a share of zeros above a limit *at a norm above* the vanish limit, so
  the front holds the deadest recording for every vanish limit at once (in practice one or a
  few points: most layers have the same share of zeros at every recording);
- sums of log10 norm and of zero fraction, with counts: a healthy cell's geometric mean.

So a column merged from stored summaries (``gradflow_levels`` in ``run.db``, one level per
power of two from 256 steps) is the column of the recordings it covers, whatever the zoom, and
one exploding recording among 20,000 stays visible at every width. Means agree to rounding:
sums added in another order. Pure, no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from steadytune.records import NONFINITE_TEXT, nonfinite_text

# The widths of the stored levels, in steps: each twice the one below, the finest holding ~5
# recordings at the guard's default interval of 50 steps.
FLOW_LEVEL0 = 256
FLOW_LEVELS: tuple[int, ...] = tuple(FLOW_LEVEL0 << k for k in range(11))  # 256 .. 262,144


def _zf(v: float | None) -> float:
    return 0.0 if v is None else v


class LayerSummary:
    """One layer's recordings in a span, reduced to what any limits could judge them by."""

    __slots__ = ("bad", "bad_zf", "front", "log_n", "log_sum", "low", "low_zf", "n", "top", "top_zf", "zf_n",
                 "zf_sum")  # fmt: skip

    def __init__(self) -> None:
        self.n = 0  # recordings with a known norm
        self.bad: float | None = None  # the first non-finite norm with the most zeros
        self.bad_zf: float | None = None
        self.top: float | None = None  # the largest finite norm
        self.top_zf: float | None = None
        self.low: float | None = None  # the smallest finite norm
        self.low_zf: float | None = None
        self.log_sum = 0.0  # of log10 over the finite norms above zero
        self.log_n = 0
        self.zf_sum = 0.0
        self.zf_n = 0
        self.front: list[tuple[float, float]] = []  # (zero_frac, norm): zero_frac falling, norm rising

    def add(self, norm: float | None, zf: float | None) -> None:
        """One recording of the layer (``norm`` None: not recorded, left out like the detector does)."""
        if norm is None:
            return
        if zf is not None and not -math.inf < zf < math.inf:
            zf = None  # no share of zeros at all: it cannot mark the layer dead
        self.n += 1
        if zf is not None:
            self.zf_sum += zf
            self.zf_n += 1
        if not -math.inf < norm < math.inf:
            self._take_bad(norm, zf)
            return
        if norm > 0:
            self.log_sum += math.log10(norm)
            self.log_n += 1
        # _take_finite and _take_front inline: this runs for every layer of every recording read.
        z = 0.0 if zf is None else zf
        top = self.top
        if top is None or norm > top or (norm == top and z > _zf(self.top_zf)):
            self.top, self.top_zf = norm, zf
        low = self.low
        if low is None or norm < low or (norm == low and z > _zf(self.low_zf)):
            self.low, self.low_zf = norm, zf
        if zf is not None:
            front = self.front
            if len(front) != 1:
                self._take_front(((zf, norm),))
                return
            (z0, v0) = front[0]  # the common case: one point so far
            if z0 >= zf and v0 >= norm:
                return
            if zf >= z0 and norm >= v0:
                self.front = [(zf, norm)]
            else:
                self.front = [(zf, norm), (z0, v0)] if zf > z0 else [(z0, v0), (zf, norm)]

    def merge(self, other: LayerSummary) -> None:
        """The recordings of ``other``, which come after this summary's, added to it."""
        if not other.n:
            return
        self.n += other.n
        self.log_sum += other.log_sum
        self.log_n += other.log_n
        self.zf_sum += other.zf_sum
        self.zf_n += other.zf_n
        if other.bad is not None:
            self._take_bad(other.bad, other.bad_zf)
        if other.top is not None and other.low is not None:
            self._take_finite(other.top, other.top_zf, other.low, other.low_zf)
        if other.front:
            self._take_front(other.front)

    # A later recording takes the place of the one kept only when strictly more extreme: ties keep the first.
    def _take_bad(self, bad: float, zf: float | None) -> None:
        if self.bad is None or _zf(zf) > _zf(self.bad_zf):
            self.bad, self.bad_zf = bad, zf

    def _take_finite(self, top: float, top_zf: float | None, low: float, low_zf: float | None) -> None:
        if self.top is None or top > self.top or (top == self.top and _zf(top_zf) > _zf(self.top_zf)):
            self.top, self.top_zf = top, top_zf
        if self.low is None or low < self.low or (low == self.low and _zf(low_zf) > _zf(self.low_zf)):
            self.low, self.low_zf = low, low_zf

    def _take_front(self, points: Sequence[tuple[float, float]]) -> None:
        mine = self.front
        if not mine:
            self.front = list(points)
            return
        # Most points are matched by one already kept (a layer's share of zeros rarely changes).
        new = [p for p in points if not any(z >= p[0] and v >= p[1] for z, v in mine)]
        if new:
            self.front = _front([*mine, *new])

    def candidates(self) -> list[tuple[float, float | None]]:
        """``(norm, zero_frac)`` of the recordings that can decide this layer's cell under any limits."""
        out: list[tuple[float, float | None]] = []
        if self.bad is not None:
            out.append((self.bad, self.bad_zf))
        if self.top is not None:
            out.append((self.top, self.top_zf))
        if self.low is not None and (self.low != self.top or self.low_zf != self.top_zf):
            out.append((self.low, self.low_zf))  # not when it is the same recording (a single one)
        # A front point is most often the largest norm itself (a layer's share of zeros rarely moves).
        out.extend((norm, zf) for zf, norm in self.front if norm != self.top or zf != self.top_zf)
        return out

    def mean(self) -> tuple[float, float | None]:
        """The geometric mean norm and the mean zero fraction: a healthy cell's values."""
        norm = 10 ** (self.log_sum / self.log_n) if self.log_n else 0.0
        return norm, (self.zf_sum / self.zf_n if self.zf_n else None)

    def to_list(self) -> list[Any]:
        def num(v: float | None) -> float | str | None:
            return None if v is None else nonfinite_text(v)

        front = [x for p in self.front for x in p]
        return [self.n, num(self.bad), self.bad_zf, self.top, self.top_zf, self.low, self.low_zf,
                self.log_sum, self.log_n, self.zf_sum, self.zf_n, front]  # fmt: skip

    @classmethod
    def from_list(cls, v: Sequence[Any]) -> LayerSummary:
        s = cls()
        s.n, bad, s.bad_zf, s.top, s.top_zf, s.low, s.low_zf, s.log_sum, s.log_n, s.zf_sum, s.zf_n, flat = v
        s.bad = NONFINITE_TEXT.get(bad) if isinstance(bad, str) else bad
        s.front = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        return s


def _front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points ``(zero_frac, norm)`` no other matches or beats in both, zero fraction falling."""
    out: list[tuple[float, float]] = []
    for zf, norm in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not out or norm > out[-1][1]:
            out.append((zf, norm))
    return out


class Span:
    """The recordings of a range of steps, per layer, in the order the layers were first recorded."""

    __slots__ = ("cells", "first", "last", "n")

    def __init__(
        self, first: int, last: int, n: int = 0, cells: dict[str, LayerSummary] | None = None
    ) -> None:
        self.first = first
        self.last = last
        self.n = n  # recordings
        self.cells: dict[str, LayerSummary] = cells if cells is not None else {}

    @classmethod
    def of(cls, step: int, layers: Sequence[str], norm: Sequence[float | None],
           zero_frac: Sequence[float | None]) -> Span:  # fmt: skip
        """The span of one recording."""
        span = cls(step, step)
        span.add(step, layers, norm, zero_frac)
        return span

    def add(self, step: int, layers: Sequence[str], norm: Sequence[float | None],
            zero_frac: Sequence[float | None]) -> None:  # fmt: skip
        """One recording, at a step after this span's, added to it."""
        self.last = step
        self.n += 1
        cells = self.cells
        for name, v, zf in zip(layers, norm, zero_frac, strict=True):
            cell = cells.get(name)
            if cell is None:
                cell = cells[name] = LayerSummary()
            cell.add(v, zf)

    def merge(self, other: Span) -> None:
        """``other``, a later span, added to this one (and used up: its summaries may become ours)."""
        self.first = min(self.first, other.first)
        self.last = max(self.last, other.last)
        self.n += other.n
        for name, cell in other.cells.items():
            mine = self.cells.get(name)
            if mine is None:
                self.cells[name] = cell  # ``other`` is merged away: its summaries are ours to keep
            else:
                mine.merge(cell)

    def cells_json(self) -> str:
        return json.dumps({name: c.to_list() for name, c in self.cells.items()})

    @classmethod
    def from_row(cls, first: int, last: int, n: int, cells: str) -> Span:
        return cls(first, last, n, {k: LayerSummary.from_list(v) for k, v in json.loads(cells).items()})


def grid(lo: int, hi: int, points: int, levels: Sequence[int] = FLOW_LEVELS) -> tuple[int, int]:
    """``(column width, level)`` for a heat map of steps ``[lo, hi]`` in at most ``points`` columns.

    Columns are the steps ``c * width .. (c + 1) * width - 1`` (the last one also takes what lies
    past ``points`` columns), with ``width`` a multiple of ``level``: the coarsest stored level of
    which a column holds at least two buckets, so the map keeps at least ~2/3 of its ``points``
    and reads at most ~4 level rows per column. A column never splits a level's bucket, so a map
    merged from the levels and one merged from the recordings are the same columns. ``level`` 0
    where none fits (a column of fewer than 512 steps, ~10 recordings): the recordings are read.
    """
    span = hi - lo + 1
    points = max(1, points)
    fit = [v for v in levels if v * 2 * points <= span]
    level = fit[-1] if fit else 0
    unit = level or 1
    return unit * max(1, math.ceil(span / (points * unit))), level


def columns(spans: Iterable[Span], lo: int, width: int, points: int) -> list[Span]:
    """``spans`` (in step order, none across a column's edge) merged into the columns of :func:`grid`.

    The first span of each column becomes the column (merged into, not copied): pass spans no one
    else holds.
    """
    out: list[Span] = []
    key = -1
    for s in spans:
        k = min(s.first // width - lo // width, points - 1)
        if k != key or not out:
            key = k
            out.append(s)
        else:
            out[-1].merge(s)
    return out


def recording_columns(
    rows: Iterable[tuple[int, Sequence[str], Sequence[float | None], Sequence[float | None]]],
    lo: int, width: int, points: int,
) -> list[Span]:  # fmt: skip
    """Recordings ``(step, layers, norm, zero_frac)``, in step order, in the columns of :func:`grid`:
    what :func:`columns` makes of their spans, without a span per recording."""
    out: list[Span] = []
    key = -1
    for step, layers, norm, zf in rows:
        k = min(step // width - lo // width, points - 1)
        if k != key or not out:
            key = k
            out.append(Span(step, step))
        out[-1].add(step, layers, norm, zf)
    return out
