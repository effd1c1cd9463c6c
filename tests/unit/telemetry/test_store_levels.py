"""The coarse summary levels: a chart of a 1M-step run (or a day of samples) reads ~2 summary rows
per bucket, and keeps every spike (min and max per bucket at every level)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from steadytune.records import GpuSample, StepRecord, SystemSample
from steadytune.rundir import RunDir
from steadytune.telemetry.store import RunStore
from steadytune.telemetry.store.schema import COARSE_LEVELS, SAMPLE_LEVELS

STEPS = 1_000_000
EVERY = 40  # a step logged every 40: 25,000 rows span the million steps, and every level fills
SPIKE, DIP = 700_040, 312_480  # one logged step each, inside buckets at every level


def _loss(step: int, rng: random.Random) -> float:
    if step == SPIKE:
        return 40.0
    if step == DIP:
        return -5.0
    return 0.6 + 1.8 / (1 + step / 20_000) + rng.gauss(0, 0.02)


def _run(path: Path) -> RunStore:
    store = RunStore(path)
    rng = random.Random(5)
    logged = range(0, STEPS, EVERY)
    for lo in range(0, len(logged), 5_000):  # in batches, as a supervisor writes them
        store.add_steps(
            [StepRecord(step=s, ts=float(s), loss=_loss(s, rng)) for s in logged[lo : lo + 5_000]]
        )
    return store


def _levels_from_raw(path: Path) -> dict[int, list[tuple]]:
    """Every coarse level as stored, and as built from the raw steps in one GROUP BY each."""
    with sqlite3.connect(path) as db:
        stored = {
            level: db.execute(
                "SELECT bucket, first, last, n, loss_min, loss_max FROM steps_coarse "
                "WHERE level=? AND rank=0 ORDER BY bucket",
                (level,),
            ).fetchall()
            for level in COARSE_LEVELS
        }
        raw = {
            level: db.execute(
                "SELECT step / ?, MIN(step), MAX(step), COUNT(*), MIN(loss), MAX(loss) FROM steps "
                "WHERE rank=0 GROUP BY step / ? ORDER BY 1",
                (level, level),
            ).fetchall()
            for level in COARSE_LEVELS
        }
    assert stored == raw
    return stored


def _extremes(store: RunStore, points: int, lo: float | None = None, hi: float | None = None) -> tuple:
    s = store.step_series(("loss",), points=points, lo=lo, hi=hi)
    assert 1 < len(s.rows) <= points
    return min(r[3] for r in s.rows), max(r[4] for r in s.rows), sum(r[2] for r in s.rows), s


def test_a_one_step_spike_and_dip_survive_every_level(tmp_path: Path) -> None:
    store = _run(tmp_path / "run.db")
    levels = _levels_from_raw(tmp_path / "run.db")  # written as the finer level filled
    assert [len(levels[v]) for v in (128, 65_536)] == [STEPS // 128 + 1, STEPS // 65_536 + 1]

    # 1,500 buckets of ~667 steps read the 512-step level; 100 of 10,000 the 8,192-step one.
    for points in (1500, 100):
        low, high, n, s = _extremes(store, points)
        assert (low, high, n) == (-5.0, 40.0, STEPS // EVERY)
        spike = next(r for r in s.rows if r[0] <= SPIKE <= r[1])
        assert spike[0] < SPIKE < spike[1] and spike[4] == 40.0  # one step among many in its bucket
    # Zoomed in: the 64-step buckets (100 points of 100 steps) and the raw steps (1,500 of ~7).
    for points in (100, 1500):
        low, high, _, _ = _extremes(store, points, lo=SPIKE - 5_000, hi=SPIKE + 5_000)
        assert high == 40.0 and low > 0
        low, high, _, _ = _extremes(store, points, lo=DIP - 5_000, hi=DIP + 5_000)
        assert low == -5.0 and high < 40.0


def test_a_later_attempt_redraws_every_level(tmp_path: Path) -> None:
    store = _run(tmp_path / "run.db")
    store.add_steps([StepRecord(step=SPIKE, ts=float(SPIKE), attempt=1, loss=1.0)])  # the spike, redone
    _levels_from_raw(tmp_path / "run.db")
    for points in (1500, 100):
        assert _extremes(store, points)[1] < 40.0


def test_an_index_written_before_the_levels_is_summarized_once(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    store = _run(db)
    before = [store.step_series(("loss",), points=p).rows for p in (1500, 100)]
    store.close()
    with sqlite3.connect(db) as old:  # as an older steadytune left it: the 64-step buckets only
        old.execute("DELETE FROM steps_coarse")
        old.execute("DELETE FROM meta WHERE key='coarse_levels'")
    readonly = RunStore(db, readonly=True)  # cannot build them: charts from the 64-step buckets
    assert readonly.step_series(("loss",), points=100).total == STEPS // EVERY
    assert max(r[4] for r in readonly.step_series(("loss",), points=1500).rows) == 40.0
    readonly.close()
    reopened = RunStore(db)
    _levels_from_raw(db)
    assert [reopened.step_series(("loss",), points=p).rows for p in (1500, 100)] == before
    assert reopened.get_meta("coarse_levels") == "1"


def test_the_samples_have_levels_too_and_keep_a_hot_sample(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    store = RunStore(db)
    samples = [
        SystemSample(ts=1e9 + 2 * i, cpu_ratio=0.01 if i == 31_313 else 0.5,
                     gpus=(GpuSample(index=1, temperature_c=99.0 if i == 13_131 else 60.0),))
        for i in range(40_000)
    ]  # fmt: skip
    for lo in range(0, 40_000, 2_000):  # ~22 hours at one sample per 2 s, in the sampler's batches
        store.add_system(samples[lo : lo + 2_000])
    with sqlite3.connect(db) as raw:
        for level in SAMPLE_LEVELS:
            stored = raw.execute(
                "SELECT bucket, first, last, n, temperature_c_max FROM gpu_coarse WHERE level=? AND idx=1 "
                "ORDER BY bucket",
                (level,),
            ).fetchall()
            built = raw.execute(
                "SELECT CAST(ts / ? AS INTEGER) b, MIN(ts), MAX(ts), COUNT(*), MAX(temperature_c) FROM gpu "
                "WHERE idx=1 GROUP BY b ORDER BY b",
                (level,),
            ).fetchall()
            assert stored == built
    store.rebuild(RunDir(tmp_path / "empty").create())  # no JSONL: an empty index, no level left over
    with sqlite3.connect(db) as raw:
        assert [
            raw.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("system_coarse", "gpu_coarse")
        ] == [0, 0]
    store.add_system(samples)
    for points in (100, 1500):  # buckets of ~800 s (the 512 s level) and ~53 s (the 32 s level)
        gpu = store.gpu_series(1, ("temperature_c",), points=points)
        system = store.system_series(("cpu_ratio",), points=points)
        assert max(r[4] for r in gpu.rows) == 99.0 and min(r[3] for r in system.rows) == 0.01
        assert sum(r[2] for r in gpu.rows) == 40_000 and len(gpu.rows) <= points


def test_a_live_run_written_a_step_at_a_time_charts_its_newest_steps(tmp_path: Path) -> None:
    """A supervisor writes a step (and a sample) at a time; the levels above the newest finest
    bucket wait for the next bucket, and a chart still draws every step up to the last one,
    as an index written in one batch draws them."""
    rng = random.Random(9)
    steps = [(s, 2.0 + rng.gauss(0, 0.05)) for s in range(0, 60_000, 3)]
    spike_at = steps[-2][0]  # in the newest finest bucket, which no level above holds yet
    steps[-2] = (spike_at, 50.0)
    live, batch = RunStore(tmp_path / "live.db"), RunStore(tmp_path / "batch.db")
    for s, loss in steps:
        live.add_steps([StepRecord(step=s, ts=float(s), loss=loss)])
    batch.add_steps([StepRecord(step=s, ts=float(s), loss=loss) for s, loss in steps])
    for points in (200, 1500):  # buckets of ~300 and ~40 steps: a coarse level, then the finest
        a = live.step_series(["loss"], points=points)
        b = batch.step_series(["loss"], points=points)
        assert a.rows == b.rows
        assert a.rows[-1][1] == steps[-1][0] and a.rows[-1][4] == 50.0  # the spike, at the end
    # Zoomed onto an older stretch, whose levels are complete, both agree too.
    assert (
        live.step_series(["loss"], points=50, lo=10_000, hi=40_000).rows
        == batch.step_series(["loss"], points=50, lo=10_000, hi=40_000).rows
    )


def test_a_supervisor_restarted_mid_bucket_brings_the_levels_above_it_up_to_date(tmp_path: Path) -> None:
    """The levels above a live run's newest finest bucket wait for the next bucket to open; a
    supervisor that stops there and a new one that goes on from the next bucket must still carry
    that bucket up, or a spike in it would be missing from every coarse chart for good."""
    rng = random.Random(3)
    stop, resume = 20_478, 20_736  # the first in finest bucket 319 (of 64 steps), the second in 324
    steps = [(s, 2.0 + rng.gauss(0, 0.05)) for s in range(0, 40_000, 2)]
    steps = [(s, 50.0 if s == stop - 4 else loss) for s, loss in steps]  # a spike the first one wrote
    db = tmp_path / "live.db"
    first = RunStore(db)
    for s, loss in steps:
        if s <= stop:
            first.add_steps([StepRecord(step=s, ts=float(s), loss=loss)])
    first.close()
    second = RunStore(db)  # the run resumed by a new supervisor, further on
    for s, loss in steps:
        if s >= resume:
            second.add_steps([StepRecord(step=s, ts=float(s), loss=loss)])
    kept = [(s, loss) for s, loss in steps if s <= stop or s >= resume]
    batch = RunStore(tmp_path / "batch.db")
    batch.add_steps([StepRecord(step=s, ts=float(s), loss=loss) for s, loss in kept])
    for points in (20, 100):  # buckets of the coarse levels only
        a, b = second.step_series(["loss"], points=points), batch.step_series(["loss"], points=points)
        assert a.rows == b.rows and max(r[4] for r in a.rows) == 50.0
