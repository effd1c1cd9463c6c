"""Rows of a dataset file, as dicts: .jsonl/.ndjson, .json, .csv (stdlib) and .parquet (pyarrow)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")
# Part of the tokenization cache key: entries built when a .csv went through `datasets`
# (which guessed numbers from the cells) are rebuilt, not reused with other tokens.
ROWS_READER = "rows-2"


class DataError(ValueError):
    """A dataset that cannot be used as configured; the message says why and how to fix it."""


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl/.ndjson/.json/.csv/.parquet file, as dicts."""
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.exists():
        raise DataError(f"dataset {path} not found; check data.train_file / data.eval_file")
    if suffix in {".jsonl", ".ndjson"}:
        return _jsonl(path)
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            for key in ("data", "rows", "train"):
                if isinstance(data.get(key), list):
                    return data[key]
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of objects")
        return data
    if suffix == ".csv":
        return _csv(path)
    if suffix == ".parquet":
        return _parquet(path)
    raise DataError(f"{path}: unsupported file type {suffix!r}; use {', '.join(SUFFIXES)}")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise DataError(
                        f"{path}:{n}: not valid JSON ({getattr(exc, 'msg', exc)}); fix or remove that line"
                    ) from None
    return rows


def _csv(path: Path) -> list[dict[str, Any]]:
    """Every cell as text, an empty cell as None (a CSV cannot tell the two apart).

    Cells stay text, not numbers guessed from their look: a column of "007" or "1.50" is
    tokenized as written. utf-8-sig drops the byte-order mark spreadsheets put first.
    """
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return []
        rows = []
        for n, raw in enumerate(reader, 2):
            if None in raw:  # DictReader files the surplus cells of a long line under None
                raise DataError(
                    f"{path}:{n}: {len(reader.fieldnames) + len(raw[None])} cells under "
                    f"{len(reader.fieldnames)} column names; quote cells that hold a comma"
                )
            rows.append({k: (v if v != "" else None) for k, v in raw.items()})
        return rows


def _parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq  # optional: only a .parquet dataset needs it
    except ImportError:
        raise DataError(
            f"{path}: reading .parquet needs pyarrow, which is not installed; "
            "`pip install pyarrow` or convert the file to .jsonl"
        ) from None
    return pq.read_table(path).to_pylist()


def detect_format(rows: list[dict[str, Any]], text_field: str = "text") -> str:
    """``messages``, ``instruction`` or ``text``, from the first row's columns."""
    if not rows:
        raise DataError("the dataset is empty")
    keys = set(rows[0])
    if "messages" in keys:
        return "messages"
    if {"instruction", "output"} <= keys:
        return "instruction"
    if text_field in keys:
        return "text"
    raise DataError(
        f"cannot tell the data format from the columns {sorted(keys)}; expected '{text_field}', "
        "'instruction'/'input'/'output' or 'messages' (or set data.format and data.text_field)"
    )
