"""The one JSONL reader: torn lines, lines over the bound, nesting too deep to parse, the last line.

The bound is 16 MiB by default; the tests lower it (``jsonl.MAX_LINE_BYTES``) so that a
line "over the bound" is a few MB and the tests stay fast. Memory is measured with
tracemalloc: a line over the bound must never be held whole.
"""

from __future__ import annotations

import json
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from steadytune.records import StepRecord, to_json
from steadytune.telemetry import jsonl
from steadytune.telemetry.jsonl import JsonlReader, Skipped, last_line

BOUND = 64 << 10
HUGE = 8 << 20  # 128 times the lowered bound
NESTED = b"[" * 100_000


def step_line(step: int) -> bytes:
    return to_json(StepRecord(step=step, ts=float(step), loss=1.0)).encode() + b"\n"


def write(path: Path, *parts: bytes) -> Path:
    path.write_bytes(b"".join(parts))
    return path


def append(path: Path, *parts: bytes) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(parts))


def peak_bytes(fn: Callable[[], object]) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture()
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", BOUND)
    return BOUND


def test_torn_last_line_is_kept_for_the_next_read(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", step_line(0), step_line(1)[:7])
    reader = JsonlReader(path)
    assert [d["step"] for d in reader.read_dicts()] == [0]
    assert reader.offset == len(step_line(0))
    assert reader.read_dicts() == []  # still torn: nothing new, nothing lost
    append(path, step_line(1)[7:], step_line(2))
    assert [d["step"] for d in reader.read_dicts()] == [1, 2]
    assert (reader.bad_lines, reader.long_lines) == (0, 0)


def test_a_missing_file_reads_as_empty(tmp_path: Path) -> None:
    reader = JsonlReader(tmp_path / "nope.jsonl")
    assert reader.read_dicts() == [] and reader.offset == 0
    assert last_line(tmp_path / "nope.jsonl") == (0, None)


def test_final_read_takes_an_unterminated_last_line(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", step_line(0), step_line(1)[:-1])
    assert [d["step"] for d in JsonlReader(path).dicts(final=True)] == [0, 1]


def test_line_over_the_bound_is_skipped_without_being_read_whole(tmp_path: Path, small_bound: int) -> None:
    path = write(
        tmp_path / "a.jsonl", step_line(0), b'{"type":"step","junk":"' + b"x" * HUGE
    )  # no newline yet
    reader = JsonlReader(path)
    got, peak = peak_bytes(reader.read_dicts)
    assert [d["step"] for d in got] == [0]
    assert peak < 1 << 20, f"peak {peak} bytes while skipping an {HUGE}-byte line"
    assert reader.long_lines == 0  # not counted before its end is seen
    assert reader.offset > HUGE  # ... but not read again either
    append(path, b"x" * HUGE, b'"}\n', step_line(1))
    got, peak = peak_bytes(reader.read_dicts)
    assert [d["step"] for d in got] == [1] and reader.long_lines == 1
    assert peak < 1 << 20


def test_line_over_the_bound_with_its_newline_is_counted_once(tmp_path: Path, small_bound: int) -> None:
    path = write(tmp_path / "a.jsonl", step_line(0), b"[" + b"1," * (BOUND) + b"1]\n", step_line(1))
    reader = JsonlReader(path)
    assert [d["step"] for d in reader.read_dicts()] == [0, 1]
    assert (reader.long_lines, reader.bad_lines, reader.lines) == (1, 0, 3)


def test_a_reader_started_inside_a_long_line_skips_to_its_end(tmp_path: Path, small_bound: int) -> None:
    head = step_line(0)
    path = write(tmp_path / "a.jsonl", head, b'{"a":"' + b"y" * (3 * BOUND) + b'"}\n', step_line(1))
    # E.g. an offset saved by a process that stopped while skipping that line.
    reader = JsonlReader(path, offset=len(head) + BOUND)
    assert [d["step"] for d in reader.read_dicts()] == [1]
    assert reader.long_lines == 1 and reader.bad_lines == 0


def test_byte_budget_is_soft_a_line_longer_than_it_is_read_whole(tmp_path: Path) -> None:
    long = json.dumps({"type": "step", "step": 5, "ts": 0.0, "pad": "z" * 5000}).encode() + b"\n"
    path = write(tmp_path / "a.jsonl", long, step_line(6), step_line(7))
    reader = JsonlReader(path, chunk_bytes=1024)
    first = reader.read_dicts(max_bytes=100)
    assert [d["step"] for d in first][:1] == [5] and len(first) < 3  # over budget, but the line is whole
    rest = reader.read_dicts()
    assert [d["step"] for d in first + rest] == [5, 6, 7]


def test_deeply_nested_line_is_skipped_and_counted(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", step_line(0), NESTED + b"\n", b"not json\n", b"[1,2]\n", step_line(1))
    reader = JsonlReader(path)
    assert [d["step"] for d in reader.read_dicts()] == [0, 1]
    assert reader.bad_lines == 3  # nested too deep, not JSON, JSON but not an object


def test_values_report_line_numbers_and_what_was_skipped(tmp_path: Path, small_bound: int) -> None:
    nested = b"[" * 20_000  # under the lowered bound
    path = write(tmp_path / "a.jsonl", step_line(0), b"\n", nested + b"\n", b"z" * (2 * BOUND) + b"\n", b"{}")
    got = list(JsonlReader(path).values(final=True))
    assert got == [(1, json.loads(step_line(0))), (3, Skipped.BAD), (4, Skipped.TOO_LONG), (5, {})]


def test_last_line_with_and_without_trailing_newline(tmp_path: Path) -> None:
    a, b = step_line(0), step_line(1)
    path = write(tmp_path / "a.jsonl", a, b)
    assert last_line(path) == (len(a) + len(b), json.loads(b))
    write(path, a, b[:-1])  # the last line has no newline: torn, unless asked for
    assert last_line(path) == (len(a), json.loads(a))
    assert last_line(path, torn=True) == (len(a) + len(b) - 1, json.loads(b))
    write(path, a, b, b"\n\n")
    assert last_line(path) == (len(a) + len(b), json.loads(b))
    write(path, b[:-1])
    assert last_line(path) == (0, None) and last_line(path, torn=True)[1] == json.loads(b)
    write(path, b"")
    assert last_line(path) == (0, None)


def test_last_line_passes_over_nested_and_long_lines_reading_backwards(
    tmp_path: Path, small_bound: int
) -> None:
    a = step_line(0)
    path = write(tmp_path / "a.jsonl", a, NESTED + b"\n", b'{"pad":"' + b"q" * HUGE + b'"}\n', b"garbage")
    (end, value), peak = peak_bytes(lambda: last_line(path, torn=True, block=4096))
    assert (end, value) == (len(a), json.loads(a))
    assert peak < 1 << 20


# ---- every reader of the code base goes through it --------------------------------------------
# Each consumer prepares what it needs, then returns the read to measure (it returns the steps read).


def _tailer(path: Path) -> Callable[[], list[int]]:
    from steadytune.telemetry.stream import JsonlTailer

    return lambda: [r.step for r in JsonlTailer(path).read()]


def _iter_records(path: Path) -> Callable[[], list[int]]:
    from steadytune.telemetry.stream import iter_records

    return lambda: [r.step for r in iter_records(path)]


def _store_sync(path: Path) -> Callable[[], list[int]]:
    from steadytune.rundir import RunDir
    from steadytune.telemetry.store import RunStore

    run = RunDir(path.parent.parent)  # path is RUN/telemetry/rank-0.jsonl

    def read() -> list[int]:
        with RunStore(run.db) as store:
            store.sync(run)
            return [r[0] for r in store.step_series(("loss",), points=100).rows]

    return read


def _poll_files(path: Path) -> Callable[[], list[int]]:
    from steadytune.rundir import RunDir
    from steadytune.supervise.log_adapter import LogAdapter
    from steadytune.telemetry.stream import JsonlWriter, iter_records

    out = path.parent.parent / "out"
    out.mkdir()
    run = RunDir(path.parent.parent / "ext")
    writer = JsonlWriter(run.telemetry(0))
    # Watched from before the job writes: rows a log held before then are an earlier run's.
    adapter = LogAdapter(writer, ["true"], out, clock=lambda: 0.0)
    with open(path, "rb") as src, open(out / "trainer_log.jsonl", "wb") as dst:
        for line in src:  # the same lines, the step ones in LLaMA-Factory's own format
            for step in (0, 1):
                if line == step_line(step):
                    line = json.dumps({"current_steps": step, "loss": 1.0}).encode() + b"\n"
            dst.write(line)
        del line

    def read() -> list[int]:
        adapter.poll_files()
        writer.close()
        return [r.step for r in iter_records(run.telemetry(0))]

    return read


def rank_file(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "telemetry" / "rank-0.jsonl"
    path.parent.mkdir(parents=True)
    return path


CONSUMERS = {"JsonlTailer": _tailer, "iter_records": _iter_records, "RunStore.sync": _store_sync,
             "LogAdapter.poll_files": _poll_files}  # fmt: skip


@pytest.mark.parametrize("consumer", CONSUMERS.values(), ids=CONSUMERS.keys())
def test_consumers_skip_a_deeply_nested_line(tmp_path: Path, consumer) -> None:
    path = write(rank_file(tmp_path), step_line(0), NESTED + b"\n", step_line(1))
    assert consumer(path)() == [0, 1]


@pytest.mark.parametrize("consumer", CONSUMERS.values(), ids=CONSUMERS.keys())
def test_consumers_skip_a_huge_line_in_bounded_memory(tmp_path: Path, small_bound: int, consumer) -> None:
    path = write(
        rank_file(tmp_path),
        step_line(0),
        b'{"type":"step","step":9,"pad":"' + b"w" * HUGE + b'"}\n',
        step_line(1),
    )
    read = consumer(path)
    steps, peak = peak_bytes(read)
    assert steps == [0, 1]
    assert peak < 3 << 20, f"peak {peak} bytes for a {HUGE}-byte line"


def test_event_log_continues_past_a_nested_or_huge_last_line(tmp_path: Path, small_bound: int) -> None:
    from steadytune.telemetry.events import EventLog, read_events

    path = tmp_path / "events.jsonl"
    first = EventLog(path, "r").emit("lifecycle", "run_started")
    append(path, NESTED + b"\n", b'{"pad":"' + b"v" * HUGE + b'"}\n')
    log, peak = peak_bytes(lambda: EventLog(path, "r"))
    assert peak < 3 << 20
    ev = log.emit("lifecycle", "worker_started")
    assert (ev.seq, ev.prev_hash) == (1, first.hash)
    events, peak = peak_bytes(lambda: read_events(path))
    assert [e.name for e in events] == ["run_started", "worker_started"] and peak < 3 << 20


def test_store_adopt_passes_over_a_nested_last_line(tmp_path: Path) -> None:
    from steadytune.rundir import RunDir
    from steadytune.telemetry.store import RunStore
    from steadytune.telemetry.stream import JsonlWriter

    run = RunDir(tmp_path / "r").create()
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(StepRecord(step=0, ts=0.0, loss=1.0))
    append(run.telemetry(0), NESTED + b"\n")
    with RunStore(run.db) as store:
        store.add_steps([StepRecord(step=0, ts=0.0, loss=1.0)])
        assert store.adopt(run) == ["telemetry/rank-0.jsonl"]
        assert store.get_meta("offset:telemetry/rank-0.jsonl") == str(len(step_line(0)))


def test_control_ack_and_repro_bundle_pass_over_a_nested_event_line(tmp_path: Path) -> None:
    from steadytune.cli.control import _acked, _events_end
    from steadytune.forensics.bundle import _event_lines
    from steadytune.rundir import RunDir
    from steadytune.telemetry.events import EventLog

    run = RunDir(tmp_path / "r").create()
    log = EventLog(run.events, run.run_id, clock=lambda: 10.0)
    log.emit("lifecycle", "run_started", step=1)
    since = _events_end(run)
    append(run.events, NESTED + b"\n")
    log.emit("control", "ack_pause", data={"request_id": "req-1"}, step=2)
    assert _acked(run, "req-1", since)["name"] == "ack_pause"
    got = [json.loads(line)["name"] for line in _event_lines(run, 0, 5, 0.0, 100.0)]
    assert got == ["run_started", "ack_pause"]


# -- grep_lines: the few lines that name something, found over whole chunks -----------------------
STEP_7 = re.compile(rb'"step":7(?![0-9])')


def test_grep_lines_gives_each_matching_line_once_across_chunk_edges(tmp_path: Path) -> None:
    lines = [step_line(s % 10) for s in range(300)]  # "step":7 thirty times, among 70-byte lines
    path = write(tmp_path / "a.jsonl", *lines)
    want = [ln.rstrip(b"\n") for ln in lines if json.loads(ln)["step"] == 7]
    for chunk in (16, 61, 100, 4096):  # shorter than a line, about one, several
        assert list(jsonl.grep_lines(path, STEP_7, chunk_bytes=chunk)) == want


def test_grep_lines_gives_a_line_with_two_matches_once(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", b'{"step":7,"extra":{"step":7}}\n', step_line(8))
    assert list(jsonl.grep_lines(path, STEP_7)) == [b'{"step":7,"extra":{"step":7}}']


def test_grep_lines_leaves_out_a_torn_last_line_and_one_over_the_bound(tmp_path: Path) -> None:
    long = b'{"step":7,"pad":"' + b"x" * 5000 + b'"}\n'
    path = write(tmp_path / "a.jsonl", step_line(7), long, step_line(7), step_line(7)[:12])
    got = list(jsonl.grep_lines(path, STEP_7, max_line_bytes=1000, chunk_bytes=256))
    assert got == [step_line(7).rstrip(b"\n")] * 2


def test_grep_lines_holds_a_chunk_not_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", *(step_line(s) for s in range(100_000)))  # about 7 MB
    found, peak = peak_bytes(lambda: list(jsonl.grep_lines(path, STEP_7, chunk_bytes=64 << 10)))
    assert found == [step_line(7).rstrip(b"\n")]
    assert peak < 5 * (64 << 10)  # the chunk, the chunk joined to the line begun before it, a line
    assert path.stat().st_size > 20 * peak


def test_a_budgeted_reader_says_whether_more_is_waiting_across_segments(tmp_path: Path) -> None:
    from steadytune.telemetry import segments

    live = tmp_path / "rank-0.jsonl"
    write(live, *(step_line(s) for s in range(0, 300)))
    segments.compress(segments.seal(live))
    write(live, *(step_line(s) for s in range(300, 600)))
    reader, got, reads = JsonlReader(live, chunk_bytes=4096), [], 0
    while True:
        got += [d["step"] for d in reader.dicts(max_bytes=4096)]
        reads += 1
        if not reader.stopped_at_budget:
            break
    assert got == list(range(600)) and reads > 5  # ~40 KB in budgets of 4 KB, then the end seen
    assert reader.read_dicts(max_bytes=4096) == [] and not reader.stopped_at_budget
