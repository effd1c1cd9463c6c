"""A log read whole holds at most ``series.MAX_RECORDS`` steps; a longer one is refused with what to do.

The bound is lowered here so that the suite can afford files past it: the readers look it up
as they read, so the same code refuses a 21 M-line log at the real bound.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from steadytune.cli.analyze import analyze_path
from steadytune.config.detect import DetectConfig
from steadytune.importers import series

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
