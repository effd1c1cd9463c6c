"""Ledger and admission on fake NVML snapshots: exact bytes, exact decisions."""

from __future__ import annotations

import pytest

from steadytune.server.admission import JobRequest, admit, start_everything
from steadytune.server.ledger import (
    GIB,
    GpuProcess,
    GpuReading,
    Reservation,
    build_ledger,
    readings_from_dict,
)


def gpu(index: int, total_gib: float, used_gib: float, procs: tuple[GpuProcess, ...] = ()) -> GpuReading:
    return GpuReading(index, int(total_gib * GIB), int(used_gib * GIB), "H100", 0.5, procs)


def job(jid: str, need_gib: float, gpus: int = 1, priority: int = 0, seq: int = 0) -> JobRequest:
    return JobRequest(jid, int(need_gib * GIB), gpus, priority, seq)


def decide(readings, jobs, reservations=(), pids=None, headroom=GIB):
    return {d.job_id: d for d in admit(jobs, build_ledger(readings, reservations, pids), headroom)}


def test_a_job_that_fits_is_admitted_on_the_roomiest_gpu():
    d = decide([gpu(0, 80, 60), gpu(1, 80, 10)], [job("a", 30)])["a"]
    assert d.admitted and d.gpus == (1,)


def test_headroom_is_kept_spare():
    # 20 GiB free: a 19.5 GiB job leaves less than the 1 GiB headroom, so it waits...
    d = decide([gpu(0, 80, 60)], [job("a", 19.5)])["a"]
    assert not d.admitted
    assert "waits for room" in d.reason and "19.0 GiB" in d.reason
    # ...and exactly free − headroom fits.
    assert decide([gpu(0, 80, 60)], [job("a", 19.0)])["a"].admitted
    assert decide([gpu(0, 80, 60)], [job("a", 19.5)], headroom=0)["a"].admitted


def test_two_jobs_share_one_gpu_when_both_fit_and_the_third_queues():
    out = decide([gpu(0, 80, 2)], [job("a", 30, seq=1), job("b", 30, seq=2), job("c", 30, seq=3)])
    assert out["a"].gpus == (0,) and out["b"].gpus == (0,)
    assert not out["c"].admitted and "waits for room" in out["c"].reason


def test_a_reservation_not_yet_allocated_counts_against_free_memory():
    # Job r was admitted for 40 GiB and has allocated nothing yet: only 80 − 0 − 40 − 1 is left.
    readings = [gpu(0, 80, 0, (GpuProcess(100, 0),))]
    out = decide(readings, [job("a", 40)], [Reservation("r", 0, 40 * GIB)], {"r": {100}})
    assert not out["a"].admitted
    assert decide(readings, [job("a", 39)], [Reservation("r", 0, 40 * GIB)], {"r": {100}})["a"].admitted


def test_a_running_job_is_not_charged_twice():
    # r reserved 40 GiB and NVML already shows 30 of them used by its process: 10 outstanding.
    readings = [gpu(0, 80, 30, (GpuProcess(100, 30 * GIB),))]
    ledger = build_ledger(readings, [Reservation("r", 0, 40 * GIB)], {"r": {100}})
    assert ledger[0].reserved_bytes == 10 * GIB
    assert ledger[0].available(GIB) == (80 - 30 - 10 - 1) * GIB
    assert ledger[0].foreign == ()


def test_unknown_per_process_memory_keeps_the_whole_reservation():
    readings = [gpu(0, 80, 30, (GpuProcess(100, None),))]
    ledger = build_ledger(readings, [Reservation("r", 0, 40 * GIB)], {"r": {100}})
    assert ledger[0].reserved_bytes == 40 * GIB


def test_a_foreign_process_counts_as_used():
    # Someone's notebook (pid 999) holds 50 GiB; steadytune did not start it.
    readings = [gpu(0, 80, 50, (GpuProcess(999, 50 * GIB),)), gpu(1, 80, 0)]
    ledger = build_ledger(readings, [], {})
    assert [p.pid for p in ledger[0].foreign] == [999]
    out = decide(readings, [job("a", 40, gpus=2)])
    assert not out["a"].admitted  # GPU 0 has 29 GiB left, 40 do not fit there
    assert decide(readings, [job("a", 29, gpus=2)])["a"].gpus == (0, 1)


def test_priority_order_then_fifo_and_the_head_holds_the_line():
    readings = [gpu(0, 80, 0)]
    jobs = [
        job("low", 10, priority=0, seq=1),
        job("big", 75, priority=5, seq=2),
        job("hi", 10, priority=5, seq=3),
    ]
    order = [d.job_id for d in admit(jobs, build_ledger(readings, []))]
    assert order == ["big", "hi", "low"]
    out = decide(readings, jobs)
    assert out["big"].admitted and out["big"].gpus == (0,)
    # 79 − 75 = 4 GiB left: "hi" does not fit and "low" (which would) waits behind it.
    assert not out["hi"].admitted and "waits for room" in out["hi"].reason
    assert not out["low"].admitted and out["low"].reason == "waits behind hi (priority 5)"


def test_fifo_within_a_priority():
    out = decide([gpu(0, 40, 0)], [job("second", 30, seq=2), job("first", 30, seq=1)])
    assert out["first"].admitted and not out["second"].admitted


def test_a_job_that_can_never_fit_does_not_block_others():
    out = decide(
        [gpu(0, 24, 0)], [job("huge", 30, seq=1), job("small", 4, seq=2), job("wide", 4, gpus=2, seq=3)]
    )
    assert not out["huge"].admitted and out["huge"].reason.startswith("never fits here")
    assert "24.0 GiB" in out["huge"].reason
    assert out["small"].admitted
    # Each reason says what to change, as a waiting job's does.
    assert out["wide"].reason.startswith("never fits here: needs 2 GPUs; this server manages 1: ")
    assert "--gpus 1 or fewer" in out["wide"].reason and "run.nproc_per_node=1" in out["wide"].reason
    assert "--need-gib" in out["huge"].reason


def test_multi_gpu_job_needs_room_on_each():
    readings = [gpu(0, 80, 0), gpu(1, 80, 70), gpu(2, 80, 10)]
    out = decide(readings, [job("a", 40, gpus=2)])
    assert out["a"].gpus == (0, 2)


def test_the_estimator_free_baseline_flags_what_would_have_oomed():
    gpus = build_ledger([gpu(0, 80, 0)], [])
    jobs = [job("a", 30, seq=1), job("b", 30, seq=2), job("c", 30, seq=3)]
    oom = start_everything(jobs, gpus, {"a": 30 * GIB, "b": 30 * GIB, "c": 30 * GIB})
    assert oom == {"a": True, "b": True, "c": True}  # 90 GiB on an 80 GiB device takes all three down
    assert start_everything(jobs[:2], gpus, {"a": 30 * GIB, "b": 30 * GIB}) == {"a": False, "b": False}


def test_snapshot_dicts_are_read_and_bad_ones_named():
    r = readings_from_dict(
        {
            "gpus": [
                {"index": 0, "total_bytes": 8, "used_bytes": 2, "processes": [{"pid": 5, "used_bytes": 2}]}
            ]
        }
    )
    assert r[0].free_bytes == 6 and r[0].processes == (GpuProcess(5, 2),)
    with pytest.raises(ValueError, match=r"gpus\[0\]\.used_bytes=-1"):
        readings_from_dict({"gpus": [{"index": 0, "total_bytes": 8, "used_bytes": -1}]})
    with pytest.raises(ValueError, match="a GPU snapshot is"):
        readings_from_dict([])
