"""The heat map's summary levels in ``run.db``: a map merged from them is the map of the recordings they
cover, at every zoom, under any limits; kept up as recordings arrive or are replaced, rebuilt with the
index, built once for an index written before them."""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from steadytune.detect.gradflow import LayerLimits
from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.store import RunStore, open_store
from steadytune.telemetry.store.flowsummary import FLOW_LEVELS
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web import heatmap
from steadytune.web.heatmap import DEAD, EXPLODING, OK, VANISHING, cell_state

LAYERS = ("embeddings", "layers.0", "layers.1", "layers.2", "lm_head")
EVERY = 50
SPIKE = 6_350  # one recording where layers.1 explodes
NAN_AT = 17_450  # one recording where lm_head is not finite
STRICT: LayerLimits = {"vanish": 0.05, "explode": 3.0, "dead_zero_frac": 0.5}


def recording(step: int, rng: random.Random) -> dict[str, Any]:
    """Healthy embeddings (sparse, as they are); layers.0 vanishing as the run goes on; layers.1 healthy
    but for one spike; layers.2 dead now and then, at norms either side of the vanish limit, with a
    share of zeros that wanders; lm_head healthy but for one NaN."""
    t = step / 20_000
    norm = [
        0.3 * (1 + 0.2 * rng.random()),
        0.5 * 10 ** (-4 * t) * (1 + 0.1 * rng.random()),
        1e4 if step == SPIKE else 0.8 + 0.4 * rng.random(),
        10 ** rng.uniform(-4, 0.5),
        math.nan if step == NAN_AT else 1.0 + rng.random(),
    ]
    zero = [0.97, 0.0, 0.01, rng.choice([0.0, 0.02, rng.uniform(0.3, 1.0)]), 0.0]
    return {"layers": list(LAYERS), "norm": norm, "zero_frac": zero}


def records(n: int, seed: int = 7, attempt: int = 0, start: int = 0) -> list[StepRecord]:
    rng = random.Random(seed)
    return [
        StepRecord(step=s, ts=float(s), attempt=attempt, loss=1.0, extra={"gradflow": recording(s, rng)})
        for s in range(start, start + n * EVERY, EVERY)
    ]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    s = RunStore(tmp_path_factory.mktemp("flow") / "run.db")
    batch = records(400)  # 20,000 steps, fed as a live run feeds them: a few at a time, then one by one
    for i in range(0, 380, 7):
        s.add_steps(batch[i : min(i + 7, 380)])
    for r in batch[380:]:
        s.add_steps([r])
    return s


def oracle(rows: Sequence[Any], layer: int, limits: LayerLimits) -> tuple[Any, Any, int | None]:
    """One layer's merged cell worked out from each recording on its own: the worst state, and the
    recording most in it (a non-finite norm, else the largest; the smallest; the most zeros)."""
    cells = [(r.norm[layer], r.zero_frac[layer]) for r in rows if r.norm[layer] is not None]
    judged = [(cell_state(LAYERS[layer], n, z, limits), n, z) for n, z in cells]
    if not judged:
        return None, None, None
    worst = max(s for s, _, _ in judged if s is not None)
    mine = [(n, z) for s, n, z in judged if s == worst]
    if worst == OK:
        return (
            10 ** (sum(math.log10(n) for n, _ in mine) / len(mine)),
            sum(z for _, z in mine) / len(mine),
            OK,
        )
    if worst == EXPLODING:
        bad = [c for c in mine if not math.isfinite(c[0])]
        norm, zf = bad[0] if bad else max(mine, key=lambda c: (c[0], c[1]))
        return ("nan" if math.isnan(norm) else "inf") if not math.isfinite(norm) else norm, zf, worst
    if worst == VANISHING:
        norm, zf = min(mine, key=lambda c: (c[0], -c[1]))
        return norm, zf, worst
    norm, zf = max(mine, key=lambda c: (c[1], c[0]))
    return norm, zf, DEAD


def same_maps(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["layers"] == b["layers"] and (a["total"], a["bucket"]) == (b["total"], b["bucket"])
    assert len(a["columns"]) == len(b["columns"])
    for ca, cb in zip(a["columns"], b["columns"], strict=True):
        assert (ca["first"], ca["last"], ca["n"], ca["state"]) == (
            cb["first"],
            cb["last"],
            cb["n"],
            cb["state"],
        )
        # Means are sums added in another order: equal to rounding. Flagged cells are the same recording.
        assert ca["norm"] == [pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for v in cb["norm"]]
        assert ca["zero_frac"] == [pytest.approx(v, rel=1e-12, abs=1e-15) for v in cb["zero_frac"]]


ZOOMS = [(None, None), (0, 19_950), (3_000, 15_010), (6_000, 7_000), (123, 18_777)]


@pytest.mark.parametrize("points", [1, 3, 7, 16, 40, 100, 399])
@pytest.mark.parametrize("limits", [heatmap.DEFAULT_LIMITS, STRICT])
def test_columns_from_levels_are_the_columns_of_their_recordings(
    store: RunStore, points: int, limits: LayerLimits
) -> None:
    for lo, hi in ZOOMS:
        levels = heatmap.render(store.flow_map(lo, hi, points), limits)
        raw = heatmap.render(store.flow_map(lo, hi, points, levels=False), limits)
        same_maps(levels, raw)
        assert 0 < len(levels["columns"]) <= points
        for col in levels["columns"]:
            rows = store.gradflow(col["first"], col["last"])
            assert (
                len(rows) == col["n"]
                and (lo is None or rows[0].step >= lo)
                and (hi is None or rows[-1].step <= hi)
            )
            for i in range(len(LAYERS)):
                norm, zf, state = oracle(rows, i, limits)
                assert col["state"][i] == state, (lo, hi, col["first"], col["last"], LAYERS[i])
                assert col["norm"][i] == (pytest.approx(norm, rel=1e-9) if isinstance(norm, float) else norm)
                assert col["zero_frac"][i] == pytest.approx(zf, rel=1e-9, abs=1e-12)


def test_the_spike_and_the_nan_stay_visible_at_every_zoom(store: RunStore) -> None:
    for points in (1, 2, 5, 40, 399, 2000):
        for lo, hi in ZOOMS:
            hm = heatmap.render(store.flow_map(lo, hi, points))
            for step, layer, norm in ((SPIKE, 2, 1e4), (NAN_AT, 4, "nan")):
                if (lo or 0) <= step <= (hi if hi is not None else 10**9):
                    [col] = [c for c in hm["columns"] if c["first"] <= step <= c["last"]]
                    assert (col["state"][layer], col["norm"][layer]) == (EXPLODING, norm), (points, lo, hi)
    # The whole run in a few columns of 6,144 steps: layers.0 fades below 1e-3 past step ~13,500.
    cols = heatmap.render(store.flow_map(points=4))["columns"]
    assert [c["state"][1] for c in cols] == [OK, OK, VANISHING, VANISHING]
    assert all(c["state"][0] == OK for c in cols)  # sparse embeddings are not dead


def test_a_long_map_reads_the_levels_not_the_recordings(store: RunStore) -> None:
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    try:
        flow = store.flow_map(points=16)  # columns of 1,536 steps: three buckets of 512
    finally:
        store._db.set_trace_callback(None)
    assert flow.total == 400 and 2 * 16 // 3 <= len(flow.columns) <= 16 and flow.bucket > 1
    assert not any("FROM gradflow WHERE rank=? AND step BETWEEN" in q and "MIN(step)" not in q for q in seen)
    assert any("FROM gradflow_levels" in q for q in seen)


def level_rows(s: RunStore) -> list[tuple[Any, ...]]:
    return s._db.execute("SELECT * FROM gradflow_levels ORDER BY rank, level, bucket").fetchall()


def test_levels_kept_live_equal_levels_built_at_once(store: RunStore, tmp_path: Path) -> None:
    once = RunStore(tmp_path / "once.db")
    once.add_steps(records(400))
    rows = level_rows(once)
    assert rows and {r[1] for r in rows} == set(FLOW_LEVELS)
    assert sum(r[5] for r in rows if r[1] == FLOW_LEVELS[0]) == 400
    # Fed a few recordings at a time, then one by one, a level's newest bucket waits for the finest one
    # to close (so the maps below read it from the finest); every other bucket is the same.
    newest = {level: 19_950 // level for level in FLOW_LEVELS}
    live = level_rows(store)
    assert [r[:6] for r in live if r[2] < newest[r[1]]] == [r[:6] for r in rows if r[2] < newest[r[1]]]
    assert {r[:6] for r in live if r[2] == newest[r[1]]} != {r[:6] for r in rows if r[2] == newest[r[1]]}
    for points in (5, 16, 50):
        same_maps(heatmap.render(store.flow_map(points=points)), heatmap.render(once.flow_map(points=points)))


def test_a_restart_replaces_the_recordings_in_the_levels(tmp_path: Path) -> None:
    s = RunStore(tmp_path / "run.db")
    s.add_steps(records(400))
    assert heatmap.render(s.flow_map(points=4))["columns"][1]["state"][2] == EXPLODING
    # A restart from step 6,000 records 6,000..6,950 again, without the spike, then skips 7,000 unrecorded.
    redo = [r for r in records(400, attempt=1) if 6_000 <= r.step < 7_000]
    s.add_steps([StepRecord(step=r.step, ts=r.ts, attempt=1, loss=1.0, extra={"gradflow": {
        **r.extra["gradflow"], "norm": [1.0] * len(LAYERS)}}) for r in redo])  # fmt: skip
    s.add_steps([StepRecord(step=7_000, ts=1.0, attempt=1, loss=1.0)])
    fresh = heatmap.render(s.flow_map(points=4))
    assert fresh["columns"][1]["state"][2] == OK and fresh["total"] == 399
    same_maps(fresh, heatmap.render(s.flow_map(points=4, levels=False)))


def test_rebuild_from_the_streams_rebuilds_the_levels(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    with JsonlWriter(run.telemetry(0)) as w:
        for r in records(300):
            w.write(r)
    store = open_store(run)
    before = level_rows(store)
    assert before and store.get_meta("gradflow_levels") == "1"
    store._db.execute("DELETE FROM gradflow_levels WHERE level > ?", (FLOW_LEVELS[2],))
    store.rebuild(run)
    assert level_rows(store) == before
    store.close()
    run.db.unlink()  # the index lost: the next opener builds it, levels and all, from the streams
    again = open_store(run)
    assert level_rows(again) == before
    same_maps(
        heatmap.render(again.flow_map(points=9)), heatmap.render(again.flow_map(points=9, levels=False))
    )


def test_an_index_written_before_the_levels(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    s = RunStore(db)
    s.add_steps(records(300))
    expected = heatmap.render(s.flow_map(points=20))
    levels = level_rows(s)
    s.close()
    with sqlite3.connect(db) as old:  # what an older steadytune wrote: no table, no mark
        old.execute("DROP TABLE gradflow_levels")
        old.execute("DELETE FROM meta WHERE key='gradflow_levels'")
    # Read-only (a run folder the dashboard may not write): answered from the recordings.
    ro = RunStore(db, readonly=True)
    same_maps(heatmap.render(ro.flow_map(points=20)), expected)
    ro.close()
    # Opened for writing: the levels are built once, and answer from then on.
    rw = RunStore(db)
    assert rw.get_meta("gradflow_levels") == "1" and level_rows(rw) == levels
    same_maps(heatmap.render(rw.flow_map(points=20)), expected)


def test_a_live_run_with_gaps_and_a_new_writer_midway(tmp_path: Path) -> None:
    rng = random.Random(3)
    steps, step = [], 0
    for _ in range(300):
        step += rng.choice([50, 50, 50, 300, 2_000, 9_000])  # pauses, a skipped window, a long gap
        steps.append(step)
    recs = [StepRecord(step=s, ts=float(s), loss=1.0, extra={"gradflow": recording(s, rng)}) for s in steps]
    first = RunStore(tmp_path / "run.db")
    for r in recs[:150]:
        first.add_steps([r])
    first.close()
    second = RunStore(tmp_path / "run.db")  # the supervisor started again: a writer that knows no front
    for r in recs[150:]:
        second.add_steps([r])
    for points in (3, 17, 60):
        for lo, hi in ((None, None), (steps[40], steps[260]), (steps[100] + 1, None)):
            levels = heatmap.render(second.flow_map(lo, hi, points))
            same_maps(levels, heatmap.render(second.flow_map(lo, hi, points, levels=False)))
            assert sum(c["n"] for c in levels["columns"]) == levels["total"]
