"""Reading ``run.db``: downsampled series, changes since a version, events and plans."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from steadytune.records import Event, PlanRevision, from_dict
from steadytune.telemetry.store.compact import overlaps
from steadytune.telemetry.store.schema import (
    FAMILIES,
    GPU_METRICS,
    STEP_METRICS,
    SYSTEM_METRICS,
    StoreBase,
)


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
    # From the summary buckets because compaction dropped raw rows in the range (store/compact.py):
    # the finest a chart gets there is one bucket of 64 steps or 16 s; the streams keep every step.
    summarized: bool = False


class Queries(StoreBase):
    """The readers of the store (gradient flow aside)."""

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
                    f"SELECT first, last FROM steps_rollup WHERE rank=? AND {m}_n>0 ORDER BY bucket DESC "
                    f"LIMIT 1",
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
                "SELECT COALESCE(SUM(nonfinite), 0), COALESCE(SUM(tokens), 0), "
                "COALESCE(SUM(step_time_s_sum), 0) FROM steps_rollup WHERE rank=?",
                (rank,),
            ).fetchone()
        out.update(
            step=latest["step"], ts=latest["ts"], attempt=latest["attempt"],
            nonfinite_latest=bool(latest["nonfinite"]), nonfinite_steps=int(agg[0]), tokens_total=int(agg[1]),
            step_time_total=float(agg[2]),
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
        """The GPUs sampled: one index probe each, where DISTINCT read every row of a long run."""
        out: list[int] = []
        with self._lock:
            while True:
                row = self._db.execute("SELECT MIN(idx) FROM gpu WHERE idx > ?", (out[-1] if out else -1,))
                nxt = row.fetchone()[0]
                if nxt is None:
                    return out
                out.append(int(nxt))

    def _series(
        self, table: str, x: str, metrics: tuple[str, ...], points: int,
        lo: float | None, hi: float | None, where: str, params: tuple[Any, ...],
    ) -> Series:  # fmt: skip
        points = max(1, min(int(points), 20000))
        version = self.version
        with self._lock:
            dropped = self._dropped(table, params)
            if lo is None or hi is None:
                # Two subqueries: SQLite reads MIN or MAX alone off the index, both at once from every row.
                # A compacted index may have dropped the first raw rows: its finest buckets span the run.
                src, col = (FAMILIES[table].rollup, "first") if dropped else (table, x)
                dlo, dhi = self._db.execute(
                    f"SELECT (SELECT MIN({col}) FROM {src} WHERE {where}), "
                    f"(SELECT MAX({x if src == table else 'last'}) FROM {src} WHERE {where})",
                    params * 2,
                ).fetchone()
                lo = dlo if lo is None else lo
                hi = dhi if hi is None else hi
            if lo is None or hi is None:
                return Series(metrics, [], None, None, 0, version)
            width = (hi - lo) / points or 1.0
            summary = self._summary(table, width, where, params)
            # Raw rows of the range dropped by compaction: chart it from the summaries at any zoom.
            summarized = summary is not None and overlaps(dropped, lo, hi)
            if summary is not None:
                rollup, swhere, sparams, unit = summary
                # Bucket b holds x in [b * unit, (b + 1) * unit): the key finds a zoomed range's rows.
                swhere += " AND bucket BETWEEN ? AND ?"
                sparams = (*sparams, int(lo // unit), int(hi // unit))
                # Counting a million rows costs more than charting them: estimate from the
                # summary buckets (exact for whole buckets, which is all the choice needs).
                n = self._db.execute(
                    f"SELECT COALESCE(SUM(n), 0) FROM {rollup} WHERE {swhere} AND last >= ? AND first <= ?",
                    (*sparams, lo, hi),
                ).fetchone()[0]
            else:
                n = self._db.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE {where} AND {x} BETWEEN ? AND ?", (*params, lo, hi)
                ).fetchone()[0]
            rng = f"{where} AND {x} BETWEEN ? AND ?"
            if n <= points and not summarized:
                # Few enough rows: send them raw (min = max = last).
                cols = ", ".join(metrics)
                raw = self._db.execute(
                    f"SELECT {x}, {cols} FROM {table} WHERE {rng} ORDER BY {x}", (*params, lo, hi)
                ).fetchall()
                rows = [[r[0], r[0], 1, *[v for m in r[1:] for v in (m, m, m)]] for r in raw]
                return Series(metrics, rows, lo, hi, n, version)
            # The last x sits at (hi - lo) / width = points: it joins the last bucket, not one of its own.
            if summary is not None and (width >= unit or summarized):
                # Coarse view: merge summary buckets instead of touching raw rows.
                aggs = ", ".join(
                    f"MIN({m}_min), MAX({m}_max), SUM({m}_sum) / NULLIF(SUM({m}_n), 0)" for m in metrics
                )
                src, src_params = rollup, (*sparams, lo, hi)
                src_where = f"{swhere} AND last >= ? AND first <= ?"
                f = FAMILIES[table]
                if rollup == f.coarse:
                    # The newest coarse bucket may wait for its last finest bucket (refresh_coarse):
                    # read the one that holds ``hi`` from the finest buckets, which are always current.
                    tail = (hi // unit) * unit
                    cols = ", ".join(f"{m}_min, {m}_max, {m}_sum, {m}_n" for m in metrics)
                    src = (
                        f"(SELECT first, last, n, {cols} FROM {rollup} WHERE {src_where} AND bucket < ? "
                        f"UNION ALL SELECT first, last, n, {cols} FROM {f.rollup} "
                        f"WHERE {where} AND bucket >= ? AND last >= ? AND first <= ?)"
                    )
                    src_params = (*src_params, int(hi // unit), *params, int(tail // f.width), lo, hi)
                    src_where = "1=1"
                sql = (
                    f"SELECT MIN(first), MAX(last), SUM(n), {aggs} FROM {src} "
                    f"WHERE {src_where} "
                    "GROUP BY MIN(CAST((first - ?) / ? AS INTEGER), ?) ORDER BY 1"
                )
                raw = self._db.execute(sql, (*src_params, lo, width, points - 1)).fetchall()
            else:
                # One pass over the range: min, max and mean per bucket.
                aggs = ", ".join(f"MIN({m}), MAX({m}), AVG({m})" for m in metrics)
                sql = (
                    f"SELECT MIN({x}), MAX({x}), COUNT(*), {aggs} FROM {table} WHERE {rng} "
                    f"GROUP BY MIN(CAST(({x} - ?) / ? AS INTEGER), ?) ORDER BY 1"
                )
                raw = self._db.execute(sql, (*params, lo, hi, lo, width, points - 1)).fetchall()
        return Series(metrics, [list(r) for r in raw], lo, hi, n, version, summarized)

    def _dropped(self, table: str, params: tuple[Any, ...]) -> list[list[float]]:
        """The ranges of ``table``'s x whose raw rows compaction dropped (of the rank ``params``
        names, for steps), from ``meta``: none for an index never compacted."""
        text = self.get_meta("compacted")
        if text is None:
            return []
        record = json.loads(text)
        if table == "steps":
            return list(record["steps"].get(str(params[0]), []))
        return list(record["samples"])

    def _summary(
        self, table: str, width: float, where: str, params: tuple[Any, ...]
    ) -> tuple[str, str, tuple[Any, ...], float] | None:
        """The summary table to chart ``table`` from in buckets of ``width``: ``(table, where,
        params, bucket width)``, or None where the index keeps none (samples of an old index).

        The coarsest level no wider than a chart bucket, so merging reads at most ~2 rows per
        bucket; the finest buckets (64 steps, 16 s) below that, or in an index an older
        steadytune wrote and this process may not add the levels to.
        """
        f = FAMILIES[table]
        if table != "steps" and self.get_meta("sample_rollup") != "1":
            return None
        levels = [v for v in f.levels if v <= width] if self.get_meta("coarse_levels") == "1" else []
        if levels:
            return f.coarse, f"level=? AND {where}", (levels[-1], *params), float(levels[-1])
        return f.rollup, where, params, float(f.width)

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
                f"SELECT ts, {', '.join(SYSTEM_METRICS)}, version FROM system WHERE version>? ORDER BY "
                f"version LIMIT ?",
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
        """``(name, severity, count)`` of one kind of event, for ``/metrics``.

        An anomaly episode counts once: the event filed when its severity rose is no new one.
        """
        with self._lock:
            return [
                (r[0], r[1], int(r[2]))
                for r in self._db.execute(
                    "SELECT name, severity, COUNT(*) FROM events WHERE kind=? "
                    "AND json_extract(json, '$.data.escalated_from') IS NULL GROUP BY name, severity "
                    "ORDER BY 1, 2",
                    (kind,),
                )
            ]

    def anomaly_states(self) -> list[tuple[str, str, str, str, str | None]]:
        """``(kind, name, severity, metric, grew_out_of)`` of anomaly and resolved events, in order;
        ``grew_out_of``: the JSON of the parts an episode grew out of (a spike that became an
        explosion), which end with it, or None.

        Read with SQLite's JSON functions so ``/metrics`` never parses whole events.
        """
        with self._lock:
            return [
                (r[0], r[1], r[2], r[3] or "", r[4])
                for r in self._db.execute(
                    "SELECT kind, name, severity, json_extract(json, '$.data.metric'), "
                    "json_extract(json, '$.data.grew_out_of') FROM events "
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
