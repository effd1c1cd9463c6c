"""Compacting a finished run's ``run.db``: every summary kept, the raw rows no chart needs dropped.

``run.db`` grows ~250 MB per million steps, nearly all of it raw step and sample rows. Once a run
is over, its charts read the summary buckets (64 steps or 16 s and the ten levels above them) at
any zoom coarser than one bucket; the raw rows are read only for a zoom finer than that, for the
newest values (the run's status, ``/metrics``) and for the index's own bookkeeping. So compaction
keeps, per rank, the newest ``window_steps`` steps and ``margin_steps`` either side of every event
that names a step (anomalies, their resolutions, restarts, rollbacks: where someone zooms in), the
steps that carry an evaluation, a non-finite value or a skip, and, of the system and GPU samples,
the newest ``window_s`` seconds and ``margin_s`` either side of every event. Everything else that
the index holds is kept whole: every summary level, events, plans, gradient flow, ``meta``.

What was dropped is written in ``meta`` (``compacted``: the dropped step ranges per rank and sample
ranges), and :meth:`~steadytune.telemetry.store.queries.Queries.step_series` and its siblings
answer a range that overlaps one from the finest summary buckets, flagged ``summarized``. The
detail is not lost: the telemetry streams hold every step, and ``run.db`` is rebuilt from them
when deleted.

Crash safety: the original is never written (a WAL checkpoint aside). The kept rows are copied into
a fresh file, ``run.db.compact`` (a new file holds no free pages: it is what ``VACUUM`` would
make), which is fsynced, then renamed over ``run.db`` and the folder fsynced. A crash before the
rename leaves the old index and a stale ``run.db.compact`` the next compaction removes; after it,
the new one, whole. A reader that has the old file open goes on reading it (the rename does not
touch its inode) until it opens the index again.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.regularfile import read_text
from steadytune.rundir import RunDir, fsync_dir
from steadytune.telemetry.liveness import run_live
from steadytune.telemetry.store.schema import _DDL, FAMILIES, StoreBase, UnreadableIndex

Range = tuple[float, float]
STAGES = ("planned", "copied", "synced", "swapped")  # a test stops after each to play a crash


class CompactError(RuntimeError):
    """The run cannot be compacted now (live, or no index): the message says why and what to do."""


@dataclass(frozen=True)
class Keep:
    """What raw detail a compacted index keeps (see the module's docstring)."""

    window_steps: int = 10_000
    margin_steps: int = 1_000
    window_s: float = 3_600.0
    margin_s: float = 300.0


@dataclass(frozen=True)
class Compacted:
    """What one compaction did: the file's size and the raw rows, before and after."""

    bytes_before: int
    bytes_after: int
    steps_before: int
    steps_after: int
    samples_before: int
    samples_after: int
    dropped_steps: dict[int, list[Range]]
    dropped_samples: list[Range]

    def summary(self) -> str:
        """One line: the file's size and the raw rows, before -> after."""
        mb = 1 << 20
        return (
            f"run.db {self.bytes_before / mb:.1f} MB -> {self.bytes_after / mb:.1f} MB; raw steps "
            f"{self.steps_before:,} -> {self.steps_after:,}, samples {self.samples_before:,} -> "
            f"{self.samples_after:,}"
        )


def kept_ranges(marks: Iterable[float], newest: float, window: float, margin: float) -> list[Range]:
    """The ranges to keep, merged and sorted: ``margin`` either side of each mark, and the newest
    ``window`` up to ``newest``."""
    spans = sorted([(m - margin, m + margin) for m in marks] + [(newest - window, newest)])
    out: list[Range] = []
    for lo, hi in spans:
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def dropped_ranges(lo: float, hi: float, kept: Sequence[Range]) -> list[Range]:
    """The parts of ``[lo, hi]`` outside every kept range (``kept`` sorted and merged), as closed
    ranges: their ends are the kept ranges' ends, so a row on one of them is kept, not dropped."""
    out: list[Range] = []
    at = lo
    for k_lo, k_hi in kept:
        if k_hi < at:
            continue
        if k_lo > hi:
            break
        if k_lo > at:
            out.append((at, k_lo))
        at = max(at, k_hi)
    if at < hi:
        out.append((at, hi))
    return out


def overlaps(ranges: Sequence[Sequence[float]], lo: float, hi: float) -> bool:
    """Whether ``[lo, hi]`` meets a dropped range anywhere but on its ends (where rows were kept)."""
    return any(r_lo < hi and lo < r_hi for r_lo, r_hi in ranges)


def compact(
    run: RunDir,
    keep: Keep = Keep(),
    clock: Callable[[], float] = time.time,
    after: Callable[[str], None] = lambda stage: None,
) -> Compacted:
    """Compact ``run``'s ``run.db`` in place, atomically.

    ``after(stage)`` is called after each of :data:`STAGES` (a test raises there to play a crash).

    Raises:
        CompactError: the run's supervisor is live (``status.json`` rewritten in the last 15 s, or
            none yet and the run's files written in the last 15 s), or
            the run has no ``run.db``, or one SQLite cannot read.
    """
    db = run.db
    status = _read_json(run.status)
    now = clock()
    newest = _newest_write(run) if status is None else None  # the status speaks when there is one
    if run_live(status, newest, now):
        if status is not None:
            ago = now - float(status["updated_ts"])
            said = f"status.json says {status.get('state')!r}, updated {ago:.0f} s ago"
        else:
            said = f"it has no status.json yet and its files were written {now - (newest or now):.0f} s ago"
        raise CompactError(f"{run.root}: the run is live ({said}); compact it once it has ended")
    if not db.exists():
        raise CompactError(f"{db}: no index to compact (the dashboard builds one from the run's streams)")
    tmp = db.with_name(db.name + ".compact")
    for stale in (tmp, *(tmp.with_name(tmp.name + end) for end in ("-journal", "-wal", "-shm"))):
        stale.unlink(missing_ok=True)  # a compaction that crashed before its rename
    bytes_before = _size(db)
    # An index an older steadytune wrote may lack summaries: opened for writing, it builds them
    # from the raw rows, which must happen before any raw row is dropped.
    try:
        StoreBase(db).close()
    except UnreadableIndex as e:
        raise CompactError(str(e)) from None

    src = sqlite3.connect(str(db), timeout=10.0)
    try:
        # The WAL's frames into the file, so the new index is never paired with the old one's log.
        src.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        plan = _plan(src, keep)
        after("planned")
        counts = _copy(src, tmp, plan, bytes_before, clock())
        after("copied")
    finally:
        src.close()
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    after("synced")
    os.replace(tmp, db)
    fsync_dir(db.parent)
    after("swapped")
    return Compacted(bytes_before, _size(db), *counts, plan.steps, plan.samples)


@dataclass(frozen=True)
class _Plan:
    steps: dict[int, list[Range]]  # dropped, per rank
    samples: list[Range]
    keep_steps: dict[int, list[Range]]
    keep_samples: list[Range]


def _plan(src: sqlite3.Connection, keep: Keep) -> _Plan:
    marks = src.execute("SELECT step FROM events WHERE step IS NOT NULL").fetchall()
    mark_ts = [r[0] for r in src.execute("SELECT ts FROM events")]
    steps: dict[int, list[Range]] = {}
    keep_steps: dict[int, list[Range]] = {}
    for rank, lo, hi in src.execute("SELECT rank, MIN(step), MAX(step) FROM steps GROUP BY rank").fetchall():
        kept = kept_ranges((m[0] for m in marks), hi, keep.window_steps, keep.margin_steps)
        keep_steps[int(rank)] = kept
        steps[int(rank)] = [r for r in dropped_ranges(lo, hi, kept) if r[1] > r[0]]
    lo, hi = src.execute(
        "SELECT MIN(t), MAX(t) FROM (SELECT MIN(ts) t FROM system UNION ALL SELECT MAX(ts) FROM system "
        "UNION ALL SELECT MIN(ts) FROM gpu UNION ALL SELECT MAX(ts) FROM gpu)"
    ).fetchone()
    keep_samples: list[Range] = []
    samples: list[Range] = []
    if lo is not None:
        keep_samples = kept_ranges(mark_ts, hi, keep.window_s, keep.margin_s)
        samples = [r for r in dropped_ranges(lo, hi, keep_samples) if r[1] > r[0]]
    return _Plan(steps, samples, keep_steps, keep_samples)


def _copy(
    src: sqlite3.Connection, tmp: Path, plan: _Plan, bytes_before: int, now: float
) -> tuple[int, int, int, int]:
    """The kept rows into a fresh index at ``tmp``: ``(steps before, after, samples before, after)``."""
    src.execute("ATTACH DATABASE ? AS dst", (str(tmp),))
    try:
        # Built in rollback-journal mode (no WAL beside it to lose), switched to WAL at the end.
        src.execute("PRAGMA dst.journal_mode=DELETE")
        with src:
            for stmt in _DDL.split(";"):
                if stmt.strip():
                    src.execute(stmt.replace(" IF NOT EXISTS ", " IF NOT EXISTS dst.", 1))
        src.execute("CREATE TEMP TABLE keep_steps(rank INTEGER, lo REAL, hi REAL)")
        src.execute("CREATE TEMP TABLE keep_samples(lo REAL, hi REAL)")
        src.executemany(
            "INSERT INTO keep_steps VALUES(?, ?, ?)",
            [(rank, lo, hi) for rank, kept in plan.keep_steps.items() for lo, hi in kept],
        )
        src.executemany("INSERT INTO keep_samples VALUES(?, ?)", plan.keep_samples)
        summaries = [t for f in FAMILIES.values() for t in (f.rollup, f.coarse)]
        where = {
            "steps": "EXISTS (SELECT 1 FROM keep_steps k WHERE k.rank=s.rank AND s.step BETWEEN k.lo AND "
            "k.hi) OR s.eval_loss IS NOT NULL OR s.nonfinite OR s.skipped",
            "system": "EXISTS (SELECT 1 FROM keep_samples k WHERE s.ts BETWEEN k.lo AND k.hi)",
            "gpu": "EXISTS (SELECT 1 FROM keep_samples k WHERE s.ts BETWEEN k.lo AND k.hi)",
        }
        with src:
            for table in ("meta", "steps", "system", "gpu", *summaries, "events", "plans", "gradflow",
                          "gradflow_levels"):  # fmt: skip
                cols = ", ".join(r[1] for r in src.execute(f"PRAGMA dst.table_info({table})"))
                src.execute(
                    f"INSERT INTO dst.{table}({cols}) SELECT {cols} FROM main.{table} s "
                    f"WHERE {where.get(table, '1=1')}"
                )
            # A second compaction adds to what the first dropped (those rows are gone already).
            row = src.execute("SELECT value FROM main.meta WHERE key='compacted'").fetchone()
            before = json.loads(row[0]) if row else {"steps": {}, "samples": []}
            steps = {
                str(rank): [*before["steps"].get(str(rank), []), *ranges]
                for rank, ranges in plan.steps.items()
            }
            record = {
                "ts": now,
                "bytes_before": before.get("bytes_before", bytes_before),
                "steps": {rank: ranges for rank, ranges in steps.items() if ranges},
                "samples": [*before["samples"], *plan.samples],
            }
            src.execute(
                "INSERT OR REPLACE INTO dst.meta(key, value) VALUES('compacted', ?)", (json.dumps(record),)
            )
        counts = tuple(
            int(src.execute(f"SELECT COUNT(*) FROM {schema}.{table}").fetchone()[0])
            for table in ("steps", "system")
            for schema in ("main", "dst")
        )
        src.execute("PRAGMA dst.journal_mode=WAL")
    finally:
        src.execute("DETACH DATABASE dst")
    return counts[0], counts[1], counts[2], counts[3]


def _size(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())


def _newest_write(run: RunDir) -> float | None:
    """When the supervisor or its worker last wrote the run's own files (run.db, which readers
    build too, is not one of them)."""
    stamps = []
    for path in (run.config, run.events, run.plan, run.system, *run.telemetry_files()):
        try:
            stamps.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(stamps, default=None)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(read_text(path))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
