"""What ``steadytune analyze`` shows: a verdict per file, a table of anomalies, JSON, a plot.

Rendering only; the findings come from :func:`steadytune.detect.detect`.
rich is a core dependency; matplotlib is imported only for ``--plot``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.detect.build import KINDS
from steadytune.detect.objective import CLIP_KEYS, KL_KEYS
from steadytune.detect.rollouts import ROLLOUT_KEYS
from steadytune.objectives import LOSS_OBJECTIVE, REWARD_KEYS
from steadytune.records import SEVERITY_ORDER, Anomaly


@dataclass
class FileResult:
    """One analysed path: its format and size, its anomalies, or why it could not be read."""

    path: str
    format: str | None = None
    steps: int = 0
    metrics: list[str] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    error: str | None = None
    series: Any = None  # the imported Series, kept for plotting
    objective: str | None = None  # what the training signal was judged as (detect/objective.py)
    notes: list[str] = field(default_factory=list)  # what reading decided (a loss-like field ignored)

    @property
    def alarming(self) -> list[Anomaly]:
        return [a for a in self.anomalies if a.severity != "info"]

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return f"unreadable: {self.error}"
        bad = self.alarming
        if not bad:
            return "healthy" if not self.anomalies else "healthy (info notes only)"
        worst = max(bad, key=lambda a: SEVERITY_ORDER[a.severity]).severity
        return f"{worst}: {len(bad)} anomal{'y' if len(bad) == 1 else 'ies'}"


def anomaly_json(a: Anomaly) -> dict[str, Any]:
    """The JSON object of one anomaly: exactly the keys of the analyze schema."""
    evidence = dict(a.evidence)
    if a.rank is not None:
        evidence.setdefault("rank", a.rank)
    return {
        "kind": a.kind,
        "severity": a.severity,
        "start_step": a.start_step,
        "end_step": a.end_step,
        "metric": a.metric,
        "evidence": _json_safe(evidence),
        "cause": a.cause,
        "suggestion": a.suggestion,
        "count": a.count,
        "peak": _json_safe(a.peak),
    }


def file_json(r: FileResult) -> dict[str, Any]:
    return {
        "path": r.path,
        "format": r.format,
        "steps": r.steps,
        "metrics": list(r.metrics),
        "objective": r.objective,
        "notes": list(r.notes),
        "anomalies": [anomaly_json(a) for a in r.anomalies],
    }


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _evidence_text(a: Anomaly, limit: int = 4) -> str:
    shown = [(k, v) for k, v in a.evidence.items() if k != "run"]  # the run is in the steps column
    return ", ".join(f"{k}={v}" for k, v in shown[:limit])


_STYLE = {"critical": "bold red", "warning": "yellow", "info": "dim"}

# The series each kind of run is judged on, in the order a reader looks for them.
_LOSS_JUDGED = ("loss", "grad_norm", "eval_loss")
_RL_JUDGED = (*REWARD_KEYS, *ROLLOUT_KEYS, *KL_KEYS, *CLIP_KEYS, "grad_norm", "loss")


def header_series(r: FileResult, limit: int = 6) -> str:
    """The series a file's header names: those with an anomaly and those its objective is judged on
    first, then the others, up to ``limit``, with how many more there are."""
    judged = _RL_JUDGED if r.objective not in (None, *_JUDGED_ON) else _LOSS_JUDGED
    present = set(r.metrics)
    first = [m for m in (*(a.metric for a in r.anomalies), *judged) if m in present]
    ordered = list(dict.fromkeys([*first, *r.metrics]))
    more = len(ordered) - limit
    return ", ".join(ordered[:limit]) + (f" and {more} more" if more > 0 else "")


def render_text(results: list[FileResult], console: Any) -> None:
    """A verdict line per file, a table of its anomalies, then each kind's cause and fix once (rich)."""
    from rich.markup import escape as markup
    from rich.table import Table

    from steadytune.terminal import shown

    def escape(text: str) -> str:  # from a file or its name: neither markup nor terminal codes
        return markup(shown(text))

    for r in results:
        alarm = "red" if any(a.severity == "critical" for a in r.anomalies) else "yellow"
        style = "red" if r.error else (alarm if r.alarming else "green")
        head = f"[bold]{escape(r.path)}[/bold]"  # paths and reasons may hold [brackets]
        if r.error is None:
            head += f" [dim]({r.format}, {r.steps} steps; {escape(header_series(r))})[/dim]"
            if r.objective is not None:
                head += f"\n  judged as {escape(r.objective)}{_JUDGED_ON.get(r.objective, _RL_JUDGED_ON)}"
        # Whole lines, never wrapped by the console: a path cut in two is no path to paste.
        console.print(f"{head}\n  [{style}]{escape(r.verdict)}[/{style}]", soft_wrap=True)
        for note in r.notes:
            console.print(f"  [dim]note: {escape(note)}[/dim]", soft_wrap=True)
        if not r.anomalies:
            continue
        table = Table(pad_edge=False, box=None, header_style="bold")
        for col in ("severity", "kind", "steps", "times", "peak", "metric", "evidence"):
            table.add_column(col, overflow="fold")
        for a in r.anomalies:
            steps = str(a.start_step) if a.start_step == a.end_step else f"{a.start_step}-{a.end_step}"
            if "run" in a.evidence:  # a file holding several runs: each its own steps
                steps += f" ({a.evidence['run']})"
            metric = a.metric if a.rank is None else f"{a.metric} (rank {a.rank})"
            table.add_row(
                f"[{_STYLE[a.severity]}]{a.severity}[/]",
                a.kind,
                escape(steps),
                str(a.count),  # how often the episode's condition fired
                "" if a.peak is None else f"{a.peak:.4g}",
                escape(metric),
                escape(_evidence_text(a)),
            )
        console.print(table)
        for kind in dict.fromkeys(a.kind for a in r.anomalies):
            a = next(x for x in r.anomalies if x.kind == kind)
            # Cause and fix are the detector's own words, with its markup; the metric in them is the file's.
            console.print(
                f"  [bold]{kind}[/bold]: {shown(a.cause)}.\n    [green]→ {shown(a.suggestion)}[/green]"
            )


_JUDGED_ON = {LOSS_OBJECTIVE: ""}
_RL_JUDGED_ON = ": on its reward, KL and grad norm, its loss only for NaN/Inf (not by the SFT loss rules)"

_PANELS = (("loss", "eval_loss"), ("grad_norm",), ("mem_allocated_bytes",), ("step_time_s",))
_COLOURS = {"critical": "tab:red", "warning": "tab:orange", "info": "tab:gray"}


def plot(results: list[FileResult], out: Path) -> Path:
    """A PNG with the series of each readable file and every anomaly shaded and labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[tuple[FileResult, tuple[str, ...]]] = []
    for r in results:
        if r.series is None:
            continue
        for panel in _PANELS:
            if any(m in r.metrics for m in panel):
                rows.append((r, panel))
    fig, axes = plt.subplots(max(1, len(rows)), 1, figsize=(12, 2.8 * max(1, len(rows))), squeeze=False)
    if not rows:
        axes[0][0].text(0.5, 0.5, "nothing readable to plot", ha="center", va="center")
    for ax, (r, shown) in zip((a[0] for a in axes), rows, strict=False):
        _panel(ax, r, shown)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _panel(ax: Any, r: FileResult, panel: tuple[str, ...]) -> None:
    positive = True
    runs = r.series.runs()  # a file holding several runs: one line each, at its own steps
    for metric, run in ((m, run) for m in panel for run in runs):
        xs, ys = r.series.values(metric, run.records)
        if not xs:
            continue
        finite = [y for y in ys if math.isfinite(y)]
        positive = positive and bool(finite) and min(finite) > 0
        label = metric if len(runs) == 1 else f"{metric} ({run.label})"
        ax.plot(xs, ys, lw=0.7, marker="." if len(xs) < 200 else None, ms=3, label=label)
        bad = [x for x, y in zip(xs, ys, strict=True) if not math.isfinite(y)]
        if bad:  # NaN has no height: mark it along the bottom edge
            trans = ax.get_xaxis_transform()
            ax.scatter(
                bad,
                [0.03] * len(bad),
                transform=trans,
                marker="x",
                color="tab:red",
                label=f"{metric} NaN/Inf",
            )
    if positive and panel[0] in ("loss", "grad_norm"):
        ax.set_yscale("log")
    ax.set_title(f"{Path(r.path).name}: {', '.join(panel)}", fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="upper right")
    for a in r.anomalies:
        if a.metric not in panel and not _belongs(a.metric, panel):
            continue
        colour = _COLOURS[a.severity]
        ax.axvspan(a.start_step, max(a.end_step, a.start_step), color=colour, alpha=0.15)
        ax.axvline(a.start_step, color=colour, lw=0.8)
        ax.annotate(
            KINDS[a.kind].title if a.kind in KINDS else a.kind,
            (a.start_step, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=90,
            va="top",
            ha="right",
            color=colour,
        )


def _belongs(metric: str, panel: tuple[str, ...]) -> bool:
    """System and pace anomalies (no loss metric) go on the first panel, so none is lost."""
    known = {m for p in _PANELS for m in p}
    return panel == _PANELS[0] and metric not in known
