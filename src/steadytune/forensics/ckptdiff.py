"""``diff-ckpt``: what changed between two checkpoints, tensor by tensor and layer by layer.

Both sides are streamed a chunk at a time (:mod:`.stread`), so two 15 GB
checkpoints cost a few MB of RAM, not 30 GB. Per tensor: the L2 norm of the
change, the change relative to A's norm, the largest absolute change, NaN/Inf
counts and the ratio of the norms. The verdict names the *problem layer*: the
first layer in forward order with non-finite values, else the first whose
change is an outlier against the other layers (robust z-score of the log
relative change).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from steadytune.forensics.stread import DEFAULT_CHUNK, TensorRef, iter_chunks, tensor_index
from steadytune.layers import layer_of

OUTLIER_Z = 3.5
MAD_FLOOR = 0.1  # log10 units: layers whose changes differ by < ~25% are never outliers of each other
_EPS = 1e-12


@dataclass
class TensorDiff:
    name: str
    layer: str
    shape: tuple[int, ...]
    status: str  # changed / same / added / removed / reshaped
    numel: int = 0
    norm_a: float = 0.0
    norm_b: float = 0.0
    l2_change: float = 0.0
    rel_change: float = 0.0
    max_abs: float = 0.0
    nan_a: int = 0
    inf_a: int = 0
    nan_b: int = 0
    inf_b: int = 0
    norm_ratio: float | None = None

    @property
    def nonfinite_b(self) -> int:
        return self.nan_b + self.inf_b


@dataclass
class LayerDiff:
    name: str
    tensors: int = 0
    norm_a: float = 0.0
    norm_b: float = 0.0
    l2_change: float = 0.0
    rel_change: float = 0.0
    max_abs: float = 0.0
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    z: float | None = None


@dataclass
class CheckpointDiff:
    a: str
    b: str
    tensors: list[TensorDiff] = field(default_factory=list)
    layers: list[LayerDiff] = field(default_factory=list)
    problem_layer: str | None = None
    reason: str = ""
    bytes_read: int = 0

    def top(self, n: int) -> list[tuple[int, TensorDiff]]:
        """The ``n`` tensors that changed most (non-finite first), as ``(rank, diff)`` in forward order."""
        order = {t.name: i for i, t in enumerate(self.tensors)}
        ranked = sorted(self.tensors, key=lambda t: (-t.nonfinite_b, -t.rel_change))[:n]
        ranks = {t.name: r for r, t in enumerate(ranked, 1)}
        return [(ranks[t.name], t) for t in sorted(ranked, key=lambda t: order[t.name])]

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        def clean(d: dict[str, Any]) -> dict[str, Any]:
            return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}

        tensors = [t for _, t in self.top(top)] if top else self.tensors
        return {
            "a": self.a,
            "b": self.b,
            "problem_layer": self.problem_layer,
            "reason": self.reason,
            "layers": [clean(asdict(x)) for x in self.layers],
            "tensors": [clean({**asdict(t), "shape": list(t.shape)}) for t in tensors],
        }


def _stats(ref: TensorRef, chunk: int) -> tuple[float, int, int]:
    """Sum of squares (finite values), NaN count, Inf count of one tensor."""
    import numpy as np

    sq, nan, inf = 0.0, 0, 0
    for x in iter_chunks(ref, chunk):
        finite = np.isfinite(x)
        if not finite.all():
            nan += int(np.isnan(x).sum())
            inf += int(np.isinf(x).sum())
            x = x[finite]
        sq += float(np.dot(x.astype(np.float64), x.astype(np.float64)))
    return sq, nan, inf


def diff_tensor(a: TensorRef, b: TensorRef, chunk: int = DEFAULT_CHUNK) -> TensorDiff:
    """Compare two tensors of the same shape, one chunk of each at a time."""
    import numpy as np

    out = TensorDiff(b.name, layer_of(b.name)[0], b.shape, "changed", numel=b.numel)
    sa = sb = sd = 0.0
    for xa, xb in zip(iter_chunks(a, chunk), iter_chunks(b, chunk), strict=True):
        fa, fb = np.isfinite(xa), np.isfinite(xb)
        if not fa.all():
            out.nan_a += int(np.isnan(xa).sum())
            out.inf_a += int(np.isinf(xa).sum())
        if not fb.all():
            out.nan_b += int(np.isnan(xb).sum())
            out.inf_b += int(np.isinf(xb).sum())
        both = fa & fb
        if not both.all():
            xa, xb = xa[both], xb[both]
        da, db = xa.astype(np.float64), xb.astype(np.float64)
        d = db - da
        sa += float(np.dot(da, da))
        sb += float(np.dot(db, db))
        sd += float(np.dot(d, d))
        if d.size:  # max |d| without another temporary array
            out.max_abs = max(out.max_abs, float(d.max()), -float(d.min()))
    out.norm_a, out.norm_b, out.l2_change = math.sqrt(sa), math.sqrt(sb), math.sqrt(sd)
    out.rel_change = out.l2_change / max(out.norm_a, _EPS)
    out.norm_ratio = out.norm_b / out.norm_a if out.norm_a > 0 else None
    if out.l2_change == 0 and not out.nonfinite_b and out.nan_a + out.inf_a == 0:
        out.status = "same"
    return out


def _one_side(ref: TensorRef, status: str, chunk: int) -> TensorDiff:
    sq, nan, inf = _stats(ref, chunk)
    t = TensorDiff(ref.name, layer_of(ref.name)[0], ref.shape, status, numel=ref.numel)
    if status == "removed":
        t.norm_a, t.nan_a, t.inf_a = math.sqrt(sq), nan, inf
    else:
        t.norm_b, t.nan_b, t.inf_b = math.sqrt(sq), nan, inf
    return t


def _robust_z(values: list[float]) -> list[float | None]:
    finite = sorted(v for v in values if math.isfinite(v))
    if len(finite) < 3:
        return [None] * len(values)
    med = (
        finite[len(finite) // 2]
        if len(finite) % 2
        else (finite[len(finite) // 2 - 1] + finite[len(finite) // 2]) / 2
    )
    dev = sorted(abs(v - med) for v in finite)
    mad = dev[len(dev) // 2]
    scale = max(1.4826 * mad, MAD_FLOOR)
    return [(v - med) / scale if math.isfinite(v) else None for v in values]


def summarize_layers(tensors: list[TensorDiff]) -> list[LayerDiff]:
    """Per-layer totals in forward order, with the robust z of each layer's log relative change."""
    keys: dict[str, tuple[int, int, str]] = {}
    layers: dict[str, LayerDiff] = {}
    sq: dict[str, list[float]] = {}
    for t in tensors:
        name, key = layer_of(t.name)
        keys.setdefault(name, key)
        lay = layers.setdefault(name, LayerDiff(name))
        acc = sq.setdefault(name, [0.0, 0.0, 0.0])
        lay.tensors += 1
        acc[0] += t.norm_a**2
        acc[1] += t.norm_b**2
        acc[2] += t.l2_change**2
        lay.max_abs = max(lay.max_abs, t.max_abs)
        lay.nonfinite_a += t.nan_a + t.inf_a
        lay.nonfinite_b += t.nonfinite_b
    ordered = sorted(layers.values(), key=lambda x: keys[x.name])
    for lay in ordered:
        a2, b2, d2 = sq[lay.name]
        lay.norm_a, lay.norm_b, lay.l2_change = math.sqrt(a2), math.sqrt(b2), math.sqrt(d2)
        lay.rel_change = lay.l2_change / max(lay.norm_a, _EPS)
    logs = [math.log10(x.rel_change) if x.rel_change > 0 else -math.inf for x in ordered]
    for lay, z in zip(ordered, _robust_z(logs), strict=True):
        lay.z = z
    return ordered


def find_problem(layers: list[LayerDiff], tensors: list[TensorDiff]) -> tuple[str | None, str]:
    """The first layer with non-finite values, else the first outlier; and why."""
    for lay in layers:
        if lay.nonfinite_b:
            worst = max((t for t in tensors if t.layer == lay.name), key=lambda t: t.nonfinite_b)
            return lay.name, (
                f"{lay.nonfinite_b} non-finite value(s) in B, e.g. {worst.nan_b} NaN / {worst.inf_b} Inf "
                f"in {worst.name}; every layer before it is finite"
            )
    for lay in layers:
        if lay.z is not None and lay.z > OUTLIER_Z:
            return lay.name, (
                f"relative change {lay.rel_change:.3g} is an outlier (robust z {lay.z:.1f} > {OUTLIER_Z}) "
                "against the other layers"
            )
    changed = [x for x in layers if x.rel_change > 0]
    if not changed:
        return None, "no tensor changed"
    most = max(changed, key=lambda x: x.rel_change)
    return (
        None,
        f"no problem layer: changes are even across layers (largest: {most.name}, relative "
        f"{most.rel_change:.3g})",
    )


def diff_checkpoints(
    a: str | Path,
    b: str | Path,
    chunk: int = DEFAULT_CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> CheckpointDiff:
    """Stream-compare two checkpoints (folders of ``*.safetensors`` or single files)."""
    ia, ib = tensor_index(Path(a)), tensor_index(Path(b))
    total = sum((r.end - r.start) for r in ia.values()) + sum((r.end - r.start) for r in ib.values())
    result = CheckpointDiff(str(a), str(b))
    done = 0
    for name, rb in ib.items():
        ra = ia.get(name)
        if ra is None:
            t = _one_side(rb, "added", chunk)
        elif ra.shape != rb.shape:
            t = _one_side(rb, "reshaped", chunk)
        else:
            t = diff_tensor(ra, rb, chunk)
        result.tensors.append(t)
        done += (rb.end - rb.start) + ((ra.end - ra.start) if ra else 0)
        if progress:
            progress(done, total)
    for name, ra in ia.items():
        if name not in ib:
            result.tensors.append(_one_side(ra, "removed", chunk))
    keyed = {t.name: layer_of(t.name)[1] for t in result.tensors}
    result.tensors.sort(key=lambda t: (keyed[t.name], t.name))
    result.layers = summarize_layers(result.tensors)
    result.problem_layer, result.reason = find_problem(result.layers, result.tensors)
    result.bytes_read = total
    return result
