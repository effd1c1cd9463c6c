"""The table of benchmarks/drill_vs_baseline.py: one row per fault, steadytune beside the baseline."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    survived: bool
    why: str  # why not, or ""
    finite: bool | None  # None: no final weights
    loss: float | None  # eval loss of the final weights
    redone: int | None  # optimizer steps trained more than once (None: unknown)
    reached: int  # the highest step reached
    seconds: float
    note: str = ""
    goodput: dict[str, Any] | None = None  # steadytune.goodput.account.Account.to_dict()


def fmt_bool(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def fmt_loss(v: float | None) -> str:
    if v is None:
        return "-"
    return "nan" if math.isnan(v) else ("inf" if math.isinf(v) else f"{v:.3f}")


def fmt_redone(o: Outcome, steps: int) -> str:
    if not o.survived:
        return f"lost@{o.reached}"
    return "?" if o.redone is None else str(o.redone)


def fmt_goodput(g: dict[str, Any] | None) -> str:
    return "-" if not g or g.get("goodput") is None else f"{100 * g['goodput']:.1f} %"


def lost_line(g: dict[str, Any] | None) -> str:
    """Where the rest of the run's time went, as ``steadytune goodput`` says it."""
    from steadytune.goodput.parts import Account
    from steadytune.goodput.text import summary_line

    return summary_line(Account.from_dict(g)) if g else ""


def render(rows: list[tuple[str, Outcome | None, Outcome | None]], steps: int) -> str:
    cols = [
        ("survived", lambda o: fmt_bool(o.survived)),
        ("goodput", lambda o: fmt_goodput(o.goodput)),
        ("weights finite", lambda o: fmt_bool(o.finite)),
        ("eval loss", lambda o: fmt_loss(o.loss)),
        ("steps redone", lambda o: fmt_redone(o, steps)),
        ("wall s", lambda o: f"{o.seconds:.0f}"),
    ]
    w0, w = 22, 11
    top = " " * w0 + "".join(f"| {name:<{2 * w}}" for name, _ in cols)
    sub = f"{'fault':<{w0}}" + "".join(f"| {'steadytune':<{w}}{'baseline':<{w}}" for _ in cols)
    lines = [top, sub, "-" * len(sub)]
    for label, st, bl in rows:
        cells = "".join(
            f"| {(fn(st) if st else 'n/a'):<{w}}{(fn(bl) if bl else 'n/a'):<{w}}" for _, fn in cols
        )
        lines.append(f"{label:<{w0}}{cells}")
    return "\n".join(lines)


LEGEND = """\
steadytune = supervised run (steadytune.drill.runner); baseline = plain HF Trainer under
torchrun --max-restarts=3, resuming from the newest checkpoint-* on start.
survived        the run finished all {steps} optimizer steps (baseline: torchrun exit 0 and
                the script reached max_steps) within the limit (3x the side's clean run, >= 90 s)
weights finite  every floating tensor of the final weights is finite (safetensors); - = no final weights
eval loss       token-weighted mean cross-entropy of the final weights on the demo eval set,
                computed here in the same way for both sides; compare with the clean row (lower
                than clean means the run trained more steps than asked, not that it recovered better)
steps redone    optimizer steps trained more than once (restarts from an older checkpoint,
                rollbacks, or auto_find_batch_size restarting its loop); lost@N = the run
                never finished, it stopped at step N
goodput         the share of the run's wall time (from the benchmark's launch to its end) that became
                training kept in the final weights; both sides are counted by steadytune.goodput from
                the same kind of records (the baseline's from its log and the benchmark's kills)
wall s          wall-clock seconds of the run, process start-up included"""
