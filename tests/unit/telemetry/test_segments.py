"""Rotated telemetry streams: sealed, compressed segments read back in order as one stream."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any

import pytest

from steadytune.config.load import ConfigError, load_supervise_config
from steadytune.records import StepRecord
from steadytune.regularfile import open_regular
from steadytune.rundir import RunDir
from steadytune.telemetry import segments
from steadytune.telemetry.jsonl import JsonlReader, stream_last_line
from steadytune.telemetry.store import RunStore
from steadytune.telemetry.stream import JsonlWriter

SEGMENT = segments.MIN_SEGMENT_BYTES


def _numbers(path: Path, **kw: int) -> list[int]:
    return [d["i"] for d in JsonlReader(path, **kw).dicts()]


def _write(w: JsonlWriter, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        w.write_raw({"type": "x", "i": i, "pad": "p" * (i % 50)})


@pytest.mark.parametrize("keep_open", [False, True])
def test_a_tailer_mid_file_loses_and_repeats_nothing_across_rotations(
    tmp_path: Path, keep_open: bool
) -> None:
    live = tmp_path / "rank-0.jsonl"
    tailer = JsonlReader(live, keep_open=keep_open)
    seen: list[int] = []
    with JsonlWriter(live, segment_bytes=SEGMENT) as w:
        for lo in range(0, 3000, 97):  # the tailer reads between writes, often mid-way through a file
            _write(w, lo, min(lo + 97, 3000))
            seen += [d["i"] for d in tailer.dicts()]
    seen += [d["i"] for d in tailer.dicts()]
    assert seen == list(range(3000))
    sealed = segments.segments(live)
    assert len(sealed) >= 5 and all(s.compressed for s in sealed)  # closing waits for the compression
    assert [s.number for s in sealed] == list(range(1, len(sealed) + 1))
    assert live.stat().st_size < SEGMENT
    assert _numbers(live) == list(range(3000))  # a new reader: the whole stream, once
    tailer.close()


def test_a_held_live_file_reads_as_one_opened_at_every_call(tmp_path: Path) -> None:
    """A reader that holds the live file open returns, call by call, what one that opens it at every
    call returns: across rotations, a budget that stops mid-file, a torn line, a replaced file."""
    live = tmp_path / "rank-0.jsonl"
    held, fresh = JsonlReader(live, keep_open=True), JsonlReader(live)

    def both(budget: int | None = None) -> list[int]:
        got = [d["i"] for d in held.dicts(budget)]
        assert got == [d["i"] for d in fresh.dicts(budget)]
        assert held.position == fresh.position and held.stopped_at_budget == fresh.stopped_at_budget
        return got

    seen: list[int] = []
    with JsonlWriter(live, segment_bytes=SEGMENT) as w:
        for lo in range(0, 1500, 40):
            _write(w, lo, min(lo + 40, 1500))
            seen += both(4096 if lo % 200 == 0 else None)
        with open(live, "ab") as f:
            f.write(b'{"type":"x","i":1500')  # torn: left for the next call
        seen += both()
        with open(live, "ab") as f:
            f.write(b"}\n")
        seen += both()
    assert len(segments.segments(live)) >= 3
    while held.stopped_at_budget or not seen or seen[-1] != 1500:
        seen += both()
    assert seen == list(range(1501))
    live.unlink()  # replaced by someone else, not sealed: the new file is read from the same offset
    live.write_bytes(b"x" * held.offset + b'{"type":"x","i":7}\n')
    assert both() == [7]
    held.close()


def test_a_held_live_file_is_opened_once_until_it_is_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from steadytune.telemetry import jsonl

    opened: list[str] = []

    def counting_open(path: Path, *args: Any, **kwargs: Any) -> object:
        opened.append(Path(path).name)
        return open_regular(path, *args, **kwargs)

    monkeypatch.setattr(jsonl, "open_regular", counting_open)
    live = tmp_path / "rank-0.jsonl"
    reader = JsonlReader(live, keep_open=True)
    seen: list[int] = []
    with JsonlWriter(live, segment_bytes=SEGMENT) as w:
        for lo in range(0, 2000, 10):  # at most one rotation between two reads
            _write(w, lo, lo + 10)
            seen += [d["i"] for d in reader.dicts()]
    assert seen == list(range(2000))
    assert opened == ["rank-0.jsonl"] * (len(segments.segments(live)) + 1)  # 200 reads
    reader.close()


def test_a_saved_position_reads_on_in_another_reader(tmp_path: Path) -> None:
    live = tmp_path / "system.jsonl"
    with JsonlWriter(live, segment_bytes=SEGMENT) as w:
        _write(w, 0, 500)
        first = JsonlReader(live)
        got = [d["i"] for d in first.dicts()]
        _write(w, 500, 2000)  # rotates several times past the first reader's position
    seg, offset = first.position
    got += _numbers(live, segment=seg, offset=offset)
    assert got == list(range(2000))


def _sealed_stream(tmp_path: Path, n: int = 1200) -> Path:
    """A stream rotated a few times, its segments still plain (no writer thread compressed them)."""
    live = tmp_path / "rank-0.jsonl"
    with open(live, "w") as f:
        for i in range(n):
            f.write(f'{{"type":"x","i":{i}}}\n')
            if i in (299, 599, 899):
                f.close()
                segments.seal(live)
                f = open(live, "w")  # noqa: SIM115
    return live


def test_every_moment_of_a_rotation_reads_back_whole(tmp_path: Path) -> None:
    live = _sealed_stream(tmp_path)
    assert _numbers(live) == list(range(1200))  # sealed, not compressed yet

    first = segments.segments(live)[0].path
    gz = segments.compress(first)
    assert gz is not None and not first.exists()
    assert _numbers(live) == list(range(1200))  # compressed

    # Both forms of one segment (a crash before the plain one was removed): read once.
    with gzip.open(gz, "rb") as f:
        first.write_bytes(f.read())
    assert _numbers(live) == list(range(1200))

    # A compression cut short: a temp file nobody reads.
    second = segments.segments(live)[1].path
    tmp = tmp_path / f".{second.name}.gz.abc123.tmp"
    tmp.write_bytes(gzip.compress(second.read_bytes())[:100])
    assert _numbers(live) == list(range(1200))

    # No live file (a crash between the seal and the fresh file): the segments are the stream.
    live.rename(tmp_path / "aside")
    assert _numbers(live) == list(range(900))
    (tmp_path / "aside").rename(live)

    # The stream's next writer puts it right.
    segments.finish(live)
    assert not tmp.exists() and all(s.compressed for s in segments.segments(live))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rank-0.00001.jsonl.gz", "rank-0.00002.jsonl.gz", "rank-0.00003.jsonl.gz", "rank-0.jsonl",
    ]  # fmt: skip
    assert _numbers(live) == list(range(1200))


def test_a_damaged_segment_is_reported_and_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    live = _sealed_stream(tmp_path)
    segments.finish(live)
    gz = segments.segment_path(live, 2, gz=True)
    data = bytearray(gz.read_bytes())
    data[-8] ^= 0xFF  # the CRC in the trailer
    gz.write_bytes(bytes(data))
    assert _numbers(live) == [*range(300), *range(600, 1200)]
    assert gz in segments.BAD_SEGMENTS and "CRC" in segments.BAD_SEGMENTS[gz]
    assert "damaged" in caplog.text

    cut = segments.segment_path(live, 3, gz=True)
    cut.write_bytes(cut.read_bytes()[:-20])  # a cut end
    assert _numbers(live) == [*range(300), *range(900, 1200)]


def test_missing_segments_are_passed_over(tmp_path: Path) -> None:
    live = _sealed_stream(tmp_path)
    segments.segment_path(live, 1).unlink()
    assert _numbers(live) == list(range(300, 1200))


def test_the_last_line_of_a_stream_is_found_in_its_segments(tmp_path: Path) -> None:
    live = _sealed_stream(tmp_path)
    segments.finish(live)
    assert stream_last_line(live)[1] == {"type": "x", "i": 1199}
    end, last = stream_last_line(live, accept=lambda d: d["i"] < 700)
    assert last == {"type": "x", "i": 699}
    assert _numbers(live, segment=end[0], offset=end[1])[:1] == [700]
    live.write_text("")  # just rotated
    end, last = stream_last_line(live)
    third = gzip.decompress(segments.segment_path(live, 3, gz=True).read_bytes())
    assert last == {"type": "x", "i": 899} and end == (3, len(third))


def test_run_db_follows_a_rotated_stream_and_rebuilds_from_its_segments(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    w = JsonlWriter(run.telemetry(0), segment_bytes=SEGMENT)
    for s in range(400):
        w.write(StepRecord(step=s, ts=1000.0 + s, loss=1.0 + s / 1000))
    with RunStore(run.db) as store:
        store.sync(run)
    for s in range(400, 1500):
        w.write(StepRecord(step=s, ts=1000.0 + s, loss=1.0 + s / 1000))
    w.close()
    assert len(segments.segments(run.telemetry(0))) >= 3
    assert [p.name for p in run.telemetry_files()] == ["rank-0.jsonl"]  # segments are no rank's live file
    with RunStore(run.db) as store:  # another process: it goes on from the saved position
        assert store.sync(run) == 1100
        assert store.rebuild(run) == 1500
        assert store.sync(run) == 0


def test_adopt_starts_after_the_last_indexed_line_of_a_rotated_stream(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    steps = [StepRecord(step=s, ts=1000.0 + s, loss=1.0) for s in range(600)]
    with JsonlWriter(run.telemetry(0), segment_bytes=SEGMENT) as w:
        for r in steps:
            w.write(r)
    run.telemetry(0).write_text("")  # the live file just rotated
    with RunStore(run.db) as store:
        store.add_steps(steps)
        assert store.adopt(run) == ["telemetry/rank-0.jsonl"]
        assert store.sync(run) == 0


def test_a_writer_follows_a_stream_another_writer_rotated(tmp_path: Path) -> None:
    live = tmp_path / "rank-0.jsonl"
    quiet = JsonlWriter(live, segment_bytes=SEGMENT)  # e.g. the log adapter, while a guard writes
    with JsonlWriter(live, segment_bytes=SEGMENT) as busy:
        _write(busy, 0, 1000)
    _write(quiet, 1000, 1010)
    quiet.close()
    assert _numbers(live) == list(range(1010))


def test_the_rotation_size_is_validated_with_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        load_supervise_config(None, ["run.telemetry_segment_bytes=1000"])
    text = err.value.render()
    assert "run.telemetry_segment_bytes" in text and "1000" in text and "16384" in text
    assert load_supervise_config(None, ["run.telemetry_segment_bytes=0"]).run.telemetry_segment_bytes == 0
    assert segments.segment_bytes_from_env({}) == segments.DEFAULT_SEGMENT_BYTES
    assert segments.segment_bytes_from_env({segments.SEGMENT_ENV: "0"}) == 0


def test_run_db_reads_a_replaced_stream_again(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    with JsonlWriter(run.telemetry(0), segment_bytes=SEGMENT) as w:
        for s in range(600):
            w.write(StepRecord(step=s, ts=1000.0 + s, loss=1.0))
    with RunStore(run.db) as store:
        assert store.sync(run) == 600
        shutil.rmtree(run.telemetry_dir)  # the stream is written anew, from its start
        with JsonlWriter(run.telemetry(0), segment_bytes=SEGMENT) as w:
            for s in range(5):
                w.write(StepRecord(step=s, ts=2000.0 + s, loss=2.0))
            assert store.sync(run) == 5
            for s in range(5, 900):  # and rotated anew, past the segment numbers of the first stream
                w.write(StepRecord(step=s, ts=2000.0 + s, loss=2.0))
        assert store.sync(run) == 895
