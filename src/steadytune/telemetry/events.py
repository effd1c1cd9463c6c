"""``events.jsonl``: the append-only, hash-chained log of what happened in a run.

Each entry carries the hash of the previous entry, so an edited, deleted or
reordered line breaks the chain (``steadytune audit verify``). Each entry is also
signed with the audit key (``mac``), and after each append the log's head is
written to its anchor, both outside the run folder (see :mod:`steadytune.telemetry.attest`):
without them anyone who can write the run folder could re-chain an edited log or
cut off its tail unseen. Every message and data field is redacted
(:func:`steadytune.redact.redact`) before it is chained, since a chained entry cannot be
edited afterwards. Only one process writes a run's event log at a time: the
supervisor (or, without a supervisor, the in-process guard).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steadytune.records import Event, from_dict, replace, to_dict
from steadytune.redact import redact
from steadytune.regularfile import append_fd
from steadytune.telemetry.attest import AuditKeyError, AuditTrust
from steadytune.telemetry.jsonl import JsonlReader, last_line

GENESIS = "0" * 64
log = logging.getLogger(__name__)


def entry_hash(entry: dict[str, Any]) -> str:
    """sha256 of an entry's canonical JSON, without its own ``hash`` and ``mac`` fields."""
    body = {k: v for k, v in entry.items() if k not in ("hash", "mac")}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return str(os.getuid())


def _is_entry(d: dict[str, Any]) -> bool:
    return isinstance(d.get("hash"), str) and bool(d["hash"]) and isinstance(d.get("seq"), int)


def _open_audit(audit: AuditTrust | bool) -> AuditTrust | None:
    if isinstance(audit, AuditTrust):
        return audit
    if not audit:
        return None
    try:
        return AuditTrust.open(create=True)
    except AuditKeyError as exc:
        log.warning("events.jsonl will be written unsigned: %s", exc)
        return None


class EventLog:
    """Appends events to ``events.jsonl``, filling in the audit fields and the chain.

    ``audit``: the key and anchors to sign with. ``True`` (the default) opens the
    audit directory (:func:`~steadytune.telemetry.attest.audit_dir`), making the key
    on first use; ``False`` writes an unsigned, unanchored log. When the key cannot be
    had, the log is written unsigned with a warning: ``audit verify`` will say so.
    """

    def __init__(
        self,
        path: Path,
        run_id: str,
        clock: Callable[[], float] | None = None,
        on_append: Callable[[Event], None] | None = None,
        audit: AuditTrust | bool = True,
    ) -> None:
        import time

        self.path = Path(path)
        self.run_id = run_id
        self.clock = clock or time.time
        self.on_append = on_append
        self._lock = threading.Lock()
        self._host = socket.gethostname()
        self._user = _user()
        # The last entry (a last line that lacks only its newline included), to continue its chain.
        _, last = last_line(self.path, torn=True, accept=_is_entry)
        self._genesis: str | None = None  # hash of entry 0, which names the log's anchor
        if last is not None:
            self._prev, self._seq = str(last["hash"]), int(last["seq"]) + 1
            first = next((d for d in JsonlReader(self.path).dicts(final=True) if _is_entry(d)), None)
            if first is not None and first["seq"] == 0:
                self._genesis = first["hash"]
        else:
            self._prev, self._seq = GENESIS, 0
        self.audit = _open_audit(audit)
        self._anchor_failed = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size:
            # A torn last line (crash mid-write) must not glue onto the next entry.
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                with open(append_fd(self.path), "a", encoding="utf-8") as f:
                    f.write("\n")

    @property
    def last_hash(self) -> str:
        return self._prev

    @property
    def next_seq(self) -> int:
        return self._seq

    def append(self, event: Event) -> Event:
        """Chain, write and flush one event; returns it with its audit fields set."""
        with self._lock:
            ts = event.ts if event.ts else self.clock()
            # Redacted before it is chained: an entry of a signed log can never be scrubbed later.
            stamped = replace(
                event,
                message=redact(event.message),
                data=redact(event.data),
                ts=ts,
                seq=self._seq,
                run_id=self.run_id,
                host=self._host,
                user=event.user or self._user,
                pid=event.pid or os.getpid(),
                prev_hash=self._prev,
                hash=None,
                mac=None,
            )
            entry = to_dict(stamped)
            digest = entry_hash(entry)
            entry["hash"] = digest
            mac = None
            if self.audit is not None and self.audit.key is not None:
                mac = entry["mac"] = self.audit.sign(digest)
            line = json.dumps(entry, separators=(",", ":")) + "\n"
            with open(append_fd(self.path), "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            if self._seq == 0:
                self._genesis = digest
            self._prev, self._seq = digest, self._seq + 1
            final = replace(stamped, hash=digest, mac=mac)
            self._anchor(final)
        if self.on_append is not None:
            self.on_append(final)
        return final

    def _anchor(self, event: Event) -> None:
        """Pin the log's new head outside the run folder; a failure is logged, never fatal."""
        if self.audit is None:
            return
        try:
            if self._genesis is None:
                raise OSError("the log's first entry (seq 0) cannot be found")
            self.audit.write_anchor(
                self.run_id, self._genesis, int(event.seq or 0), str(event.hash), self.path
            )
        except OSError as exc:  # tried again at the next append; said once
            if not self._anchor_failed:
                log.warning("events.jsonl of %s: cannot anchor seq %s: %s", self.run_id, event.seq, exc)
            self._anchor_failed = True

    def emit(self, kind: str, name: str, message: str = "", **fields: Any) -> Event:
        """Shorthand: build an :class:`Event` and append it."""
        return self.append(Event(ts=self.clock(), kind=kind, name=name, message=message, **fields))  # type: ignore[arg-type]


def read_events(path: Path) -> list[Event]:
    """All events of a log, in order (torn, unparseable and over-long lines are skipped)."""
    out: list[Event] = []
    for d in JsonlReader(path).dicts(final=True):
        try:
            rec = from_dict(d)
        except (ValueError, TypeError):
            continue
        if isinstance(rec, Event):
            out.append(rec)
    return out
