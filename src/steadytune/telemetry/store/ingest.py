"""Writing ``run.db``: idempotent upserts of records, and (re)building it from the JSONL."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from steadytune.records import Event, PlanRevision, StepRecord, SystemSample, from_dict, to_dict
from steadytune.rundir import RunDir
from steadytune.telemetry import segments
from steadytune.telemetry.jsonl import JsonlReader, stream_last_line
from steadytune.telemetry.store.gradflow import flow_columns, refresh_levels
from steadytune.telemetry.store.schema import (
    FAMILIES,
    GPU_METRICS,
    ROLLUP,
    STEP_METRICS,
    SYSTEM_METRICS,
    StoreBase,
)


def _num(value: Any) -> float | None:
    """A chartable number: NaN becomes NULL (SQLite cannot hold NaN), Inf stays."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _indexed(d: dict[str, Any]) -> bool:
    """A line whose record the index keeps (a heartbeat or a worker's exit is not kept)."""
    return d.get("type") in {"step", "system", "event", "plan"}


def _nonfinite(*values: Any) -> int:
    return int(any(isinstance(v, float) and not math.isfinite(v) for v in values))


def _position(saved: str | None) -> tuple[int, int]:
    """A stream position kept in ``meta``: ``"<segment>:<offset>"``, or a bare offset (kept before
    streams were rotated, so in the live file of a stream with no segment: segment 1)."""
    seg, _, offset = (saved or "0").rpartition(":")
    try:
        return (int(seg) if seg else 1), int(offset)
    except ValueError:
        return 1, 0


def _saved(position: tuple[int, int]) -> str:
    """A stream never rotated keeps its bare offset: an index an older steadytune opens reads on."""
    seg, offset = position
    return str(offset) if seg == 1 else f"{seg}:{offset}"


class Ingest(StoreBase):
    """The writers of the store."""

    # ---- writers ------------------------------------------------------------------

    def add_steps(self, records: Sequence[StepRecord]) -> int:
        """Upsert step records; a later attempt of the same (rank, step) replaces an earlier one."""
        if not records:
            return 0
        rows = []
        with self._lock:
            # Another process (supervisor and dashboard) may have stamped rows since we
            # last looked; continue after the newest stamp so readers never miss one.
            self._version = max(self._version, self._max_version())
            for r in records:
                tps = r.tokens_per_s
                rows.append(
                    (
                        r.rank, r.step, r.attempt, r.ts,
                        _num(r.loss), _num(r.eval_loss), _num(r.grad_norm), _num(r.lr), _num(tps),
                        _num(r.step_time_s), _num(r.mem_allocated_bytes), _num(r.mem_reserved_bytes),
                        _num(r.mem_peak_bytes), r.tokens, _nonfinite(r.loss, r.grad_norm), int(r.skipped),
                        self._next_version(),
                    )
                )  # fmt: skip
            cols = (
                "rank",
                "step",
                "attempt",
                "ts",
                *STEP_METRICS,
                "tokens",
                "nonfinite",
                "skipped",
                "version",
            )
            # A later attempt replaces the row. The same attempt adds to it: the eval-only record the
            # worker writes for a step it already logged must not blank that step's loss.
            newer = "excluded.attempt > steps.attempt"
            merged = [f"{c}=CASE WHEN {newer} THEN excluded.{c} ELSE COALESCE(excluded.{c}, steps.{c}) END"
                      for c in (*STEP_METRICS, "tokens")]  # fmt: skip
            flags = [f"{c}=CASE WHEN {newer} THEN excluded.{c} ELSE MAX(excluded.{c}, steps.{c}) END"
                     for c in ("nonfinite", "skipped")]  # fmt: skip
            updates = ", ".join(
                [*(f"{c}=excluded.{c}" for c in ("attempt", "ts", "version")), *merged, *flags]
            )
            sql = (
                f"INSERT INTO steps({', '.join(cols)}) VALUES({', '.join('?' * len(cols))}) "
                f"ON CONFLICT(rank, step) DO UPDATE SET {updates} WHERE excluded.attempt >= steps.attempt"
            )
            with self._db:
                self._db.executemany(sql, rows)
                self._add_gradflow(records, [row[-1] for row in rows])
                by_rank: dict[int, list[int]] = {}
                for r in records:
                    by_rank.setdefault(r.rank, []).append(r.step)
                for rank, steps in by_rank.items():
                    self._refresh_rollup(rank, min(steps) // ROLLUP, max(steps) // ROLLUP)
        return len(rows)

    def _add_gradflow(self, records: Sequence[StepRecord], versions: Sequence[int]) -> None:
        """Upsert the gradient flow of the steps that carry one, and the heat map's levels over them (in the
        caller's transaction)."""
        flows, stale = [], []
        for r, version in zip(records, versions, strict=True):
            cols = flow_columns(r.extra.get("gradflow")) if r.extra else None
            if cols is not None:
                flows.append((r.rank, r.step, r.attempt, r.ts, *cols, version))
            elif r.attempt > 0:
                # A later attempt redid this step without a recording: the old one no longer applies.
                stale.append((r.rank, r.step, r.attempt))
        if flows:
            names: tuple[str, ...] = ("rank", "step", "attempt", "ts", "layers", "norm", "zero_frac")
            names += ("hist", "bins", "version")
            updates = ", ".join(f"{c}=excluded.{c}" for c in names[2:])
            self._db.executemany(
                f"INSERT INTO gradflow({', '.join(names)}) VALUES({', '.join('?' * len(names))}) "
                f"ON CONFLICT(rank, step) DO UPDATE SET {updates} WHERE excluded.attempt >= gradflow.attempt",
                flows,
            )
        if stale:
            gone = self._db.executemany("DELETE FROM gradflow WHERE rank=? AND step=? AND attempt<?", stale)
            if not gone.rowcount:
                stale = []  # every step redone after a restart is one: the levels need only those that had
        touched: dict[int, list[int]] = {}
        for rank, step in [(f[0], f[1]) for f in flows] + [(d[0], d[1]) for d in stale]:
            touched.setdefault(rank, []).append(step)
        for rank, at in touched.items():
            refresh_levels(self._db, rank, min(at), max(at), self._flow_front)

    def _refresh_rollup(self, rank: int, b_lo: int, b_hi: int) -> None:
        """Recompute the summary buckets ``b_lo..b_hi`` of a rank from the raw steps, and the coarse
        buckets above them."""
        aggs = ", ".join(f"MIN({m}), MAX({m}), SUM({m}), COUNT({m})" for m in STEP_METRICS)
        cols = ", ".join(f"{m}_min, {m}_max, {m}_sum, {m}_n" for m in STEP_METRICS)
        self._db.execute(
            f"INSERT OR REPLACE INTO steps_rollup(rank, bucket, first, last, n, tokens, nonfinite, {cols}) "
            f"SELECT rank, step / {ROLLUP}, MIN(step), MAX(step), COUNT(*), SUM(tokens), SUM(nonfinite), "
            f"{aggs} "
            "FROM steps WHERE rank=? AND step BETWEEN ? AND ? GROUP BY step / ?",
            (rank, b_lo * ROLLUP, b_hi * ROLLUP + ROLLUP - 1, ROLLUP),
        )
        self.refresh_coarse("steps", b_lo, b_hi, rank)

    def add_system(self, samples: Sequence[SystemSample]) -> int:
        if not samples:
            return 0
        with self._lock:
            self._version = max(self._version, self._max_version())
            rows, gpus = [], []
            for s in samples:
                rows.append((s.ts, *(_num(getattr(s, m)) for m in SYSTEM_METRICS), self._next_version()))
                for g in s.gpus:
                    gpus.append((s.ts, g.index, g.name, *(_num(getattr(g, m)) for m in GPU_METRICS)))
            cols = ("ts", *SYSTEM_METRICS, "version")
            gcols = ("ts", "idx", "name", *GPU_METRICS)
            with self._db:
                self._db.executemany(
                    f"INSERT OR REPLACE INTO system({', '.join(cols)}) VALUES({', '.join('?' * len(cols))})",
                    rows,
                )
                self._db.executemany(
                    f"INSERT OR REPLACE INTO gpu({', '.join(gcols)}) VALUES({', '.join('?' * len(gcols))})",
                    gpus,
                )
                self.refresh_sample_rollup(min(s.ts for s in samples), max(s.ts for s in samples))
        return len(rows)

    def add_events(self, events: Sequence[Event]) -> int:
        """Index events by ``seq`` (an event without one is given the next free seq)."""
        if not events:
            return 0
        with self._lock, self._db:
            for e in events:
                seq = e.seq
                if seq is None:
                    row = self._db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM events").fetchone()
                    seq = int(row[0])
                    e = replace(e, seq=seq)  # readers see the seq it is filed under
                self._db.execute(
                    "INSERT OR REPLACE INTO events(seq, ts, kind, name, severity, step, message, json) "
                    "VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                    (seq, e.ts, e.kind, e.name, e.severity, e.step, e.message, json.dumps(to_dict(e))),
                )
        return len(events)

    def add_plans(self, plans: Sequence[PlanRevision]) -> int:
        if not plans:
            return 0
        with self._lock, self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO plans(revision, ts, json) VALUES(?, ?, ?)",
                [(p.revision, p.ts, json.dumps(to_dict(p))) for p in plans],
            )
        return len(plans)

    def add(self, records: Iterable[Any]) -> None:
        """Route a mixed batch of records to the right ``add_*`` (others are ignored)."""
        steps, system, events, plans = [], [], [], []
        for r in records:
            if isinstance(r, StepRecord):
                steps.append(r)
            elif isinstance(r, SystemSample):
                system.append(r)
            elif isinstance(r, Event):
                events.append(r)
            elif isinstance(r, PlanRevision):
                plans.append(r)
        self.add_steps(steps)
        self.add_system(system)
        self.add_events(events)
        self.add_plans(plans)

    # ---- rebuilding from the JSONL ------------------------------------------------

    def sync(self, run_dir: RunDir, chunk_bytes: int = 8 << 20) -> int:
        """Index the JSONL lines appended since the last sync; returns how many records.

        The position reached in each stream (segment and byte offset) is kept in ``meta``
        (``offset:<relpath>``), so a later call, in this process or another, continues where
        this one stopped, across the rotations in between.
        """
        total = 0
        files = [*run_dir.telemetry_files(), run_dir.system, run_dir.events, run_dir.plan]
        # A worker's notices (events in telemetry/) are filed by its supervisor in events.jsonl,
        # with their seq: index the filed copy only, or each would show twice, the second without a seq.
        filed = run_dir.events.exists()
        for path in files:
            notices = path.parent == run_dir.telemetry_dir
            key = f"offset:{path.relative_to(run_dir.root).as_posix()}"
            seg, start = _position(self.get_meta(key))
            if seg > 1 and segments.segment(path, seg) is None and segments.segment(path, seg - 1) is None:
                seg, start = 1, 0  # the stream was replaced (its segments are gone): read it again
            if segments.segment(path, seg) is None:
                try:
                    if path.stat().st_size < start:
                        start = 0  # the live file was replaced (rewritten by hand): read it again
                except FileNotFoundError:
                    if not segments.segments(path):
                        continue
            reader = JsonlReader(path, start, segment=seg)
            while True:
                position = reader.position
                skipped = reader.bad_lines + reader.long_lines
                dicts = reader.read_dicts(max_bytes=chunk_bytes)
                bad = reader.bad_lines + reader.long_lines - skipped
                if reader.position == position:
                    break
                recs = []
                for d in dicts:
                    try:
                        rec = from_dict(d)
                    except (ValueError, TypeError, AttributeError, RecursionError):
                        bad += 1
                        continue
                    if not (filed and notices and isinstance(rec, Event)):
                        recs.append(rec)
                self.unreadable_lines += bad
                self.add(recs)
                total += len(recs)
            self.set_meta(key, _saved(reader.position))
        return total

    def adopt(self, run_dir: RunDir) -> list[str]:
        """Start tailing at the end of each JSONL file whose last record is already indexed.

        For an index another process filled with ``add_*`` (no offsets kept): instead
        of re-reading a million lines to find nothing new, check the last line of each
        file against the index and, where it is there, continue from the end. Files
        whose tail is not indexed keep offset 0 and are read in full by :meth:`sync`.
        Returns the files adopted.
        """
        adopted = []
        for path in [*run_dir.telemetry_files(), run_dir.system, run_dir.events, run_dir.plan]:
            key = f"offset:{path.relative_to(run_dir.root).as_posix()}"
            if self.get_meta(key) is not None:
                continue
            # The last record the index could hold: a finished worker's stream ends with its heartbeats
            # and last words, which prove nothing, and a run left unadopted is read again whole.
            where, last = stream_last_line(path, accept=_indexed)
            if last is None or not self._has(last):
                continue
            self.set_meta(key, _saved(where))
            adopted.append(key[len("offset:") :])
        return adopted

    def _has(self, d: dict[str, Any]) -> bool:
        try:
            rec = from_dict(d)
        except (ValueError, TypeError):
            return False
        with self._lock:
            if isinstance(rec, StepRecord):
                row = self._db.execute(
                    "SELECT 1 FROM steps WHERE rank=? AND step=? AND attempt>=?",
                    (rec.rank, rec.step, rec.attempt),
                ).fetchone()
            elif isinstance(rec, SystemSample):
                row = self._db.execute("SELECT 1 FROM system WHERE ts=?", (rec.ts,)).fetchone()
            elif isinstance(rec, Event):
                row = self._db.execute("SELECT 1 FROM events WHERE seq=?", (rec.seq,)).fetchone()
            elif isinstance(rec, PlanRevision):
                row = self._db.execute("SELECT 1 FROM plans WHERE revision=?", (rec.revision,)).fetchone()
            else:
                return False  # a record the index does not keep proves nothing
        return row is not None

    def rebuild(self, run_dir: RunDir) -> int:
        """Drop the index and build it again from the run's JSONL files."""
        with self._lock, self._db:
            summaries = [t for f in FAMILIES.values() for t in (f.rollup, f.coarse)]
            for table in ("steps", "system", "gpu", *summaries, "events", "plans", "gradflow",
                          "gradflow_levels"):  # fmt: skip
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("DELETE FROM meta WHERE key LIKE 'offset:%'")
            self._flow_front.clear()
        return self.sync(run_dir)
