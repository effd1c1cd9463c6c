"""A FIFO or a device where a run's file belongs never hangs the dashboard or a command.

Whoever can write a run folder can ``mkfifo status.json`` (opening it for reading waits for a
writer for good) or link ``events.jsonl`` to ``/dev/zero`` (a read that never ends). Each test
puts the real thing in a real run folder and asks the real server, or runs the real command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.web.test_server_robustness import get as robust_get

from steadytune.records import StepRecord, WorkerExit
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter
from steadytune.web.server import DashboardHandle, start_dashboard

REPO = Path(__file__).resolve().parents[3]
BOUND_S = 20  # a backstop: each answer comes at once; without the fix none ever came


def good_run(runs: Path, run_id: str) -> RunDir:
    run = RunDir(runs / run_id).create()
    log = EventLog(run.events, run_id=run_id)
    log.emit("lifecycle", "started", "run started")
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(4):
            w.write(StepRecord(step=s, ts=11.0 + s, loss=2.0 - s / 10))
        w.write(WorkerExit(ts=20.0, step=3))
    log.emit("lifecycle", "completed", "run completed")
    status = {"run_id": run_id, "state": "completed", "step": 3, "max_steps": 4, "updated_ts": 1000.0}
    atomic_write_text(run.status, json.dumps(status))
    return run


def fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Path]:
    """A runs folder of one good run and one run for each special file; a reader left waiting on a
    FIFO (the bug) is let go at the end, so a failing test fails instead of hanging."""
    runs = tmp_path / "runs"
    good_run(runs, "good")
    fifos = [fifo(good_run(runs, "fifo-status").status), fifo(good_run(runs, "fifo-events").events)]
    zero = good_run(runs, "zero-events")
    zero.events.unlink()
    zero.events.symlink_to("/dev/zero")
    ckpt = good_run(runs, "fifo-manifest").checkpoints / "checkpoint-200"
    ckpt.mkdir()
    fifos.append(fifo(ckpt / "MANIFEST.json"))
    yield runs
    for f in fifos:
        for _ in range(8):
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                break  # ENXIO: no reader waits on it


@pytest.fixture
def dashboard(runs: Path) -> Iterator[DashboardHandle]:
    handle = start_dashboard(runs, host="127.0.0.1", port=0, poll_s=0.05)
    yield handle
    handle.stop()


def get(handle: DashboardHandle, path: str) -> tuple[int, bytes]:
    return robust_get(handle, path, timeout=BOUND_S)


def test_the_overview_routes_answer_with_special_files_in_the_runs_folder(dashboard: DashboardHandle) -> None:
    for _ in range(3):  # more requests than one: each stuck one used to hold a thread for good
        assert get(dashboard, "/healthz")[0] == 200
        status, body = get(dashboard, "/api/runs")
        assert status == 200
        rows = {r["run_id"]: r for r in json.loads(body)}
        assert rows["good"]["state"] == "completed"
        assert set(rows) >= {"good", "fifo-status", "fifo-events", "zero-events", "fifo-manifest"}
        assert get(dashboard, "/metrics")[0] == 200
        assert get(dashboard, "/api/goodput")[0] == 200


@pytest.mark.parametrize(
    ("run_id", "what"), [("fifo-events", "a FIFO"), ("zero-events", "a character device")]
)
def test_a_run_whose_event_log_is_special_answers_an_error_naming_it(
    dashboard: DashboardHandle, run_id: str, what: str
) -> None:
    status, body = get(dashboard, f"/api/runs/{run_id}")
    assert status == 500
    assert json.loads(body)["error"].startswith(f"{run_id}/events.jsonl is {what}")
    assert get(dashboard, "/api/runs/good")[0] == 200


def test_a_fifo_manifest_leaves_its_checkpoint_unverified(dashboard: DashboardHandle) -> None:
    status, body = get(dashboard, "/api/runs/fifo-manifest")
    assert status == 200
    (ckpt,) = json.loads(body)["checkpoints"]["items"]
    assert ckpt["name"] == "checkpoint-200" and not ckpt["verified"]


def command(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", "steadytune.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=BOUND_S * 3,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "special"),
    [
        (["replay", "{runs}/fifo-events"], "fifo-events/events.jsonl: a FIFO"),
        (["replay", "{runs}/zero-events"], "zero-events/events.jsonl: a character device"),
        (["goodput", "{runs}/fifo-events"], "fifo-events/events.jsonl: a FIFO"),
        (["analyze", "{runs}/fifo-status/status.json"], "fifo-status/status.json: a FIFO"),
    ],
)
def test_a_command_given_a_special_file_ends_with_an_error_naming_it(
    runs: Path, argv: list[str], special: str
) -> None:
    done = command(*(a.format(runs=runs) for a in argv))
    assert done.returncode == 1, done.stderr
    assert special in done.stderr and "Traceback" not in done.stderr


def test_goodput_and_top_read_past_a_fifo_status(runs: Path) -> None:
    assert command("goodput", str(runs / "fifo-status")).returncode == 0
    assert command("top", "--once", str(runs)).returncode == 0
