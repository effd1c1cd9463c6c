"""A finished run's summary, /metrics samples and goodput account are kept beside the run, so the
next dashboard answers from them instead of reading every line of the run's telemetry again."""

from __future__ import annotations

import json
import os
from pathlib import Path

from steadytune.records import Heartbeat, StepRecord
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.api import runs_list
from steadytune.web.goodput import runs_payload
from steadytune.web.metrics import render_metrics
from steadytune.web.runs import RunsIndex
from steadytune.web.stored import NAME

NOW = 1_800_000_000.0
STEPS = 50


def _finished_run(root: Path) -> RunDir:
    run = RunDir(root / "runs" / "done").create()
    with JsonlWriter(run.telemetry(0)) as w:
        w.write(Heartbeat(ts=NOW - 100.0, phase="train"))
        for s in range(STEPS):
            w.write(StepRecord(step=s, ts=NOW - 99.0 + s, loss=2.0 - s / 100, step_time_s=1.0, tokens=100))
    status = {"run_id": "done", "state": "completed", "step": STEPS - 1, "max_steps": STEPS,
              "updated_ts": NOW - 40.0, "started_ts": NOW - 100.0}  # fmt: skip
    atomic_write_text(run.status, json.dumps(status))
    return run


def _dashboard(root: Path, refresh: bool = True) -> RunsIndex:
    index = RunsIndex(root / "runs", clock=lambda: NOW, cache_dir=root / "cache")
    if refresh:
        index.refresh_all()
    return index


def _scramble_behind_its_stamp(path: Path) -> None:
    """Rewrite ``path`` as unreadable lines of the same size and mtime: only a reader sees it changed."""
    st = path.stat()
    path.write_bytes(b"x" * (st.st_size - 1) + b"\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _answers(index: RunsIndex) -> tuple[list[str], list[dict], list[dict]]:
    metrics = [ln for ln in render_metrics(index, lambda: NOW).splitlines() if 'run="done"' in ln]
    return metrics, runs_list(index), runs_payload(index)[0]


def test_the_next_dashboard_answers_from_the_stored_summary_without_reading_the_telemetry(
    tmp_path: Path,
) -> None:
    run = _finished_run(tmp_path)
    first = _dashboard(tmp_path)
    before = _answers(first)
    first.close()
    assert (run.root / NAME).is_file()
    assert any(ln.startswith('steadytune_goodput_ratio{run="done"}') for ln in before[0])
    assert before[2][0]["steps_kept"] == STEPS

    # Were the telemetry read again, no step would be found in it: no loss, no steps kept.
    _scramble_behind_its_stamp(run.telemetry(0))
    second = _dashboard(tmp_path, refresh=False)  # its first scrape, before any indexing
    assert _answers(second) == before
    second.close()


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    run = _finished_run(tmp_path)
    first = _dashboard(tmp_path)
    _answers(first)
    first.close()
    with JsonlWriter(run.telemetry(0)) as w:  # the run went on: its stamp moved
        w.write(StepRecord(step=STEPS, ts=NOW - 45.0, loss=0.5, step_time_s=1.0, tokens=100))
    second = _dashboard(tmp_path)
    metrics, _, accounts = _answers(second)
    assert 'steadytune_loss{run="done"} 0.5' in metrics
    assert accounts[0]["steps_kept"] == STEPS + 1
    second.close()


def test_a_stored_summary_of_another_version_is_not_used(tmp_path: Path) -> None:
    run = _finished_run(tmp_path)
    first = _dashboard(tmp_path)
    before = _answers(first)
    first.close()
    path = run.root / NAME
    data = json.loads(path.read_text())
    data["steadytune"] = "0.0.0-other"
    for kept in data["values"].values():
        kept["value"] = None  # what this version could not read
    path.write_text(json.dumps(data))
    second = _dashboard(tmp_path)
    assert _answers(second) == before
    assert json.loads(path.read_text())["values"]["metrics"]["value"] is not None  # written again
    second.close()


def test_a_live_run_is_not_stored(tmp_path: Path) -> None:
    run = _finished_run(tmp_path)
    status = json.loads(run.status.read_text())
    atomic_write_text(run.status, json.dumps({**status, "state": "running", "updated_ts": NOW - 1.0}))
    index = _dashboard(tmp_path)
    _answers(index)
    index.close()
    assert not (run.root / NAME).exists()
