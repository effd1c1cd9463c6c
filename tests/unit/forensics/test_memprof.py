"""mem-profile's statistics and sampling, with injected samplers and clocks (exact, no sleeping)."""

from __future__ import annotations

import math

from steadytune.forensics.memprof import (
    MIN_GROWTH_BYTES,
    MemSample,
    TreeSampler,
    allocator_report,
    analyze,
    profile,
    theil_sen,
)
from steadytune.guard.memsnap import dump_cuda_snapshot
from steadytune.records import StepRecord

MIB = 1024**2


def test_theil_sen_ignores_outliers():
    xs = list(range(10))
    ys = [2.0 * x + 1 for x in xs]
    ys[3] = 1000.0  # one wild reading
    slope, agree = theil_sen(xs, ys)
    assert slope == 2.0 and agree > 0.8


def test_leak_is_flagged_with_a_projection():
    samples = [MemSample(float(t), 100 * MIB + t * 4 * MIB, 90 * MIB + t * 4 * MIB) for t in range(30)]
    rep = analyze(7, samples, ram_available=1000 * MIB, gpu_total=None)
    rss = rep.series[0]
    assert rep.leak_suspected and rss.growing and rss.slope_bps == 4 * MIB
    assert math.isclose(rss.eta_s, 1000 / 4)  # the available RAM at 4 MiB/s
    assert "GPU memory: N/A" in rep.notes[0]


def test_sawtooth_and_small_drift_are_not_leaks():
    saw = [MemSample(float(t), 500 * MIB + (t % 5) * 20 * MIB) for t in range(60)]
    assert not analyze(1, saw, None, None).leak_suspected
    creep = [MemSample(float(t), 500 * MIB + t * 1024) for t in range(60)]  # 60 KiB in all: below the floor
    assert not analyze(1, creep, None, None).leak_suspected
    assert MIN_GROWTH_BYTES > 60 * 1024


def test_gpu_series_against_the_device_total():
    samples = [MemSample(float(t), 100 * MIB, None, 1000 * MIB + t * 10 * MIB) for t in range(20)]
    rep = analyze(1, samples, ram_available=None, gpu_total=2000 * MIB)
    gpu = next(s for s in rep.series if s.name == "gpu")
    assert gpu.growing and math.isclose(gpu.eta_s, (2000 - 1190) / 10)


def test_too_few_samples():
    assert "fewer than 3 samples" in analyze(1, [MemSample(0.0, 1)], None, None).notes[0]


class FakeProc:
    def __init__(self, pid, rss, uss, kids=()):
        self.pid, self._rss, self._uss, self._kids = pid, rss, uss, list(kids)

    def memory_info(self):
        return type("M", (), {"rss": self._rss})

    def memory_full_info(self):
        if self._uss is None:
            raise PermissionError
        return type("M", (), {"uss": self._uss})

    def children(self, recursive=False):
        return self._kids


class FakeNvml:
    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [
            type("P", (), {"pid": 2, "usedGpuMemory": 300})(),
            type("P", (), {"pid": 99, "usedGpuMemory": 5})(),
        ]

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("I", (), {"total": 1000})()


def test_tree_sampler_sums_the_tree_and_its_gpu_memory():
    tree = FakeProc(1, 100, 60, [FakeProc(2, 50, 30)])
    s = TreeSampler(1, process=lambda pid: tree, nvml=FakeNvml()).sample(5.0)
    assert (s.rss, s.uss, s.gpu, s.procs) == (150, 90, 300, 2)
    no_uss = TreeSampler(1, process=lambda pid: FakeProc(1, 100, None), nvml=None).sample(0.0)
    assert no_uss.uss is None and no_uss.gpu is None


def test_profile_loop_with_a_fake_clock():
    now = [0.0]

    class Sampler:
        def sample(self, t):
            return MemSample(t, int(t * 10))

    def sleep(s):
        now[0] += s

    samples = profile(Sampler(), seconds=3.0, interval=0.5, clock=lambda: now[0], sleep=sleep)
    assert [s.ts for s in samples] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]


def test_allocator_report_from_step_records():
    steps = [
        StepRecord(
            step=i, ts=0.0, mem_allocated_bytes=1000 + 10 * i, mem_reserved_bytes=4000, mem_peak_bytes=5000
        )
        for i in range(1, 11)
    ]
    rep = allocator_report(steps)
    assert rep["mem_allocated_bytes"]["slope_bytes_per_step"] == 10.0 and rep["steps"] == "1-10"
    assert allocator_report([StepRecord(step=1, ts=0.0)]) is None


def test_cuda_snapshot_is_a_clear_no_op_on_cpu(tmp_path, monkeypatch):
    import steadytune.guard.memsnap as memsnap

    monkeypatch.setattr(memsnap, "_cuda", lambda: None)
    res = dump_cuda_snapshot(tmp_path / "snap.pickle")
    assert not res.written and "no CUDA device" in res.message and not (tmp_path / "snap.pickle").exists()
