"""The gradient-flow heat map of the run page: layers × recorded steps. Pure, no I/O.

Each cell is one layer at one recording (every 50 steps): its gradient norm,
share of exact zeros and a state judged with the thresholds and rules of
:func:`steadytune.detect.gradflow.layer_state`, the detector's own rule, with the limits
:func:`steadytune.detect.build.layer_limits` gives it, so the page marks exactly the layers the
detector reports: dead (mostly exact zeros, embeddings aside), vanishing (norm below
``detect.grad.layer_vanish_norm``) and exploding (above ``layer_explode_norm``, or not finite).
The limits travel with the map, and the page's legend states them.

A long run is reduced to at most ``points`` columns of consecutive recordings, merged as
:mod:`steadytune.telemetry.store.flowsummary` keeps them (the store's levels answer a long run's
map without reading its recordings). A merged cell keeps its worst state, so one exploding
recording among a hundred stays visible, as the min..max band does on the line charts, and
shows the recording that is most so: a non-finite norm, else the largest (exploding); the
smallest (vanishing); the most zeros (dead). A healthy cell shows the geometric mean norm and
the mean share of zeros.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from steadytune.config.detect import DetectConfig
from steadytune.detect.build import layer_limits
from steadytune.detect.gradflow import LayerLimits, layer_state
from steadytune.records import nonfinite_text
from steadytune.telemetry.store import GradFlow, flowsummary
from steadytune.telemetry.store.flowsummary import LayerSummary, Span
from steadytune.telemetry.store.gradflow import FlowMap

OK, VANISHING, DEAD, EXPLODING = 0, 1, 2, 3
STATES = ("ok", "vanishing", "dead", "exploding")  # index = state code; worse states have higher codes
MAX_COLUMNS = 2000
DEFAULT_LIMITS = layer_limits(DetectConfig())


def cell_state(
    layer: str, norm: float | None, zero_frac: float | None, limits: LayerLimits = DEFAULT_LIMITS
) -> int | None:
    """The state code of one layer at one step; ``None`` when its norm is unknown."""
    if norm is None:
        return None
    return STATES.index(layer_state(layer, norm, zero_frac, **limits))


def _norm_json(v: float | None) -> float | str | None:
    return None if v is None else nonfinite_text(v)


def _extremity(state: int, norm: float, zf: float | None) -> tuple[float, float]:
    """How far one recording is into its (flagged) state, to pick the one a merged cell shows."""
    zeros = 0.0 if zf is None else zf
    if state == EXPLODING:
        return (norm if math.isfinite(norm) else math.inf), zeros
    if state == VANISHING:
        return -norm, zeros
    return zeros, norm  # dead


def judge(
    layer: str, cell: LayerSummary | None, limits: LayerLimits = DEFAULT_LIMITS
) -> tuple[float | str | None, float | None, int | None]:
    """``(norm, zero_frac, state)`` of one layer's merged cell; ``None``s when it was not recorded.

    The worst state of the cell's candidates (:meth:`LayerSummary.candidates`) is the worst of all
    its recordings, and the most extreme candidate in it is the most extreme of those recordings.
    """
    if cell is None or not cell.n:
        return None, None, None
    candidates = cell.candidates()
    states = [STATES.index(layer_state(layer, norm, zf, **limits)) for norm, zf in candidates]
    worst = max(states)
    if worst == OK:
        norm, zf = cell.mean()
        return norm, zf, OK
    norm, zf = max((c for c, s in zip(candidates, states, strict=True) if s == worst),
                   key=lambda c: _extremity(worst, *c))  # fmt: skip
    return _norm_json(norm), zf, worst


def _column(span: Span, layers: list[str], limits: LayerLimits) -> dict[str, Any]:
    norms, zeros, states = [], [], []
    for name in layers:
        norm, zf, state = judge(name, span.cells.get(name), limits)
        norms.append(norm)
        zeros.append(zf)
        states.append(state)
    return {
        "first": span.first,
        "last": span.last,
        "n": span.n,
        "norm": norms,
        "zero_frac": zeros,
        "state": states,
    }


def render(flow: FlowMap, limits: LayerLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The heat map of a store's :class:`FlowMap`, cells judged by ``limits``.

    Returns ``{"layers", "columns", "bucket", "total", "states", "thresholds"}``; each column is
    ``{"first", "last", "n", "norm", "zero_frac", "state"}`` with one entry per layer (``None``
    where the layer was not recorded; a non-finite norm as ``"nan"``/``"inf"``). ``bucket`` is
    the most recordings in one column (1: a column per recording). ``thresholds`` are the limits
    the states were judged by, for the page's legend.
    """
    seen: dict[str, None] = {}
    for c in flow.columns:
        for name in c.cells:
            seen.setdefault(name, None)
    layers = list(seen)
    return {
        "layers": layers,
        "columns": [_column(c, layers, limits) for c in flow.columns],
        "bucket": flow.bucket,
        "total": flow.total,
        "states": list(STATES),
        "thresholds": {
            "vanish_norm": limits["vanish"],
            "explode_norm": limits["explode"],
            "zero_frac": limits["dead_zero_frac"],
        },
    }


def build(
    rows: Sequence[GradFlow], points: int = 400, limits: LayerLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """The heat map of ``rows`` (oldest first) in at most ``points`` columns, as :func:`render` gives it:
    the recordings merged in the columns the store's levels would give (:func:`flowsummary.grid`)."""
    points = max(1, min(int(points), MAX_COLUMNS))
    if len(rows) > points:
        width, _ = flowsummary.grid(rows[0].step, rows[-1].step, points)
        recordings = ((r.step, r.layers, r.norm, r.zero_frac) for r in rows)
        spans = flowsummary.recording_columns(recordings, rows[0].step, width, points)
    else:
        spans = [Span.of(r.step, r.layers, r.norm, r.zero_frac) for r in rows]
    return render(FlowMap(spans, len(rows), max((s.n for s in spans), default=1)), limits)
