"""A run whose index outgrew ``run.compact_index_bytes`` is compacted by its own supervisor at its end.

The real supervisor (its tailers, store, detectors and sampler) over the generated stream
benchmarks/scale.py uses (``_scale_feed.py``: what the guard writes, no model). With the limit at
one byte every run is past it; with the default (256 MiB) a short run is left whole.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.rundir import RunDir
from steadytune.web.api import series
from steadytune.web.runs import RunsIndex

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
LIVE = 40
SPIKE = 777  # the feed's one spiked step below 100,000 (3x the loss)


def _supervised(runs: Path, run_id: str, prefill: int, *sets: str) -> RunDir:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "_scale_supervisor.py"), str(runs), run_id,
         "--set", "policy.mode=observe", "--set", "run.sample_interval_s=0.2", *sets,
         "--", "--prefill", str(prefill), "--chunk", "500", "--rate", "50", "--max-live", str(LIVE)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return RunDir(runs / run_id)


def _meta(run: RunDir) -> dict[str, str]:
    db = sqlite3.connect(f"file:{run.db}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT key, value FROM meta").fetchall())
    finally:
        db.close()


def _raw_steps(run: RunDir) -> list[int]:
    db = sqlite3.connect(f"file:{run.db}?mode=ro", uri=True)
    try:
        return [r[0] for r in db.execute("SELECT step FROM steps ORDER BY step")]
    finally:
        db.close()


def test_a_run_past_the_limit_is_compacted_at_its_end_and_its_charts_still_show_it(tmp_path: Path) -> None:
    runs, steps = tmp_path / "runs", 12_000
    run = _supervised(runs, "big", steps, "--set", "run.compact_index_bytes=1")
    total = steps + LIVE
    compacted = json.loads(_meta(run)["compacted"])
    # The newest 10,000 steps and 1,000 either side of the spike's events are kept raw; between them,
    # only the summaries.
    dropped = compacted["steps"]["0"]
    assert dropped and all(lo >= SPIKE + 1000 and hi <= total - 10_000 for lo, hi in dropped), dropped
    raw = set(_raw_steps(run))
    assert SPIKE in raw and total in raw
    assert not any(lo < s < hi for s in raw for lo, hi in dropped)
    assert run.db.with_name("run.db.compact").exists() is False

    index = RunsIndex(runs, cache_dir=tmp_path / "cache")
    index.refresh_all()
    entry = index.get("big")
    assert entry is not None
    chart = series(entry, points=1500)["steps"]
    assert chart["total"] == total and sum(chart["n"]) == total  # every step still counted
    highs = chart["columns"]["loss"].get("max", chart["columns"]["loss"]["min"])
    top = max(range(len(highs)), key=lambda b: highs[b] or 0.0)
    assert chart["first"][top] <= SPIKE <= chart["x"][top]  # the spike is still the chart's highest point
    # A zoom into a dropped range is answered from the summaries, and says so.
    lo, hi = dropped[0]
    zoom = series(entry, points=50, lo=lo + 10, hi=hi - 10)["steps"]
    assert zoom["summarized"] is True and sum(zoom["n"]) > 0


def test_a_run_under_the_limit_keeps_every_raw_row(tmp_path: Path) -> None:
    runs, steps = tmp_path / "runs", 3_000
    run = _supervised(runs, "small", steps)  # the default limit: 256 MiB
    assert "compacted" not in _meta(run)
    assert _raw_steps(run) == list(range(1, steps + LIVE + 1))
