"""/metrics: the text exposition format, names, labels and values from a run directory."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from steadytune.records import Event, GpuSample, PlanRevision, StepRecord, SystemSample
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.metrics import render_metrics
from steadytune.web.runs import RunsIndex

SAMPLE = re.compile(r'^(steadytune_[a-z_]+)(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? (NaN|[+-]Inf|-?[0-9.e+-]+)$')


def test_label_values_are_escaped_and_non_finite_values_spelled_out(tmp_path: Path) -> None:
    # A run id may hold characters the format must escape; a NaN loss must stay NaN.
    run = RunDir(tmp_path / "runs" / "r3").create()
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(StepRecord(step=0, ts=1.0, loss=math.nan))
    gpu = GpuSample(index=0, name='A "quoted"\\name', util_ratio=0.5)
    with JsonlWriter(run.system) as w:
        w.write(SystemSample(ts=1.0, cpu_ratio=0.1, ram_used_bytes=1, ram_total_bytes=2, gpus=(gpu,)))
    index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
    index.refresh_all()
    text = render_metrics(index, lambda: 10.0)
    assert 'steadytune_gpu_utilization_ratio{gpu="0",name="A \\"quoted\\"\\\\name",run="r3"} 0.5' in text
    assert 'steadytune_loss{run="r3"} NaN' in text


def test_families_without_samples_are_left_out(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "r4").create()
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(StepRecord(step=0, ts=1.0, loss=1.0))
    index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
    index.refresh_all()
    text = render_metrics(index, lambda: 10.0)
    assert "# TYPE steadytune_loss gauge" in text
    # No system sample: no GPU family at all, not a HELP/TYPE pair without series.
    assert "steadytune_gpu_" not in text and "steadytune_host_" not in text


def _run(tmp_path: Path, now: float) -> RunDir:
    run = RunDir(tmp_path / "runs" / "r1").create()
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(10):
            w.write(
                StepRecord(
                    step=s,
                    ts=now - 10 + s,
                    attempt=2,  # the attempt status.json follows
                    loss=2.0 - s * 0.1,
                    grad_norm=1.5,
                    lr=1e-4,
                    tokens=1000,
                    step_time_s=0.5,
                    mem_allocated_bytes=100,
                    mem_reserved_bytes=200,
                    mem_peak_bytes=300,
                )
            )
    gpu = GpuSample(
        index=0,
        name="H100",
        util_ratio=0.9,
        mem_used_bytes=75,
        mem_total_bytes=100,
        temperature_c=70,
        power_w=500,
    )
    with JsonlWriter(run.system) as w:
        w.write(SystemSample(ts=now, cpu_ratio=0.4, ram_used_bytes=10, ram_total_bytes=20, disk_free_bytes=5,
                             disk_total_bytes=9, gpus=(gpu,)))  # fmt: skip
    with JsonlWriter(run.plan) as w:
        w.write(PlanRevision(revision=0, ts=now, reason="initial"))
        w.write(PlanRevision(revision=1, ts=now, reason="oom", attempt=1))
        w.write(PlanRevision(revision=2, ts=now, reason="oom", attempt=2))
    log = EventLog(run.events, run_id="r1")
    log.append(
        Event(ts=now, kind="anomaly", name="loss_spike", severity="warning", step=3, data={"metric": "loss"})
    )
    log.append(Event(ts=now, kind="resolved", name="loss_spike", step=5, data={"metric": "loss"}))
    log.append(
        Event(ts=now, kind="anomaly", name="divergence", severity="critical", step=8, data={"metric": "loss"})
    )
    ck = run.checkpoints / "checkpoint-5"
    ck.mkdir(parents=True)
    (ck / "w.bin").write_bytes(b"abc")
    atomic_write_text(
        ck / "MANIFEST.json",
        json.dumps({"step": 5, "ts": now - 120, "files": [{"path": "w.bin", "size": 3}]}),
    )
    atomic_write_text(run.latest_pointer, "checkpoint-5")
    atomic_write_text(
        run.status,
        json.dumps(
            {
                "run_id": "r1",
                "state": "running",
                "step": 9,
                "max_steps": 100,
                "restarts": 2,
                "attempt": 2,
                "updated_ts": now,
                "eta_s": 45.5,
            }
        ),
    )
    return run


def test_render_metrics_from_a_run(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    _run(tmp_path, now)
    index = RunsIndex(tmp_path / "runs", clock=lambda: now, cache_dir=tmp_path / "cache")
    index.refresh_all()
    text = render_metrics(index, lambda: now)
    lines = text.splitlines()
    for line in lines:
        assert (
            line.startswith("# HELP steadytune_")
            or line.startswith("# TYPE steadytune_")
            or SAMPLE.match(line)
        ), line
    expect = {
        'steadytune_run_state{run="r1",state="running"} 1.0',
        'steadytune_run_state{run="r1",state="failed"} 0.0',
        'steadytune_step{run="r1"} 9.0',
        'steadytune_progress_ratio{run="r1"} 0.09',
        'steadytune_eta_seconds{run="r1"} 45.5',
        'steadytune_grad_norm{run="r1"} 1.5',
        'steadytune_loss_nonfinite{run="r1"} 0.0',
        'steadytune_tokens_total{run="r1"} 10000.0',
        'steadytune_throughput_tokens_per_second{run="r1"} 2000.0',
        'steadytune_device_memory_peak_bytes{run="r1"} 300.0',
        'steadytune_anomalies_total{kind="divergence",run="r1",severity="critical"} 1.0',
        'steadytune_anomalies_total{kind="loss_spike",run="r1",severity="warning"} 1.0',
        'steadytune_anomalies_active{kind="divergence",run="r1",severity="critical"} 1.0',
        'steadytune_restarts_total{reason="oom",run="r1"} 2.0',
        'steadytune_gpu_memory_headroom_ratio{gpu="0",name="H100",run="r1"} 0.25',
        'steadytune_gpu_temperature_celsius{gpu="0",name="H100",run="r1"} 70.0',
        'steadytune_host_cpu_utilization_ratio{run="r1"} 0.4',
        'steadytune_checkpoint_age_seconds{run="r1"} 120.0',
        'steadytune_checkpoints_verified{run="r1"} 1.0',
    }
    assert expect <= set(lines), expect - set(lines)
    assert 'kind="loss_spike"' not in "".join(
        ln for ln in lines if ln.startswith("steadytune_anomalies_active")
    )
    assert any(ln.startswith('steadytune_loss{run="r1"} 1.1') for ln in lines)
    # Every family is typed once, counters end in _total, each name carries the steadytune_ prefix.
    types = [ln.split()[2:] for ln in lines if ln.startswith("# TYPE")]
    assert len({t[0] for t in types}) == len(types)
    assert all(name.endswith("_total") for name, kind in types if kind == "counter")


def test_after_a_rollback_the_abandoned_attempts_loss_is_not_the_runs(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "r4").create()
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(1, 24):  # attempt 0 diverged at 23, then rolled back to checkpoint-20
            w.write(StepRecord(step=s, ts=float(s), loss=2.0 if s < 22 else 69.2567, grad_norm=9.0))

    def status(step: int, loss: float | None) -> None:
        body = {
            "run_id": "r4",
            "state": "running",
            "step": step,
            "attempt": 1,
            "loss": loss,
            "updated_ts": 30.0,
        }
        atomic_write_text(run.status, json.dumps(body))

    def gauges() -> dict[str, str]:
        index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
        index.refresh_all()
        lines = render_metrics(index, lambda: 40.0).splitlines()
        return {ln.split("{")[0]: ln.rsplit(" ", 1)[1] for ln in lines if ln.startswith("steadytune_")}

    status(20, None)  # resumed from checkpoint-20: no step of the new timeline yet
    got = gauges()
    assert got["steadytune_step"] == "20.0"
    assert "steadytune_loss" not in got and "steadytune_grad_norm" not in got, got
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(StepRecord(step=21, ts=31.0, attempt=1, loss=1.9, grad_norm=1.0))
    status(21, 1.9)
    got = gauges()
    assert (got["steadytune_step"], got["steadytune_loss"]) == ("21.0", "1.9")


def test_nonfinite_latest_loss_is_exported_as_nan(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "r2").create()
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(StepRecord(step=0, ts=1.0, loss=1.0))
        w.write(StepRecord(step=1, ts=2.0, loss=math.nan))
    index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
    index.refresh_all()
    text = render_metrics(index, lambda: 10.0)
    assert 'steadytune_loss{run="r2"} NaN' in text and 'steadytune_loss_nonfinite{run="r2"} 1.0' in text


def _finish(run: RunDir, state: str, ended: float) -> None:
    atomic_write_text(
        run.status, json.dumps({"run_id": run.run_id, "state": state, "step": 9, "updated_ts": ended})
    )


def test_a_finished_run_leaves_the_series_after_the_keep_window_and_stays_counted(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    run = _run(tmp_path, now)
    index = RunsIndex(tmp_path / "runs", clock=lambda: now, cache_dir=tmp_path / "cache")
    index.refresh_all()
    hour = 3600.0
    _finish(run, "completed", now - 2 * hour)
    kept = render_metrics(index, lambda: now, keep_finished_s=3 * hour)
    assert 'steadytune_step{run="r1"} 9.0' in kept
    assert 'steadytune_checkpoint_age_seconds{run="r1"} 120.0' in kept  # the age moves with the clock
    assert 'steadytune_checkpoint_age_seconds{run="r1"} 180.0' in render_metrics(
        index, lambda: now + 60, keep_finished_s=3 * hour
    )
    gone = render_metrics(index, lambda: now, keep_finished_s=hour)
    assert 'run="r1"' not in gone
    assert 'steadytune_runs{state="completed"} 1.0' in gone and 'steadytune_runs{state="running"} 0.0' in gone
    # A run whose supervisor died (its status stale, not terminal) ages out the same way.
    _finish(run, "running", now - 2 * hour)
    assert 'run="r1"' not in render_metrics(index, lambda: now, keep_finished_s=hour)
    assert 'steadytune_runs{state="running"} 1.0' in render_metrics(index, lambda: now, keep_finished_s=hour)
    # Restarted (its supervisor live again): back at once, whatever the window.
    _finish(run, "running", now)
    assert 'steadytune_step{run="r1"} 9.0' in render_metrics(index, lambda: now, keep_finished_s=0.0)


def test_a_finished_runs_series_are_read_once_until_its_files_change(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    run = _run(tmp_path, now)
    _finish(run, "completed", now - 60)
    index = RunsIndex(tmp_path / "runs", clock=lambda: now, cache_dir=tmp_path / "cache")
    index.refresh_all()
    first = render_metrics(index, lambda: now)
    entry = index.get("r1")
    assert entry is not None
    queries: list[str] = []
    entry.store()._db.set_trace_callback(queries.append)  # every statement the index is asked
    again = render_metrics(index, lambda: now)
    assert queries == []

    def runs_series(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if 'run="r1"' in ln]

    assert runs_series(again) == runs_series(first) != []
    with JsonlWriter(run.plan) as w:
        w.write(PlanRevision(revision=3, ts=now, reason="oom", attempt=3))
    index.refresh_all()  # the dashboard indexes the new line: run.db changes
    assert 'steadytune_restarts_total{reason="oom",run="r1"} 3.0' in render_metrics(index, lambda: now)
