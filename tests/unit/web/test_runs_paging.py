"""The runs list a page at a time: every run searched, filtered and sorted, one slice sent.

``select`` is the pure part; the HTTP tests ask a real dashboard for pages of a real runs folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.web.test_server_robustness import Stream, get
from tests.waiting import wait_for

from steadytune.rundir import RunDir, atomic_write_text
from steadytune.web.params import BadParam
from steadytune.web.runlist import RunQuery, parse_query, select
from steadytune.web.server import DashboardHandle, start_dashboard


def _row(run_id: str, state: str = "completed", step: int | None = 10, **more: object) -> dict[str, object]:
    return {"run_id": run_id, "state": state, "step": step, "loss": None, "updated_ts": None, **more}


ROWS = [
    _row("alpha", step=30, updated_ts=3.0),
    _row("beta-1", state="failed", step=None, updated_ts=1.0),
    _row("beta-2", step=5, updated_ts=2.0, indexing=True),
    _row("gamma", state="running", step="garbled"),  # a hand-edited status.json
    _row("BETA-3", step=20, updated_ts=4.0),
]


def test_every_run_is_counted_and_a_page_is_the_slice_of_the_sorted_runs() -> None:
    page = select(ROWS, RunQuery(sort="run_id", offset=1, limit=2))
    assert [r["run_id"] for r in page["runs"]] == ["alpha", "beta-1"]  # "BETA-3" sorts first, by code point
    assert (page["total"], page["matched"], page["pending"]) == (5, 5, 1)
    assert page["states"] == {"completed": 3, "failed": 1, "running": 1}


def test_the_search_ignores_case_and_the_filter_keeps_one_state() -> None:
    found = select(ROWS, RunQuery(text="Beta", limit=10))
    assert [r["run_id"] for r in found["runs"]] == ["BETA-3", "beta-1", "beta-2"]
    assert (found["matched"], found["total"]) == (3, 5)  # the counts of all runs stay
    kept = select(ROWS, RunQuery(text="beta", state="completed", limit=10))
    assert [r["run_id"] for r in kept["runs"]] == ["BETA-3", "beta-2"]
    assert select(ROWS, RunQuery(text="nothing"))["runs"] == []


def test_a_run_without_the_sorted_value_comes_last_in_either_order() -> None:
    up = select(ROWS, RunQuery(sort="step", limit=10))
    down = select(ROWS, RunQuery(sort="step", descending=True, limit=10))
    assert [r["run_id"] for r in up["runs"]] == ["beta-2", "BETA-3", "alpha", "beta-1", "gamma"]
    assert [r["run_id"] for r in down["runs"]] == ["alpha", "BETA-3", "beta-2", "beta-1", "gamma"]
    newest = select(ROWS, RunQuery(sort="updated_ts", descending=True, limit=2))
    assert [r["run_id"] for r in newest["runs"]] == ["BETA-3", "alpha"]


def test_a_wrong_value_is_named_with_what_is_expected() -> None:
    with pytest.raises(BadParam, match="sort='size': sort by one of run_id, state"):
        parse_query({"sort": ["size"]})
    with pytest.raises(BadParam, match="order='up': asc or desc"):
        parse_query({"order": ["up"]})
    with pytest.raises(BadParam, match=r"limit='ten' is not a number"):
        parse_query({"limit": ["ten"]})
    q = parse_query({"limit": ["99999"], "offset": ["-4"], "q": ["  run-1 "]})
    assert (q.limit, q.offset, q.text, q.state) == (1000, 0, "run-1", None)


RUNS = 25


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[DashboardHandle]:
    """``RUNS`` runs with only their ``status.json`` (the one state of a run not read yet)."""
    runs = tmp_path / "runs"
    for i in range(RUNS):
        run = RunDir(runs / f"run-{i:02d}").create()
        state = "failed" if i % 5 == 0 else "completed"
        status = {"run_id": run.run_id, "state": state, "step": 100 + i, "updated_ts": 1_700_000_000.0 + i}
        atomic_write_text(run.status, json.dumps(status))
    handle = start_dashboard(runs, host="127.0.0.1", port=0, poll_s=0.05)
    yield handle
    handle.stop()


def _page(handle: DashboardHandle, query: str) -> dict[str, object]:
    status, body = get(handle, f"/api/runs?{query}")
    assert status == 200, body
    answer = json.loads(body)
    assert isinstance(answer, dict)
    return answer


def test_a_page_over_http_holds_its_slice_and_the_counts_of_every_run(dashboard: DashboardHandle) -> None:
    page = _page(dashboard, "limit=10&offset=20")
    assert [r["run_id"] for r in page["runs"]] == [f"run-{i:02d}" for i in range(20, 25)]
    assert (page["total"], page["matched"], page["states"]) == (RUNS, RUNS, {"completed": 20, "failed": 5})
    newest = _page(dashboard, "sort=updated_ts&order=desc&limit=3")
    assert [r["run_id"] for r in newest["runs"]] == ["run-24", "run-23", "run-22"]
    failed = _page(dashboard, "state=failed&q=RUN-1&limit=100")
    assert [r["run_id"] for r in failed["runs"]] == ["run-10", "run-15"] and failed["matched"] == 2
    everything = json.loads(get(dashboard, "/api/runs")[1])  # no page asked for: the whole list, as before
    assert isinstance(everything, list) and len(everything) == RUNS


def test_a_wrong_page_parameter_is_a_400_that_names_it(dashboard: DashboardHandle) -> None:
    status, body = get(dashboard, "/api/runs?sort=size")
    assert status == 400 and b"sort" in body and b"updated_ts" in body


def test_the_stream_of_a_page_sends_it_again_when_a_run_moves_into_it(
    dashboard: DashboardHandle, tmp_path: Path
) -> None:
    run = RunDir(tmp_path / "runs" / "run-03")
    wait_for(lambda: _page(dashboard, "limit=1")["pending"] == 0, what="every run read")

    def move() -> None:  # run-03 becomes the newest: it enters the page of the two newest runs
        status = json.loads(run.status.read_text())
        atomic_write_text(run.status, json.dumps({**status, "updated_ts": 1_800_000_000.0}))

    stream = Stream(dashboard, "/api/stream?sort=updated_ts&order=desc&limit=2")
    try:
        stream.until(lambda f: len(f) >= 1, what="the first page")  # sent before the run moves
        move()
        frames = stream.until(lambda f: [n for n, _ in f].count("runs") >= 2, what="the page again")
    finally:
        stream.close()
    pages = [data for name, data in frames if name == "runs"]
    assert isinstance(pages[0], dict) and [r["run_id"] for r in pages[0]["runs"]] == ["run-24", "run-23"]
    assert [r["run_id"] for r in pages[-1]["runs"]] == ["run-03", "run-24"] and pages[-1]["total"] == RUNS
