"""Gradient flow per layer: norm, share of exact zeros, and a coarse log10 histogram.

Called every N optimizer steps (``DEFAULT_INTERVAL``), after backward and before
the optimizer step. The statistics are of the gradients before clipping scaled
them: the HF Trainer clips before its last hook ahead of the optimizer step, so
the adapter passes ``scale=unclip_scale(norm, max_grad_norm)`` with the norm
clipping computed, and the clipped gradients are scaled back. Everything is
computed on the gradients' device and copied to the host once, in a single
sync, at the end.

The result is small and plain so it can ride in ``StepRecord.extra["gradflow"]``
(see :func:`columns`) and feed the dashboard heat map and
:func:`steadytune.detect.gradflow.check_layers`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from steadytune.layers import layer_of

DEFAULT_INTERVAL = 50  # steps between two recordings; benchmarks/gradflow_overhead.py measures the cost
# log10 bin edges of |grad|: [1e-10, 1e-9), ..., [1, 10]; values outside go to the edge bins, zeros to none.
DEFAULT_BINS: tuple[float, ...] = tuple(float(e) for e in range(-10, 2))


@lru_cache(maxsize=65536)
def _layer(name: str) -> tuple[str, tuple[int, int, str]]:
    return layer_of(name)


def should_record(step: int, interval: int = DEFAULT_INTERVAL) -> bool:
    """Whether optimizer step ``step`` is one to record (the first, then every ``interval``)."""
    return interval > 0 and (step == 1 or step % interval == 0)


def unclip_scale(pre_clip_norm: float | None, max_norm: float) -> float:
    """The factor that undoes ``clip_grad_norm_(params, max_norm)`` given the total norm it returned.

    torch (``clip_grads_with_norm_``, FSDP's ``clip_grad_norm_``) multiplies every gradient by
    ``min(1, max_norm / (norm + 1e-6))``; this is its inverse. 1.0 when clipping is off, left the
    gradients alone, or the norm is unknown or non-finite.
    """
    if pre_clip_norm is None or max_norm <= 0 or not math.isfinite(pre_clip_norm):
        return 1.0
    return max(1.0, (pre_clip_norm + 1e-6) / max_norm)


def layer_grad_stats(
    model: Any, bins: Sequence[float] = DEFAULT_BINS, scale: float = 1.0
) -> dict[str, dict[str, Any]]:
    """Per-layer gradient statistics, layers in forward order.

    Args:
        model: any ``torch.nn.Module`` (PEFT, DDP and compiled wrappers are fine).
        bins: increasing log10 edges of the |grad| histogram.
        scale: the statistics are of ``grad * scale`` (see :func:`unclip_scale`).

    Returns:
        ``{layer: {"norm": float, "zero_frac": float, "numel": int, "nonfinite": int, "hist": [int, ...]}}``;
        layers without gradients are left out. ``norm`` is NaN when any gradient entry of the layer is
        non-finite, and ``nonfinite`` counts its parameters with such entries. ``hist`` has
        ``len(bins) - 1`` counts of non-zero entries; magnitudes beyond the edges count in the edge bins.
    """
    names, numels, packed = _per_parameter(model, bins, scale)
    if not names:
        return {}
    return _by_layer(names, numels, packed, len(bins) - 1, scale)


def _per_parameter(
    model: Any, bins: Sequence[float], scale: float
) -> tuple[list[str], list[int], list[float]]:
    """Each parameter's name and size, and its sum of squares, zero count and histogram, packed.

    The reductions run on the gradients' device; ``packed`` (every sum of squares, then every
    zero count, then every histogram row) is the one copy to the host.
    """
    import torch

    lo, hi, nbins = float(bins[0]), float(bins[-1]), len(bins) - 1
    names: list[str] = []
    sumsq, zeros, hists, numels = [], [], [], []
    for name, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        g = g.detach()
        if g.is_sparse:
            g = g.to_dense()
        g = g.float()
        names.append(name)
        numels.append(g.numel())
        # A NaN/Inf anywhere makes the sum non-finite: flagged per parameter without an isfinite pass.
        sumsq.append(g.square().sum())
        z = (g == 0).sum()
        zeros.append(z)
        # Clamping puts out-of-range magnitudes in the edge bins; zeros land in the first bin and are
        # taken out again; NaN stays NaN and histc skips it.
        mag = g.abs()
        if scale != 1.0:
            mag.mul_(scale)
        logs = mag.clamp_(10.0**lo, 10.0**hi).log10_()
        h = torch.histc(logs, bins=nbins, min=lo, max=hi)
        h[0] -= z
        hists.append(h)
    if not names:
        return [], [], []
    # One device-to-host copy for everything: this is the only sync point.
    packed = (
        torch.cat([torch.stack(sumsq), torch.stack(zeros).float(), torch.stack(hists).flatten()])
        .cpu()
        .tolist()
    )
    return names, numels, packed


def _by_layer(
    names: list[str], numels: list[int], packed: list[float], nbins: int, scale: float
) -> dict[str, dict[str, Any]]:
    """The per-parameter figures summed per layer, layers in forward order (plain Python, no torch)."""
    n = len(names)
    sq_l, zero_l, hist_flat = packed[:n], packed[n : 2 * n], packed[2 * n :]
    acc: dict[str, dict[str, Any]] = {}
    keys: dict[str, tuple[int, int, str]] = {}
    for i, name in enumerate(names):
        layer, key = _layer(name)
        keys.setdefault(layer, key)
        a = acc.setdefault(
            layer, {"sumsq": 0.0, "zeros": 0.0, "numel": 0, "nonfinite": 0, "hist": [0.0] * nbins}
        )
        if math.isfinite(sq_l[i]):
            a["sumsq"] += sq_l[i]
        else:
            a["nonfinite"] += 1
        a["zeros"] += zero_l[i]
        a["numel"] += numels[i]
        row = hist_flat[i * nbins : (i + 1) * nbins]
        a["hist"] = [x + y for x, y in zip(a["hist"], row, strict=True)]
    out: dict[str, dict[str, Any]] = {}
    for layer in sorted(acc, key=lambda k: keys[k]):
        a = acc[layer]
        norm = math.nan if a["nonfinite"] else math.sqrt(a["sumsq"]) * scale
        out[layer] = {
            "norm": norm,
            "zero_frac": a["zeros"] / max(a["numel"], 1),
            "numel": a["numel"],
            "nonfinite": a["nonfinite"],
            "hist": [int(x) for x in a["hist"]],
        }
    return out


def columns(stats: dict[str, dict[str, Any]], bins: Sequence[float] = DEFAULT_BINS) -> dict[str, Any]:
    """The storage/dashboard shape: ``{"layers", "norm", "zero_frac", "hist", "bins"}`` as parallel lists."""
    layers = list(stats)
    return {
        "layers": layers,
        "norm": [stats[k]["norm"] for k in layers],
        "zero_frac": [round(stats[k]["zero_frac"], 6) for k in layers],
        "hist": [stats[k]["hist"] for k in layers],
        "bins": [float(b) for b in bins],
    }
