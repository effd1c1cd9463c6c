"""``audit verify``: is ``events.jsonl`` exactly what was written, in order, in full?

Each entry holds ``seq``, the hash of the previous entry and its own hash (see
:mod:`steadytune.telemetry.events`). Walking the chain catches an edited line
(its hash no longer matches its content), a deleted line (``seq`` jumps, the
previous hash points further back) and a reordered line (``seq`` goes back).

A chain cannot see its own tail cut off. For that the run store keeps the last
hash and seq it saw (``meta`` keys ``last_event_hash`` / ``last_event_seq`` in
``run.db``; else its ``events`` table) and the log must still reach them.

A torn line (a crash mid-write) is not tampering: the writer continues the
chain from the last complete entry, so it is reported and skipped; so is a line
too long or nested too deep to read (see :mod:`steadytune.telemetry.jsonl`). Either
is harmless only if the chain goes on unbroken after it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.rundir import RunDir
from steadytune.telemetry.events import GENESIS, entry_hash
from steadytune.telemetry.jsonl import JsonlReader, Skipped


@dataclass(frozen=True)
class Anchor:
    """The last entry the run store recorded."""

    seq: int
    hash: str
    source: str


@dataclass
class AuditResult:
    ok: bool
    entries: int = 0
    first_bad_line: int | None = None
    problem: str = ""  # edited / deleted / reordered / truncated / unreadable
    message: str = ""
    torn_lines: list[int] = field(default_factory=list)
    long_lines: list[int] = field(default_factory=list)  # over the reader's line-length bound
    truncation_checked: bool = False
    truncation_note: str = ""
    last_seq: int | None = None
    last_hash: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_anchor(db: Path) -> tuple[Anchor | None, str]:
    """The last event the store recorded, or ``None`` with the reason it is unknown."""
    if not db.exists():
        return None, f"{db.name} is absent, so truncation of the log's tail cannot be checked"
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as exc:
        return None, f"{db.name} cannot be opened ({exc}); truncation cannot be checked"
    try:
        meta = dict(
            con.execute("SELECT key, value FROM meta WHERE key IN ('last_event_hash', 'last_event_seq')")
        )
        if "last_event_hash" in meta and "last_event_seq" in meta:
            return Anchor(int(meta["last_event_seq"]), str(meta["last_event_hash"]), "run.db meta"), ""
        row = con.execute("SELECT seq, json FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        if row is not None:
            h = json.loads(row[1]).get("hash")
            if h:
                return Anchor(int(row[0]), str(h), "run.db events table"), ""
        return None, f"{db.name} has recorded no event yet, so truncation cannot be checked"
    except (sqlite3.Error, ValueError) as exc:
        return None, f"{db.name} holds no last event ({exc}); truncation cannot be checked"
    finally:
        con.close()


def _classify_link(
    entry: dict[str, Any], expected_seq: int, prev_hash: str, seen: dict[str, int], later: dict[int, int]
) -> tuple[str, str]:
    seq = entry.get("seq")
    if isinstance(seq, int) and seq > expected_seq and expected_seq in later:
        return (
            "reordered",
            f"seq {seq} comes where seq {expected_seq} was due; seq {expected_seq} is at line {later[expected_seq]}",
        )
    if isinstance(seq, int) and seq > expected_seq:
        return (
            "deleted",
            f"seq jumps from {expected_seq - 1} to {seq}: {seq - expected_seq} entr{'y' if seq - expected_seq == 1 else 'ies'} deleted before it",
        )
    if isinstance(seq, int) and seq < expected_seq:
        return (
            "reordered",
            f"seq {seq} comes after seq {expected_seq - 1}: lines were reordered or duplicated",
        )
    back = seen.get(str(entry.get("prev_hash")))
    if back is not None:
        return "reordered", f"its prev_hash points at line {back}, not at the line before it"
    return (
        "deleted",
        f"its prev_hash {str(entry.get('prev_hash'))[:12]}… matches no earlier entry (expected {prev_hash[:12]}…)",
    )


def _entries(path: Path) -> Iterator[tuple[int, dict[str, Any] | Skipped]]:
    """``(line number, entry)`` of each non-blank line; an unreadable one is a :class:`Skipped`."""
    for lineno, value in JsonlReader(path).values(final=True):
        yield lineno, value if isinstance(value, (dict, Skipped)) else Skipped.BAD


def verify_chain(path: Path) -> AuditResult:
    """Walk the hash chain of one event log; stop at the first break."""
    if not Path(path).is_file():
        return AuditResult(False, problem="unreadable", message=f"{path} does not exist")
    res = AuditResult(True)
    where: dict[int, int] = {}  # seq -> last line holding it, to tell a reorder from a deletion
    for lineno, entry in _entries(path):
        if isinstance(entry, dict) and isinstance(entry.get("seq"), int):
            where[entry["seq"]] = lineno
    prev, expected, seen = GENESIS, 0, {}
    for lineno, entry in _entries(path):
        digest = None
        if isinstance(entry, dict):
            try:
                digest = entry_hash(entry)
            except (RecursionError, TypeError, ValueError):
                entry = Skipped.BAD  # parsed, but nested too deep to hash
        if entry is Skipped.TOO_LONG:
            res.long_lines.append(lineno)
            continue
        if not isinstance(entry, dict):
            res.torn_lines.append(lineno)
            continue
        if digest != entry.get("hash"):
            res.ok, res.first_bad_line, res.problem = False, lineno, "edited"
            res.message = (
                f"line {lineno} (seq {entry.get('seq')}) was edited: its hash does not match its content"
            )
            return res
        if entry.get("prev_hash") != prev or entry.get("seq") != expected:
            later = {q: n for q, n in where.items() if n > lineno}
            problem, why = _classify_link(entry, expected, prev, seen, later)
            res.ok, res.first_bad_line, res.problem = False, lineno, problem
            res.message = f"line {lineno} (seq {entry.get('seq')}) breaks the chain: {why}"
            return res
        seen[str(entry["hash"])] = lineno
        prev, expected = str(entry["hash"]), expected + 1
        res.entries += 1
        res.last_seq, res.last_hash = entry["seq"], prev
    return res


def verify_run(run: RunDir) -> AuditResult:
    """The chain of ``events.jsonl``, then its tail against the store's last recorded entry."""
    res = verify_chain(run.events)
    if not res.ok:
        return res
    anchor, why = read_anchor(run.db)
    if anchor is None:
        res.truncation_note = why
        return res
    res.truncation_checked = True
    last = -1 if res.last_seq is None else res.last_seq
    if last < anchor.seq:
        res.ok, res.problem = False, "truncated"
        res.first_bad_line = None
        res.message = (
            f"the log ends at seq {last} but {anchor.source} recorded seq {anchor.seq}: "
            f"{anchor.seq - last} entr{'y' if anchor.seq - last == 1 else 'ies'} cut off the end"
        )
        return res
    found = _hash_at(run.events, anchor.seq)
    if found != anchor.hash:
        res.ok, res.problem = False, "truncated"
        res.message = (
            f"seq {anchor.seq} in the log is not the entry {anchor.source} recorded (its tail was replaced)"
        )
        return res
    res.truncation_note = f"the log reaches the last entry {anchor.source} recorded (seq {anchor.seq})"
    return res


def _hash_at(path: Path, seq: int) -> str | None:
    for _, entry in _entries(path):
        if isinstance(entry, dict) and entry.get("seq") == seq:
            return entry.get("hash")
    return None
