"""System samples: thermal, GPU errors, disk, host memory."""

from __future__ import annotations

import pytest

from steadytune.detect import LiveDetector
from steadytune.records import GpuSample, StepRecord, SystemSample

GIB = 1 << 30


def _sample(ts: float, temp: float = 70.0, ecc: int = 0, free: float = 0.5, ram: float = 0.5) -> SystemSample:
    return SystemSample(
        ts=ts,
        ram_used_bytes=int(ram * 512 * GIB),
        ram_total_bytes=512 * GIB,
        disk_free_bytes=int(free * 1000 * GIB),
        disk_total_bytes=1000 * GIB,
        gpus=(
            GpuSample(
                index=0, temperature_c=70.0, ecc_errors=0, mem_used_bytes=40 * GIB, mem_total_bytes=80 * GIB
            ),
            GpuSample(
                index=1, temperature_c=temp, ecc_errors=ecc, mem_used_bytes=40 * GIB, mem_total_bytes=80 * GIB
            ),
        ),
    )


def _run(samples: list[SystemSample]) -> list[tuple[str, str, str, str]]:
    det = LiveDetector()
    det.observe_step(StepRecord(step=7, ts=0.0, loss=2.0))
    out = []
    for s in samples:
        out += [
            (t.state, t.anomaly.kind, t.anomaly.metric, t.anomaly.severity) for t in det.observe_system(s)
        ]
    return out


def test_hot_gpu_is_raised_once_per_gpu_and_resolved_when_cool() -> None:
    temps = [70, 86, 88, 91, 90, 80, 70]
    got = _run([_sample(float(i), temp=t) for i, t in enumerate(temps)])
    assert got == [
        ("raised", "gpu_thermal", "gpu1_temperature_c", "warning"),
        ("cleared", "gpu_thermal", "gpu1_temperature_c", "warning"),
    ]


def test_one_hot_reading_is_not_enough() -> None:
    assert _run([_sample(float(i), temp=t) for i, t in enumerate([70, 90, 70, 70])]) == []


@pytest.mark.parametrize("temp", (92.0, 95.5, 99.0))
def test_one_reading_at_the_critical_level_is_critical_at_once(temp: float) -> None:
    got = _run([_sample(float(i), temp=t) for i, t in enumerate([70, 71, temp])])
    assert got == [("raised", "gpu_thermal", "gpu1_temperature_c", "critical")]


def test_new_ecc_errors_are_critical() -> None:
    got = _run([_sample(0.0), _sample(1.0), _sample(2.0, ecc=3)])
    assert got == [("raised", "gpu_error", "gpu1_ecc_errors", "critical")]


def test_disk_filling_up_warns_then_is_critical() -> None:
    got = _run([_sample(float(i), free=f) for i, f in enumerate([0.5, 0.04, 0.01])])
    assert got == [
        ("raised", "disk_low", "disk_free_bytes", "warning"),
        ("escalated", "disk_low", "disk_free_bytes", "critical"),  # one episode, told when it got worse
    ]
    det = LiveDetector()
    assert [t.anomaly.severity for t in det.observe_system(_sample(0.0, free=0.01))] == ["critical"]


def test_host_ram_almost_full_is_headroom() -> None:
    got = _run([_sample(0.0), _sample(1.0, ram=0.97)])
    assert got == [("raised", "memory_headroom", "ram_used_bytes", "warning")]


def test_unavailable_readings_are_not_judged() -> None:
    det = LiveDetector()
    assert det.observe_system(SystemSample(ts=0.0, gpus=(GpuSample(index=0),))) == []
