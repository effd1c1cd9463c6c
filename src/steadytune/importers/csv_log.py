"""CSV (or TSV) with a step column: W&B "Export CSV", pandas dumps, hand-made tables.

W&B chart exports name columns ``<run> - train/loss`` and add ``__MIN`` /
``__MAX`` band columns; the run prefix is dropped and the bands are ignored.
Empty cells are missing values.
"""

from __future__ import annotations

import csv
from pathlib import Path

from steadytune.importers.series import Series, SeriesBuilder, UnreadableLog, parse_number

FORMAT = "csv"
STEP_COLUMNS = (
    "step",
    "_step",
    "global_step",
    "train/global_step",
    "trainer/global_step",
    "iteration",
    "iter",
)


def step_column(header: list[str]) -> int | None:
    names = [h.strip().lower() for h in header]
    for candidate in STEP_COLUMNS:
        if candidate in names:
            return names.index(candidate)
    return None


def _metric(column: str) -> str | None:
    name = column.strip()
    if name.endswith(("__MIN", "__MAX")):
        return None
    if " - " in name:
        name = name.split(" - ", 1)[1]
    return name


def sniff(head: str) -> bool:
    first = head.splitlines()[0] if head else ""
    for delim in (",", "\t"):
        if delim in first and step_column(next(csv.reader([first], delimiter=delim))) is not None:
            return True
    return False


def read(path: Path) -> Series:
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        text = f.read()
    first = text.splitlines()[0] if text else ""
    delim = "\t" if first.count("\t") > first.count(",") else ","
    rows = csv.reader(text.splitlines(), delimiter=delim)
    header = next(rows, [])
    col = step_column(header)
    if col is None:
        raise UnreadableLog(f"CSV has no step column (looked for {', '.join(STEP_COLUMNS)})")
    metrics = [_metric(h) for h in header]
    b = SeriesBuilder(str(path), FORMAT)
    for row in rows:
        if len(row) <= col:
            continue
        step = parse_number(row[col])
        if step is None or step != step:
            continue
        for i, cell in enumerate(row):
            name = metrics[i] if i < len(metrics) else None
            if i != col and name:
                b.add(int(step), name, parse_number(cell))
    return b.build(require=("loss", "eval_loss", "grad_norm"))
