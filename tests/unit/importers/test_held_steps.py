"""A log read whole holds at most ``series.MAX_RECORDS`` steps; a longer one is refused with what to do.

The bound is lowered here so that the suite can afford files past it: the readers look it up
as they read, so the same code refuses a 21 M-line log at the real bound.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from steadytune.cli.analyze import analyze_path
from steadytune.config.detect import DetectConfig
from steadytune.importers import csv_log, series
from steadytune.importers.series import UnreadableLog

BOUND = 500


@pytest.fixture(autouse=True)
def _low_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series, "MAX_RECORDS", BOUND)


def _text_log(path: Path, lines: int) -> Path:
    path.write_text("loss: 1.0\n" * lines)  # no step: each line is one, numbered by its order
    return path


def _analyze(path: Path) -> object:
    return analyze_path(str(path), DetectConfig())


def test_a_text_log_past_the_bound_is_refused_with_the_fix(tmp_path: Path) -> None:
    result = _analyze(_text_log(tmp_path / "train.log", BOUND + 1))
    error = getattr(result, "error", None)
    assert error is not None and f"more than {BOUND:,} steps" in error
    assert "JSON lines" in error and "split it" in error


def test_a_gzip_log_past_the_bound_is_refused_as_its_plain_text_is(tmp_path: Path) -> None:
    plain = _text_log(tmp_path / "train.log", BOUND * 3)
    packed = tmp_path / "train.log.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    error = getattr(_analyze(packed), "error", None)
    assert error is not None and f"more than {BOUND:,} steps" in error


def test_a_log_at_the_bound_is_read(tmp_path: Path) -> None:
    result = _analyze(_text_log(tmp_path / "train.log", BOUND))
    assert getattr(result, "error", "x") is None and getattr(result, "steps", 0) == BOUND


def test_every_reader_through_the_builder_is_bound_a_csv_too(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("step,train/loss\n" + "".join(f"{s},1.0\n" for s in range(1, BOUND + 2)))
    error = getattr(_analyze(path), "error", None)
    assert error is not None and f"more than {BOUND:,} steps" in error


def test_a_json_lines_log_is_streamed_past_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, BOUND * 3)))
    result = _analyze(path)
    assert getattr(result, "error", "x") is None and getattr(result, "steps", 0) == BOUND * 3 - 1


@pytest.mark.parametrize("table", ["csv", "markdown"])
def test_a_table_past_the_bound_is_refused_before_the_rest_of_it_is_held(tmp_path: Path, table: str) -> None:
    """A table is read a row at a time: refusing it costs what the bound holds, not what the file
    holds (its text, lines and rows held at once took ~30 times the file's size)."""
    rows = 200_000
    path = tmp_path / "table.txt"
    if table == "csv":
        path.write_text("step,loss\n" + "".join(f"{s},1.0\n" for s in range(rows)))
    else:
        rule = "| Step | Training Loss |\n|---|---|\n"
        path.write_text(rule + "".join(f"| {s} | 1.0 |\n" for s in range(rows)))
    size = path.stat().st_size
    with pytest.raises(UnreadableLog, match=f"more than {BOUND:,} steps"):
        csv_log.read(path)  # once, so what the first read imports is not counted below
    tracemalloc.start()
    try:
        with pytest.raises(UnreadableLog, match=f"more than {BOUND:,} steps"):
            csv_log.read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 4, f"held {peak:,} bytes reading {size:,}"
