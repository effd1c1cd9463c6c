"""A log streamed through ``analyze``: the same records and verdict as read whole, none of them kept."""

from __future__ import annotations

import gc
import json
import math
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steadytune.cli.analyze import analyze_path
from steadytune.config.detect import DetectConfig
from steadytune.detect.offline import replay
from steadytune.importers import NotStreamable, jsonl_log, load, stream
from steadytune.importers.stream import CHUNK
from steadytune.records import StepRecord


def _write(path: Path, rows: Iterable[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _curve(steps: int, seed: int = 3, spike_at: int | None = None) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for s in range(1, steps + 1):
        level = 0.6 + 1.8 / (1 + s / max(1, steps / 50))
        yield {"step": s, "loss": 3 * level if s == spike_at else level * (1 + rng.gauss(0, 0.03))}


def _repeated(steps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for s in range(1, steps):
        n = 3 if s % 31 == 0 or len(rows) in (CHUNK - 2, CHUNK - 1) else 2 if s % 9 == 0 else 1
        rows += (
            {
                "step": s,
                "loss": 2.0 - s / 900 + i / 50,
                "grad_norm": 1.0 + s % 7,
                "epoch": s / 1e3,
                "ts": s + i,
            }
            for i in range(n)
        )
    return rows


# Shapes the streaming reader takes: each must give exactly the records the whole-log reader gives.
STREAMED: dict[str, list[Any]] = {
    "plain": list(_curve(300, spike_at=200)),
    "aliases and extras": [
        {"_step": s, "train/loss": 2.0 - s / 400, "learning_rate": 1e-4, "tokens": 4096, "mfu": 0.4}
        for s in range(1, 200)
    ],
    "micro-batches": [{"step": s // 3, "loss": 2.0 + (s % 3) / 10} for s in range(3, 600)],
    "a header, typed and eval rows": [
        {"type": "config", "lr": 1e-4},
        *({"type": "train", "step": s, "loss": 2.0 - s / 500, "grad_norm": 1.0} for s in range(1, 150)),
        {"type": "eval", "step": 150, "loss": 1.9, "accuracy": 0.5},
    ],
    "NaN, strings, nulls, nesting, huge numbers": [
        *({"step": s, "loss": 2.0 - s / 500} for s in range(1, 100)),
        '{"step": 100, "loss": NaN}',
        {"step": 101, "loss": "1.8", "note": "warm"},
        {"step": 102, "loss": None, "grad_norm": 2.0},
        {"step": 103, "metrics": {"loss": 1.7, "grad_norm": 1.0}},
        '{"step": 104, "loss": 1.7, "tokens": 1' + "0" * 400 + "}",
        {"step": 105, "loss": 1.6, "epoch": "Infinity"},
        {"step": 105, "loss": 1.6, "seen": 123456789012345678901234, "big": 1e300},
        *({"step": s, "loss": 1.6, "epoch": s / 100} for s in range(106, 160)),
    ],
    # Rows read as they are (every key but the step a field under its own name), some steps logged
    # two or three times, one of them across the end of the reader's first block of CHUNK rows.
    "fields under their own names, steps repeated": _repeated(400),
    "rank 0 named": [{"step": s, "loss": 2.0 - s / 500, "rank": 0} for s in range(1, 120)],
    "an RL log": [
        {"step": s, "reward": 0.1 + s / 300, "kl": 0.01 * s, "loss": 0.01 * ((-1) ** s)}
        for s in range(1, 160)
    ],
}

# Shapes that need the whole log: each is read whole, with the same result as before.
WHOLE: dict[str, list[Any]] = {
    "two runs": [*_curve(120, seed=1), *_curve(150, seed=2)],
    "ranks": [{"step": s // 2, "rank": s % 2, "loss": 2.0 - s / 900} for s in range(2, 300)],
    "a second loss-like series": [
        {"step": s, "loss": 2.0, "train_loss": 2.0 - s / 400} for s in range(1, 150)
    ],
    "a counter of its own": [{"grpo_step": s, "loss": 2.0 - s / 500} for s in range(1, 120)],
    "no step named": [{"loss": 2.0 - s / 400} for s in range(1, 150)],
    "a damaged step": [
        *({"step": s, "loss": 2.0 - s / 400} for s in range(1, 100)),
        {"step": 2**62, "loss": 1},
    ],
    "no loss": [{"step": s, "accuracy": s / 200} for s in range(1, 100)],
}


@pytest.fixture(params=["orjson", "json"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Rows parsed by orjson where it is installed, and by the standard library where it is not."""
    if request.param == "json":
        monkeypatch.setattr(jsonl_log, "_fast_loads", json.loads)
        monkeypatch.setattr(jsonl_log, "_FAST_IS_JSON", True)
    return str(request.param)


@pytest.mark.parametrize("name", STREAMED)
def test_a_streamed_log_gives_the_records_the_whole_log_reader_gives(
    tmp_path: Path, name: str, parser: str
) -> None:
    path = _write(tmp_path / "log.jsonl", STREAMED[name])
    whole = load(path)
    streamed = stream(path)
    assert streamed is not None
    assert list(streamed) == whole.records
    assert (streamed.steps, streamed.metrics) == (whole.steps, whole.metrics)


@pytest.mark.parametrize("name", WHOLE)
def test_a_log_that_needs_the_whole_file_says_so_and_is_read_whole(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path / "log.jsonl", WHOLE[name])
    streamed = stream(path)
    if streamed is not None:
        with pytest.raises(NotStreamable):
            list(streamed)
    assert _report(analyze_path(str(path), DetectConfig())) == _report(
        analyze_path(str(path), DetectConfig(), keep_series=True)
    )


@pytest.mark.parametrize("name", STREAMED)
def test_analyze_says_the_same_of_a_streamed_log_and_keeps_no_record(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path / "log.jsonl", STREAMED[name])
    streamed = analyze_path(str(path), DetectConfig())
    whole = analyze_path(str(path), DetectConfig(), keep_series=True)
    assert _report(streamed) == _report(whole)
    assert whole.series is not None and _records_held(whole) == len(whole.series.records)
    assert streamed.series is None and _records_held(streamed) == 0


def test_no_other_format_and_no_compressed_log_is_streamed(tmp_path: Path) -> None:
    text = tmp_path / "train.log"
    text.write_text("".join(f"step {s} | loss {2.0 - s / 400:.4f}\n" for s in range(1, 100)))
    gz = tmp_path / "log.jsonl.gz"
    import gzip

    gz.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in _curve(100))))
    assert stream(text) is None and stream(gz) is None and stream(tmp_path / "missing.jsonl") is None
    assert analyze_path(str(gz), DetectConfig()).steps == 100


def test_the_records_alive_while_a_long_log_is_analysed_do_not_grow_with_its_steps(tmp_path: Path) -> None:
    """200,000 steps: at every 50,000th, the step records alive are counted (objects, not bytes)."""
    steps = 200_000
    path = _write(tmp_path / "long.jsonl", _curve(steps, spike_at=140_000))
    alive: list[int] = []

    def counted(records: Iterable[StepRecord]) -> Iterator[StepRecord]:
        for i, rec in enumerate(records, 1):
            if i % 50_000 == 0:
                alive.append(sum(type(o) is StepRecord for o in gc.get_objects()))
            yield rec

    streamed = stream(path)
    assert streamed is not None
    found = replay(counted(streamed))
    # A log held whole would show 50k, 100k, ...; a streamed one, what it reads ahead.
    assert len(alive) == 4 and max(alive) <= 2 * CHUNK, alive
    assert streamed.steps == steps
    spikes = [a.start_step for a in found.anomalies if a.kind == "loss_spike"]
    assert spikes == [140_000]


def _report(r: Any) -> tuple[Any, ...]:
    return (r.error, r.format, r.steps, r.metrics, r.anomalies, r.objective, r.notes)


def _records_held(result: Any) -> int:
    """The step records reachable from ``result``."""
    seen: set[int] = set()
    todo = [result]
    n = 0
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (str, bytes, int, float, type)) or o is None:
            continue
        seen.add(id(o))
        n += type(o) is StepRecord
        todo.extend(gc.get_referents(o))
    return n


def test_the_test_counts_what_it_should() -> None:
    rec = StepRecord(step=1, ts=0.0, loss=math.pi)
    assert _records_held({"a": [rec, rec], "b": (rec,)}) == 1


def test_a_step_of_the_repeated_rows_goes_on_past_the_readers_first_block() -> None:
    rows = STREAMED["fields under their own names, steps repeated"]
    assert rows[CHUNK - 1]["step"] == rows[CHUNK]["step"]
