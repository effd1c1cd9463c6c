"""A quant-check's result: the table, its JSON, and a plot (torch-free)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.quant.figures import Figures, Skipped, Thresholds, Verdict


@dataclass
class QuantReport:
    mode: str  # "config" (before training) or "run" (a trained run)
    subject: str  # the model (config) or the trained weights (run)
    data: str
    device: str
    tokens: int
    limits: Thresholds
    reference: Figures
    candidates: list[Figures]
    skipped: list[Skipped]
    verdict: Verdict
    notes: list[str] = field(default_factory=list)


def to_json(report: QuantReport) -> dict[str, Any]:
    def fig(f: Figures) -> dict[str, Any]:
        return {**dataclasses.asdict(f), "passed": f.passed}

    return {
        "mode": report.mode,
        "subject": report.subject,
        "data": report.data,
        "device": report.device,
        "tokens": report.tokens,
        "limits": dataclasses.asdict(report.limits),
        "reference": dataclasses.asdict(report.reference),
        "candidates": [fig(c) for c in report.candidates],
        "skipped": [dataclasses.asdict(s) for s in report.skipped],
        "verdict": dataclasses.asdict(report.verdict),
        "go": report.verdict.go,
        "notes": report.notes,
    }


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    n = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def render_text(report: QuantReport) -> str:
    """The table, the skip lines and the verdict, as plain text (the same in a terminal and a log)."""
    lim = report.limits
    head = [
        "model",
        "perplexity",
        "change",
        "mean KL",
        "p99 KL",
        "top-1",
        "weights",
        "peak",
        "tokens/s",
        "result",
    ]
    rows = []
    for f in [report.reference, *report.candidates]:
        is_ref = f is report.reference
        rows.append(
            [
                f"{f.name}: {f.label}",
                f"{f.perplexity:.4f}",
                "reference" if is_ref else _opt(f.ppl_change, "{:+.2%}"),
                _opt(f.mean_kl, "{:.5f}"),
                _opt(f.p99_kl, "{:.5f}"),
                _opt(f.top1, "{:.1%}"),
                _size(f.weights_bytes),
                _size(f.peak_bytes),
                f"{f.tokens_per_s:,.0f}",
                "" if is_ref else ("pass" if f.passed else "FAIL"),
            ]
        )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    what = "before training" if report.mode == "config" else "trained run"
    out = [
        f"quant-check ({what}): {report.subject}",
        f"eval data: {report.data}, {report.tokens} scored tokens, on {report.device}",
        f"limits: perplexity change <= {lim.max_ppl_change:.1%}, mean KL <= {lim.max_mean_kl:g}, "
        f"p99 KL <= {lim.max_p99_kl:g}, top-1 >= {lim.min_top1:.0%}  (quant: in the config)",
        "",
        line(head),
        line(["-" * w for w in widths]),
        *(line(r) for r in rows),
    ]
    for f in report.candidates:
        for failure in f.failures:
            out.append(f"  {f.name}: {failure}")
    for s in report.skipped:
        out.append(f"skipped {s.name}: {s.reason}")
    for note in report.notes:
        out.append(f"note: {note}")
    v = report.verdict
    use = f" use {v.use}." if v.use else ""
    out += ["", f"verdict: {'GO' if v.go else 'NO-GO'}:{use} {v.reason}"]
    return "\n".join(out) + "\n"


def plot(report: QuantReport, path: Path) -> Path:
    """Bars of perplexity change, mean / p99 KL and top-1 per candidate, each against its limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = report.candidates
    names = [c.name for c in cands]
    colors = ["tab:green" if c.passed else "tab:red" for c in cands]
    lim = report.limits
    panels = [
        ("perplexity change (%)", [100 * (c.ppl_change or 0) for c in cands], 100 * lim.max_ppl_change),
        ("mean KL (nats)", [c.mean_kl or 0 for c in cands], lim.max_mean_kl),
        ("p99 KL (nats)", [c.p99_kl or 0 for c in cands], lim.max_p99_kl),
        ("top-1 agreement (%)", [100 * (c.top1 or 0) for c in cands], 100 * lim.min_top1),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (title, values, limit) in zip(axes, panels, strict=True):
        ax.bar(names, values, color=colors)
        ax.axhline(limit, color="black", linestyle="--", linewidth=1, label="limit")
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
    axes[0].legend()
    v = report.verdict
    fig.suptitle(
        f"quant-check: {'GO' if v.go else 'NO-GO'}"
        + (f", use {v.use}" if v.use else "")
        + f" ({report.tokens} tokens)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
