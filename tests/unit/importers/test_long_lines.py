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

from steadytune.importers import UnreadableLog, detect_format, document, lines, load, stream

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

    def whole() -> tuple[list[Any], list[str]]:
        series = load(path)
        return series.records, series.notes

    def streamed() -> tuple[list[Any], list[str]]:
        log = stream(path)
        assert log is not None
        return list(log), log.notes

    for read in (whole, streamed):
        (records, notes), peak = _peak(read)
        assert [r.loss for r in records] == pytest.approx([r["loss"] for r in rows])
        assert peak < 2 << 20, peak
        assert notes == ["1 line over 65,536 characters left out unread: no record is that long"]


def test_a_file_of_one_line_too_long_to_read_whole_is_refused_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single line past the bound a JSON document is read whole to (1 GiB; 1 MiB here): an error
    that says what was found and what to write instead, before a byte of it is held."""
    monkeypatch.setattr(document, "MAX_DOCUMENT_BYTES", 1 << 20)
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 2.0, "blob": "x" * (4 << 20)}))
    err, peak = _peak(lambda: load(path))
    assert isinstance(err, UnreadableLog)
    assert "one line or document" in str(err) and "one record per line" in str(err)
    assert peak < 1 << 20, peak
    # Under the bound, the same line is one JSON document, read as before.
    monkeypatch.setattr(document, "MAX_DOCUMENT_BYTES", 8 << 20)
    with pytest.raises(UnreadableLog, match="JSON, but neither"):
        load(path)


# One record line of each line reader, at a step with a loss (composer's is two lines).
_LAYOUTS: dict[str, Callable[[int, float], str]] = {
    "text_log": lambda s, v: f"step {s} | loss {v:.6f}",
    "megatron_text": lambda s, v: (
        f" iteration {s:8d}/    1000 | lm loss: {v:.6E} | grad norm: 1.000 | number of skipped iterations:"
        "   0 | number of nan iterations:   0 |"
    ),
    "llmc_log": lambda s, v: f"s:{s} trl:{v:.6f}",
    "llmc_stdout": lambda s, v: (
        f"step {s:4d}/100 | train loss {v:.6f} | norm 1.0000 | lr 1.00e-04 | 10.00 ms"
    ),
    "nanogpt_log": lambda s, v: f"{s} train {v:.6f}",
    "nanogpt_stdout": lambda s, v: (
        f"step {s:5d} | loss: {v:.6f} | lr 1.0000e-04 | norm: 1.0000 | dt: 10.00ms"
    ),
    "modded_nanogpt": lambda s, v: (
        f"step:{s}/100 train_loss:{v:.4f} train_time:{s * 100}ms step_avg:100.00ms"
    ),
    "composer_console": lambda s, v: f"[batch={s}/100]:\n\t Train loss/train/total: {v:.6f}",
    "dict_log": lambda s, v: (
        f"{{'loss': {v:.4f}, 'grad_norm': 1.0, 'learning_rate': 0.0001, 'epoch': {s / 100}}}"
    ),
    "csv": lambda s, v: f"{s},{v:.6f}",
    "jsonl_log": lambda s, v: json.dumps({"step": s, "loss": v}),
    "llamafactory_trainer_log": lambda s, v: json.dumps({"current_steps": s, "total_steps": 100, "loss": v}),
}
_HEADERS = {"csv": "step,loss\n"}


def _log(path: Path, fmt: str, long_line: str | None, at: int) -> Path:
    """A log of ``STEPS`` records in ``fmt``'s layout, ``long_line`` before the record ``at``."""
    rows = [_LAYOUTS[fmt](s, 3.0 * 0.99**s) for s in range(1, STEPS + 1)]
    if long_line is not None:
        rows.insert(at, long_line)
    text = _HEADERS.get(fmt, "") + "\n".join(rows)
    path.write_text(text if long_line is not None and at == len(rows) - 1 else text + "\n")
    return path


@pytest.mark.parametrize("at", [STEPS // 2, STEPS], ids=["middle", "last-without-newline"])
@pytest.mark.parametrize("fmt", sorted(_LAYOUTS))
def test_every_line_reader_passes_over_a_line_without_end_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, at: int
) -> None:
    """A line 64 times the line bound (a 2 GiB line, scaled down), read with the format named as
    ``--format`` names it: the other records read as in the same log without it, memory bounded by
    the chunk (the line was held whole, and split or parsed), and the verdict says so once."""
    monkeypatch.setattr(lines, "MAX_LINE_CHARS", 64 << 10)
    clean = load(_log(tmp_path / "clean.log", fmt, None, 0), fmt)
    assert detect_format(tmp_path / "clean.log") == fmt
    assert [r.loss for r in clean.records] == pytest.approx(
        [3.0 * 0.99**s for s in range(1, STEPS + 1)], rel=1e-3
    )
    assert not any("left out unread" in n for n in clean.notes)

    path = _log(tmp_path / "hostile.log", fmt, "1 loss " + "x" * (4 << 20), at)
    series, peak = _peak(lambda: load(path, fmt))
    assert not isinstance(series, UnreadableLog), series
    assert [(r.step, r.loss) for r in series.records] == [(r.step, r.loss) for r in clean.records]
    assert peak < 2 << 20, peak
    assert "1 line over 65,536 characters left out unread: no record is that long" in series.notes


def _trainer_state(pad: str) -> Any:
    return {"log_history": [{"step": s, "loss": 2.0 - s / 100} for s in range(1, STEPS + 1)], "note": pad}


def _golden(pad: str) -> Any:
    values = {str(s): 2.0 - s / 100 for s in range(1, STEPS + 1)}
    return {"lm loss": {"values": values}, "note": {"values": {}, "text": pad}}


def _records(pad: str) -> Any:
    return [{"step": s, "loss": 2.0 - s / 100, "note": pad if s == 1 else ""} for s in range(1, STEPS + 1)]


@pytest.mark.parametrize(
    ("fmt", "doc"),
    [("hf_trainer_state", _trainer_state), ("megatron_golden_values", _golden), ("json_document", _records)],
)
def test_a_json_document_named_by_its_format_is_refused_past_the_bound_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, doc: Callable[[str], Any]
) -> None:
    """With ``--format`` given, detection's bound was never met: the file was read and parsed whole,
    whatever its size. Now refused first, naming the file, its size and the bound (1 GiB; 1 MiB here)."""
    monkeypatch.setattr(document, "MAX_DOCUMENT_BYTES", 1 << 20)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(doc("x" * (4 << 20)), indent=1))
    err, peak = _peak(lambda: load(path, fmt))
    assert isinstance(err, UnreadableLog)
    assert str(err).startswith("state.json is 4 MiB of JSON") and "over the 1 MiB" in str(err), err
    assert peak < 256 << 10, peak
    # Under the bound the same file reads as before; and a small one, as it always did.
    monkeypatch.setattr(document, "MAX_DOCUMENT_BYTES", 8 << 20)
    small = tmp_path / "small.json"
    small.write_text(json.dumps(doc("")))
    for p in (path, small):
        assert [(r.step, r.loss) for r in load(p, fmt).records] == [
            (s, 2.0 - s / 100) for s in range(1, STEPS + 1)
        ]
