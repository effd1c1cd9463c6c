"""A dashboard new to a runs folder answers at once and reads the runs in the background, newest first.

A request never reads a finished run the dashboard has not read (nor stored): the runs page shows
what its ``status.json`` says, ``/metrics`` leaves its series out and counts it in
``steadytune_runs_pending_index``, the goodput panel counts it as pending. Once read, its series are
whole, and a run read before (live then) keeps its series when its supervisor goes.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from pathlib import Path

from tests.waiting import ANSWER_S, wait_for

from steadytune.records import Event, Heartbeat, StepRecord
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.api import runs_list
from steadytune.web.goodput import runs_payload
from steadytune.web.metrics import render_metrics
from steadytune.web.runs import RunsIndex
from steadytune.web.server import start_dashboard
from steadytune.web.warm import BackgroundReader, read, ready

NOW = 1_800_000_000.0
STEPS = 30


def _run(runs: Path, run_id: str, ended: float, state: str = "completed") -> RunDir:
    """A run as a supervisor leaves it, with no index: only its files (one anomaly raised)."""
    run = RunDir(runs / run_id).create()
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(Heartbeat(ts=ended - 100.0, phase="train"))
        for s in range(STEPS):
            w.write(StepRecord(step=s, ts=ended - 99.0 + s, loss=2.0 - s / 100, step_time_s=1.0, tokens=100))
    EventLog(run.events, run_id=run_id).append(
        Event(ts=ended - 80.0, kind="anomaly", name="loss_spike", severity="warn", step=5, message="spike")
    )
    status = {"run_id": run_id, "state": state, "step": STEPS - 1, "max_steps": STEPS, "loss": 1.71,
              "updated_ts": ended, "started_ts": ended - 100.0}  # fmt: skip
    atomic_write_text(run.status, json.dumps(status))
    return run


def _series(text: str, run_id: str) -> list[str]:
    """The run's samples of a scrape, but its checkpoint's age (it moves with the clock)."""
    return [ln for ln in text.splitlines() if f'run="{run_id}"' in ln and "checkpoint_age" not in ln]


def _pending(text: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith("steadytune_runs_pending_index "))
    return float(line.split()[1])


def test_a_request_answers_from_status_alone_and_the_background_reader_makes_it_whole(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = _run(runs, "done", NOW - 60.0)
    shutil.copytree(runs, tmp_path / "copy")  # the same run, for a dashboard that reads as it answers
    index = RunsIndex(runs, clock=lambda: NOW, cache_dir=tmp_path / "cache", background=True)

    text = render_metrics(index, lambda: NOW)
    assert _series(text, "done") == []  # none of its series: not half of them
    assert 'steadytune_runs{state="completed"} 1.0' in text and _pending(text) == 1.0
    (row,) = runs_list(index)
    assert row["indexing"] is True and row["step"] == STEPS - 1 and row["loss"] == 1.71
    assert row["anomalies"] is None  # not known before the run is read, rather than a wrong 0
    assert runs_payload(index) == ([], 1)
    assert not run.db.exists()  # nothing of the run was read: its index was not even built

    entry = index.newest_wanted()
    assert entry is not None and entry.run_id == "done"
    read(entry, index)
    index.read(entry)

    plain = RunsIndex(tmp_path / "copy", clock=lambda: NOW, cache_dir=tmp_path / "cache2")
    plain.refresh_all()  # as a dashboard's indexer does before the answers below
    text = render_metrics(index, lambda: NOW)
    assert _series(text, "done") == _series(render_metrics(plain, lambda: NOW), "done") != []
    assert _pending(text) == 0.0
    assert runs_list(index) == runs_list(plain) and runs_list(index)[0]["anomalies"] == 1
    assert runs_payload(index) == (runs_payload(plain)[0], 0)
    index.close()
    plain.close()


def test_a_run_read_during_a_scrape_is_still_counted_pending_by_the_scrape_that_left_it_out(
    tmp_path: Path,
) -> None:
    """The background reader may finish a run while a scrape walks the runs: that scrape left its
    series out, so it must not say that nothing is pending (a scraper would take it as the whole)."""
    runs = tmp_path / "runs"
    _run(runs, "done", NOW - 60.0)
    index = RunsIndex(runs, clock=lambda: NOW, cache_dir=tmp_path / "cache", background=True)
    walk = index.entries

    def entries_then_read():  # the reader finishes "done" once the scrape has passed it
        yield from walk()
        entry = index.newest_wanted()
        assert entry is not None
        read(entry, index)
        index.read(entry)

    index.entries = entries_then_read  # type: ignore[method-assign]
    text = render_metrics(index, lambda: NOW)
    assert _series(text, "done") == [] and _pending(text) == 1.0
    index.entries = walk  # type: ignore[method-assign]
    text = render_metrics(index, lambda: NOW)
    assert _series(text, "done") != [] and _pending(text) == 0.0
    index.close()


def test_the_newest_run_is_read_first(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for i, run_id in enumerate(("a-old", "b-newest", "c-middle")):
        _run(runs, run_id, NOW - (3600.0, 60.0, 600.0)[i])
    index = RunsIndex(runs, clock=lambda: NOW, cache_dir=tmp_path / "cache", background=True)
    for entry in index.entries():
        ready(entry, index)
    order = []
    while (entry := index.newest_wanted()) is not None:
        order.append(entry.run_id)
        read(entry, index)
        index.read(entry)
    assert order == ["b-newest", "c-middle", "a-old"]
    index.close()


def test_a_run_read_while_live_keeps_its_series_once_its_supervisor_is_gone(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _run(runs, "live", NOW - 1.0, state="running")
    clock = [NOW]
    index = RunsIndex(runs, clock=lambda: clock[0], cache_dir=tmp_path / "cache", background=True)
    index.refresh_all()
    shown = _series(render_metrics(index, lambda: clock[0]), "live")
    assert shown != []  # a live run is read as it is asked for
    clock[0] = NOW + 3600.0  # its supervisor stopped writing an hour ago: gone
    text = render_metrics(index, lambda: clock[0])
    assert 'steadytune_runs{state="running"} 1.0' in text
    assert _series(text, "live") != [] and _pending(text) == 0.0  # read again here, not left out
    index.close()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=ANSWER_S) as r:
        return r.read()


def test_over_http_each_finished_runs_series_appear_whole_and_never_change_or_vanish(tmp_path: Path) -> None:
    """What a scraper sees of a new dashboard: the runs come one by one, each with all its series at
    their final values, and none goes away or moves in a later scrape."""
    runs = tmp_path / "runs"
    ids = [f"run-{i:02d}" for i in range(12)]
    for i, run_id in enumerate(ids):
        _run(runs, run_id, time.time() - 60.0 * (i + 1))
    # The reader is held until the first answers are in: a reader that ran ahead (the test's own
    # thread descheduled between two requests) would leave nothing for them to be answered without.
    gate = threading.Semaphore(0)
    handle = start_dashboard(runs, host="127.0.0.1", port=0, read_gate=gate)
    try:
        first = _get(handle.url + "metrics").decode()
        assert _pending(first) == len(ids) and not any(_series(first, run_id) for run_id in ids)
        rows = json.loads(_get(handle.url + "api/runs"))
        assert all(r.get("indexing") for r in rows) and len(rows) == len(ids)
        gate.release(len(ids))  # one permit a run: the reader reads them all, while the scrapes go on
        seen: dict[str, list[str]] = {}

        def scrape() -> bool:
            text = _get(handle.url + "metrics").decode()
            for run_id in ids:
                now = _series(text, run_id)
                if run_id in seen:
                    assert now == seen[run_id], f"{run_id}'s series changed or vanished"
                elif now:
                    seen[run_id] = now
            return _pending(text) == 0.0

        wait_for(scrape, timeout=120, what="every run read", interval=0.02)
        assert sorted(seen) == ids
        assert all(any(ln.startswith("steadytune_tokens_total{") for ln in s) for s in seen.values())
        rows = json.loads(_get(handle.url + "api/runs"))
        assert not any(r.get("indexing") for r in rows) and {r["anomalies"] for r in rows} == {1}
        goodput = json.loads(_get(handle.url + "api/goodput"))
        assert goodput["pending"] == 0 and sorted(r["run"] for r in goodput["runs"]) == ids
    finally:
        handle.stop()


def test_a_run_that_cannot_be_read_is_given_back_to_the_requests(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _run(runs, "good", NOW - 60.0)
    bad = _run(runs, "broken", NOW - 30.0)
    # A folder where the index should be: SQLite cannot open it (a damaged file is rebuilt instead).
    bad.db.mkdir()
    index = RunsIndex(runs, clock=lambda: NOW, cache_dir=tmp_path / "cache", background=True)
    assert all(r.get("indexing") for r in runs_list(index))
    stopping = threading.Event()
    reader = BackgroundReader(index, stopping)  # its child process fails on the run, then this thread
    thread = threading.Thread(target=reader.run, kwargs={"idle_s": 0.05})
    thread.start()
    try:
        wait_for(lambda: index.pending() == 0, timeout=60, what="both runs read or given up")
    finally:
        stopping.set()
        reader.stop()
        thread.join(10)
    rows = {r["run_id"]: r for r in runs_list(index)}
    assert rows["broken"]["state"] == "unreadable"  # read by the request now, and shown broken
    assert rows["good"]["anomalies"] == 1 and "indexing" not in rows["good"]
    assert index.pending() == 0  # not wanted again for ever
    index.close()


def test_a_gated_reader_reads_one_run_per_permit_and_stops_while_held(tmp_path: Path) -> None:
    """The gate a test holds the reading back with: no permit, no run read; each permit, one run,
    the newest first; a dashboard stopped while the reader waits for a permit ends it."""
    runs = tmp_path / "runs"
    for i in range(3):
        _run(runs, f"run-{i}", NOW - 60.0 * (i + 1))
    index = RunsIndex(runs, clock=lambda: NOW, cache_dir=tmp_path / "cache", background=True)
    render_metrics(index, lambda: NOW)  # wants all three
    stopping, gate = threading.Event(), threading.Semaphore(0)
    reader = BackgroundReader(index, stopping, gate=gate)
    thread = threading.Thread(target=reader.run, kwargs={"idle_s": 0.05})
    thread.start()
    try:
        time.sleep(0.5)  # time to read a run, had it a permit
        assert index.pending() == 3
        gate.release()
        wait_for(lambda: index.pending() == 2, timeout=60, what="one run read")
        time.sleep(0.5)
        assert index.pending() == 2  # one permit, one run
        text = render_metrics(index, lambda: NOW)
        assert _series(text, "run-0") and not _series(text, "run-1")  # the newest was the one read
    finally:
        stopping.set()
        thread.join(10)
        alive = thread.is_alive()
        reader.stop()
        index.close()
    assert not alive  # it left its wait for a permit once the dashboard stopped
