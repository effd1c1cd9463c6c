"""The server's job queue: one SQLite file, every change one transaction.

States and the moves between them::

    queued ──► admitted ──► running ──► done | failed
      │ ▲         │            │
      ▼ │         ▼            ▼
     held      queued       cancelled     (queued, held and admitted jobs may be cancelled too)

A move names the states it may leave (``UPDATE ... WHERE state IN (...)``), so two
writers (the daemon loop and a ``cancel`` from the socket) can never both win; the
loser gets False and reads the job again. The file is in WAL mode with full
synchronous commits: a job that was acknowledged as submitted survives a power cut.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from steadytune.redact import redact
from steadytune.secretfile import private_dir, private_files

STATES = ("queued", "held", "admitted", "running", "done", "failed", "cancelled")
WAITING = ("queued",)
LIVE = ("admitted", "running")
FINAL = ("done", "failed", "cancelled")
HISTORY_MAX = 200  # entries kept per job: a run that resizes all day does not grow its row without end

MOVES: dict[str, tuple[str, ...]] = {
    "held": ("queued",),
    "queued": ("held", "admitted"),  # release, or an admitted job whose start never happened
    "admitted": ("queued",),
    "running": ("admitted",),
    "done": ("running",),
    "failed": ("admitted", "running"),
    "cancelled": ("queued", "held", "admitted", "running"),
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT UNIQUE NOT NULL,
  state TEXT NOT NULL,
  priority INTEGER NOT NULL DEFAULT 0,
  spec TEXT NOT NULL,
  need_bytes INTEGER NOT NULL,
  need_source TEXT NOT NULL,
  gpus_wanted INTEGER NOT NULL,
  gpus TEXT NOT NULL DEFAULT '[]',
  run_dir TEXT,
  pid INTEGER,
  pid_started REAL,
  reason TEXT NOT NULL DEFAULT '',
  submitted_ts REAL NOT NULL,
  started_ts REAL,
  ended_ts REAL,
  user TEXT NOT NULL DEFAULT '',
  cancel_requested INTEGER NOT NULL DEFAULT 0,
  history TEXT NOT NULL DEFAULT '[]',
  paused TEXT,
  shrink_to TEXT
);
"""
# Every pass reads the queued and the live jobs: by their state, not by a scan past every finished one.
# Made after the columns an older file lacks are added (an index names only columns every file has).
_INDEXES = "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);"

# Columns added since the first schema, with their definitions: a queue.db written by an older
# server gains them when it is opened, so its jobs are kept.
_ADDED = {
    "history": "TEXT NOT NULL DEFAULT '[]'",
    "paused": "TEXT",
    "shrink_to": "TEXT",
}


class QueueError(Exception):
    """A request the queue cannot carry out; the message says why and what to do."""


@dataclass(frozen=True)
class Job:
    """One row of the queue. ``spec`` is how to start it (see daemon.job_command)."""

    id: str
    seq: int
    state: str
    priority: int
    spec: dict[str, Any]
    need_bytes: int
    need_source: str
    gpus_wanted: int
    gpus: tuple[int, ...] = ()
    run_dir: str | None = None
    pid: int | None = None
    pid_started: float | None = None
    reason: str = ""
    submitted_ts: float = 0.0
    started_ts: float | None = None
    ended_ts: float | None = None
    user: str = ""
    cancel_requested: bool = False
    history: tuple[dict[str, Any], ...] = ()  # resizes and memory-pressure pauses, oldest first
    paused: str | None = None  # why the server paused it (memory pressure); None when it did not
    shrink_to: tuple[int, ...] | None = None  # the GPUs the server asked it to shrink onto

    def to_dict(self) -> dict[str, Any]:
        """The job as the API shows it: its environment stays out, its command line redacted."""
        return {
            "id": self.id,
            "seq": self.seq,
            "state": self.state,
            "priority": self.priority,
            "spec": redact({k: v for k, v in self.spec.items() if k != "env"}),
            "need_bytes": self.need_bytes,
            "need_source": self.need_source,
            "gpus_wanted": self.gpus_wanted,
            "gpus": list(self.gpus),
            "run_dir": self.run_dir,
            "pid": self.pid,
            "reason": self.reason,
            "submitted_ts": self.submitted_ts,
            "started_ts": self.started_ts,
            "ended_ts": self.ended_ts,
            "user": self.user,
            "cancel_requested": self.cancel_requested,
            "history": list(self.history),
            "paused": self.paused,
            "shrink_to": list(self.shrink_to) if self.shrink_to is not None else None,
        }


class Waiting(NamedTuple):
    """A queued job as one admission pass reads it: no spec, no history (a thousand of them are
    read every second, and their JSON is what a pass does not need)."""

    id: str
    seq: int
    priority: int
    need_bytes: int
    need_source: str
    gpus_wanted: int
    reason: str


def _job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        seq=row["seq"],
        state=row["state"],
        priority=row["priority"],
        spec=json.loads(row["spec"]),
        need_bytes=row["need_bytes"],
        need_source=row["need_source"],
        gpus_wanted=row["gpus_wanted"],
        gpus=tuple(json.loads(row["gpus"])),
        run_dir=row["run_dir"],
        pid=row["pid"],
        pid_started=row["pid_started"],
        reason=row["reason"],
        submitted_ts=row["submitted_ts"],
        started_ts=row["started_ts"],
        ended_ts=row["ended_ts"],
        user=row["user"],
        cancel_requested=bool(row["cancel_requested"]),
        history=tuple(json.loads(row["history"])),
        paused=row["paused"],
        shrink_to=tuple(json.loads(row["shrink_to"])) if row["shrink_to"] is not None else None,
    )


class JobQueue:
    """The durable queue. Safe to share between the daemon's threads (one lock, one connection)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        """Open (or make) the queue at ``path``.

        The jobs' environments are kept here, and they may hold tokens: the folder is made (or
        made again) the owner's only, and what was changed is in :attr:`notes`.

        Raises:
            InsecureDirectory: the folder belongs to another user.
        """
        self.notes = [n for n in [private_dir(path.parent, "the server's folder")] if n]
        self.path = path
        self.clock = clock
        self._lock = threading.Lock()
        # The database, its -wal and -shm are created 0600 (SQLite gives the last two the
        # database's mode): a chmod afterwards left them readable by everyone until then.
        with private_files():
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            have = {r["name"] for r in self._db.execute("PRAGMA table_info(jobs)")}
            for name, definition in _ADDED.items():
                if name not in have:
                    self._db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {definition}")
            self._db.executescript(_INDEXES)
        for made in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if made.exists():  # written by an older server, before the files were made private
                made.chmod(0o600)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def submit(
        self,
        spec: dict[str, Any],
        need_bytes: int,
        need_source: str,
        gpus: int = 1,
        priority: int = 0,
        user: str = "",
        held: bool = False,
    ) -> Job:
        """Append a job; its id is ``j<seq>``, in submission order."""
        if gpus < 1:
            raise QueueError(f"gpus={gpus}: a job needs at least 1 GPU")
        if need_bytes < 0:
            raise QueueError(f"need={need_bytes} bytes: give a size ≥ 0")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "INSERT INTO jobs (id, state, priority, spec, need_bytes, need_source, gpus_wanted,"
                    " submitted_ts, user) VALUES ('', ?, ?, ?, ?, ?, ?, ?, ?)",
                    ("held" if held else "queued", priority, json.dumps(spec), need_bytes, need_source, gpus,
                     self.clock(), user),
                )  # fmt: skip
                seq = cur.lastrowid
                self._db.execute("UPDATE jobs SET id = ? WHERE seq = ?", (f"j{seq}", seq))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        job = self.get(f"j{seq}")
        assert job is not None
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row is not None else None

    def jobs(self, states: Iterable[str] | None = None) -> list[Job]:
        """Jobs in submission order, optionally only those in ``states``."""
        with self._lock:
            if states is None:
                rows = self._db.execute("SELECT * FROM jobs ORDER BY seq").fetchall()
            else:
                wanted = tuple(states)
                marks = ",".join("?" * len(wanted))
                rows = self._db.execute(
                    f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY seq", wanted
                ).fetchall()
        return [_job(r) for r in rows]

    def waiting(self) -> list[Waiting]:
        """The queued jobs, in submission order, as an admission pass reads them."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, seq, priority, need_bytes, need_source, gpus_wanted, reason FROM jobs "
                "WHERE state = 'queued' ORDER BY seq"
            ).fetchall()
        return [Waiting(*r) for r in rows]

    def move(self, job_id: str, to: str, **fields: Any) -> bool:
        """Move a job to state ``to`` (and set ``fields``) if its state allows; False if it does not."""
        if to not in MOVES:
            raise QueueError(f"unknown state {to!r}; one of {', '.join(STATES)}")
        sets, values = ["state = ?"], [to]
        for key, value in fields.items():
            if key not in {"gpus", "run_dir", "pid", "pid_started", "reason", "started_ts", "ended_ts"}:
                raise QueueError(f"cannot set {key!r} on a job")
            sets.append(f"{key} = ?")
            values.append(json.dumps(list(value)) if key == "gpus" else value)
        sources = MOVES[to]
        marks = ",".join("?" * len(sources))
        with self._lock:
            cur = self._db.execute(
                f"UPDATE jobs SET {', '.join(sets)} WHERE id = ? AND state IN ({marks})",
                (*values, job_id, *sources),
            )
        return cur.rowcount == 1

    def note(self, job_id: str, reason: str) -> None:
        """Record why a job waits (or what happened last), without changing its state."""
        with self._lock:
            self._db.execute(
                "UPDATE jobs SET reason = ? WHERE id = ? AND reason != ?", (reason, job_id, reason)
            )

    def note_many(self, notes: Sequence[tuple[str, str]]) -> None:
        """:meth:`note` for many jobs at once, in one transaction (one commit to disk)."""
        if not notes:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "UPDATE jobs SET reason = ? WHERE id = ? AND reason != ?",
                    [(reason, job_id, reason) for job_id, reason in notes],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def request_cancel(self, job_id: str) -> None:
        """Flag a running job for the daemon to stop; it becomes cancelled once it has exited."""
        with self._lock:
            self._db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))

    def resize(self, job_id: str, gpus: Iterable[int], entry: dict[str, Any]) -> bool:
        """Set a live job's GPUs and record why in its history; False if it is no longer live."""
        marks = ",".join("?" * len(LIVE))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    f"SELECT history FROM jobs WHERE id = ? AND state IN ({marks})", (job_id, *LIVE)
                ).fetchone()
                if row is not None:
                    history = [*json.loads(row["history"]), {"ts": self.clock(), **entry}]
                    self._db.execute(
                        "UPDATE jobs SET gpus = ?, history = ?, shrink_to = NULL WHERE id = ?",
                        (json.dumps(list(gpus)), json.dumps(history[-HISTORY_MAX:]), job_id),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return row is not None

    def record(self, job_id: str, entry: dict[str, Any], **fields: Any) -> None:
        """Add ``entry`` to a job's history, and set ``paused`` or ``shrink_to`` with it."""
        if not set(fields) <= {"paused", "shrink_to"}:
            raise QueueError(f"cannot record {sorted(fields)} on a job; paused or shrink_to")
        sets, values = [], []
        for key, value in fields.items():
            sets.append(f"{key} = ?")
            values.append(json.dumps(list(value)) if key == "shrink_to" and value is not None else value)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT history FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is not None:
                    history = [*json.loads(row["history"]), {"ts": self.clock(), **entry}]
                    sets.append("history = ?")
                    values.append(json.dumps(history[-HISTORY_MAX:]))
                    self._db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*values, job_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def set_need(self, job_id: str, need_bytes: int, source: str, why: str) -> bool:
        """A waiting job's need, once measured; False if it no longer waits."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT spec FROM jobs WHERE id = ? AND state IN ('queued', 'held')", (job_id,)
                ).fetchone()
                if row is not None:
                    spec = {**json.loads(row["spec"]), "need": why}
                    self._db.execute(
                        "UPDATE jobs SET need_bytes = ?, need_source = ?, spec = ? WHERE id = ?",
                        (need_bytes, source, json.dumps(spec), job_id),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return row is not None

    def set_probe(self, job_id: str, pid: int | None, pid_started: float | None) -> None:
        """The process measuring a waiting job's need (None once it has stopped): a restarted server
        stops it."""
        with self._lock:
            self._db.execute(
                "UPDATE jobs SET pid = ?, pid_started = ? WHERE id = ? AND state IN ('queued', 'held')",
                (pid, pid_started, job_id),
            )
