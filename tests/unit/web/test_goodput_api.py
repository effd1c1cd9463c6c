"""/api/goodput's server side: the stretches a job held each GPU, and the part of them its run trained."""

from __future__ import annotations

import pytest

from steadytune.goodput.parts import PARTS, Account, Segment
from steadytune.web.goodput import gpu_hours, held


def job(**fields: object) -> dict:
    return {"id": "j1", "run_id": "j1-run", "gpus": [0], "history": [], **fields}


def test_a_job_holds_its_gpus_from_its_start_to_its_end() -> None:
    assert held(job(gpus=[0, 1], started_ts=100.0, ended_ts=400.0), now=999.0) == {
        0: [(100.0, 400.0)],
        1: [(100.0, 400.0)],
    }
    assert held(job(started_ts=100.0), now=250.0) == {0: [(100.0, 250.0)]}  # still running
    assert held(job(started_ts=None), now=250.0) == {}  # never started: it held nothing


def test_resizes_move_the_gpus_a_job_holds() -> None:
    history = [
        {"ts": 200.0, "kind": "grow", "from": [0], "to": [0, 1]},
        {"ts": 250.0, "kind": "pause", "gpu": 0},  # not a resize: the GPUs stay
        {"ts": 300.0, "kind": "shrink", "from": [0, 1], "to": [1]},
    ]
    got = held(job(gpus=[1], started_ts=100.0, ended_ts=500.0, history=history), now=999.0)
    assert got == {0: [(100.0, 200.0), (200.0, 300.0)], 1: [(200.0, 300.0), (300.0, 500.0)]}


def test_a_gpu_is_productive_where_its_job_trained_steps_that_survive() -> None:
    seconds = dict.fromkeys(PARTS, 0.0)
    segments = (
        Segment(90.0, 150.0, "startup"),
        Segment(150.0, 260.0, "productive"),
        Segment(260.0, 280.0, "restart"),
        Segment(280.0, 500.0, "productive"),
    )
    acct = Account("j1-run", 90.0, 500.0, seconds, True, "completed", 10, 0, 1, 0, 1.0, 1, segments)
    history = [{"ts": 300.0, "kind": "shrink", "from": [0, 1], "to": [1]}]
    snapshot = {
        "gpus": [{"index": 0, "name": "H100"}, {"index": 1, "name": "H100"}, {"index": 2, "name": "H100"}],
        "jobs": [job(gpus=[1], started_ts=100.0, ended_ts=500.0, history=history)],
    }
    rows = {r["gpu"]: r for r in gpu_hours(snapshot, {"j1-run": acct}, now=999.0)}
    # GPU 0: held 100..300, trained 150..260 and 280..300; GPU 1: held 100..500, trained but for the restart.
    assert rows[0]["allocated_s"] == pytest.approx(200.0) and rows[0]["productive_s"] == pytest.approx(130.0)
    assert rows[1]["allocated_s"] == pytest.approx(400.0) and rows[1]["productive_s"] == pytest.approx(330.0)
    assert rows[2]["allocated_s"] == 0.0 and rows[2]["jobs"] == []
