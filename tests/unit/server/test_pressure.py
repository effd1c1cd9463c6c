"""Memory pressure on fake NVML snapshots: who steps aside, how, and when it comes back."""

from __future__ import annotations

from steadytune.server.ledger import GIB, GpuProcess, GpuReading, Reservation, build_ledger
from steadytune.server.pressure import LiveJob, relieve

HEADROOM = GIB


def ledger(used_gib: float, jobs: list[LiveJob], procs=(), total_gib: float = 24, gpus=(0,)):
    readings = [
        GpuReading(i, int(total_gib * GIB), int(used_gib * GIB), "fake", 0.9, tuple(procs)) for i in gpus
    ]
    reservations = [Reservation(j.job_id, g, j.need_bytes) for j in jobs for g in j.gpus]
    return build_ledger(readings, reservations, {})


def job(jid: str, priority: int, seq: int, need_gib: float = 8, gpus=(0,), **kw) -> LiveJob:
    return LiveJob(jid, priority, seq, tuple(gpus), int(need_gib * GIB), **kw)


def test_no_pressure_no_action():
    jobs = [job("hi", 5, 1), job("lo", 0, 2)]
    assert relieve(ledger(16, jobs), jobs, HEADROOM, HEADROOM) == []


def test_the_lower_priority_job_is_paused_when_free_falls_below_the_threshold():
    jobs = [job("lo", 0, 1), job("hi", 5, 2)]  # the low one came first: priority decides, not order
    [action] = relieve(ledger(23.5, jobs), jobs, HEADROOM, HEADROOM)
    assert (action.kind, action.job_id, action.gpu) == ("pause", "lo", 0)
    assert "0.5 GiB free < 1.0 GiB" in action.reason


def test_among_equals_the_latest_started_steps_aside():
    jobs = [job("a", 0, 1), job("b", 0, 2)]
    [action] = relieve(ledger(23.5, jobs), jobs, HEADROOM, HEADROOM)
    assert action.job_id == "b"


def test_a_job_alone_on_its_gpu_is_left_alone_unless_a_foreign_process_is_there():
    jobs = [job("a", 0, 1)]
    assert relieve(ledger(23.5, jobs), jobs, HEADROOM, HEADROOM) == []
    foreign = [GpuProcess(4242, 10 * GIB)]
    [action] = relieve(ledger(23.5, jobs, foreign), jobs, HEADROOM, HEADROOM)
    assert (action.kind, action.job_id) == ("pause", "a")


def test_a_job_that_may_run_on_fewer_gpus_is_shrunk_off_the_pressed_gpu():
    jobs = [job("hi", 5, 1, gpus=(1,)), job("lo", 0, 2, gpus=(0, 1), min_gpus=1)]
    readings = [GpuReading(0, 24 * GIB, 4 * GIB), GpuReading(1, 24 * GIB, int(23.5 * GIB))]
    g = build_ledger(readings, [Reservation(j.job_id, i, j.need_bytes) for j in jobs for i in j.gpus], {})
    [action] = relieve(g, jobs, HEADROOM, HEADROOM)
    assert (action.kind, action.job_id, action.gpu, action.keep) == ("shrink", "lo", 1, (0,))
    # At its smallest it is paused instead; while a shrink or pause is in progress nobody else is asked.
    at_min = [jobs[0], job("lo", 0, 2, gpus=(0, 1), min_gpus=2)]
    assert relieve(g, at_min, HEADROOM, HEADROOM)[0].kind == "pause"
    shrinking = [jobs[0], job("lo", 0, 2, gpus=(0, 1), min_gpus=1, stepping_aside=True)]
    assert relieve(g, shrinking, HEADROOM, HEADROOM) == []
    pausing = [jobs[0], job("lo", 0, 2, gpus=(0, 1), paused=True, stepping_aside=True)]
    assert relieve(g, pausing, HEADROOM, HEADROOM) == []


def test_a_paused_job_resumes_only_when_its_need_fits_beside_the_others():
    hi, lo = job("hi", 5, 1, need_gib=8), job("lo", 0, 2, need_gib=8, paused=True)
    jobs = [hi, lo]
    # hi holds 20 GiB of 24 (more than it reserved): 4 free, lo needs 8 + 1 headroom.
    procs = [GpuProcess(100, 20 * GIB)]
    g = build_ledger(
        [GpuReading(0, 24 * GIB, 20 * GIB, "fake", 0.9, tuple(procs))],
        [Reservation("hi", 0, hi.need_bytes), Reservation("lo", 0, lo.need_bytes)],
        {"hi": {100}, "lo": set()},
    )
    assert relieve(g, jobs, HEADROOM, HEADROOM) == []  # paused, still no room: nothing
    procs = [GpuProcess(100, 10 * GIB)]
    g = build_ledger(
        [GpuReading(0, 24 * GIB, 10 * GIB, "fake", 0.9, tuple(procs))],
        [Reservation("hi", 0, hi.need_bytes), Reservation("lo", 0, lo.need_bytes)],
        {"hi": {100}, "lo": set()},
    )
    [action] = relieve(g, jobs, HEADROOM, HEADROOM)
    assert (action.kind, action.job_id) == ("resume", "lo")
    # 14 free, nothing else outstanding (hi holds more than it reserved): 14 - 1 headroom >= 8.
    assert "GPU 0 13.0 GiB" in action.reason


def test_a_paused_job_is_not_chosen_again_and_its_neighbour_may_be():
    jobs = [job("hi", 5, 1), job("mid", 2, 2), job("lo", 0, 3, paused=True)]
    [action] = relieve(ledger(23.5, jobs), jobs, HEADROOM, HEADROOM)
    assert (action.kind, action.job_id) == ("pause", "mid")
