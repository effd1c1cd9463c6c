"""``run.db``: the SQLite (WAL) index of one run, rebuilt from the JSONL if lost.

The JSONL files are the truth; this is the fast index the dashboard, ``/metrics``
and ``analyze`` query. Every ``add_*`` is an idempotent upsert on a natural key
(rank+step, event seq, sample ts, plan revision), so the same line may be fed
twice (a supervisor and a dashboard tailing the same run) without harm.

Steps: after a restart the worker records the same step again under a later
``attempt``; the latest attempt wins, per rank. Every upsert stamps the row with
a new ``version`` so a live reader can ask for "what changed since version N".

Gradient flow: a step whose ``extra["gradflow"]`` holds per-layer statistics
(every 50 steps, see ``guard/gradflow.py``) also gets a row in ``gradflow``,
stamped with its step's version and replaced with it after a restart.

No torch here: the supervisor and the web server import this module.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from steadytune.records import Event, PlanRevision, StepRecord, SystemSample, from_dict, to_dict
from steadytune.rundir import RunDir
from steadytune.telemetry.jsonl import JsonlReader, last_line

SCHEMA_VERSION = "1"
# Steps are also kept summarized in buckets of this many steps, so a chart of a
# 1,000,000-step run reads ~16k summary rows instead of a million raw ones.
ROLLUP = 64

# Columns of the step series the dashboard charts, in this order.
STEP_METRICS: tuple[str, ...] = (
    "loss",
    "eval_loss",
    "grad_norm",
    "lr",
    "tokens_per_s",
    "step_time_s",
    "mem_allocated_bytes",
    "mem_reserved_bytes",
    "mem_peak_bytes",
)
SYSTEM_METRICS: tuple[str, ...] = (
    "cpu_ratio",
    "ram_used_bytes",
    "ram_total_bytes",
    "disk_free_bytes",
    "disk_total_bytes",
    "worker_rss_bytes",
)
GPU_METRICS: tuple[str, ...] = ("util_ratio", "mem_used_bytes", "mem_total_bytes", "temperature_c", "power_w")

_DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
  rank INTEGER NOT NULL, step INTEGER NOT NULL, attempt INTEGER NOT NULL, ts REAL NOT NULL,
  {", ".join(f"{m} REAL" for m in STEP_METRICS)},
  tokens INTEGER, nonfinite INTEGER NOT NULL DEFAULT 0, skipped INTEGER NOT NULL DEFAULT 0,
  version INTEGER NOT NULL,
  PRIMARY KEY (rank, step)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS steps_version ON steps(version);
CREATE TABLE IF NOT EXISTS steps_rollup (
  rank INTEGER NOT NULL, bucket INTEGER NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
  n INTEGER NOT NULL, tokens INTEGER, nonfinite INTEGER NOT NULL,
  {", ".join(f"{m}_min REAL, {m}_max REAL, {m}_sum REAL, {m}_n INTEGER" for m in STEP_METRICS)},
  PRIMARY KEY (rank, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS system (
  ts REAL PRIMARY KEY, {", ".join(f"{m} REAL" for m in SYSTEM_METRICS)}, version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS system_version ON system(version);
CREATE TABLE IF NOT EXISTS gpu (
  ts REAL NOT NULL, idx INTEGER NOT NULL, name TEXT,
  {", ".join(f"{m} REAL" for m in GPU_METRICS)},
  PRIMARY KEY (ts, idx)
);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
  severity TEXT NOT NULL, step INTEGER, message TEXT, json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind, name);
CREATE TABLE IF NOT EXISTS plans (revision INTEGER PRIMARY KEY, ts REAL NOT NULL, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gradflow (
  rank INTEGER NOT NULL, step INTEGER NOT NULL, attempt INTEGER NOT NULL, ts REAL NOT NULL,
  layers TEXT NOT NULL, norm TEXT NOT NULL, zero_frac TEXT NOT NULL, hist TEXT, bins TEXT,
  version INTEGER NOT NULL,
  PRIMARY KEY (rank, step)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gradflow_version ON gradflow(version);
"""


def _num(value: Any) -> float | None:
    """A chartable number: NaN becomes NULL (SQLite cannot hold NaN), Inf stays."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _nonfinite(*values: Any) -> int:
    return int(any(isinstance(v, float) and not math.isfinite(v) for v in values))


_NONFINITE_TEXT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _flow_num(value: Any) -> float | None:
    """A per-layer number as recorded: a float, or "nan"/"inf" after a JSONL round trip."""
    if isinstance(value, str):
        return _NONFINITE_TEXT.get(value.strip().lower())
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _flow_text(values: Sequence[float | None]) -> str:
    """JSON of per-layer numbers; a NaN/Inf norm is the evidence of an exploding layer, so it is kept as text."""
    return json.dumps(
        [
            v if v is None or math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
            for v in values
        ]
    )


def _flow_columns(flow: Any) -> tuple[str, str, str, str | None, str | None] | None:
    """The stored columns of a ``gradflow`` extra, or ``None`` when it is not one.

    A malformed extra (a newer or foreign writer) is left out rather than failing the
    whole batch: the steps still go in.
    """
    if not isinstance(flow, dict):
        return None
    layers, norm = flow.get("layers"), flow.get("norm")
    if not isinstance(layers, list) or not isinstance(norm, list) or not layers or len(layers) != len(norm):
        return None
    zero = flow.get("zero_frac")
    if not isinstance(zero, list) or len(zero) != len(layers):
        zero = [None] * len(layers)
    hist, bins = flow.get("hist"), flow.get("bins")
    return (
        json.dumps([str(x) for x in layers]),
        _flow_text([_flow_num(v) for v in norm]),
        _flow_text([_flow_num(v) for v in zero]),
        json.dumps(hist) if isinstance(hist, list) and len(hist) == len(layers) else None,
        json.dumps(bins) if isinstance(bins, list) else None,
    )


@dataclass(frozen=True)
class GradFlow:
    """The per-layer gradient statistics recorded at one step, layers in forward order.

    ``norm`` is NaN/Inf where a layer's gradient was not finite, ``None`` where unknown.
    ``hist`` (per layer, counts over the log10 ``bins`` of |grad|) is read only on request.
    """

    step: int
    attempt: int
    ts: float
    layers: tuple[str, ...]
    norm: tuple[float | None, ...]
    zero_frac: tuple[float | None, ...]
    version: int
    hist: tuple[tuple[int, ...], ...] | None = None
    bins: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Series:
    """A downsampled series: one row per bucket of the x axis.

    ``rows`` are ``[x_first, x_last, count, m1_min, m1_max, m1_mean, m2_min, ...]``,
    in the order of ``metrics``; a chart draws the min..max band at each bucket
    and a line through the means, which keeps spikes visible at any zoom.
    """

    metrics: tuple[str, ...]
    rows: list[list[float | None]]
    lo: float | None
    hi: float | None
    total: int
    version: int


class RunStore:
    """The SQLite index of one run. Thread-safe; one connection guarded by a lock."""

    def __init__(self, path: Path | str, readonly: bool = False) -> None:
        self.path = Path(path) if str(path) != ":memory:" else Path(":memory:")
        self.readonly = readonly
        self._lock = threading.RLock()
        if readonly:
            uri = f"file:{self.path}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=5.0)
        else:
            if str(self.path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=10.0)
            # WAL lets the dashboard read while the supervisor writes; NORMAL sync is
            # enough because the JSONL, not this file, is the durable truth.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_DDL)
            if self.get_meta("schema") is None:
                self.set_meta("schema", SCHEMA_VERSION)
        self._db.execute("PRAGMA busy_timeout=5000")
        self._version = self._max_version()
        # Lines of the JSONL that sync() skipped: not JSON, nested too deep, or not a record.
        self.unreadable_lines = 0

    # ---- housekeeping -------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _max_version(self) -> int:
        try:
            row = self._db.execute(
                "SELECT MAX(v) FROM (SELECT MAX(version) v FROM steps UNION ALL SELECT MAX(version) FROM system)"
            ).fetchone()
        except sqlite3.OperationalError:
            return 0
        return int(row[0] or 0)

    def _next_version(self) -> int:
        self._version += 1
        return self._version

    @property
    def version(self) -> int:
        """The newest change stamp; readers pass it back to :meth:`steps_since`."""
        with self._lock:
            self._version = max(self._version, self._max_version())
            return self._version

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", (key, str(value)))

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
        """Upsert the gradient flow of the steps that carry one (in the caller's transaction)."""
        flows, stale = [], []
        for r, version in zip(records, versions, strict=True):
            cols = _flow_columns(r.extra.get("gradflow")) if r.extra else None
            if cols is not None:
                flows.append((r.rank, r.step, r.attempt, r.ts, *cols, version))
            elif r.attempt > 0:
                # A later attempt redid this step without a recording: the old one no longer applies.
                stale.append((r.rank, r.step, r.attempt))
        if flows:
            cols = ("rank", "step", "attempt", "ts", "layers", "norm", "zero_frac", "hist", "bins", "version")
            updates = ", ".join(f"{c}=excluded.{c}" for c in cols[2:])
            self._db.executemany(
                f"INSERT INTO gradflow({', '.join(cols)}) VALUES({', '.join('?' * len(cols))}) "
                f"ON CONFLICT(rank, step) DO UPDATE SET {updates} WHERE excluded.attempt >= gradflow.attempt",
                flows,
            )
        if stale:
            self._db.executemany("DELETE FROM gradflow WHERE rank=? AND step=? AND attempt<?", stale)

    def _refresh_rollup(self, rank: int, b_lo: int, b_hi: int) -> None:
        """Recompute the summary buckets ``b_lo..b_hi`` of a rank from the raw steps."""
        aggs = ", ".join(f"MIN({m}), MAX({m}), SUM({m}), COUNT({m})" for m in STEP_METRICS)
        cols = ", ".join(f"{m}_min, {m}_max, {m}_sum, {m}_n" for m in STEP_METRICS)
        self._db.execute(
            f"INSERT OR REPLACE INTO steps_rollup(rank, bucket, first, last, n, tokens, nonfinite, {cols}) "
            f"SELECT rank, step / {ROLLUP}, MIN(step), MAX(step), COUNT(*), SUM(tokens), SUM(nonfinite), {aggs} "
            "FROM steps WHERE rank=? AND step BETWEEN ? AND ? GROUP BY step / ?",
            (rank, b_lo * ROLLUP, b_hi * ROLLUP + ROLLUP - 1, ROLLUP),
        )

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

        The byte offset reached in each file is kept in ``meta`` (``offset:<relpath>``),
        so a later call, in this process or another, continues where this one stopped.
        """
        total = 0
        files = [*run_dir.telemetry_files(), run_dir.system, run_dir.events, run_dir.plan]
        # A worker's notices (events in telemetry/) are filed by its supervisor in events.jsonl,
        # with their seq: index the filed copy only, or each would show twice, the second without a seq.
        filed = run_dir.events.exists()
        for path in files:
            notices = path.parent == run_dir.telemetry_dir
            key = f"offset:{path.relative_to(run_dir.root).as_posix()}"
            start = int(self.get_meta(key, "0") or 0)
            try:
                if path.stat().st_size < start:
                    start = 0  # the file was replaced (rotated or rewritten): read it again
            except FileNotFoundError:
                continue
            reader = JsonlReader(path, start)
            while True:
                offset = reader.offset
                skipped = reader.bad_lines + reader.long_lines
                dicts = reader.read_dicts(max_bytes=chunk_bytes)
                bad = reader.bad_lines + reader.long_lines - skipped
                if reader.offset == offset:
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
            self.set_meta(key, str(reader.offset))
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
            end, last = last_line(path)
            if last is None or not self._has(last):
                continue
            self.set_meta(key, str(end))
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
                # A heartbeat or exit record last: not indexed, so it proves nothing.
                return False
        return row is not None

    def rebuild(self, run_dir: RunDir) -> int:
        """Drop the index and build it again from the run's JSONL files."""
        with self._lock, self._db:
            for table in ("steps", "steps_rollup", "system", "gpu", "events", "plans", "gradflow"):
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("DELETE FROM meta WHERE key LIKE 'offset:%'")
        return self.sync(run_dir)

    # ---- queries ------------------------------------------------------------------

    def step_count(self, rank: int = 0) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM steps WHERE rank=?", (rank,)).fetchone()[0])

    def step_range(self, rank: int = 0) -> tuple[int | None, int | None]:
        with self._lock:
            lo, hi = self._db.execute(
                "SELECT MIN(step), MAX(step) FROM steps WHERE rank=?", (rank,)
            ).fetchone()
        return lo, hi

    def latest_step(self, rank: int = 0) -> dict[str, Any] | None:
        """The newest step row of a rank, as a dict (``None`` before the first step)."""
        with self._lock:
            cur = self._db.execute("SELECT * FROM steps WHERE rank=? ORDER BY step DESC LIMIT 1", (rank,))
            row = cur.fetchone()
            names = [d[0] for d in cur.description]
        return dict(zip(names, row, strict=True)) if row else None

    def latest_values(self, rank: int = 0) -> dict[str, Any]:
        """The last non-null value of every step metric (eval loss is often sparse)."""
        out: dict[str, Any] = {}
        latest = self.latest_step(rank)
        if latest is None:
            return out
        with self._lock:
            for m in STEP_METRICS:
                if latest.get(m) is not None:
                    out[m] = latest[m]
                    continue
                # Find the newest bucket holding the metric, then the row inside it: a
                # sparse metric (eval loss) never costs a scan of the whole table.
                b = self._db.execute(
                    f"SELECT first, last FROM steps_rollup WHERE rank=? AND {m}_n>0 ORDER BY bucket DESC LIMIT 1",
                    (rank,),
                ).fetchone()
                if b is None:
                    continue
                row = self._db.execute(
                    f"SELECT {m} FROM steps WHERE rank=? AND step BETWEEN ? AND ? AND {m} IS NOT NULL "
                    "ORDER BY step DESC LIMIT 1",
                    (rank, b[0], b[1]),
                ).fetchone()
                if row is not None:
                    out[m] = row[0]
            agg = self._db.execute(
                "SELECT COALESCE(SUM(nonfinite), 0), COALESCE(SUM(tokens), 0) FROM steps_rollup WHERE rank=?",
                (rank,),
            ).fetchone()
        out.update(
            step=latest["step"], ts=latest["ts"], attempt=latest["attempt"],
            nonfinite_latest=bool(latest["nonfinite"]), nonfinite_steps=int(agg[0]), tokens_total=int(agg[1]),
        )  # fmt: skip
        return out

    def step_series(
        self,
        metrics: Sequence[str] = STEP_METRICS,
        points: int = 1000,
        lo: float | None = None,
        hi: float | None = None,
        rank: int = 0,
    ) -> Series:
        """Steps in ``[lo, hi]`` reduced to at most ``points`` buckets of min/max/last."""
        bad = [m for m in metrics if m not in STEP_METRICS]
        if bad:
            raise ValueError(f"unknown step metrics {bad}; known: {list(STEP_METRICS)}")
        return self._series("steps", "step", tuple(metrics), points, lo, hi, "rank=?", (rank,))

    def system_series(
        self,
        metrics: Sequence[str] = SYSTEM_METRICS,
        points: int = 1000,
        lo: float | None = None,
        hi: float | None = None,
    ) -> Series:
        bad = [m for m in metrics if m not in SYSTEM_METRICS]
        if bad:
            raise ValueError(f"unknown system metrics {bad}; known: {list(SYSTEM_METRICS)}")
        return self._series("system", "ts", tuple(metrics), points, lo, hi, "1=1", ())

    def gpu_series(
        self, index: int = 0, metrics: Sequence[str] = GPU_METRICS, points: int = 1000,
        lo: float | None = None, hi: float | None = None,
    ) -> Series:  # fmt: skip
        bad = [m for m in metrics if m not in GPU_METRICS]
        if bad:
            raise ValueError(f"unknown gpu metrics {bad}; known: {list(GPU_METRICS)}")
        return self._series("gpu", "ts", tuple(metrics), points, lo, hi, "idx=?", (index,))

    def gpu_indices(self) -> list[int]:
        with self._lock:
            return [int(r[0]) for r in self._db.execute("SELECT DISTINCT idx FROM gpu ORDER BY idx")]

    def _series(
        self, table: str, x: str, metrics: tuple[str, ...], points: int,
        lo: float | None, hi: float | None, where: str, params: tuple[Any, ...],
    ) -> Series:  # fmt: skip
        points = max(1, min(int(points), 20000))
        version = self.version
        with self._lock:
            if lo is None or hi is None:
                dlo, dhi = self._db.execute(
                    f"SELECT MIN({x}), MAX({x}) FROM {table} WHERE {where}", params
                ).fetchone()
                lo = dlo if lo is None else lo
                hi = dhi if hi is None else hi
            if lo is None or hi is None:
                return Series(metrics, [], None, None, 0, version)
            if table == "steps":
                # Counting a million rows costs more than charting them: estimate from the
                # summary buckets (exact for whole buckets, which is all the choice needs).
                n = self._db.execute(
                    "SELECT COALESCE(SUM(n), 0) FROM steps_rollup WHERE rank=? AND last >= ? AND first <= ?",
                    (*params, lo, hi),
                ).fetchone()[0]
            else:
                n = self._db.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE {where} AND {x} BETWEEN ? AND ?", (*params, lo, hi)
                ).fetchone()[0]
            rng = f"{where} AND {x} BETWEEN ? AND ?"
            if n <= points:
                # Few enough rows: send them raw (min = max = last).
                cols = ", ".join(metrics)
                raw = self._db.execute(
                    f"SELECT {x}, {cols} FROM {table} WHERE {rng} ORDER BY {x}", (*params, lo, hi)
                ).fetchall()
                rows = [[r[0], r[0], 1, *[v for m in r[1:] for v in (m, m, m)]] for r in raw]
                return Series(metrics, rows, lo, hi, n, version)
            width = (hi - lo) / points or 1.0
            if table == "steps" and width >= ROLLUP:
                # Coarse view: merge summary buckets instead of touching raw rows.
                aggs = ", ".join(
                    f"MIN({m}_min), MAX({m}_max), SUM({m}_sum) / NULLIF(SUM({m}_n), 0)" for m in metrics
                )
                sql = (
                    f"SELECT MIN(first), MAX(last), SUM(n), {aggs} FROM steps_rollup "
                    "WHERE rank=? AND last >= ? AND first <= ? GROUP BY CAST((first - ?) / ? AS INTEGER) ORDER BY 1"
                )
                raw = self._db.execute(sql, (*params, lo, hi, lo, width)).fetchall()
            else:
                # One pass over the range: min, max and mean per bucket.
                aggs = ", ".join(f"MIN({m}), MAX({m}), AVG({m})" for m in metrics)
                sql = (
                    f"SELECT MIN({x}), MAX({x}), COUNT(*), {aggs} FROM {table} WHERE {rng} "
                    f"GROUP BY CAST(({x} - ?) / ? AS INTEGER) ORDER BY 1"
                )
                raw = self._db.execute(sql, (*params, lo, hi, lo, width)).fetchall()
        return Series(metrics, [list(r) for r in raw], lo, hi, n, version)

    def steps_since(self, version: int, rank: int = 0, limit: int = 5000) -> list[dict[str, Any]]:
        """Step rows changed after ``version`` (new steps, or steps a later attempt replaced)."""
        with self._lock:
            cur = self._db.execute(
                f"SELECT step, attempt, ts, {', '.join(STEP_METRICS)}, nonfinite, version FROM steps "
                "WHERE rank=? AND version>? ORDER BY version LIMIT ?",
                (rank, version, limit),
            )
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def system_since(self, version: int, limit: int = 2000) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._db.execute(
                f"SELECT ts, {', '.join(SYSTEM_METRICS)}, version FROM system WHERE version>? ORDER BY version LIMIT ?",
                (version, limit),
            )
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
            for row in rows:
                gcur = self._db.execute(
                    f"SELECT idx, {', '.join(GPU_METRICS)} FROM gpu WHERE ts=? ORDER BY idx", (row["ts"],)
                )
                gnames = [d[0] for d in gcur.description]
                row["gpus"] = [dict(zip(gnames, g, strict=True)) for g in gcur.fetchall()]
        return rows

    def gradflow(
        self, lo: float | None = None, hi: float | None = None, rank: int = 0, hist: bool = False,
        limit: int = 200_000,
    ) -> list[GradFlow]:  # fmt: skip
        """The gradient-flow recordings of steps in ``[lo, hi]``, oldest first.

        Every 50 steps, a million-step run has 20,000 of them: few enough to read whole
        (the histograms, the bulk of a row, only when ``hist`` is asked for).
        """
        sql = (
            f"SELECT step, attempt, ts, layers, norm, zero_frac, version{', hist, bins' if hist else ''} "
            "FROM gradflow WHERE rank=? AND step BETWEEN ? AND ? ORDER BY step LIMIT ?"
        )
        lo_ = -(2**62) if lo is None else math.floor(lo)
        hi_ = 2**62 if hi is None else math.ceil(hi)
        return self._gradflow_rows(sql, (rank, lo_, hi_, limit), hist)

    def gradflow_since(self, version: int, rank: int = 0, limit: int = 500) -> list[GradFlow]:
        """Recordings added or replaced after ``version`` (the step versions of :meth:`steps_since`)."""
        sql = (
            "SELECT step, attempt, ts, layers, norm, zero_frac, version FROM gradflow "
            "WHERE rank=? AND version>? ORDER BY version LIMIT ?"
        )
        return self._gradflow_rows(sql, (rank, version, limit), False)

    def _gradflow_rows(self, sql: str, params: tuple[Any, ...], hist: bool) -> list[GradFlow]:
        with self._lock:
            try:
                raw = self._db.execute(sql, params).fetchall()
            except sqlite3.OperationalError:
                return []  # an index written before gradient flow was kept, opened read-only
        out = []
        names: dict[str, tuple[str, ...]] = {}  # the same layer list on every row: parse it once

        def num(v: Any) -> float | None:
            return v if type(v) is float else _flow_num(v)  # the common case first: 1.4M calls on a long run

        for r in raw:
            layers = names.get(r[3])
            if layers is None:
                layers = names[r[3]] = tuple(json.loads(r[3]))
            hists = bins = None
            if hist and r[7] is not None:
                hists = tuple(tuple(int(x) for x in h) for h in json.loads(r[7]))
            if hist and r[8] is not None:
                bins = tuple(float(b) for b in json.loads(r[8]))
            out.append(GradFlow(
                step=r[0], attempt=r[1], ts=r[2], layers=layers, norm=tuple(map(num, json.loads(r[4]))),
                zero_frac=tuple(map(num, json.loads(r[5]))), version=r[6], hist=hists, bins=bins,
            ))  # fmt: skip
        return out

    def latest_system(self) -> dict[str, Any] | None:
        with self._lock:
            cur = self._db.execute(
                f"SELECT ts, {', '.join(SYSTEM_METRICS)} FROM system ORDER BY ts DESC LIMIT 1"
            )
            row = cur.fetchone()
            if row is None:
                return None
            names = [d[0] for d in cur.description]
            rows = dict(zip(names, row, strict=True))
            gcur = self._db.execute(
                f"SELECT idx, name, {', '.join(GPU_METRICS)} FROM gpu WHERE ts=? ORDER BY idx", (rows["ts"],)
            )
            gnames = [d[0] for d in gcur.description]
            rows["gpus"] = [dict(zip(gnames, g, strict=True)) for g in gcur.fetchall()]
        return rows

    def events(
        self, after_seq: int = -1, kinds: Sequence[str] | None = None, limit: int = 500, newest: bool = False
    ) -> list[Event]:
        """Events with ``seq > after_seq`` in order; ``newest`` takes the last ``limit`` instead."""
        sql = "SELECT seq, json FROM events WHERE seq>?"
        params: list[Any] = [after_seq]
        if kinds:
            sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params.extend(kinds)
        sql += f" ORDER BY seq {'DESC' if newest else 'ASC'} LIMIT ?"
        params.append(limit)
        with self._lock:
            raw = list(self._db.execute(sql, params))
        if newest:
            raw.reverse()
        out: list[Event] = []
        for seq, text in raw:
            rec = from_dict(json.loads(text))
            if isinstance(rec, Event):
                # An index filled before seqs were kept in the JSON: the row's seq is the event's.
                out.append(rec if rec.seq == seq else replace(rec, seq=seq))
        return out

    def last_event_seq(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(seq) FROM events").fetchone()
        return -1 if row[0] is None else int(row[0])

    def event_counts(self, kind: str = "anomaly") -> list[tuple[str, str, int]]:
        """``(name, severity, count)`` of one kind of event, for ``/metrics``."""
        with self._lock:
            return [
                (r[0], r[1], int(r[2]))
                for r in self._db.execute(
                    "SELECT name, severity, COUNT(*) FROM events WHERE kind=? GROUP BY name, severity ORDER BY 1, 2",
                    (kind,),
                )
            ]

    def anomaly_states(self) -> list[tuple[str, str, str, str]]:
        """``(kind, name, severity, metric)`` of anomaly and resolved events, in order.

        Read with SQLite's JSON functions so ``/metrics`` never parses whole events.
        """
        with self._lock:
            return [
                (r[0], r[1], r[2], r[3] or "")
                for r in self._db.execute(
                    "SELECT kind, name, severity, json_extract(json, '$.data.metric') FROM events "
                    "WHERE kind IN ('anomaly', 'resolved') ORDER BY seq"
                )
            ]

    def plans(self) -> list[PlanRevision]:
        with self._lock:
            raw = [r[0] for r in self._db.execute("SELECT json FROM plans ORDER BY revision")]
        out: list[PlanRevision] = []
        for text in raw:
            rec = from_dict(json.loads(text))
            if isinstance(rec, PlanRevision):
                out.append(rec)
        return out


def open_store(run_dir: RunDir) -> RunStore:
    """The run's ``run.db``, created and filled from the JSONL when it is missing."""
    fresh = not run_dir.db.exists()
    store = RunStore(run_dir.db)
    if fresh:
        store.rebuild(run_dir)
    return store
