"""``audit verify``: is ``events.jsonl`` exactly what was written, in order, in full?

Each entry holds ``seq``, the hash of the previous entry and its own hash (see
:mod:`steadytune.telemetry.events`). Walking the chain catches an edited line
(its hash no longer matches its content), a deleted line (``seq`` jumps, the
previous hash points further back) and a reordered line (``seq`` goes back).

The chain alone is public arithmetic: whoever can write the run folder can edit an
entry and recompute every hash after it. So each entry's ``mac`` is checked with the
audit key (kept outside the run folder, :mod:`steadytune.telemetry.attest`): an
entry whose MAC does not match was made without the key (``forged``), one with no
MAC was written unsigned or had it stripped (``unsigned``, accepted only with
``allow_unkeyed``).

A chain cannot see its own tail cut off. For that the log must still reach its
anchor, the head its writer pinned outside the run folder after every append; no
anchor fails unless ``allow_unanchored``. The run store's record of the last entry
(``meta`` keys ``last_event_hash`` / ``last_event_seq`` in ``run.db``; else its
``events`` table) is checked too, but it sits in the run folder: it catches an
accident, not a forger.

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

from steadytune.regularfile import not_a_file
from steadytune.rundir import RunDir
from steadytune.telemetry.attest import AuditKeyError, AuditTrust
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
    # edited / deleted / reordered / forged / unsigned / no key / truncated / unanchored / replaced /
    # unreadable
    problem: str = ""
    message: str = ""
    torn_lines: list[int] = field(default_factory=list)
    long_lines: list[int] = field(default_factory=list)  # over the reader's line-length bound
    truncation_checked: bool = False  # against the anchor
    truncation_note: str = ""
    store_checked: bool = False  # against run.db's record of the last entry
    store_note: str = ""
    last_seq: int | None = None
    last_hash: str | None = None
    first_hash: str | None = None  # of entry 0: names the log's anchor
    run_id: str | None = None  # as the entries name it
    keyed: bool = False  # every MAC was checked with the key
    key_id: str | None = None
    key_path: str | None = None
    unsigned_entries: int = 0  # entries without a MAC, accepted (allow_unkeyed)
    anchor_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def fail(self, problem: str, message: str, line: int | None = None) -> AuditResult:
        self.ok, self.problem, self.message, self.first_bad_line = False, problem, message, line
        return self


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
            f"seq {seq} comes where seq {expected_seq} was due; seq {expected_seq} is at line "
            f"{later[expected_seq]}",
        )
    if isinstance(seq, int) and seq > expected_seq:
        return (
            "deleted",
            f"seq jumps from {expected_seq - 1} to {seq}: {seq - expected_seq} "
            f"entr{'y' if seq - expected_seq == 1 else 'ies'} deleted before it",
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
        f"its prev_hash {str(entry.get('prev_hash'))[:12]}… matches no earlier entry (expected "
        f"{prev_hash[:12]}…)",
    )


def _entries(path: Path) -> Iterator[tuple[int, dict[str, Any] | Skipped]]:
    """``(line number, entry)`` of each non-blank line; an unreadable one is a :class:`Skipped`."""
    for lineno, value in JsonlReader(path).values(final=True):
        yield lineno, value if isinstance(value, (dict, Skipped)) else Skipped.BAD


def verify_chain(path: Path, trust: AuditTrust | None = None, allow_unkeyed: bool = False) -> AuditResult:
    """Walk the hash chain of one event log (and its MACs, given a key); stop at the first break."""
    if not Path(path).is_file():
        return AuditResult(False, problem="unreadable", message=f"{path} {not_a_file(Path(path))}")
    res = AuditResult(True)
    key = trust if trust is not None and trust.key is not None else None
    if key is not None:
        res.keyed, res.key_id, res.key_path = True, key.key_id, str(key.key_path)
    where: dict[int, int] = {}  # seq -> last line holding it, to tell a reorder from a deletion
    for lineno, entry in _entries(path):
        if isinstance(entry, dict) and isinstance(entry.get("seq"), int):
            where[entry["seq"]] = lineno
    seen: dict[str, int] = {}
    prev, expected = GENESIS, 0
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
        if key is not None and "mac" not in entry:
            if not allow_unkeyed:
                return res.fail(
                    "unsigned",
                    f"line {lineno} (seq {entry.get('seq')}) carries no MAC: it was written without the "
                    "audit key, or someone rewrote it and dropped the MAC. Pass --allow-unkeyed to accept "
                    "unsigned entries (a log written before signing existed)",
                    lineno,
                )
            res.unsigned_entries += 1
        elif key is not None and not key.mac_ok(str(digest), entry["mac"]):
            return res.fail(
                "forged",
                f"line {lineno} (seq {entry.get('seq')}) has a MAC that does not match: it was rewritten "
                "(and the chain recomputed) by someone without the audit key, or the log was signed with "
                f"another key than {key.key_path} (key id {key.key_id})",
                lineno,
            )
        seen[str(entry["hash"])] = lineno
        prev, expected = str(entry["hash"]), expected + 1
        if res.entries == 0:
            res.first_hash, res.run_id = prev, str(entry.get("run_id") or "") or None
        res.entries += 1
        res.last_seq, res.last_hash = entry["seq"], prev
    return res


def verify_run(
    run: RunDir,
    trust: AuditTrust | None = None,
    *,
    allow_unkeyed: bool = False,
    allow_unanchored: bool = False,
) -> AuditResult:
    """The chain and MACs of ``events.jsonl``, then its tail against run.db and its anchor.

    ``trust``: the audit key and anchors (default: the audit directory,
    :func:`~steadytune.telemetry.attest.audit_dir`; the key is never made here).
    """
    if trust is None:
        try:
            trust = AuditTrust.open()
        except AuditKeyError as exc:
            return AuditResult(False, problem="no key", message=str(exc))
    res = verify_chain(run.events, trust, allow_unkeyed)
    if not res.ok:
        return res
    if not res.keyed:
        res.key_path = str(trust.key_path)
        if not allow_unkeyed:
            return res.fail(
                "no key",
                f"no audit key at {trust.key_path}, so the MACs cannot be checked, and the bare hash chain "
                "proves nothing (anyone who can write the run folder can recompute it). Point --audit-dir "
                "(or STEADYTUNE_AUDIT_DIR) at the directory holding the key the run was written with, "
                "or pass --allow-unkeyed",
            )
    if _check_store(res, run):
        _check_anchor(res, run, trust, allow_unkeyed, allow_unanchored)
    return res


def _cut(last: int, recorded: int) -> str:
    n = recorded - last
    return f"{n} entr{'y' if n == 1 else 'ies'} cut off the end"


def _check_store(res: AuditResult, run: RunDir) -> bool:
    """The log against the last entry run.db recorded (in the run folder: an accident check)."""
    record, why = read_anchor(run.db)
    if record is None:
        res.store_note = why
        return True
    last = -1 if res.last_seq is None else res.last_seq
    if last < record.seq:
        res.fail(
            "truncated",
            f"the log ends at seq {last} but {record.source} recorded seq {record.seq}: "
            f"{_cut(last, record.seq)}",
        )
        return False
    if _hash_at(run.events, record.seq) != record.hash:
        res.fail(
            "truncated",
            f"seq {record.seq} in the log is not the entry {record.source} recorded (its tail was replaced)",
        )
        return False
    res.store_checked = True
    res.store_note = f"the log reaches the last entry {record.source} recorded (seq {record.seq})"
    return True


def _check_anchor(
    res: AuditResult, run: RunDir, trust: AuditTrust, allow_unkeyed: bool, allow_unanchored: bool
) -> bool:
    """The log against the head its writer pinned outside the run folder.

    The anchor is this run's (its folder's name), never the one the entries name: those are
    written by whoever wrote the log, so run B's whole log copied into A would otherwise be
    checked against B's anchor, and pass.
    """
    run_id = run.run_id
    if res.run_id is not None and res.run_id != run_id:
        res.fail(
            "replaced",
            f"the log's entries belong to run {res.run_id}, but this is run {run_id}: another run's log "
            f"was put in its place (or the folder was renamed; verify it under its own name, {res.run_id})",
        )
        return False
    accept = " Pass --allow-unanchored to accept a log written elsewhere or before anchors existed."
    if res.first_hash is None:
        others = trust.anchors_of(run_id)
        if others:
            res.fail(
                "truncated",
                f"the log holds no entry, but {trust.directory / 'anchors' / run_id} keeps "
                f"{len(others)} anchor(s) for run id {run_id}: the log was cut to nothing (or replaced)",
            )
            return False
        why = f"the log holds no entry and no anchor exists for run id {run_id}"
        if not allow_unanchored:
            res.fail("unanchored", why + "." + accept)
            return False
        res.truncation_note = why + " (accepted: --allow-unanchored)"
        return True
    path = trust.anchor_path(run_id, res.first_hash)
    res.anchor_path = str(path)
    anchor, why = trust.read_anchor(run_id, res.first_hash)
    if anchor is None:
        why = why or f"no anchor for this log ({path} does not exist)"
        others = [p for p in trust.anchors_of(run_id) if p != path]
        if others:
            why += (
                f"; anchors exist for run id {run_id} with another first entry ({others[0].name}): "
                "the whole log may have been replaced"
            )
        if not allow_unanchored:
            res.fail(
                "unanchored",
                why + ". Without its anchor, a log's tail could have been cut off unseen." + accept,
            )
            return False
        res.truncation_note = why + "; truncation not checked (accepted: --allow-unanchored)"
        return True
    checkable = trust.key is not None and (anchor.mac is not None or not allow_unkeyed)
    if checkable and not trust.anchor_mac_ok(anchor):
        res.fail(
            "forged",
            f"the anchor {path} was changed: its MAC does not match (rewritten without the audit key, "
            "e.g. rolled back to an earlier head)",
        )
        return False
    last = -1 if res.last_seq is None else res.last_seq
    if last < anchor.seq:
        res.fail(
            "truncated",
            f"the log ends at seq {last} but its anchor ({path}) recorded seq {anchor.seq}: "
            f"{_cut(last, anchor.seq)}",
        )
        return False
    if _hash_at(run.events, anchor.seq) != anchor.hash:
        res.fail(
            "truncated",
            f"seq {anchor.seq} in the log is not the entry its anchor ({path}) recorded (its tail was "
            f"replaced)",
        )
        return False
    res.truncation_checked = True
    res.truncation_note = f"the log reaches its anchor (seq {anchor.seq}, {path})"
    return True


def _hash_at(path: Path, seq: int) -> str | None:
    for _, entry in _entries(path):
        if isinstance(entry, dict) and entry.get("seq") == seq:
            return entry.get("hash")
    return None
