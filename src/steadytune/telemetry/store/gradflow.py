"""Gradient flow in ``run.db``: the per-layer columns of a step's ``extra["gradflow"]``, their reads, and
the heat map's summary levels (``gradflow_levels``, see :mod:`.flowsummary`), kept with them."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.records import NONFINITE_TEXT, nonfinite_text
from steadytune.telemetry.store.flowsummary import FLOW_LEVELS, Span, columns, grid, recording_columns
from steadytune.telemetry.store.schema import StoreBase


def flow_num(value: Any) -> float | None:
    """A per-layer number as recorded: a float, or "nan"/"inf" after a JSONL round trip."""
    if isinstance(value, str):
        return NONFINITE_TEXT.get(value.strip().lower())
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _flow_text(values: Sequence[float | None]) -> str:
    """JSON of per-layer numbers; a NaN/Inf norm is the evidence of an exploding layer, so it is kept
    as text."""
    return json.dumps([None if v is None else nonfinite_text(v) for v in values])


def flow_columns(flow: Any) -> tuple[str, str, str, str | None, str | None] | None:
    """The stored columns of a ``gradflow`` extra, or ``None`` when it is not one.

    A malformed extra (a newer or foreign writer) is left out rather than failing the
    whole batch: the steps still go in.
    """
    if not isinstance(flow, dict):
        return None
    layers, norm = flow.get("layers"), flow.get("norm")
    if not isinstance(layers, list) or not isinstance(norm, list) or not layers or len(layers) != len(norm):
        return None
    zero = flow.get("zero_frac")
    if not isinstance(zero, list) or len(zero) != len(layers):
        zero = [None] * len(layers)
    hist, bins = flow.get("hist"), flow.get("bins")
    return (
        json.dumps([str(x) for x in layers]),
        _flow_text([flow_num(v) for v in norm]),
        _flow_text([flow_num(v) for v in zero]),
        json.dumps(hist) if isinstance(hist, list) and len(hist) == len(layers) else None,
        json.dumps(bins) if isinstance(bins, list) else None,
    )


@dataclass(frozen=True)
class GradFlow:
    """The per-layer gradient statistics recorded at one step, layers in forward order.

    ``norm`` is NaN/Inf where a layer's gradient was not finite, ``None`` where unknown.
    ``hist`` (per layer, counts over the log10 ``bins`` of |grad|) is read only on request.
    """

    step: int
    attempt: int
    ts: float
    layers: tuple[str, ...]
    norm: tuple[float | None, ...]
    zero_frac: tuple[float | None, ...]
    version: int
    hist: tuple[tuple[int, ...], ...] | None = None
    bins: tuple[float, ...] | None = None


def _nums(text: str) -> list[float | None]:
    # The common case first: 1.4M numbers on a long run.
    return [v if type(v) is float else flow_num(v) for v in json.loads(text)]


def refresh_levels(
    db: sqlite3.Connection, rank: int | None = None, lo: int | None = None, hi: int | None = None,
    front: dict[int, int] | None = None,
) -> None:  # fmt: skip
    """Recompute the heat map's levels over steps ``[lo, hi]`` of ``rank`` (None: every rank, every
    step) from the raw recordings, each level from the one below, in the caller's transaction.

    From the recordings, not added to what is stored: a later attempt that replaced or dropped a
    recording leaves no trace of the old one.

    ``front``: the newest finest bucket this process wrote, per rank (kept by the caller). A
    level's newest bucket is left to wait while a live run appends (eleven levels rewritten per
    recording were 5 ms of the supervisor's time every 50 steps), as the series' coarse levels
    wait (``StoreBase.refresh_coarse``): :meth:`GradFlowQueries.flow_map` reads the run's newest
    bucket of a level from the finest level, and the newest finest bucket from its recordings
    (at most ~5), so it loses nothing.
    """
    if rank is None:
        for (r,) in db.execute("SELECT DISTINCT rank FROM gradflow").fetchall():
            refresh_levels(db, r, lo, hi)
        db.execute("DELETE FROM gradflow_levels WHERE rank NOT IN (SELECT DISTINCT rank FROM gradflow)")
        return
    if lo is None or hi is None:
        lo, hi = db.execute("SELECT MIN(step), MAX(step) FROM gradflow WHERE rank=?", (rank,)).fetchone()
        if lo is None or hi is None:
            return
    unit = FLOW_LEVELS[0]
    b_lo, b_hi = lo // unit, hi // unit
    append = False
    if front is not None:
        newest = front.get(rank)
        if newest is None:
            # The first write here: the newest bucket of an earlier writer may not have been brought up.
            row = db.execute(
                "SELECT MAX(bucket) FROM gradflow_levels WHERE rank=? AND level=? AND bucket<?",
                (rank, unit, b_lo),
            ).fetchone()
            newest = b_lo if row[0] is None else int(row[0])
        elif b_lo == b_hi == newest:
            return
        front[rank] = max(b_hi, newest)
        # Recordings past the newest bucket (a live run's): at each level, what they completed, from
        # the bucket that held the newest to the one before that holding the new newest, is written
        # once; the new newest waits (``flow_map`` reads it from the level below, the finest from the
        # recordings). ~2 buckets written per 256 steps.
        append = newest < b_lo
        b_lo = min(b_lo, newest)
    made: dict[int, Span] = {}
    names: dict[str, list[str]] = {}
    for step, layers, norm, zf in db.execute(
        "SELECT step, layers, norm, zero_frac FROM gradflow WHERE rank=? AND step BETWEEN ? AND ? "
        "ORDER BY step",
        (rank, b_lo * unit, (b_hi - append) * unit + unit - 1),
    ):
        layer_names = names.get(layers)
        if layer_names is None:
            layer_names = names[layers] = json.loads(layers)
        span = made.get(step // unit)
        if span is None:
            span = made[step // unit] = Span(step, step)
        span.add(step, layer_names, _nums(norm), _nums(zf))
    _write_level(db, rank, 0, b_lo, b_hi - append, made)
    known = (b_lo, b_hi - append)  # the buckets of the level below that ``made`` holds (others are empty)
    for k in range(1, len(FLOW_LEVELS)):
        lo_k, hi_k = b_lo >> k, (b_hi >> k) - append
        if lo_k > hi_k:
            break
        # The buckets below that were just made are at hand; the others in these buckets are read.
        below = {b: span for b, span in made.items() if 2 * lo_k <= b <= 2 * hi_k + 1}
        for first, last, n, cells, b in db.execute(
            "SELECT first, last, n, cells, bucket FROM gradflow_levels WHERE rank=? AND level=? "
            "AND bucket BETWEEN ? AND ? AND bucket NOT BETWEEN ? AND ?",
            (rank, FLOW_LEVELS[k - 1], 2 * lo_k, 2 * hi_k + 1, *known),
        ):
            below[b] = Span.from_row(first, last, n, cells)
        known, made = (lo_k, hi_k), {}
        for b in sorted(below):
            # The spans below are written already: the first of each pair becomes the one above.
            if b >> 1 in made:
                made[b >> 1].merge(below[b])
            else:
                made[b >> 1] = below[b]
        _write_level(db, rank, k, lo_k, hi_k, made)


def _write_level(
    db: sqlite3.Connection, rank: int, k: int, b_lo: int, b_hi: int, made: dict[int, Span]
) -> None:
    """Level ``k``'s buckets ``b_lo..b_hi`` of ``rank`` replaced by ``made`` (a bucket left empty goes)."""
    level = FLOW_LEVELS[k]
    db.execute(
        "DELETE FROM gradflow_levels WHERE rank=? AND level=? AND bucket BETWEEN ? AND ?",
        (rank, level, b_lo, b_hi),
    )
    db.executemany(
        "INSERT INTO gradflow_levels(rank, level, bucket, first, last, n, cells) VALUES(?, ?, ?, ?, ?, ?, ?)",
        [(rank, level, b, s.first, s.last, s.n, s.cells_json()) for b, s in sorted(made.items())],
    )


@dataclass(frozen=True)
class FlowMap:
    """The heat map's columns of a range of steps, merged (see :mod:`.flowsummary`), and how many
    recordings the range holds. ``bucket``: the most recordings in one column (1: none merged)."""

    columns: list[Span]
    total: int
    bucket: int


class GradFlowQueries(StoreBase):
    """Reads of the ``gradflow`` table, and the upkeep of its levels."""

    def _open(self, path: Path | str, readonly: bool) -> None:
        super()._open(path, readonly)
        if not readonly and self.get_meta("gradflow_levels") is None:
            # An index made before the heat map's levels: build them from the recordings, once. Opened
            # read-only, it is answered from the recordings (flow_map).
            with self._lock, self._db:
                refresh_levels(self._db)
                self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('gradflow_levels', '1')")

    def flow_map(
        self, lo: float | None = None, hi: float | None = None, points: int = 400, rank: int = 0,
        levels: bool = True,
    ) -> FlowMap:  # fmt: skip
        """The recordings of steps in ``[lo, hi]`` in at most ``points`` columns (one per recording when
        they are that few), from the stored levels where a column holds at least two buckets of the
        finest (:func:`.flowsummary.grid`; ``levels=False``: from the recordings, as an index that
        has no levels is answered). The columns are the same either way.

        A level bucket only partly in the range is not used: the recordings past the range's edge
        would join it. Its recordings in the range are read instead (at most two buckets' worth).
        """
        points = max(1, int(points))
        lo_ = -(2**62) if lo is None else math.floor(lo)
        hi_ = 2**62 if hi is None else math.ceil(hi)
        with self._lock:
            try:
                first, last, total = self._db.execute(
                    "SELECT MIN(step), MAX(step), COUNT(*) FROM gradflow "
                    "WHERE rank=? AND step BETWEEN ? AND ?",
                    (rank, lo_, hi_),
                ).fetchone()
            except sqlite3.OperationalError:
                return FlowMap([], 0, 1)  # an index written before gradient flow was kept, opened read-only
            if not total:
                return FlowMap([], 0, 1)
            # Nothing lies before the run's first recording or after its last: a bucket across those is whole.
            run_first, run_last = self._db.execute(
                "SELECT (SELECT MIN(step) FROM gradflow WHERE rank=?), "
                "(SELECT MAX(step) FROM gradflow WHERE rank=?)",
                (rank, rank),
            ).fetchone()
            whole_lo, whole_hi = lo_ <= run_first, hi_ >= run_last
            lo_, hi_ = max(lo_, first), min(hi_, last)
            use_levels = levels and self.get_meta("gradflow_levels") == "1"
            if total <= points:
                return FlowMap(self._raw_spans(lo_, hi_, rank), total, 1)
            width, level = grid(lo_, hi_, points)  # the same columns whether the levels are there or not
            full_lo, full_hi = 0, -1
            if level and use_levels:
                full_lo = lo_ // level if whole_lo else -(-lo_ // level)
                full_hi = hi_ // level if whole_hi else (hi_ + 1) // level - 1
            if full_lo > full_hi:
                rows = ((r.step, r.layers, r.norm, r.zero_frac) for r in self.gradflow(lo_, hi_, rank))
                cols = recording_columns(rows, lo_, width, points)
                return FlowMap(cols, total, max(c.n for c in cols))
            # A level's newest bucket waits for the run to pass it (refresh_levels): the run's newest
            # is read from the finest level, and the newest of those from the recordings.
            unit = FLOW_LEVELS[0]
            newest, newest_unit = run_last // level, run_last // unit
            sql = (
                "SELECT first, last, n, cells FROM gradflow_levels WHERE rank=? AND level=? "
                "AND bucket BETWEEN ? AND ? ORDER BY bucket"
            )
            stored = self._db.execute(sql, (rank, level, full_lo, min(full_hi, newest - 1))).fetchall()
            raw_from = (full_hi + 1) * level
            if full_hi >= newest:
                if level > unit:
                    stored += self._db.execute(
                        sql, (rank, unit, newest * level // unit, newest_unit - 1)
                    ).fetchall()
                raw_from = newest_unit * unit
            spans = [
                *self._raw_spans(lo_, full_lo * level - 1, rank),
                *(Span.from_row(*r) for r in stored),
                *self._raw_spans(raw_from, hi_, rank),
            ]
        cols = columns(spans, lo_, width, points)
        return FlowMap(cols, total, max((c.n for c in cols), default=1))

    @staticmethod
    def _raw_span(r: GradFlow) -> Span:
        return Span.of(r.step, r.layers, r.norm, r.zero_frac)

    def _raw_spans(self, lo: int, hi: int, rank: int) -> list[Span]:
        return [self._raw_span(r) for r in self.gradflow(lo, hi, rank)] if lo <= hi else []

    def gradflow(
        self, lo: float | None = None, hi: float | None = None, rank: int = 0, hist: bool = False,
        limit: int = 200_000,
    ) -> list[GradFlow]:  # fmt: skip
        """The gradient-flow recordings of steps in ``[lo, hi]``, oldest first.

        Every 50 steps, a million-step run has 20,000 of them: few enough to read whole
        (the histograms, the bulk of a row, only when ``hist`` is asked for).
        """
        sql = (
            f"SELECT step, attempt, ts, layers, norm, zero_frac, version{', hist, bins' if hist else ''} "
            "FROM gradflow WHERE rank=? AND step BETWEEN ? AND ? ORDER BY step LIMIT ?"
        )
        lo_ = -(2**62) if lo is None else math.floor(lo)
        hi_ = 2**62 if hi is None else math.ceil(hi)
        return self._gradflow_rows(sql, (rank, lo_, hi_, limit), hist)

    def gradflow_since(self, version: int, rank: int = 0, limit: int = 500) -> list[GradFlow]:
        """Recordings added or replaced after ``version`` (the step versions of :meth:`steps_since`)."""
        sql = (
            "SELECT step, attempt, ts, layers, norm, zero_frac, version FROM gradflow "
            "WHERE rank=? AND version>? ORDER BY version LIMIT ?"
        )
        return self._gradflow_rows(sql, (rank, version, limit), False)

    def _gradflow_rows(self, sql: str, params: tuple[Any, ...], hist: bool) -> list[GradFlow]:
        with self._lock:
            try:
                raw = self._db.execute(sql, params).fetchall()
            except sqlite3.OperationalError:
                return []  # an index written before gradient flow was kept, opened read-only
        out = []
        names: dict[str, tuple[str, ...]] = {}  # the same layer list on every row: parse it once

        def num(v: Any) -> float | None:
            return v if type(v) is float else flow_num(v)  # the common case first: 1.4M calls on a long run

        for r in raw:
            layers = names.get(r[3])
            if layers is None:
                layers = names[r[3]] = tuple(json.loads(r[3]))
            hists = bins = None
            if hist and r[7] is not None:
                hists = tuple(tuple(int(x) for x in h) for h in json.loads(r[7]))
            if hist and r[8] is not None:
                bins = tuple(float(b) for b in json.loads(r[8]))
            out.append(GradFlow(
                step=r[0], attempt=r[1], ts=r[2], layers=layers, norm=tuple(map(num, json.loads(r[4]))),
                zero_frac=tuple(map(num, json.loads(r[5]))), version=r[6], hist=hists, bins=bins,
            ))  # fmt: skip
        return out
