"""``steadytune diff-ckpt A B``: which layer changed, and how, between two checkpoints."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from steadytune.cli._common import add_command, add_format, fail


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "diff-ckpt",
        "compare two checkpoints tensor by tensor and name the problem layer",
        "steadytune diff-ckpt runs/my-run/checkpoints/checkpoint-100 "
        "runs/my-run/checkpoints/checkpoint-150 --top 20",
        description="Compare two checkpoints (folders of .safetensors, full models or LoRA adapters, or "
        "single "
        ".safetensors files), streaming one chunk of each tensor at a time. Per tensor: L2 norm of the "
        "change, "
        "relative change, max abs change, NaN/Inf counts, norm ratio. The verdict names the first layer with "
        "non-finite values or an outlier change.",
    )
    p.add_argument("a", help="the earlier (healthy) checkpoint")
    p.add_argument("b", help="the later (suspect) checkpoint")
    p.add_argument("--top", type=int, default=20, help="tensors to list, ranked by change (default 20)")
    add_format(p)
    p.set_defaults(func=main)


def _g(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def render(d: Any, top: int) -> str:
    lines = [
        f"A {d.a}",
        f"B {d.b}",
        "",
        "layers (forward order):",
        f"  {'layer':<24} {'tensors':>7} {'|A|':>9} {'|B|':>9} {'|B-A|':>9} {'rel':>9} {'z':>6} "
        f"{'NaN/Inf':>8}",
    ]
    for lay in d.layers:
        mark = "  <-- problem" if lay.name == d.problem_layer else ""
        lines.append(
            f"  {lay.name:<24} {lay.tensors:>7} {_g(lay.norm_a):>9} {_g(lay.norm_b):>9} "
            f"{_g(lay.l2_change):>9} "
            f"{_g(lay.rel_change):>9} {_g(lay.z):>6} {lay.nonfinite_b:>8}{mark}"
        )
    lines += [
        "",
        f"top {top} tensors by relative change (forward order):",
        f"  {'#':>3} {'tensor':<52} {'|B-A|':>9} {'rel':>9} {'max abs':>9} {'NaN':>6} {'Inf':>6} "
        f"{'|B|/|A|':>8}",
    ]
    for rank, t in d.top(top):
        status = "" if t.status in {"changed", "same"} else f" ({t.status})"
        lines.append(
            f"  {rank:>3} {t.name + status:<52} {_g(t.l2_change):>9} {_g(t.rel_change):>9} "
            f"{_g(t.max_abs):>9} "
            f"{t.nan_b:>6} {t.inf_b:>6} {_g(t.norm_ratio):>8}"
        )
    verdict = f"problem layer: {d.problem_layer} — {d.reason}" if d.problem_layer else d.reason
    lines += ["", f"verdict: {verdict}"]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from steadytune.forensics.ckptdiff import diff_checkpoints
    from steadytune.forensics.stread import SafetensorsError

    show = sys.stderr.isatty() and args.format == "text"

    def progress(done: int, total: int) -> None:
        if show:
            print(
                f"\rread {done / 1024**2:,.0f}/{total / 1024**2:,.0f} MiB",
                end="",
                file=sys.stderr,
                flush=True,
            )

    try:
        d = diff_checkpoints(args.a, args.b, progress=progress)
    except (SafetensorsError, OSError) as exc:
        return fail(str(exc))
    if show:
        print(file=sys.stderr)
    if args.format == "json":
        print(json.dumps(d.to_dict(top=None), indent=1))
    else:
        print(render(d, args.top))
    return 0
