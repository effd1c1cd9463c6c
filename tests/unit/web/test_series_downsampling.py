"""The run page's charts are downsampled on the server: min and max per bucket, so no spike is lost."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import pytest

from steadytune.records import GpuSample, StepRecord, SystemSample
from steadytune.rundir import RunDir
from steadytune.telemetry.store.compact import Keep, compact
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.api import encode, series
from steadytune.web.runs import RunsIndex

N = 30_000  # past the summary buckets' size times the chart's points: the coarse path is taken
SPIKE, DIP = 17_389, 23_011  # single points, inside buckets, not at their edges
SAMPLES = 20_000  # system samples: at 100 points their summary buckets are read, at 1,500 the samples


def _loss(step: int, rng: random.Random) -> float:
    if step == SPIKE:
        return 40.0
    if step == DIP:
        return -5.0
    return 0.6 + 1.8 / (1 + step / 600) + rng.gauss(0, 0.02)


def _column(chart: dict, name: str) -> tuple[list, list]:
    """(min, max) per bucket of one metric of the answer's columns (max left out where it equals min)."""
    col = chart["columns"][name]
    return col["min"], col.get("max", col["min"])


@pytest.mark.parametrize("compacted", [False, True])
@pytest.mark.parametrize("points", [100, 1500])
def test_a_single_step_spike_and_dip_survive_downsampling(
    tmp_path: Path, points: int, compacted: bool
) -> None:
    run = RunDir(tmp_path / "runs" / "long").create()
    rng = random.Random(3)
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(N):
            w.write(StepRecord(step=s, ts=1000.0 + s, loss=_loss(s, rng)))
    with JsonlWriter(run.system) as w:
        for i in range(SAMPLES):  # one sample (every 2 s, ~11 hours) whose GPU ran hot
            g = GpuSample(index=0, name="gpu", util_ratio=0.5, temperature_c=95.0 if i == 13_131 else 60.0)
            w.write(SystemSample(ts=1000.0 + 2 * i, cpu_ratio=0.9 if i == 7_007 else 0.2, ram_used_bytes=1,
                                 ram_total_bytes=2, gpus=(g,)))  # fmt: skip
    index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
    index.refresh_all()
    if compacted:  # the run over, its raw steps and samples dropped but the newest few: the same charts
        run.status.write_text(json.dumps({"state": "completed", "updated_ts": time.time()}))
        done = compact(run, Keep(window_steps=1_000, margin_steps=100, window_s=600.0, margin_s=60.0))
        assert done.steps_after <= 1_001 and done.samples_after <= 301
        index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
        index.refresh_all()
    entry = index.get("long")
    assert entry is not None

    charts = series(entry, points=points)
    assert json.loads(encode(charts)) == charts  # as the page gets it
    steps = charts["steps"]
    assert steps["total"] == N and len(steps["x"]) <= points  # the page gets a chart, not the run
    assert steps["summarized"] == compacted
    lows, highs = _column(steps, "loss")
    assert max(h for h in highs if h is not None) == 40.0
    assert min(lo for lo in lows if lo is not None) == -5.0
    first, last = next((a, b) for a, b in zip(steps["first"], steps["x"], strict=True) if a <= SPIKE <= b)
    assert first < SPIKE < last  # the spike was one point among many in its bucket
    assert sum(steps["n"]) == N  # every step counted in one bucket
    assert steps["columns"]["eval_loss"] is None  # no value: no column of gaps

    gpu = charts["gpus"]["0"]
    assert len(gpu["x"]) <= points
    _, temps = _column(gpu, "temperature_c")
    assert max(t for t in temps if t is not None) == 95.0
    system = charts["system"]
    assert len(system["x"]) <= points and sum(system["n"]) == SAMPLES
    _, cpu = _column(system, "cpu_ratio")
    assert max(c for c in cpu if c is not None) == 0.9
    loss = steps["columns"]["loss"]
    assert not any(
        isinstance(v, float) and math.isnan(v) for col in loss.values() for v in col if v is not None
    )


def test_only_the_gpus_asked_for_are_charted_and_their_spikes_kept(tmp_path: Path) -> None:
    # The run page draws one GPU: on an 8-GPU run the seven others were most of the answer.
    run = RunDir(tmp_path / "runs" / "gpus").create()
    with JsonlWriter(run.system) as w:
        for i in range(SAMPLES):
            hot = 97.0 if i == 9_999 else 61.0
            gpus = tuple(
                GpuSample(index=g, util_ratio=0.5, temperature_c=hot if g == 2 else 60.0) for g in range(4)
            )
            w.write(SystemSample(ts=1000.0 + 2 * i, cpu_ratio=0.2, gpus=gpus))
    index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
    index.refresh_all()
    entry = index.get("gpus")
    assert entry is not None

    every = series(entry, points=300)
    assert sorted(every["gpus"]) == ["0", "1", "2", "3"] and every["gpu_indices"] == [0, 1, 2, 3]
    asked = series(entry, points=300, gpus=[2, 7])  # 7: never sampled, left out rather than empty
    assert list(asked["gpus"]) == ["2"] and asked["gpu_indices"] == [0, 1, 2, 3]
    chart = asked["gpus"]["2"]
    assert len(chart["x"]) <= 300 and chart == every["gpus"]["2"]
    _, temps = _column(chart, "temperature_c")
    assert max(t for t in temps if t is not None) == 97.0
    assert series(entry, points=300, gpus=[])["gpus"] == {}
