"""Projected disk need (and disk_low raising on it), the report's verdict and JSON round trip."""

from __future__ import annotations

from pathlib import Path

from steadytune.config.detect import DetectConfig
from steadytune.detect.build import fill
from steadytune.detect.points import SystemPoint
from steadytune.detect.system import SystemLimits, SystemWatch
from steadytune.preflight.disk import projected_need, run_disk_need
from steadytune.preflight.result import Check, PreflightReport, Recommendation, from_json, to_json
from steadytune.records import SystemSample

GiB = 1 << 30


def test_projected_need() -> None:
    assert projected_need(10, saves_remaining=0, keep_last=3, existing=2, final_bytes=5) == 5
    assert projected_need(10, saves_remaining=1, keep_last=3, existing=0) == 10
    assert (
        projected_need(10, saves_remaining=50, keep_last=3, existing=0) == 50
    )  # at most keep_last + 2 at once
    assert projected_need(10, saves_remaining=50, keep_last=3, existing=5) == 0
    assert projected_need(10, saves_remaining=50, keep_last=3, existing=4) == 10


def test_run_disk_need_measures_the_newest_checkpoint(tmp_path: Path) -> None:
    for step, size in ((10, 100), (20, 300)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"x" * size)
    assert run_disk_need(tmp_path, keep_last=3, save_steps=10, max_steps=100, step=20) == 3 * 300
    assert run_disk_need(tmp_path / "none", 3, 10, 100, 0, estimated_checkpoint_bytes=7) == 5 * 7
    assert run_disk_need(tmp_path, 3, 10, -1, 20) is None


def test_disk_low_raises_when_the_coming_checkpoints_do_not_fit() -> None:
    watch = SystemWatch(fill(SystemLimits, DetectConfig(), ("system", "memory")))
    sample = SystemSample(ts=1.0, disk_free_bytes=200 * GiB, disk_total_bytes=1000 * GiB)
    out: list = []
    watch.observe(SystemPoint(sample, 5), out)
    assert out == []  # 20% free: fine by share and by the absolute floor
    watch.set_projected_need(300 * GiB)
    watch.observe(
        SystemPoint(SystemSample(ts=2.0, disk_free_bytes=200 * GiB, disk_total_bytes=1000 * GiB), 6), out
    )
    assert [f.kind for f in out] == ["disk_low"]
    assert out[0].evidence["projected_need_bytes"] == 300 * GiB


def test_verdict_and_json_round_trip() -> None:
    checks = (Check("memory", "device_memory", "ok", "fits"), Check("data", "utf8", "warn", "w", "fix it"))
    rec = Recommendation(4, 2, 128, False, 8, 100, 200, ("why",))
    report = PreflightReport(checks, rec, "cpu", "x.yaml")
    assert (
        report.go and report.verdict == "go" and report.counts() == {"ok": 1, "warn": 1, "fail": 0, "na": 0}
    )
    again = from_json(to_json(report))
    assert again == report
    failing = PreflightReport((*checks, Check("data", "utf8", "fail", "bad", "fix")))
    assert not failing.go and to_json(failing)["verdict"] == "no-go"
