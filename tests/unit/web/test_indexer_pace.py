"""The background indexer looks at a run whose files stand still less and less often, and at every
pass again once they move: a thousand finished runs must not cost the dashboard a core."""

from __future__ import annotations

from pathlib import Path

from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.runs import QUIET_MAX_S, RunsIndex


def _steps(run: RunDir, lo: int, hi: int) -> None:
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(lo, hi):
            w.write(StepRecord(step=s, ts=1000.0 + s, loss=1.0))


def test_a_quiet_run_is_looked_at_less_often_and_a_moving_one_at_once(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "watched").create()
    _steps(run, 0, 5)
    index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
    entry = index.get("watched")
    assert entry is not None
    t = 0.0
    waits = []
    for _ in range(8):  # each pass at the moment the run is due again
        index.refresh_due(lambda at=t: at)
        waits.append(entry.refresh_wait)
        t = entry.next_refresh
    assert entry.store().step_count() == 5
    assert waits == [0.0, 0.2, 0.4, 0.8, 1.6, QUIET_MAX_S, QUIET_MAX_S, QUIET_MAX_S]

    _steps(run, 5, 9)  # the run moves while the indexer waits
    index.refresh_due(lambda: t - 0.1)  # not due yet: not looked at
    assert entry.store().step_count() == 5
    index.refresh_due(lambda: t)
    assert entry.store().step_count() == 9 and entry.refresh_wait == 0.0  # looked at every pass again
    index.close()
