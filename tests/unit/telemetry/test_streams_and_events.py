from __future__ import annotations

import json
from pathlib import Path

from steadytune.records import Event, Heartbeat, StepRecord
from steadytune.telemetry.events import GENESIS, EventLog, entry_hash, read_events
from steadytune.telemetry.stream import JsonlTailer, JsonlWriter


def test_tailer_reads_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = JsonlWriter(path)
    tail = JsonlTailer(path)
    assert tail.read() == []
    w.write(StepRecord(step=1, ts=1.0, loss=2.0))
    with open(path, "a") as f:
        f.write('{"type":"step","step":2,"ts"')  # a writer died mid-line
    got = tail.read()
    assert [r.step for r in got] == [1]
    with open(path, "a") as f:
        f.write(":2.0}\n")
    w.write(Heartbeat(ts=3.0, step=2))
    got = tail.read()
    assert [type(r).__name__ for r in got] == ["StepRecord", "Heartbeat"]
    assert tail.read() == []


def test_tailer_counts_garbage_lines_without_failing(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('not json\n{"type":"step","step":1,"ts":0}\n{"type":"nope"}\n')
    tail = JsonlTailer(path)
    assert [r.step for r in tail.read()] == [1]
    assert tail.bad_lines == 2


def test_event_log_chains_and_continues_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path, "run-1", clock=lambda: 10.0)
    a = log.emit("lifecycle", "run_started")
    b = log.emit("anomaly", "loss_spike", severity="warning", step=4)
    assert a.prev_hash == GENESIS and b.prev_hash == a.hash and (a.seq, b.seq) == (0, 1)
    reopened = EventLog(path, "run-1", clock=lambda: 11.0)  # e.g. the supervisor restarted
    c = reopened.emit("lifecycle", "run_completed")
    assert c.prev_hash == b.hash and c.seq == 2
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for entry in lines:
        assert entry_hash(entry) == entry["hash"]
    assert [e.name for e in read_events(path)] == ["run_started", "loss_spike", "run_completed"]
    assert lines[1]["run_id"] == "run-1" and lines[1]["host"] and lines[1]["pid"]


def test_event_log_survives_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    EventLog(path, "r").emit("lifecycle", "run_started")
    with open(path, "a") as f:
        f.write('{"type":"event","kind":"life')
    log = EventLog(path, "r")
    ev = log.append(Event(ts=1.0, kind="lifecycle", name="worker_started"))
    assert ev.seq == 1
    assert [e.name for e in read_events(path)] == ["run_started", "worker_started"]
