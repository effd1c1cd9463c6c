"""The preflight for people: a rich table of ✓/⚠/✗ with the reason and the fix, and the verdict."""

from __future__ import annotations

from typing import Any

from steadytune.preflight.result import SYMBOLS, Check, PreflightReport, Recommendation

_STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red", "na": "dim"}


def _table(checks: list[Check], title: str | None = None) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=False, expand=False, title_justify="left")
    table.add_column("", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("finding", overflow="fold")
    table.add_column("fix", overflow="fold")
    for c in checks:
        style = _STYLES[c.status]
        table.add_row(
            Text(SYMBOLS[c.status], style=style),
            Text(f"{c.family}/{c.name}", style=style),
            Text(c.reason),
            Text(c.fix, style="cyan"),
        )
    return table


def recommendation_lines(rec: Recommendation | None) -> list[str]:
    if rec is None:
        return ["recommendation: none (no memory estimate)"]
    if rec.per_device_train_batch_size is None:
        return ["recommendation: none", *(f"  {n}" for n in rec.notes)]
    lines = [
        "recommended:",
        f"  per_device_train_batch_size: {rec.per_device_train_batch_size}",
        f"  gradient_accumulation_steps: {rec.gradient_accumulation_steps}"
        f"   # effective batch {rec.effective_batch} per device, unchanged",
        f"  max_seq_length: {rec.max_seq_length}",
        f"  gradient_checkpointing: {str(rec.gradient_checkpointing).lower()}",
    ]
    lines += [f"  - {n}" for n in rec.notes]
    return lines


def verdict_line(report: PreflightReport) -> str:
    c = report.counts()
    parts = f"{c['ok']} ✓, {c['warn']} ⚠, {c['fail']} ✗, {c['na']} N/A"
    return f"preflight: {report.verdict.upper()} ({parts})"


def print_report(report: PreflightReport, console: Any, only_problems: bool = False) -> None:
    """The full view (``check``) or, with ``only_problems``, the rows that need attention (``run``)."""
    rows = report.sorted_checks()
    if only_problems:
        rows = [c for c in rows if c.status in ("warn", "fail")]
    if rows:
        title = f"steadytune check {report.config_path or ''}".strip() if not only_problems else None
        console.print(_table(rows, title))
    if not only_problems:
        where = "GPU" if report.device == "cuda" else "CPU"
        console.print(f"device: {where}", highlight=False)
        for line in recommendation_lines(report.recommendation):
            console.print(line, highlight=False, markup=False)
    style = "bold green" if report.go else "bold red"
    console.print(verdict_line(report), style=style, highlight=False)
