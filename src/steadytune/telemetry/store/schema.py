"""The tables of ``run.db`` and the connection every part of the store shares."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = "1"
# Steps are also kept summarized in buckets of this many steps, so a chart of a
# 1,000,000-step run reads ~16k summary rows instead of a million raw ones.
ROLLUP = 64

# Coarser summaries above the buckets of each family (steps, system, GPU samples), each level
# twice the one below (steps: 128 to 65,536; samples: 32 s to 16,384 s), kept in ``<family>_coarse``
# and merged from the level below as it fills: a chart of N buckets reads the level just finer
# than its bucket, so at most ~2N rows whatever the run's length (a 1M-step run charted in 1,500
# buckets reads 1,953 rows of 512 steps, not 15,625 of 64).
LEVELS = 10
COARSE_LEVELS: tuple[int, ...] = tuple(ROLLUP << k for k in range(1, LEVELS + 1))

# System and GPU samples are also kept summarized per this many seconds (8 samples at the
# sampler's 2 s): a chart of a day-long run of 8 GPUs reads 50k summary rows, not 400k samples.
SAMPLE_ROLLUP_S = 16.0

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
SAMPLE_LEVELS: tuple[float, ...] = tuple(SAMPLE_ROLLUP_S * (1 << k) for k in range(1, LEVELS + 1))


@dataclass(frozen=True)
class Family:
    """One summarized table: its buckets, their coarse levels, and the key a chart picks rows by."""

    rollup: str  # the finest summary buckets
    coarse: str  # the levels above them
    key: str  # the column a chart picks (a rank, a GPU), "" for none
    metrics: tuple[str, ...]
    width: float  # of the finest buckets (steps or seconds)
    levels: tuple[float, ...]
    extra: tuple[str, ...] = ()  # counters summed along (tokens, non-finite steps)


FAMILIES: dict[str, Family] = {
    "steps": Family(
        "steps_rollup", "steps_coarse", "rank", STEP_METRICS, ROLLUP, COARSE_LEVELS, ("tokens", "nonfinite")
    ),
    "system": Family("system_rollup", "system_coarse", "", SYSTEM_METRICS, SAMPLE_ROLLUP_S, SAMPLE_LEVELS),
    "gpu": Family("gpu_rollup", "gpu_coarse", "idx", GPU_METRICS, SAMPLE_ROLLUP_S, SAMPLE_LEVELS),
}


def _summary_columns(metrics: tuple[str, ...]) -> str:
    """A summary bucket's columns for ``metrics``: min, max, sum and count of each."""
    return ", ".join(f"{m}_min REAL, {m}_max REAL, {m}_sum REAL, {m}_n INTEGER" for m in metrics)


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
  {_summary_columns(STEP_METRICS)},
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
-- One GPU's series, and which GPUs there are, without reading every other GPU's rows.
CREATE INDEX IF NOT EXISTS gpu_idx ON gpu(idx, ts);
CREATE TABLE IF NOT EXISTS system_rollup (
  bucket INTEGER PRIMARY KEY, first REAL NOT NULL, last REAL NOT NULL, n INTEGER NOT NULL,
  {_summary_columns(SYSTEM_METRICS)}
);
CREATE TABLE IF NOT EXISTS gpu_rollup (
  idx INTEGER NOT NULL, bucket INTEGER NOT NULL, first REAL NOT NULL, last REAL NOT NULL, n INTEGER NOT NULL,
  {_summary_columns(GPU_METRICS)},
  PRIMARY KEY (idx, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS steps_coarse (
  level INTEGER NOT NULL, rank INTEGER NOT NULL, bucket INTEGER NOT NULL, first INTEGER NOT NULL,
  last INTEGER NOT NULL, n INTEGER NOT NULL, tokens INTEGER, nonfinite INTEGER NOT NULL,
  {_summary_columns(STEP_METRICS)},
  PRIMARY KEY (level, rank, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS system_coarse (
  level REAL NOT NULL, bucket INTEGER NOT NULL, first REAL NOT NULL, last REAL NOT NULL, n INTEGER NOT NULL,
  {_summary_columns(SYSTEM_METRICS)},
  PRIMARY KEY (level, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gpu_coarse (
  level REAL NOT NULL, idx INTEGER NOT NULL, bucket INTEGER NOT NULL, first REAL NOT NULL, last REAL NOT NULL,
  n INTEGER NOT NULL,
  {_summary_columns(GPU_METRICS)},
  PRIMARY KEY (level, idx, bucket)
) WITHOUT ROWID;
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
-- The heat map's summaries of the recordings (store/flowsummary.py), per level of FLOW_LEVELS steps.
CREATE TABLE IF NOT EXISTS gradflow_levels (
  rank INTEGER NOT NULL, level INTEGER NOT NULL, bucket INTEGER NOT NULL, first INTEGER NOT NULL,
  last INTEGER NOT NULL, n INTEGER NOT NULL, cells TEXT NOT NULL,
  PRIMARY KEY (rank, level, bucket)
) WITHOUT ROWID;
"""


class UnreadableIndex(sqlite3.DatabaseError):
    """A ``run.db`` SQLite cannot read (not a database, or damaged); ``str()`` names it and the fix.

    A ``sqlite3.DatabaseError`` still, so what caught that catches this; a busy or locked file is
    not this (its ``OperationalError`` passes as it is).
    """


class StoreBase:
    """One connection to ``run.db``, guarded by a lock, and its change stamps and ``meta`` table.

    Raises:
        UnreadableIndex: the file is not an SQLite database, or a damaged one.
    """

    def __init__(self, path: Path | str, readonly: bool = False) -> None:
        try:
            self._open(path, readonly)
        except sqlite3.DatabaseError as e:
            if type(e) is not sqlite3.DatabaseError:  # locked, busy, read-only: not the file's fault
                raise
            db = getattr(self, "_db", None)
            if db is not None:
                db.close()
            raise UnreadableIndex(
                f"{self.path}: not a readable index ({e}); move it aside, or open the run in the "
                "dashboard, which does so once the run has ended (run.db.unreadable) and rebuilds it "
                "from the run's streams"
            ) from None

    def _open(self, path: Path | str, readonly: bool) -> None:
        self.path = Path(path) if str(path) != ":memory:" else Path(":memory:")
        self.readonly = readonly
        self._lock = threading.RLock()
        # The newest finest bucket each (family, rank or GPU) has written: see refresh_coarse.
        self._coarse_front: dict[tuple[str, int | None], int] = {}
        # The same for the heat map's levels, per rank: see gradflow.refresh_levels.
        self._flow_front: dict[int, int] = {}
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
            if self.get_meta("sample_rollup") is None:
                # An index made before the sample summaries: summarize what it holds, once.
                with self._lock, self._db:
                    self.refresh_sample_rollup(None, None)
                    self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('sample_rollup', '1')")
            if self.get_meta("coarse_levels") is None:
                # An index made before the coarse levels: build them from the finest buckets, once.
                with self._lock, self._db:
                    for family in FAMILIES:
                        self.refresh_coarse(family, None, None)
                    self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('coarse_levels', '1')")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._version = self._max_version()
        # Lines of the JSONL that sync() skipped: not JSON, nested too deep, or not a record.
        self.unreadable_lines = 0

    # ---- housekeeping -------------------------------------------------------------

    def refresh_sample_rollup(self, lo: float | None, hi: float | None) -> None:
        """Recompute the system and GPU summary buckets that hold ``[lo, hi]`` (None: all of them)
        from the raw samples, and the coarse levels above them, in the caller's transaction."""
        width = SAMPLE_ROLLUP_S
        rng, params = (
            ("WHERE ts >= ? AND ts < ?", (lo // width * width, (hi // width + 1) * width))
            if (lo is not None and hi is not None)
            else ("", ())
        )
        for table, metrics, key in (("system", SYSTEM_METRICS, ""), ("gpu", GPU_METRICS, "idx, ")):
            aggs = ", ".join(f"MIN({m}), MAX({m}), SUM({m}), COUNT({m})" for m in metrics)
            cols = ", ".join(f"{m}_min, {m}_max, {m}_sum, {m}_n" for m in metrics)
            self._db.execute(
                f"INSERT OR REPLACE INTO {table}_rollup({key}bucket, first, last, n, {cols}) "
                f"SELECT {key}CAST(ts / ? AS INTEGER), MIN(ts), MAX(ts), COUNT(*), {aggs} FROM {table} {rng} "
                f"GROUP BY {key}CAST(ts / ? AS INTEGER)",
                (width, *params, width),
            )
            if lo is None or hi is None:
                self.refresh_coarse(table, None, None)
            else:
                self.refresh_coarse(table, int(lo // width), int(hi // width))

    def refresh_coarse(self, family: str, b_lo: int | None, b_hi: int | None, key: int | None = None) -> None:
        """Recompute every coarse level of ``family`` over its finest buckets ``b_lo..b_hi`` (None: all
        of them), of one rank or GPU (``key``; None: all), each level from the one below, in the
        caller's transaction."""
        if b_lo is not None and b_hi is not None:
            front = self._coarse_front.get((family, key))
            if front is None:
                self._coarse_front[(family, key)] = b_hi
                b_lo, b_hi = self._unsettled(family, key, b_lo, b_hi)
            else:
                if b_lo == b_hi == front:
                    # Only the newest finest bucket moved (a live run's every step and sample): the
                    # levels above it wait until the next bucket opens, since ten statements a
                    # step were a fifth of the supervisor's CPU. A chart reads the newest coarse
                    # bucket from the finest level (queries._series), so it loses nothing meanwhile.
                    return
                b_lo = min(b_lo, front)  # the bucket that was newest is complete: bring it up too
                self._coarse_front[(family, key)] = max(b_hi, front)
        f = FAMILIES[family]
        keyed = f"{f.key}, " if f.key else ""
        extra = "".join(f"{c}, " for c in f.extra)
        sums = "".join(f"SUM({c}), " for c in f.extra)
        cols = ", ".join(f"{m}_min, {m}_max, {m}_sum, {m}_n" for m in f.metrics)
        aggs = ", ".join(f"MIN({m}_min), MAX({m}_max), SUM({m}_sum), SUM({m}_n)" for m in f.metrics)
        below: float | None = None  # the finest buckets first, then each level from the one before
        for k, level in enumerate(f.levels, start=1):
            where, params = ["1=1"], []
            if below is not None:
                where.append("level=?")
                params.append(below)
            if key is not None and f.key:
                where.append(f"{f.key}=?")
                params.append(key)
            if b_lo is not None and b_hi is not None:
                # Finest buckets b_lo..b_hi lie in this level's buckets b >> k, made of the level
                # below's buckets 2 * (b_lo >> k)..2 * (b_hi >> k) + 1.
                where.append("bucket BETWEEN ? AND ?")
                params += [2 * (b_lo >> k), 2 * (b_hi >> k) + 1]
            self._db.execute(
                f"INSERT OR REPLACE INTO {f.coarse}(level, {keyed}bucket, first, last, n, {extra}{cols}) "
                f"SELECT ?, {keyed}bucket / 2, MIN(first), MAX(last), SUM(n), {sums}{aggs} "
                f"FROM {f.rollup if below is None else f.coarse} WHERE {' AND '.join(where)} "
                f"GROUP BY {keyed}bucket / 2",
                (level, *params),
            )
            below = level

    def _unsettled(self, family: str, key: int | None, b_lo: int, b_hi: int) -> tuple[int, int]:
        """The finest buckets to carry up at this writer's first write of ``family``: its own, and
        those an earlier writer (a supervisor since stopped, a run resumed) left above the levels'
        front, whose carrying up waited for a next bucket that writer never opened. Without them
        a spike in that bucket would be missing from every coarse chart for good."""
        f = FAMILIES[family]
        where, params = ("", ()) if key is None or not f.key else (f" AND {f.key}=?", (key,))
        (top,) = self._db.execute(
            f"SELECT MAX(bucket) FROM {f.coarse} WHERE level=?{where}", (f.levels[0], *params)
        ).fetchone()
        (newest,) = self._db.execute(
            f"SELECT MAX(bucket) FROM {f.rollup} WHERE 1=1{where}", params
        ).fetchone()
        if newest is None:
            return b_lo, b_hi
        # The first level's newest bucket holds finest buckets 2*top and 2*top+1, the older of which
        # may be the one left waiting; every finest bucket before them is in the levels already.
        settled_below = 0 if top is None else 2 * int(top)
        return min(b_lo, settled_below), max(b_hi, int(newest))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _max_version(self) -> int:
        try:
            row = self._db.execute(
                "SELECT MAX(v) FROM (SELECT MAX(version) v FROM steps UNION ALL SELECT MAX(version) FROM "
                "system)"
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
