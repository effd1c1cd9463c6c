"""audit verify: the chain holds, and each kind of tampering is caught where it happened."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from steadytune.cli.main import main
from steadytune.forensics.audit import verify_chain, verify_run
from steadytune.rundir import RunDir
from steadytune.telemetry.attest import AuditTrust
from steadytune.telemetry.events import GENESIS, EventLog, entry_hash


@pytest.fixture()
def trust(tmp_path: Path) -> AuditTrust:
    return AuditTrust.open(tmp_path / "audit", create=True)  # outside the run folder


@pytest.fixture()
def run(tmp_path: Path, trust: AuditTrust) -> RunDir:
    run = RunDir(tmp_path / "r").create()
    log = EventLog(run.events, run.run_id, clock=lambda: 1000.0, audit=trust)
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
    con.executemany(
        "INSERT INTO meta VALUES (?, ?)", [("last_event_seq", str(seq)), ("last_event_hash", digest)]
    )
    con.commit()
    con.close()


def test_intact_log_passes_signed_and_anchored_without_run_db(run, trust):
    res = verify_run(run, trust)
    assert res.ok and res.entries == 6 and res.last_seq == 5, res.message
    assert res.keyed and res.key_id == trust.key_id and res.unsigned_entries == 0
    assert res.truncation_checked and res.anchor_path == str(trust.anchor_path(run.run_id, res.first_hash))
    assert "reaches its anchor" in res.truncation_note


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


def test_truncated_tail_against_run_db(run, trust):
    last = json.loads(lines(run)[-1])
    anchor(run, last["seq"], last["hash"])
    assert verify_run(run, trust).ok and verify_run(run, trust).truncation_checked
    put(run, lines(run)[:-2])
    res = verify_run(run, trust)
    assert (res.ok, res.problem) == (False, "truncated") and "2 entries cut off" in res.message


def test_replaced_tail_against_run_db(run, trust):
    anchor(run, 5, "f" * 64)
    res = verify_run(run, trust)
    assert (res.ok, res.problem) == (False, "truncated")


def test_store_events_table_is_the_fallback_anchor(run, trust):
    last = json.loads(lines(run)[-1])
    con = sqlite3.connect(run.db)
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, json TEXT NOT NULL)")
    con.execute("INSERT INTO events VALUES (?, ?)", (5, json.dumps(last)))
    con.commit()
    con.close()
    put(run, lines(run)[:-1])
    res = verify_run(run, trust)
    assert res.problem == "truncated" and "events table" in res.message


def test_torn_line_from_a_crash_is_not_tampering(run, trust):
    rows = lines(run)
    put(run, [*rows[:3], rows[3][:40]])  # the writer died mid-line
    log = EventLog(run.events, run.run_id, clock=lambda: 2000.0, audit=trust)  # a restart continues the chain
    log.emit("lifecycle", "after_crash")
    res = verify_chain(run.events)
    assert res.ok and res.torn_lines == [4] and res.entries == 4


def test_nested_and_over_long_lines_are_skipped_not_a_crash(run, trust, monkeypatch):
    from steadytune.telemetry import jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 4096)
    rows = lines(run)
    put(run, [*rows[:2], "[" * 100_000, "[" * 3000, *rows[2:], "x" * 10_000])
    res = verify_run(run, trust)
    assert res.ok and res.entries == 6
    assert (res.torn_lines, res.long_lines) == ([4], [3, 9])


# ---- a forger who can write the run folder, but has neither the key nor the anchors ----------


def rechain(rows: list[str], start: int, strip_mac: bool = False) -> list[str]:
    """What a forger does after editing line ``start``: recompute every hash from there on."""
    prev = json.loads(rows[start - 1])["hash"] if start else GENESIS
    out = rows[:start]
    for row in rows[start:]:
        entry = json.loads(row)
        entry["prev_hash"] = prev
        if strip_mac:
            entry.pop("mac", None)
        entry["hash"] = prev = entry_hash(entry)
        out.append(json.dumps(entry, separators=(",", ":")))
    return out


def edited(run: RunDir, lineno: int) -> list[str]:
    rows = lines(run)
    entry = json.loads(rows[lineno - 1])
    entry["message"] = "nothing to see here"
    rows[lineno - 1] = json.dumps(entry, separators=(",", ":"))
    return rows


def test_edited_and_rechained_log_with_run_db_updated_fails(run, trust):
    rows = rechain(edited(run, 3), 2)
    put(run, rows)
    last = json.loads(rows[-1])
    anchor(run, last["seq"], last["hash"])  # run.db agrees with the forgery
    assert verify_chain(run.events).ok  # the bare hash chain is whole again: that was the hole
    res = verify_run(run, trust)
    assert (res.ok, res.problem, res.first_bad_line) == (False, "forged", 3), res.message
    assert "audit key" in res.message


@pytest.mark.parametrize("start", [0, 2], ids=["all MACs stripped", "MACs stripped from the edit on"])
def test_rechained_log_without_macs_fails(run, trust, start):
    put(run, rechain(edited(run, 3), start, strip_mac=True))
    res = verify_run(run, trust)
    assert (res.ok, res.problem, res.first_bad_line) == (False, "unsigned", start + 1), res.message


def test_truncated_tail_with_run_db_deleted_fails(run, trust):
    assert not run.db.exists()
    put(run, lines(run)[:-2])
    res = verify_run(run, trust)
    assert (res.ok, res.problem) == (False, "truncated"), res.message
    assert "anchor" in res.message and "2 entries cut off" in res.message


def test_log_cut_to_nothing_fails(run, trust):
    put(run, [])
    res = verify_run(run, trust)
    assert (res.ok, res.problem) == (False, "truncated"), res.message


def test_missing_anchor_fails_unless_allowed(run, trust):
    trust.anchor_path(run.run_id, json.loads(lines(run)[0])["hash"]).unlink()
    res = verify_run(run, trust)
    assert (res.ok, res.problem) == (False, "unanchored") and "--allow-unanchored" in res.message
    res = verify_run(run, trust, allow_unanchored=True)
    assert res.ok and not res.truncation_checked and "no anchor" in res.truncation_note


def test_replaced_log_fails_and_names_the_other_anchor(run, trust, tmp_path):
    other = RunDir(tmp_path / "elsewhere" / run.run_id).create()
    EventLog(other.events, run.run_id, clock=lambda: 5.0, audit=AuditTrust(tmp_path / "x", None)).emit(
        "lifecycle", "a"
    )
    put(run, lines(other))  # a whole new log, unsigned, under the same run id
    res = verify_run(run, trust, allow_unkeyed=True)
    assert (res.ok, res.problem) == (False, "unanchored") and "another first entry" in res.message


def test_rolled_back_anchor_fails(run, trust):
    rows = lines(run)
    path = trust.anchor_path(run.run_id, json.loads(rows[0])["hash"])
    saved = json.loads(path.read_text())
    saved.update(seq=3, hash=json.loads(rows[3])["hash"])  # point it at an earlier, genuine entry
    path.write_text(json.dumps(saved))
    put(run, rows[:4])
    res = verify_run(run, trust)
    assert (res.ok, res.problem) == (False, "forged") and "anchor" in res.message


def test_unsigned_log_fails_unless_allowed(tmp_path, trust):
    run = RunDir(tmp_path / "legacy").create()
    EventLog(run.events, run.run_id, audit=False).emit("lifecycle", "run_started")
    res = verify_run(run, trust)
    assert (res.ok, res.problem, res.first_bad_line) == (False, "unsigned", 1)
    res = verify_run(run, trust, allow_unkeyed=True, allow_unanchored=True)
    assert res.ok and res.unsigned_entries == 1


def test_another_key_or_no_key(run, trust, tmp_path):
    res = verify_run(run, AuditTrust.open(tmp_path / "other", create=True))
    assert (res.ok, res.problem, res.first_bad_line) == (False, "forged", 1) and "another key" in res.message
    keyless = AuditTrust(trust.directory, None)  # the anchors, but not the key
    res = verify_run(run, keyless)
    assert (res.ok, res.problem) == (False, "no key") and "--allow-unkeyed" in res.message
    res = verify_run(run, keyless, allow_unkeyed=True)
    assert res.ok and not res.keyed and res.truncation_checked


def test_key_is_made_owner_only_and_refused_when_others_may_read_it(tmp_path):
    from steadytune.telemetry.attest import AuditKeyError

    trust = AuditTrust.open(tmp_path / "a", create=True)
    assert trust.key and (trust.key_path.stat().st_mode & 0o777) == 0o600
    assert AuditTrust.open(tmp_path / "a").key == trust.key  # made once, then read
    trust.key_path.chmod(0o644)
    with pytest.raises(AuditKeyError, match=f"mode 644.*chmod 600 {trust.key_path}"):
        AuditTrust.open(tmp_path / "a")


def test_cli_verify(run, trust, capsys, monkeypatch):
    monkeypatch.setenv("STEADYTUNE_AUDIT_DIR", str(trust.directory))
    rows = lines(run)
    put(run, [*rows[:2], "[" * 100_000, *rows[2:]])  # a nested line: skipped, not a crash
    assert main(["audit", "verify", str(run.root)]) == 0
    out = capsys.readouterr().out
    assert "chain: OK" in out and "key: OK" in out and "tail: OK" in out and "verdict: OK" in out
    trust.anchor_path(run.run_id, json.loads(rows[0])["hash"]).unlink()
    assert main(["audit", "verify", str(run.root)]) == 1
    assert "verdict: FAILED" in capsys.readouterr().out
    assert main(["audit", "verify", str(run.root), "--allow-unanchored"]) == 0
    assert "tail: not checked" in capsys.readouterr().out
    monkeypatch.setenv("STEADYTUNE_AUDIT_DIR", str(run.root / "nowhere"))
    assert (
        main(["audit", "verify", str(run.root), "--audit-dir", str(trust.directory), "--allow-unanchored"])
        == 0
    )


def test_an_anchor_that_cannot_be_written_does_not_stop_the_log(tmp_path, trust, caplog):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the audit directory should be")
    run = RunDir(tmp_path / "r2").create()
    log = EventLog(run.events, run.run_id, audit=AuditTrust(blocked, trust.key))
    log.emit("lifecycle", "run_started")
    log.emit("lifecycle", "worker_started")
    assert [e.seq for e in log_entries(run)] == [0, 1]
    assert sum("cannot anchor" in r.getMessage() for r in caplog.records) == 1  # said once
    res = verify_run(run, trust)
    assert (res.ok, res.problem) == (False, "unanchored")


def log_entries(run: RunDir):
    from steadytune.telemetry.events import read_events

    return read_events(run.events)


def test_another_runs_whole_log_copied_over_fails_against_this_runs_anchor(run, trust, tmp_path):
    """Run B's log, signed with the same key and anchored under B, put in A's folder with A's
    run.db removed: A's own anchor must be the one consulted, not the one the entries name."""
    other = RunDir(tmp_path / "b").create()
    log = EventLog(other.events, other.run_id, clock=lambda: 2000.0, audit=trust)
    for i in range(3):
        log.emit("lifecycle", f"b{i}", f"event {i} of b", step=i)
    assert verify_run(other, trust).ok
    put(run, lines(other))
    run.db.unlink(missing_ok=True)
    res = verify_run(run, trust)
    assert not res.ok and res.problem in {"unanchored", "replaced"}, res
    assert run.run_id in res.message and other.run_id in res.message


@pytest.mark.parametrize(("make", "says"), [("fifo", "is a FIFO, not a regular file"),
                                            ("folder", "is a folder, not a regular file"),
                                            ("missing", "does not exist")])  # fmt: skip
def test_a_log_that_is_not_a_file_is_named_for_what_it_is(tmp_path: Path, make: str, says: str) -> None:
    # A FIFO or a folder in the log's place read "does not exist".
    import os

    path = tmp_path / "events.jsonl"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "folder":
        path.mkdir()
    res = verify_chain(path)
    assert not res.ok and res.problem == "unreadable"
    assert res.message == f"{path} {says}"
