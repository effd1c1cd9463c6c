"""The daemon loop on fake GPU readings and real processes (a stand-in job that waits for a gate file)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from steadytune.server.daemon import Daemon, ServerPaths
from steadytune.server.jobs import ProcessTable, run_id
from steadytune.server.ledger import GIB, GpuReading
from steadytune.server.queue import JobQueue, QueueError

# Writes the run's status.json as a supervisor would, then waits for the gate and ends as told.
JOB = """
import json, os, pathlib, sys, time
run, gate = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
run.mkdir(parents=True, exist_ok=True)
def status(state):
    tmp = run / "status.tmp"
    tmp.write_text(json.dumps({"state": state, "supervisor_pid": os.getpid(),
                               "gpus": os.environ["CUDA_VISIBLE_DEVICES"]}))
    os.replace(tmp, run / "status.json")
status("running")
while not gate.exists():
    time.sleep(0.02)
status(gate.read_text() or "completed")
"""


def make(tmp_path: Path, readings: list[GpuReading]) -> Daemon:
    paths = ServerPaths(tmp_path / "server", tmp_path / "runs")
    gate_dir = tmp_path / "gates"
    gate_dir.mkdir(exist_ok=True)

    def command(job, runs_dir):
        return [sys.executable, "-c", JOB, str(runs_dir / run_id(job)), str(gate_dir / job.id)]

    return Daemon(JobQueue(paths.queue), paths, lambda: tuple(readings), command=command)


def submit(d: Daemon, need_gib: float, gpus: int = 1, priority: int = 0) -> str:
    spec = {"kind": "supervise", "cmd": ["stand-in"], "label": "t", "cwd": str(d.paths.root.parent)}
    return d.queue.submit(spec, int(need_gib * GIB), "user", gpus=gpus, priority=priority).id


def wait_for(pred, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.05)


def status(d: Daemon, jid: str) -> dict:
    path = Path(d.queue.get(jid).run_dir) / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def open_gate(tmp_path: Path, jid: str, end: str = "completed") -> None:
    (tmp_path / "gates" / jid).write_text(end)


def test_two_jobs_share_a_gpu_the_third_waits_then_starts(tmp_path: Path):
    d = make(tmp_path, [GpuReading(0, 80 * GIB, 2 * GIB, "fake"), GpuReading(1, 80 * GIB, 75 * GIB, "fake")])
    a, b, c = submit(d, 30), submit(d, 30), submit(d, 30)
    d.tick()
    assert [d.queue.get(j).state for j in (a, b, c)] == ["running", "running", "queued"]
    assert d.queue.get(a).gpus == (0,) and d.queue.get(b).gpus == (0,)
    assert "waits for room" in d.queue.get(c).reason
    assert d.ledger[0].reserved_bytes == 60 * GIB and set(d.ledger[0].jobs) == {a, b}
    wait_for(lambda: status(d, a).get("state") == "running")
    assert status(d, a)["gpus"] == "0"  # placed through CUDA_VISIBLE_DEVICES
    open_gate(tmp_path, a)
    wait_for(lambda: (d.tick(), d.queue.get(a).state)[1] == "done")
    assert d.queue.get(c).state == "running"  # a's reservation was returned
    open_gate(tmp_path, b, "failed")
    open_gate(tmp_path, c)
    wait_for(lambda: (d.tick(), d.queue.get(c).state)[1] == "done")
    wait_for(lambda: (d.tick(), d.queue.get(b).state)[1] == "failed")
    assert "run ended failed" in d.queue.get(b).reason


def test_a_restarted_daemon_adopts_running_jobs_and_requeues_unstarted_ones(tmp_path: Path):
    d = make(tmp_path, [GpuReading(0, 80 * GIB, 0, "fake")])
    a, b = submit(d, 10), submit(d, 10)
    d.tick()
    wait_for(lambda: status(d, a).get("state") == "running" and status(d, b).get("state") == "running")
    # A third job was admitted when the daemon died, before its process started.
    c = submit(d, 10)
    assert d.queue.move(c, "admitted", gpus=[0], run_dir=str(tmp_path / "runs" / "never"))
    d.queue.close()

    again = make(tmp_path, [GpuReading(0, 80 * GIB, 0, "fake")])
    assert again.adopt() == [a, b]
    assert again.queue.get(a).reason == "adopted after a server restart"
    assert again.queue.get(c).state == "queued" and again.queue.get(c).gpus == ()
    open_gate(tmp_path, a)
    open_gate(tmp_path, b)
    wait_for(lambda: (again.tick(), again.queue.get(b).state)[1] == "done")
    wait_for(lambda: (again.tick(), again.queue.get(a).state)[1] == "done")


def test_a_job_that_ended_while_the_daemon_was_down_is_settled_from_its_run(tmp_path: Path):
    d = make(tmp_path, [GpuReading(0, 80 * GIB, 0, "fake")])
    a = submit(d, 10)
    d.tick()
    open_gate(tmp_path, a)
    wait_for(lambda: status(d, a).get("state") == "completed")
    d._handles[a].wait()  # the daemon is "down": nobody watches it end
    again = make(tmp_path, [GpuReading(0, 80 * GIB, 0, "fake")])
    assert again.adopt() == []
    assert again.queue.get(a).state == "done"


def test_cancel_hold_release(tmp_path: Path):
    d = make(tmp_path, [GpuReading(0, 20 * GIB, 0, "fake")])
    running, waiting = submit(d, 15), submit(d, 15)
    d.tick()
    assert d.act("hold", waiting).state == "held"
    with pytest.raises(QueueError, match=r"only a queued job can be held.*steadytune pause"):
        d.act("hold", running)
    with pytest.raises(QueueError, match="only a held job can be released"):
        d.act("release", running)
    assert d.act("release", waiting).state == "queued"
    assert d.act("cancel", waiting).state == "cancelled"
    with pytest.raises(QueueError, match="no job 'j9'"):
        d.act("cancel", "j9")
    # A running job is asked to stop (SIGTERM to its supervisor) and is cancelled once it has ended.
    assert d.act("cancel", running).cancel_requested
    wait_for(lambda: (d.tick(), d.queue.get(running).state)[1] == "cancelled")


def test_process_table_tells_a_reused_pid_from_the_job(tmp_path: Path):
    procs = ProcessTable()
    started = procs.start(
        [sys.executable, "-c", "import time; time.sleep(30)"], {}, str(tmp_path), tmp_path / "l"
    )
    try:
        assert procs.alive(started.pid, started.started)
        assert not procs.alive(started.pid, started.started - 100)  # another process under the same pid
    finally:
        started.handle.kill()
        started.handle.wait()
    assert not procs.alive(started.pid, started.started)
