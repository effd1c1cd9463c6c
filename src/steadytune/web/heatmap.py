"""The gradient-flow heat map of the run page: layers × recorded steps. Pure, no I/O.

Each cell is one layer at one recording (every 50 steps): its gradient norm,
share of exact zeros and a state judged with the thresholds and rules of
:func:`steadytune.detect.gradflow.layer_state`, the detector's own rule, with the limits
:func:`steadytune.detect.build.layer_limits` gives it, so the page marks exactly the layers the
detector reports: dead (mostly exact zeros, embeddings aside), vanishing (norm below
``detect.grad.layer_vanish_norm``) and exploding (above ``layer_explode_norm``, or not finite).
The limits travel with the map, and the page's legend states them.

A long run is reduced to at most ``points`` columns of consecutive recordings;
a merged cell keeps its worst state, so one exploding recording among a hundred
stays visible, as the min..max band does on the line charts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from steadytune.config.detect import DetectConfig
from steadytune.detect.build import layer_limits
from steadytune.detect.gradflow import LayerLimits, layer_state
from steadytune.records import nonfinite_text
from steadytune.telemetry.store import GradFlow

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


def _severity(norm: float | None) -> float:
    """How far a norm is from healthy, to pick the cell that stands for a merged bucket."""
    if norm is None or not math.isfinite(norm):
        return math.inf
    return abs(math.log10(norm)) if norm > 0 else math.inf


def layer_order(rows: Sequence[GradFlow]) -> list[str]:
    """Every layer of ``rows``, in forward order as first recorded (a later run may add some)."""
    seen: dict[str, None] = {}
    for r in rows:
        for name in r.layers:
            seen.setdefault(name, None)
    return list(seen)


def _column(bucket: Sequence[GradFlow], layers: list[str], limits: LayerLimits) -> dict[str, Any]:
    norms: list[float | str | None] = []
    zeros: list[float | None] = []
    states: list[int | None] = []
    cells: dict[str, list[tuple[float | None, float | None, int | None]]] = {name: [] for name in layers}
    for r in bucket:
        for name, norm, zf in zip(r.layers, r.norm, r.zero_frac, strict=True):
            cells[name].append((norm, zf, cell_state(name, norm, zf, limits)))
    for name in layers:
        known = [c for c in cells[name] if c[2] is not None]
        if not known:
            norms.append(None)
            zeros.append(None)
            states.append(None)
            continue
        worst = max(c[2] for c in known if c[2] is not None)
        if worst == OK:
            # Healthy throughout: the geometric mean, the middle of a log colour scale.
            logs = [math.log10(c[0]) for c in known if c[0]]  # OK implies a finite norm >= the vanish limit
            norm = 10 ** (sum(logs) / len(logs))
            zfs = [c[1] for c in known if c[1] is not None]
            zf = sum(zfs) / len(zfs) if zfs else None
        else:
            # The most extreme flagged recording stands for the bucket.
            norm, zf, _ = max(
                (c for c in known if c[2] == worst), key=lambda c: (_severity(c[0]), c[1] or 0.0)
            )
        norms.append(_norm_json(norm))
        zeros.append(zf)
        states.append(worst)
    return {
        "first": bucket[0].step,
        "last": bucket[-1].step,
        "n": len(bucket),
        "norm": norms,
        "zero_frac": zeros,
        "state": states,
    }


def build(
    rows: Sequence[GradFlow], points: int = 400, limits: LayerLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """The heat map of ``rows`` (oldest first) in at most ``points`` columns, cells judged by ``limits``.

    Returns ``{"layers", "columns", "bucket", "total", "states", "thresholds"}``; each column is
    ``{"first", "last", "n", "norm", "zero_frac", "state"}`` with one entry per layer (``None``
    where the layer was not recorded; a non-finite norm as ``"nan"``/``"inf"``). ``thresholds``
    are the limits the states were judged by, for the page's legend.
    """
    points = max(1, min(int(points), MAX_COLUMNS))
    layers = layer_order(rows)
    size = max(1, math.ceil(len(rows) / points))
    columns = [_column(rows[i : i + size], layers, limits) for i in range(0, len(rows), size)]
    return {
        "layers": layers,
        "columns": columns,
        "bucket": size,
        "total": len(rows),
        "states": list(STATES),
        "thresholds": {
            "vanish_norm": limits["vanish"],
            "explode_norm": limits["explode"],
            "zero_frac": limits["dead_zero_frac"],
        },
    }
