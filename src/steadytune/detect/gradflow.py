"""Judge recorded gradient flow: dead, vanishing and exploding layers. Pure, no torch.

Input is what :func:`steadytune.guard.gradflow.layer_grad_stats` returns (or its
column form stored in ``StepRecord.extra["gradflow"]``). The thresholds are
``detect.grad.layer_*``, handed over as :class:`LayerLimits` by
:func:`steadytune.detect.build.layer_limits`: absolute norms of the raw (pre-clip)
gradient of one layer. The dashboard's heat map classifies its cells with
:func:`layer_state`, so it marks what the detector reports.

Embeddings are left out of the zero-fraction rule: only the rows of tokens in
the batch get a gradient, so a mostly-zero embedding gradient is normal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

from steadytune.detect.base import Finding, Reporter
from steadytune.detect.grad import KINDS
from steadytune.detect.points import Signal
from steadytune.layers import EMBEDDINGS
from steadytune.objectives import is_rl, without_learning_signal
from steadytune.records import Anomaly


class LayerLimits(TypedDict):
    """The per-layer rule's thresholds, as keyword arguments of :func:`layer_state` and :func:`check_layers`.

    ``vanish``: a layer norm below this is vanishing; ``explode``: above this (or
    non-finite) it is exploding; ``dead_zero_frac``: a share of exact zeros above
    this is a dead layer.
    """

    vanish: float
    explode: float
    dead_zero_frac: float


def as_rows(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Accept both shapes: ``{layer: {...}}`` or ``{"layers": [...], "norm": [...], ...}``."""
    if isinstance(stats.get("layers"), list):
        cols = stats
        return {
            name: {"norm": cols["norm"][i], "zero_frac": cols["zero_frac"][i]}
            for i, name in enumerate(cols["layers"])
        }
    return stats


def layer_state(
    layer: str,
    norm: float,
    zero_frac: float | None,
    *,
    vanish: float,
    explode: float,
    dead_zero_frac: float,
) -> str:
    """``"exploding"``, ``"vanishing"``, ``"dead"`` or ``"ok"`` for one layer at one recording."""
    if not math.isfinite(norm) or norm > explode:
        return "exploding"
    if norm < vanish:
        return "vanishing"
    if zero_frac is not None and zero_frac > dead_zero_frac and layer != EMBEDDINGS:
        # Only the rows of the batch's tokens get a gradient: a sparse embedding gradient is normal.
        return "dead"
    return "ok"


def _anomaly(kind: str, layer: str, step: int, evidence: dict[str, Any], cause: str) -> Anomaly:
    info = KINDS[kind]
    return Anomaly(
        kind=kind,
        severity=info.severity,
        start_step=step,
        end_step=step,
        metric=f"grad_norm/{layer}",
        evidence={"layer": layer, **evidence},
        cause=cause,
        suggestion=info.suggestion,
    )


def check_layers(
    stats: dict[str, Any],
    step: int = 0,
    *,
    vanish: float,
    explode: float,
    dead_zero_frac: float,
) -> list[Anomaly]:
    """One anomaly per dead/vanishing (``grad_vanishing``) or exploding (``grad_explosion``) layer.

    Args:
        stats: per-layer gradient statistics, in forward order.
        step: the optimizer step they were recorded at.
        vanish: a layer norm below this is vanishing.
        explode: a layer norm above this (or non-finite) is exploding.
        dead_zero_frac: a share of exact zeros above this is a dead layer.
    """
    out: list[Anomaly] = []
    for layer, row in as_rows(stats).items():
        norm = float(row.get("norm", math.nan))
        zf = float(row.get("zero_frac", 0.0))
        ev = {"value": norm if math.isfinite(norm) else str(norm), "zero_frac": round(zf, 4)}
        state = layer_state(layer, norm, zf, vanish=vanish, explode=explode, dead_zero_frac=dead_zero_frac)
        if state == "exploding":
            cause = f"layer {layer}: gradient norm {norm:.3g} exceeds {explode:g}"
            out.append(_anomaly("grad_explosion", layer, step, ev, cause))
        elif state == "vanishing":
            cause = f"layer {layer}: gradient norm {norm:.3g} is below {vanish:g} (vanishing)"
            out.append(_anomaly("grad_vanishing", layer, step, ev, cause))
        elif state == "dead":
            cause = f"layer {layer}: {zf:.0%} of its gradient entries are exactly zero (dead units)"
            out.append(_anomaly("grad_vanishing", layer, step, ev, cause))
    return out


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """As ``detect.grad`` names them (docs/detectors.md); :meth:`layers` is what :func:`layer_state` takes."""

    layer_vanish_norm: float
    layer_explode_norm: float
    layer_dead_zero_frac: float
    zero_grad_norm: float

    def layers(self) -> LayerLimits:
        return LayerLimits(
            vanish=self.layer_vanish_norm,
            explode=self.layer_explode_norm,
            dead_zero_frac=self.layer_dead_zero_frac,
        )


# The episode the layers' findings belong to: a layer's gradient is a part of the model's, so layers
# that explode (or vanish) at one step, with the model's norm or without it, are one incident: one
# episode per kind on the model's metric, its evidence naming the layers (detect/episodes.py, groups).
GROUP = "grad_norm"


class GradFlowWatch:
    """grad_vanishing / grad_explosion per layer, from the gradient flow the guard records.

    A step on which the whole model got no gradient (a norm of zero, or an RL batch whose
    groups all tied) is one fact about the run, which ``no_learning_signal`` judges over a
    window: not one vanishing layer per layer. So is a recording in which every layer
    vanished at once, when the run logs no global norm: one finding, on all layers.
    """

    reports: ClassVar[tuple[str, ...]] = ("grad_vanishing", "grad_explosion")
    needs: ClassVar[tuple[str, ...]] = ("extra",)  # the flow rides in the record's extra

    def __init__(self, limits: FlowLimits) -> None:
        self.rep = Reporter(None)
        self._limits = limits.layers()
        self._zero = limits.zero_grad_norm

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """The layers' gradient flow, on the steps the guard recorded it."""
        rec = point.rec
        flow = rec.extra.get("gradflow") if rec.extra else None
        if not isinstance(flow, dict):
            return
        g = rec.grad_norm
        if (g is not None and g <= self._zero) or (
            is_rl(point.objective) and without_learning_signal(rec.extra, g)
        ):
            return
        self.judge(rec.step, flow, out)

    def judge(self, step: int, flow: dict[str, Any], out: list[Finding]) -> None:
        found = check_layers(flow, step, **self._limits)
        if (
            len(found) > 1
            and len(found) == len(as_rows(flow))
            and all(a.kind == "grad_vanishing" for a in found)
        ):
            norms = [a.evidence.get("value") for a in found]
            ev = {
                "layers": len(found),
                "largest_norm": max((n for n in norms if isinstance(n, float)), default=None),
            }
            cause = (
                f"every layer's gradient norm is below {self._limits['vanish']:g}: the whole model gets none"
            )
            found = [_anomaly("grad_vanishing", "all layers", step, ev, cause)]
        now = {(a.kind, a.metric): a for a in found}
        for (kind, metric), a in now.items():
            self.rep.report(
                out,
                kind,
                metric,
                step,
                True,
                severity=a.severity,
                evidence=a.evidence,
                cause=a.cause,
                group=GROUP,
            )
        for kind, metric in list(self.rep.on):
            if (kind, metric) not in now:
                self.rep.report(out, kind, metric, step, False)
