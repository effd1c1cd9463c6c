"""Gradient flow in ``run.db``: the per-layer columns of a step's ``extra["gradflow"]`` and their reads."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from steadytune.records import NONFINITE_TEXT, nonfinite_text
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


class GradFlowQueries(StoreBase):
    """Reads of the ``gradflow`` table."""

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
