"""The run store: upserts, latest attempt wins, rollups, JSONL rebuild and incremental sync."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from steadytune.records import (
    Event,
    GpuSample,
    Heartbeat,
    PlanRevision,
    StepRecord,
    SystemSample,
    WorkerExit,
    to_json,
)
from steadytune.rundir import RunDir
from steadytune.telemetry.events import EventLog, read_events
from steadytune.telemetry.store import ROLLUP, RunStore, open_store
from steadytune.telemetry.stream import JsonlWriter


def steps(
    n: int, attempt: int = 0, rank: int = 0, start: int = 0, loss=lambda s: 1.0 / (1 + s)
) -> list[StepRecord]:
    return [
        StepRecord(
            step=s, ts=100.0 + s, rank=rank, attempt=attempt, loss=loss(s), tokens=100, step_time_s=0.5
        )
        for s in range(start, start + n)
    ]


def test_latest_attempt_wins_per_rank(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    store.add_steps(steps(10, attempt=0))
    store.add_steps(steps(10, attempt=0, rank=1, loss=lambda s: 9.0))
    store.add_steps(steps(3, attempt=1, start=5, loss=lambda s: 42.0))  # restart from step 5
    store.add_steps(steps(2, attempt=0, start=5, loss=lambda s: -1.0))  # a late line of the old attempt
    s = store.step_series(("loss",), points=100)
    by_step = {r[0]: r[5] for r in s.rows}
    assert [by_step[i] for i in (4, 5, 6, 7, 8)] == [
        pytest.approx(0.2),
        42.0,
        42.0,
        42.0,
        pytest.approx(1 / 9),
    ]
    assert store.step_series(("loss",), rank=1).rows[0][5] == 9.0
    assert store.latest_step()["attempt"] == 0 and store.latest_step()["step"] == 9


def test_steps_since_version_reports_new_and_replaced_rows(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    store.add_steps(steps(5))
    v = store.version
    assert store.steps_since(v) == []
    store.add_steps(steps(1, attempt=1, start=2, loss=lambda s: 7.0) + steps(1, start=5))
    changed = store.steps_since(v)
    assert [(r["step"], r["attempt"]) for r in changed] == [(2, 1), (5, 0)]
    # A second process writing the same db continues after the newest stamp.
    other = RunStore(tmp_path / "run.db")
    other.add_steps(steps(1, start=6))
    assert [r["step"] for r in store.steps_since(max(r["version"] for r in changed))] == [6]


def test_nan_is_flagged_and_counted(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    store.add_steps([*steps(3), StepRecord(step=3, ts=1.0, loss=math.nan, grad_norm=math.inf)])
    latest = store.latest_values()
    assert latest["nonfinite_latest"] is True and latest["nonfinite_steps"] == 1
    assert latest["loss"] == pytest.approx(1 / 3)  # last finite value, for the chart
    assert latest["tokens_total"] == 300


def test_sparse_eval_loss_found_without_scan(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    recs = steps(1000)
    recs[300] = StepRecord(step=300, ts=1.0, loss=0.5, eval_loss=0.77)
    store.add_steps(recs)
    assert store.latest_values()["eval_loss"] == 0.77


def test_rollup_series_matches_raw_min_max(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    n = ROLLUP * 100
    loss = lambda s: 10.0 if s == 777 else math.sin(s / 50)  # noqa: E731 - one spike inside a bucket
    store.add_steps(steps(n, loss=loss))
    s = store.step_series(("loss",), points=50)
    assert len(s.rows) == 50 and s.total == n
    assert max(r[4] for r in s.rows) == 10.0  # the spike survives downsampling
    assert min(r[3] for r in s.rows) == pytest.approx(min(math.sin(i / 50) for i in range(n)))
    assert sum(r[2] for r in s.rows) == n
    zoom = store.step_series(("loss",), points=10, lo=700, hi=800)
    assert zoom.rows[0][0] >= 700 and zoom.rows[-1][1] <= 800 and max(r[4] for r in zoom.rows) == 10.0


def test_system_gpu_events_plans_meta(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    gpu = GpuSample(
        index=0, name="A", util_ratio=0.5, mem_used_bytes=1, mem_total_bytes=4, temperature_c=60, power_w=200
    )
    store.add_system([SystemSample(ts=float(t), cpu_ratio=0.1 * t, gpus=(gpu,)) for t in range(5)])
    assert store.latest_system()["gpus"][0]["temperature_c"] == 60
    assert store.gpu_indices() == [0]
    assert len(store.system_series(("cpu_ratio",)).rows) == 5
    store.add_events([Event(ts=1, kind="anomaly", name="loss_spike", severity="warning", seq=0),
                      Event(ts=2, kind="anomaly", name="loss_spike", severity="warning", seq=1),
                      Event(ts=3, kind="action", name="rollback", seq=2)])  # fmt: skip
    assert store.event_counts("anomaly") == [("loss_spike", "warning", 2)]
    assert [e.seq for e in store.events(after_seq=0)] == [1, 2]
    assert [e.seq for e in store.events(limit=1, newest=True)] == [2]
    store.add_plans(
        [PlanRevision(revision=0, ts=1, reason="initial"), PlanRevision(revision=1, ts=2, reason="oom")]
    )
    assert [p.reason for p in store.plans()] == ["initial", "oom"]
    store.set_meta("last_event_hash", "abc")
    assert store.get_meta("last_event_hash") == "abc" and store.get_meta("nope", "d") == "d"
    with pytest.raises(ValueError, match="unknown step metrics"):
        store.step_series(("bogus",))


def _write_run(root: Path) -> RunDir:
    run = RunDir(root).create()
    with JsonlWriter(run.telemetry(0)) as w:
        for r in steps(50):
            w.write(r)
    with JsonlWriter(run.system) as w:
        w.write(SystemSample(ts=1.0, cpu_ratio=0.5))
    with JsonlWriter(run.plan) as w:
        w.write(PlanRevision(revision=0, ts=1.0, reason="initial"))
    log = EventLog(run.events, run_id=run.run_id)
    log.emit("anomaly", "loss_spike", severity="warning", step=3)
    return run


def test_rebuild_from_jsonl_and_incremental_sync(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "r1")
    store = open_store(run)  # no run.db yet: built from the JSONL
    assert store.step_count() == 50 and store.last_event_seq() == 0 and len(store.plans()) == 1
    # A torn last line is left for later, then picked up once completed.
    with open(run.telemetry(0), "a") as f:
        line = to_json(StepRecord(step=50, ts=1.0, loss=0.1))
        f.write(line[:10])
    assert store.sync(run) == 0
    with open(run.telemetry(0), "a") as f:
        f.write(line[10:] + "\n")
    assert store.sync(run) == 1 and store.step_count() == 51
    run.db.unlink()
    for p in tmp_path.glob("r1/run.db-*"):
        p.unlink()
    rebuilt = RunStore(run.db)
    assert rebuilt.rebuild(run) == 51 + 1 + 1 + 1
    assert rebuilt.step_count() == 51


def test_sync_rereads_a_replaced_file(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "r2")
    store = open_store(run)
    run.telemetry(0).write_text(to_json(StepRecord(step=0, ts=1.0, loss=5.0)) + "\n")
    store.sync(run)
    assert store.step_series(("loss",)).rows[0][5] == 5.0


def test_adopt_continues_after_what_another_writer_indexed(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "r3")
    store = RunStore(run.db)  # the supervisor's way: add_* with records it tailed itself
    store.add_steps(steps(50))
    store.add_events(read_events(run.events))
    assert store.adopt(run) == ["telemetry/rank-0.jsonl", "events.jsonl"]
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(StepRecord(step=50, ts=1.0, loss=0.25))
    # Only the new line is read for the adopted file; the unadopted ones are read in full.
    assert store.sync(run) == 1 + 1 + 1
    assert store.step_count() == 51


def test_adopt_looks_past_a_finished_workers_last_words(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "r4")
    store = RunStore(run.db)
    store.add_steps(steps(50))
    with JsonlWriter(run.telemetry(0)) as w:  # what a worker writes after its last step
        w.write(Heartbeat(ts=2.0, step=49, phase="finish"))
        w.write(WorkerExit(ts=3.0, step=49, status="completed"))
    assert "telemetry/rank-0.jsonl" in store.adopt(run)
    before = store.version
    store.sync(run)  # the two lines after the last step, not the 50 steps again
    assert store.steps_since(before) == [] and store.step_count() == 50


def flow(layers: list[str], norm: list, zero: list | None = None) -> dict:
    return {"layers": layers, "norm": norm, "zero_frac": zero or [0.0] * len(layers),
            "hist": [[0, 1]] * len(layers), "bins": [-1.0, 0.0, 1.0]}  # fmt: skip


def flow_step(step: int, norm: list, attempt: int = 0, zero: list | None = None) -> StepRecord:
    return StepRecord(
        step=step,
        ts=100.0 + step,
        attempt=attempt,
        loss=1.0,
        extra={"gradflow": flow(["embeddings", "layers.0", "lm_head"], norm, zero)},
    )


def test_gradflow_kept_per_step_with_nonfinite_norms(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    v0 = store.version
    store.add_steps([*steps(3), flow_step(3, [0.5, 1e-5, math.inf]), StepRecord(step=4, ts=1.0)])
    [row] = store.gradflow()
    assert (row.step, row.attempt, row.layers) == (3, 0, ("embeddings", "layers.0", "lm_head"))
    assert row.norm[:2] == (0.5, 1e-5) and row.norm[2] == math.inf and row.hist is None
    # The row carries its step's version, so a live reader gets both from one stamp.
    step3 = next(r for r in store.steps_since(v0) if r["step"] == 3)
    assert [r.version for r in store.gradflow_since(v0)] == [step3["version"]]
    assert store.gradflow_since(step3["version"]) == []
    full = store.gradflow(hist=True)[0]
    assert full.hist == ((0, 1),) * 3 and full.bins == (-1.0, 0.0, 1.0)
    assert store.gradflow(lo=4) == [] and len(store.gradflow(lo=2.5, hi=3.2)) == 1


def test_gradflow_round_trip_through_jsonl_and_rebuild(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(flow_step(1, [math.nan, 2.0, 3.0], zero=[0.1, 0.95, 0.0]))  # NaN travels as "nan"
        w.write(
            StepRecord(step=2, ts=1.0, extra={"gradflow": {"layers": ["a"], "norm": [1.0, 2.0]}})
        )  # malformed
        w.write(StepRecord(step=3, ts=1.0, extra={"other": 1}))
    store = open_store(run)
    assert store.step_count() == 3  # a malformed gradflow extra never costs the step itself
    [row] = store.gradflow()
    assert math.isnan(row.norm[0]) and row.norm[1:] == (2.0, 3.0) and row.zero_frac == (0.1, 0.95, 0.0)
    assert store.rebuild(run) == 3 and len(store.gradflow()) == 1


def test_gradflow_latest_attempt_wins(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    store.add_steps([flow_step(50, [1.0, 1.0, 1.0]), flow_step(100, [9.0, 9.0, 9.0])])
    store.add_steps([flow_step(50, [2.0, 2.0, 2.0], attempt=1)])  # restart from 40: 50 recorded again
    store.add_steps([flow_step(50, [7.0, 7.0, 7.0], attempt=0)])  # a late line of the old attempt
    store.add_steps([StepRecord(step=100, ts=1.0, attempt=1)])  # redone without a recording (skipped update)
    assert [(r.step, r.attempt, r.norm[0]) for r in store.gradflow()] == [(50, 1, 2.0)]


def test_gradflow_readonly_index_without_the_table(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as c:  # an index from before gradient flow was kept
        c.execute("CREATE TABLE steps (rank INTEGER, step INTEGER, version INTEGER)")
        c.execute("CREATE TABLE system (ts REAL, version INTEGER)")
    store = RunStore(db, readonly=True)
    assert store.gradflow() == [] and store.gradflow_since(0) == []


def test_eval_record_of_a_logged_step_keeps_its_training_metrics(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    store.add_steps(steps(3, start=74))
    v = store.version
    # The worker logs step 75, then (after evaluating) a record with only the eval loss for the same step.
    store.add_steps([StepRecord(step=75, ts=500.0, eval_loss=2.5, extra={"eval": True})])
    by_step = {r[0]: r for r in store.step_series(("loss", "eval_loss"), points=100).rows}
    assert by_step[75][5] == pytest.approx(1 / 76) and by_step[75][8] == 2.5
    [changed] = store.steps_since(v)  # re-sent to live pages, now with both
    assert changed["loss"] == pytest.approx(1 / 76) and changed["eval_loss"] == 2.5 and changed["ts"] == 500.0
    assert store.latest_values()["tokens_total"] == 300
    # A later attempt still replaces the row whole.
    store.add_steps([StepRecord(step=75, ts=600.0, attempt=1, eval_loss=9.0)])
    row = store.steps_since(changed["version"])[0]
    assert (row["attempt"], row["loss"], row["eval_loss"]) == (1, None, 9.0)


def test_an_index_made_before_the_sample_summaries_is_summarized_when_opened(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    hot = lambda i: 90.0 if i == 4321 else 50.0  # noqa: E731 - one hot sample among 10,000
    store.add_system([
        SystemSample(ts=1.0 + 2 * i, cpu_ratio=0.5, ram_used_bytes=1, ram_total_bytes=2,
                     gpus=(GpuSample(index=1, name="g", temperature_c=hot(i)),))
        for i in range(10_000)
    ])  # fmt: skip
    summarized = store.gpu_series(1, ("temperature_c",), points=50)
    assert summarized.total == 10_000 and max(r[4] for r in summarized.rows) == 90.0
    raw = [r[:3] for r in store._db.execute("SELECT * FROM gpu_rollup ORDER BY bucket").fetchall()]
    with store._db:  # as an index written before the summaries existed
        store._db.execute("DELETE FROM system_rollup")
        store._db.execute("DELETE FROM gpu_rollup")
        store._db.execute("DELETE FROM meta WHERE key='sample_rollup'")
    store.close()
    reader = RunStore(tmp_path / "run.db", readonly=True)  # cannot summarize: reads the samples
    unsummarized = reader.gpu_series(1, ("temperature_c",), points=50)
    assert unsummarized.total == 10_000 and max(r[4] for r in unsummarized.rows) == 90.0
    reader.close()
    again = RunStore(tmp_path / "run.db")
    assert [r[:3] for r in again._db.execute("SELECT * FROM gpu_rollup ORDER BY bucket").fetchall()] == raw
    assert again.gpu_series(1, ("temperature_c",), points=50).rows == summarized.rows
