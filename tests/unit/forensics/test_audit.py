"""audit verify: the chain holds, and each kind of tampering is caught where it happened."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from steadytune.forensics.audit import verify_chain, verify_run
from steadytune.rundir import RunDir
from steadytune.telemetry.events import EventLog


@pytest.fixture()
def run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "r").create()
    log = EventLog(run.events, run.run_id, clock=lambda: 1000.0)
    for i in range(6):
        log.emit("lifecycle", f"e{i}", f"event {i}", step=i)
    return run


def lines(run: RunDir) -> list[str]:
    return run.events.read_text().splitlines()


def put(run: RunDir, rows: list[str]) -> None:
    run.events.write_text("".join(r + "\n" for r in rows))


def anchor(run: RunDir, seq: int, digest: str) -> None:
    con = sqlite3.connect(run.db)
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.executemany("INSERT INTO meta VALUES (?, ?)", [("last_event_seq", str(seq)), ("last_event_hash", digest)])
    con.commit()
    con.close()


def test_intact_log_passes_and_says_truncation_is_unchecked_without_run_db(run):
    res = verify_run(run)
    assert res.ok and res.entries == 6 and res.last_seq == 5
    assert not res.truncation_checked and "cannot be checked" in res.truncation_note


def test_edited_line(run):
    rows = lines(run)
    entry = json.loads(rows[2])
    entry["message"] = "nothing to see here"
    rows[2] = json.dumps(entry, separators=(",", ":"))
    put(run, rows)
    res = verify_chain(run.events)
    assert (res.ok, res.problem, res.first_bad_line) == (False, "edited", 3)


def test_deleted_line(run):
    rows = lines(run)
    put(run, rows[:3] + rows[4:])
    res = verify_chain(run.events)
    assert (res.ok, res.problem, res.first_bad_line) == (False, "deleted", 4)
    assert "seq jumps from 2 to 4" in res.message


def test_reordered_lines(run):
    rows = lines(run)
    rows[2], rows[3] = rows[3], rows[2]
    put(run, rows)
    res = verify_chain(run.events)
    assert (res.ok, res.problem, res.first_bad_line) == (False, "reordered", 3)
    assert "seq 2 is at line 4" in res.message
    rows = lines(run)
    rows[2], rows[3] = rows[3], rows[2]
    rows.insert(5, rows[1])  # a replayed (duplicated) old entry
    put(run, rows)
    res = verify_chain(run.events)
    assert (res.ok, res.problem, res.first_bad_line) == (False, "reordered", 6)


def test_truncated_tail_against_run_db(run):
    last = json.loads(lines(run)[-1])
    anchor(run, last["seq"], last["hash"])
    assert verify_run(run).ok and verify_run(run).truncation_checked
    put(run, lines(run)[:-2])
    res = verify_run(run)
    assert (res.ok, res.problem) == (False, "truncated") and "2 entries cut off" in res.message


def test_replaced_tail_against_run_db(run):
    anchor(run, 5, "f" * 64)
    res = verify_run(run)
    assert (res.ok, res.problem) == (False, "truncated")


def test_store_events_table_is_the_fallback_anchor(run):
    last = json.loads(lines(run)[-1])
    con = sqlite3.connect(run.db)
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, json TEXT NOT NULL)")
    con.execute("INSERT INTO events VALUES (?, ?)", (5, json.dumps(last)))
    con.commit()
    con.close()
    put(run, lines(run)[:-1])
    res = verify_run(run)
    assert res.problem == "truncated" and "events table" in res.message


def test_torn_line_from_a_crash_is_not_tampering(run):
    rows = lines(run)
    put(run, [*rows[:3], rows[3][:40]])  # the writer died mid-line
    log = EventLog(run.events, run.run_id, clock=lambda: 2000.0)  # a restart continues the chain
    log.emit("lifecycle", "after_crash")
    res = verify_chain(run.events)
    assert res.ok and res.torn_lines == [4] and res.entries == 4


def test_nested_and_over_long_lines_are_skipped_not_a_crash(run, monkeypatch):
    from steadytune.telemetry import jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 4096)
    rows = lines(run)
    put(run, [*rows[:2], "[" * 100_000, "[" * 3000, *rows[2:], "x" * 10_000])
    res = verify_run(run)
    assert res.ok and res.entries == 6
    assert (res.torn_lines, res.long_lines) == ([4], [3, 9])
