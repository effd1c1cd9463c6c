"""A log whose first line is longer than the head the sniffer reads (a config dumped as the first
JSON record), and a hostile one of a line without end: read right, in bounded memory.

Files are generated here; the bounds are made small (monkeypatched) so that "a line of gigabytes"
takes megabytes to show.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import steadytune.importers as importers
from steadytune.importers import UnreadableLog, detect_format, lines, load, stream

STEPS = 60


def _config(size: int, typed: bool) -> dict[str, Any]:
    """A run's config of about ``size`` bytes, as scripts dump it before their first step."""
    params = {f"param_{i}": "v" * 40 for i in range(size // 56 + 1)}
    return {"type": "config", "config": params} if typed else {"config": params, "run": "sft-1"}


def _step_rows(loss0: float) -> list[dict[str, Any]]:
    return [{"step": s, "loss": loss0 * 0.99**s, "grad_norm": 1.0 + s % 5 / 10} for s in range(1, STEPS + 1)]


def _jsonl(path: Path, first: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in [first, *rows]) + "\n")
    return path


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """What ``fn`` returns or raises, and the most memory Python held while it ran."""
    tracemalloc.start()
    try:
        try:
            out: Any = fn()
        except UnreadableLog as e:
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("size", [100 << 10, 2 << 20], ids=["100KB", "2MB"])
@pytest.mark.parametrize("typed", [True, False], ids=["typed", "untyped"])
def test_a_jsonl_log_whose_first_record_is_a_long_config_is_read_whole(
    tmp_path: Path, size: int, typed: bool
) -> None:
    """It was 'invalid JSON: Extra data': the head held a cut line only, so the file was read as one
    JSON document. The lines after the long one say what it is."""
    rows = _step_rows(2.3)
    path = _jsonl(tmp_path / "metrics.jsonl", _config(size, typed), rows)
    assert path.stat().st_size > size
    assert detect_format(path) == "jsonl_log"
    for records in (load(path).records, list(stream(path) or [])):
        assert [r.step for r in records] == [r["step"] for r in rows]
        assert [r.loss for r in records] == pytest.approx([r["loss"] for r in rows])
        assert [r.grad_norm for r in records] == pytest.approx([r["grad_norm"] for r in rows])


def test_a_llamafactory_log_after_a_long_first_line_is_still_one(tmp_path: Path) -> None:
    rows = [{"current_steps": s, "total_steps": STEPS, "loss": 1.5 - s / 100} for s in range(1, STEPS + 1)]
    path = _jsonl(tmp_path / "trainer_log.jsonl", _config(200 << 10, False), rows)
    assert detect_format(path) == "llamafactory_trainer_log"
    assert [r.loss for r in load(path).records] == pytest.approx([r["loss"] for r in rows])


def test_a_line_too_long_to_be_a_record_is_passed_over_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first line 64 times the line bound (a hostile file's gigabytes, scaled down): the records
    after it are read, and the line is never held (it was, and parsed, whole)."""
    monkeypatch.setattr(lines, "MAX_LINE_CHARS", 64 << 10)
    rows = _step_rows(3.0)
    blob = {"type": "config", "blob": "x" * (4 << 20)}
    path = _jsonl(tmp_path / "metrics.jsonl", blob, rows)
    for read in (lambda: load(path).records, lambda: list(stream(path) or [])):
        records, peak = _peak(read)
        assert [r.loss for r in records] == pytest.approx([r["loss"] for r in rows])
        assert peak < 2 << 20, peak


def test_a_file_of_one_line_too_long_to_read_whole_is_refused_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single line past the bound a JSON document is read whole to (1 GiB; 1 MiB here): an error
    that says what was found and what to write instead, before a byte of it is held."""
    monkeypatch.setattr(importers, "MAX_DOCUMENT_BYTES", 1 << 20)
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 2.0, "blob": "x" * (4 << 20)}))
    err, peak = _peak(lambda: load(path))
    assert isinstance(err, UnreadableLog)
    assert "one line or document" in str(err) and "one record per line" in str(err)
    assert peak < 1 << 20, peak
    # Under the bound, the same line is one JSON document, read as before.
    monkeypatch.setattr(importers, "MAX_DOCUMENT_BYTES", 8 << 20)
    with pytest.raises(UnreadableLog, match="JSON, but neither"):
        load(path)
