"""A supervised run whose streams rotate every few hundred steps reads back as if they never had.

The real supervisor (its tailers, store, detectors and system sampler) over the generated stream
benchmarks/scale.py uses (``_scale_feed.py``: what the guard writes, no model), with the smallest
rotation size: the worker's stream and the supervisor's ``system.jsonl`` are cut into many
compressed segments. ``analyze``, ``replay`` and the dashboard's series must read the run exactly
as they read a copy whose streams were joined back into single files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.records import SystemSample
from steadytune.rundir import RunDir
from steadytune.telemetry import segments
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.api import series
from steadytune.web.runs import RunsIndex

from .runs import finish, run_dir, start_run, steps, write_config

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
STEADYTUNE = str(Path(sys.executable).parent / "steadytune")
STEPS, LIVE = 3000, 60
SPIKE = 777  # the feed's one spiked step below 100,000 (3x the loss)


def _joined(src: Path, dst: Path) -> None:
    """A copy of the run with each stream one plain file again, as if it had never rotated."""
    shutil.copytree(src, dst)
    run = RunDir(dst)
    for live in [*run.telemetry_files(), run.system]:
        data = b""
        for seg in segments.segments(live):
            with segments.open_segment(seg) as f:
                data += f.read()
            seg.path.unlink()
        live.write_bytes(data + live.read_bytes())
    for p in dst.glob("run.db*"):
        p.unlink()


def _cli(*args: str | Path) -> str:
    proc = subprocess.run([STEADYTUNE, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.stdout


def _loss_chart(runs: Path, run_id: str) -> dict:
    index = RunsIndex(runs, cache_dir=runs.parent / f"cache-{runs.name}")
    index.refresh_all()
    entry = index.get(run_id)
    assert entry is not None
    return series(entry, points=1500)["steps"]


def test_a_rotated_run_reads_back_as_one_stream(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = RunDir(runs / "rot").create()
    with JsonlWriter(run.system) as w:  # an adopted run's samples, past the size: the supervisor rotates them
        for i in range(200):
            w.write(
                SystemSample(ts=1.0e9 + 2 * i, cpu_ratio=0.3, ram_used_bytes=1 << 30, ram_total_bytes=8 << 30)
            )
    size = segments.MIN_SEGMENT_BYTES
    proc = subprocess.run(
        [sys.executable, str(BENCH / "_scale_supervisor.py"), str(runs), "rot",
         "--set", "policy.mode=observe", "--set", f"run.telemetry_segment_bytes={size}",
         "--set", "run.sample_interval_s=0.2",
         "--", "--prefill", str(STEPS), "--chunk", "100", "--rate", "50", "--max-live", str(LIVE)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    steps = segments.segments(run.telemetry(0))
    samples = segments.segments(run.system)
    assert len(steps) >= 10 and all(s.compressed for s in steps)
    assert len(samples) >= 1 and all(s.compressed for s in samples)
    assert not any(p.name.endswith(".tmp") for p in run.telemetry_dir.iterdir())

    whole = tmp_path / "whole" / "rot"
    _joined(run.root, whole)
    analyzed = _cli("analyze", run.root, "--format", "json")
    assert analyzed.replace(str(run.root), "RUN") == _cli("analyze", whole, "--format", "json").replace(
        str(whole), "RUN"
    )
    found = json.loads(analyzed)["files"][0]
    assert found["steps"] == STEPS + LIVE
    assert [(a["kind"], a["start_step"]) for a in found["anomalies"]] == [("loss_spike", SPIKE)]
    replayed = _cli("replay", run.root, "--format", "json")
    assert replayed.replace(str(run.root), "RUN") == _cli("replay", whole, "--format", "json").replace(
        str(whole), "RUN"
    )
    assert json.loads(replayed)

    # The dashboard: from the index the supervisor kept, and from one rebuilt out of the segments.
    kept = _loss_chart(runs, "rot")
    for p in run.root.glob("run.db*"):
        p.unlink()
    rebuilt = _loss_chart(runs, "rot")
    for chart in (kept, rebuilt):
        assert chart["total"] == STEPS + LIVE
        assert sum(chart["n"]) == STEPS + LIVE
        loss = chart["columns"]["loss"]
        highs = loss.get("max", loss["min"])
        top = max(range(len(highs)), key=lambda b: highs[b] or 0.0)
        assert chart["first"][top] <= SPIKE <= chart["x"][top]  # the spike is the chart's highest point
    assert rebuilt == kept


def test_a_real_run_rotates_its_worker_stream(tmp_path: Path, demo_assets: Path) -> None:
    """The tiny demo model under `steadytune run`: the worker is told the size and rotates its stream."""
    cfg = write_config(
        tmp_path,
        demo_assets,
        train={"max_steps": 40, "save_steps": 40, "logging_steps": 1},
        run={"telemetry_segment_bytes": segments.MIN_SEGMENT_BYTES},
    )
    rc, out = finish(start_run(cfg, "real"))
    assert rc == 0, out[-3000:]
    run = run_dir(cfg, "real")
    sealed = segments.segments(run.telemetry(0))
    assert len(sealed) >= 1 and all(s.compressed for s in sealed)  # ~25 KB for 40 steps of this model
    assert run.telemetry(0).stat().st_size < segments.MIN_SEGMENT_BYTES
    assert [s.step for s in steps(run)] == list(range(1, 41))
    for p in run.root.glob("run.db*"):
        p.unlink()
    chart = _loss_chart(run.root.parent, "real")
    assert chart["total"] == 40
