"""Plot every series a log holds, for labelling it by eye, blind.

    python benchmarks/corpus/plot.py LOG... --out DIR [--from STEP] [--to STEP] [--log]

Reads each log with steadytune's readers only (``steadytune.importers.load``): nothing here
runs a detector, so a labeller can look at a file before any detector has seen it. Writes
``DIR/<file>.png`` (one panel per series: the losses, the gradient norm, the LR, then the
reward, KL, entropy, length and every other logged number) and prints, per series, its step
range, first, last, min and max, so label windows can be written in the file's own steps.
A file the readers cannot read is said so, with their reason: label it from its text.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from steadytune.importers import Series, UnreadableLog, load

FIRST = ("loss", "eval_loss", "grad_norm", "lr")
SIGNAL_WORDS = ("reward", "kl", "entropy", "length", "margin", "chosen", "rejected", "accur", "clip", "score")
SKIP = {"ts", "epoch", "tokens", "samples", "step_time_s", "total_flos", "train_runtime"}
MAX_PANELS = 10
MAX_POINTS = 4000  # per panel: min and max of each bucket are kept, so no spike is lost


def order(metrics: list[str]) -> list[str]:
    """The series worth a panel, the training signal first."""
    first = [m for m in FIRST if m in metrics]
    signal = [m for m in metrics if m not in first and any(w in m.lower() for w in SIGNAL_WORDS)]
    rest = [m for m in metrics if m not in first and m not in signal and m not in SKIP]
    return (first + signal + rest)[:MAX_PANELS]


def thin(xs: list[int], ys: list[float]) -> tuple[list[int], list[float]]:
    """At most ~MAX_POINTS points: each bucket keeps its lowest and highest value."""
    if len(xs) <= MAX_POINTS:
        return xs, ys
    size = math.ceil(len(xs) / (MAX_POINTS // 2))
    ox: list[int] = []
    oy: list[float] = []
    for i in range(0, len(xs), size):
        seg = list(zip(xs[i : i + size], ys[i : i + size], strict=True))
        finite = [p for p in seg if math.isfinite(p[1])] or seg
        lo, hi = min(finite, key=lambda p: p[1]), max(finite, key=lambda p: p[1])
        for p in sorted({lo, hi}):
            ox.append(p[0])
            oy.append(p[1])
    return ox, oy


def describe(series: Series, metric: str, xs: list[int], ys: list[float]) -> str:
    bad = sum(1 for y in ys if not math.isfinite(y))
    fin = [y for y in ys if math.isfinite(y)]
    if not fin:
        return f"  {metric:<32} {len(ys):>7} points, all non-finite"
    note = f", {bad} non-finite" if bad else ""
    return (
        f"  {metric:<32} {len(ys):>7} points  steps {xs[0]}..{xs[-1]}  first {ys[0]:.6g}  last {ys[-1]:.6g}"
        f"  min {min(fin):.6g}  max {max(fin):.6g}{note}"
    )


def plot(
    path: Path, out: Path, lo: int | None, hi: int | None, logy: bool, only: list[str] | None = None
) -> int:
    try:
        series = load(path)
    except UnreadableLog as e:
        print(f"{path.name}: not readable by steadytune's readers ({e}); label it from its text")
        return 1
    metrics = [m for m in only if m in series.metrics] if only else order(series.metrics)
    print(f"{path.name}: format {series.format}, {series.steps} steps")
    panels = []
    for m in metrics:
        xs, ys = series.values(m)
        pts = [
            (x, y) for x, y in zip(xs, ys, strict=True) if (lo is None or x >= lo) and (hi is None or x <= hi)
        ]
        if len(pts) < 2:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        print(describe(series, m, xs, ys))
        panels.append((m, xs, ys))
    if not panels:
        print("  (no series with two points or more in this range)")
        return 1
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 2.1 * len(panels)), sharex=True, squeeze=False)
    for ax, (m, xs, ys) in zip(axes[:, 0], panels, strict=True):
        bad = [x for x, y in zip(xs, ys, strict=True) if not math.isfinite(y)]
        tx, ty = thin(
            [x for x, y in zip(xs, ys, strict=True) if math.isfinite(y)], [y for y in ys if math.isfinite(y)]
        )
        ax.plot(tx, ty, lw=0.8, marker="." if len(tx) <= 300 else None, ms=3)
        for x in bad:
            ax.axvline(x, color="red", lw=0.8, alpha=0.6)
        if logy and ty and min(ty) > 0:
            ax.set_yscale("log")
        ax.set_ylabel(m, rotation=0, ha="right", fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step (red lines: non-finite values)")
    fig.suptitle(path.name, fontsize=9)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    suffix = f"_{lo or 0}-{hi or 'end'}" if lo is not None or hi is not None else ""
    fig.savefig(out / f"{path.name}{suffix}.png", dpi=80)
    plt.close(fig)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    ap.add_argument("--from", dest="lo", type=int, help="first step to show")
    ap.add_argument("--to", dest="hi", type=int, help="last step to show")
    ap.add_argument("--log", action="store_true", help="log-scale y axes (positive series)")
    ap.add_argument("--metrics", help="comma-separated series to show instead of the first ten")
    args = ap.parse_args(argv)
    only = args.metrics.split(",") if args.metrics else None
    bad = sum(plot(p, args.out, args.lo, args.hi, args.log, only) for p in args.logs)
    return 1 if bad == len(args.logs) else 0


if __name__ == "__main__":
    sys.exit(main())
