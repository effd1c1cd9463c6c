"""Compacting a finished run's ``run.db``: smaller, every spike still charted at every zoom, a crash
at any point leaves an index a reader trusts, and a live run is refused."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steadytune.cli.main import main as cli
from steadytune.records import Event, GpuSample, SystemSample
from steadytune.rundir import RunDir
from steadytune.telemetry.store import RunStore
from steadytune.telemetry.store.compact import (
    STAGES,
    CompactError,
    Keep,
    compact,
    dropped_ranges,
    kept_ranges,
)

from .test_store_levels import DIP, EVERY, SPIKE, STEPS, _extremes, _run

KEEP = Keep(window_steps=50_000, margin_steps=1_000, window_s=3_600.0, margin_s=300.0)
HOT = 1e9 + 2 * 5_000  # a GPU at 99 °C, hours before the newest sample and near no event


def _finished_run(root: Path) -> RunDir:
    run = RunDir(root / "run").create()
    store = _run(run.db)
    store.add_events([Event(ts=float(SPIKE), kind="anomaly", name="loss_spike", severity="warning",
                            step=SPIKE, seq=0)])  # fmt: skip
    store.add_system(
        [SystemSample(ts=1e9 + 2 * i, cpu_ratio=0.5,
                      gpus=(GpuSample(index=0, temperature_c=99.0 if 1e9 + 2 * i == HOT else 60.0),))
         for i in range(20_000)]
    )  # fmt: skip
    store.close()
    run.status.write_text(json.dumps({"state": "completed", "updated_ts": time.time()}))
    return run


def _answers(db: Path) -> list[list[list[float | None]]]:
    """The charts a run page draws at two widths, and the GPU's."""
    with RunStore(db, readonly=True) as store:
        return [
            *(store.step_series(("loss",), points=p).rows for p in (1500, 100)),
            store.gpu_series(0, ("temperature_c",), points=1500).rows,
        ]


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _finished_run(tmp_path_factory.mktemp("compact")).root


def _copy(original: Path, tmp_path: Path) -> RunDir:
    subprocess.run(["cp", "-r", str(original), str(tmp_path / "run")], check=True)
    return RunDir(tmp_path / "run")


def test_kept_and_dropped_ranges() -> None:
    kept = kept_ranges([100, 150, 900], newest=1_000, window=80, margin=30)
    assert kept == [(70, 180), (870, 1_000)]  # 100 and 150 merge; 900's margin meets the window
    assert dropped_ranges(0, 1_000, kept) == [(0, 70), (180, 870)]
    assert dropped_ranges(0, 1_000, [(-5, 2_000)]) == []


def test_compacted_run_is_smaller_and_draws_every_spike(original: Path, tmp_path: Path) -> None:
    run = _copy(original, tmp_path)
    before = _answers(run.db)
    done = compact(run, KEEP)
    assert done.bytes_after < done.bytes_before * 0.6  # a step logged every 40: the summaries weigh most
    assert done.steps_before == STEPS // EVERY and done.steps_after < done.steps_before / 10
    assert done.samples_after < done.samples_before / 5
    assert _answers(run.db) == before  # the whole-run charts read the summaries: unchanged

    store = RunStore(run.db, readonly=True)
    for points in (1500, 100):
        low, high, n, _ = _extremes(store, points)
        assert (low, high, n) == (-5.0, 40.0, STEPS // EVERY)
        # Zoomed into the dip, whose raw steps are gone: drawn from the 64-step buckets, dip and all.
        low, high, _, s = _extremes(store, points, lo=DIP - 5_000, hi=DIP + 5_000)
        assert low == -5.0 and high < 40.0 and s.summarized
        # Zoomed into the spike's margin: raw steps, one a point, as before compaction.
        s = store.step_series(("loss",), points=points, lo=SPIKE - 500, hi=SPIKE + 500)
        assert not s.summarized and max(r[4] for r in s.rows) == 40.0
        assert all(r[0] == r[1] and r[2] == 1 for r in s.rows)
    gpu = store.gpu_series(0, ("temperature_c",), points=1500, lo=HOT - 600, hi=HOT + 600)
    assert gpu.summarized and max(r[4] for r in gpu.rows) == 99.0
    dropped = json.loads(store.get_meta("compacted") or "{}")
    assert any(lo < DIP < hi for lo, hi in dropped["steps"]["0"])
    assert not any(lo < SPIKE < hi for lo, hi in dropped["steps"]["0"])
    assert store.latest_values()["step"] == STEPS - EVERY


def test_an_index_without_summaries_gets_them_before_its_raw_rows_go(original: Path, tmp_path: Path) -> None:
    run = _copy(original, tmp_path)
    before = _answers(run.db)
    with sqlite3.connect(run.db) as old:  # as an older steadytune left it: no summary but the raw rows
        for table in ("steps_coarse", "system_rollup", "system_coarse", "gpu_rollup", "gpu_coarse"):
            old.execute(f"DELETE FROM {table}")
        old.execute("DELETE FROM meta WHERE key IN ('coarse_levels', 'sample_rollup')")
    compact(run, KEEP)
    assert _answers(run.db) == before


def test_a_reader_with_the_old_index_open_keeps_reading_it(original: Path, tmp_path: Path) -> None:
    run = _copy(original, tmp_path)
    reader = RunStore(run.db, readonly=True)
    assert reader.step_count() == STEPS // EVERY
    compact(run, KEEP)
    assert reader.step_count() == STEPS // EVERY  # its file, renamed away, is still whole
    assert _extremes(reader, 100, lo=DIP - 5_000, hi=DIP + 5_000)[0] == -5.0
    assert RunStore(run.db, readonly=True).step_count() < STEPS // EVERY // 10


@pytest.mark.parametrize("stage", STAGES)
def test_a_crash_after_any_stage_leaves_the_old_index_or_the_new(
    original: Path, tmp_path: Path, stage: str
) -> None:
    run = _copy(original, tmp_path)
    before = _answers(run.db)

    def crash(at: str) -> None:
        if at == stage:
            raise KeyboardInterrupt(at)

    with pytest.raises(KeyboardInterrupt):
        compact(run, KEEP, after=crash)
    with sqlite3.connect(run.db) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        compacted = db.execute("SELECT 1 FROM meta WHERE key='compacted'").fetchone() is not None
    assert compacted == (stage == "swapped")
    assert _answers(run.db) == before
    compact(run, KEEP)  # and a compaction run again afterwards finishes it
    assert _answers(run.db) == before and not (run.root / "run.db.compact").exists()


# The child compacts, killed by the test wherever it is (a delay after "go"), or held after a stage (argv[2])
# until the test kills it there: a kill that certainly lands mid-compaction, however slow the test's thread.
KILLED = """
import sys
from pathlib import Path
from steadytune.rundir import RunDir
from steadytune.telemetry.store.compact import Keep, compact

def after(stage):
    if stage == sys.argv[2]:
        print(stage, flush=True)
        sys.stdin.readline()  # held here until killed

print("go", flush=True)
compact(RunDir(Path(sys.argv[1])), Keep(50_000, 1_000, 3_600.0, 300.0), after=after)
print("done", flush=True)
"""


def start_compaction(run: RunDir, held_at: str = "") -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", KILLED, str(run.root), held_at]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"go\n"  # imports done: compacting
    return proc


def assert_trusted_after_the_kill(run: RunDir, before: object) -> None:
    with sqlite3.connect(run.db) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert _answers(run.db) == before
    compact(run, KEEP)
    assert _answers(run.db) == before and not (run.root / "run.db.compact").exists()


@pytest.mark.parametrize("delay_s", [0.0, 0.02, 0.05, 0.1, 0.2])
def test_sigkill_mid_compaction_leaves_an_index_a_reader_trusts(
    original: Path, tmp_path: Path, delay_s: float
) -> None:
    run = _copy(original, tmp_path)
    before = _answers(run.db)
    proc = start_compaction(run)
    assert proc.stdout is not None and proc.stdin is not None
    time.sleep(delay_s)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()
    proc.wait(timeout=60)
    proc.stdin.close()
    # One that ended before the kill (a test's thread slower than the compaction) compacted whole: a child
    # that crashed would test nothing (its RunDir was given a str, and every child died of a TypeError
    # before compacting anything). The held cases below are the kills certain to land mid-compaction.
    assert killed or (proc.returncode == 0 and rest == b"done\n"), (proc.returncode, rest)
    assert_trusted_after_the_kill(run, before)


@pytest.mark.parametrize("stage", STAGES)
def test_sigkill_held_after_any_stage_leaves_an_index_a_reader_trusts(
    original: Path, tmp_path: Path, stage: str
) -> None:
    run = _copy(original, tmp_path)
    before = _answers(run.db)
    proc = start_compaction(run, held_at=stage)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == f"{stage}\n".encode()
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL and proc.stdout.read() == b""
    proc.stdin.close()
    with sqlite3.connect(run.db) as db:
        compacted = db.execute("SELECT 1 FROM meta WHERE key='compacted'").fetchone() is not None
    assert compacted == (stage == "swapped")
    assert_trusted_after_the_kill(run, before)


def test_a_live_run_is_refused_and_the_cli_says_so(
    original: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(original, tmp_path)
    run.status.write_text(json.dumps({"state": "running", "updated_ts": time.time()}))
    size = run.db.stat().st_size
    with pytest.raises(CompactError, match="live"):
        compact(run, KEEP)
    assert cli(["compact", str(run.root)]) == 1
    assert "the run is live" in capsys.readouterr().err and run.db.stat().st_size == size
    run.status.write_text(json.dumps({"state": "running", "updated_ts": time.time() - 60}))  # a dead one
    assert cli(["compact", str(run.root), "--window-steps", "50000"]) == 0
    assert "raw steps 25,000 ->" in capsys.readouterr().out
    assert cli(["compact", str(run.root), "--margin-s", "-1"]) == 2


def test_a_run_in_its_first_seconds_without_status_json_is_refused(original: Path, tmp_path: Path) -> None:
    run = _copy(original, tmp_path)
    run.status.unlink()
    run.events.write_text("")  # the supervisor's run_started, a moment ago
    size = run.db.stat().st_size
    with pytest.raises(CompactError, match=r"no status\.json yet"):
        compact(run, KEEP)
    assert run.db.stat().st_size == size
    # The same files, written a minute before: a supervisor that died before its first status.
    compact(run, KEEP, clock=lambda: time.time() + 60)
    assert run.db.stat().st_size < size


def test_a_missing_path_and_a_folder_of_runs_are_named_as_such(
    original: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["compact", str(tmp_path / "nope")]) == 1
    assert "no such directory" in capsys.readouterr().err
    runs = tmp_path / "runs"
    runs.mkdir()
    _copy(original, runs)
    assert cli(["compact", str(runs)]) == 1
    err = capsys.readouterr().err
    assert "is a folder of runs: give one run" in err and str(runs / "run") in err
