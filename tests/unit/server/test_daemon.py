"""The daemon loop on fake GPU readings and real processes (a stand-in job that waits for a gate file)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from steadytune.records import Event
from steadytune.server.daemon import Daemon, ServerPaths
from steadytune.server.jobs import ProcessTable, run_id
from steadytune.server.ledger import GIB, GpuReading
from steadytune.server.queue import JobQueue, QueueError
from steadytune.telemetry.events import EventLog
from tests.waiting import wait_for

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
# A supervisor still starting (imports, preflight): it writes no run status before its gate opens.
STARTING = """
import pathlib, sys, time
gate = pathlib.Path(sys.argv[2])
while not gate.exists():
    time.sleep(0.02)
"""
# A supervisor that started its worker (in a session of its own, as a real one does) and says so.
WITH_WORKER = """
import json, os, pathlib, subprocess, sys, time
run = pathlib.Path(sys.argv[1])
run.mkdir(parents=True, exist_ok=True)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
tmp = run / "status.tmp"
tmp.write_text(json.dumps({"state": "running", "supervisor_pid": os.getpid(), "worker_pid": worker.pid}))
os.replace(tmp, run / "status.json")
time.sleep(120)
"""
_GATES: list[Path] = []


@pytest.fixture(autouse=True)
def _stand_ins_end_with_their_test():
    """A stand-in job a test left waiting (one it never opened the gate of) ends with the test."""
    yield
    for gate in _GATES:
        if not gate.exists():
            gate.write_text("cancelled")
    _GATES.clear()


def make(tmp_path: Path, readings: list[GpuReading], script: str = JOB) -> Daemon:
    paths = ServerPaths(tmp_path / "server", tmp_path / "runs")
    gate_dir = tmp_path / "gates"
    gate_dir.mkdir(exist_ok=True)

    def command(job, runs_dir):
        _GATES.append(gate_dir / job.id)
        return [sys.executable, "-c", script, str(runs_dir / run_id(job)), str(gate_dir / job.id)]

    return Daemon(JobQueue(paths.queue), paths, lambda: tuple(readings), command=command)


def submit(d: Daemon, need_gib: float, gpus: int = 1, priority: int = 0) -> str:
    spec = {"kind": "supervise", "cmd": ["stand-in"], "label": "t", "cwd": str(d.paths.root.parent)}
    return d.queue.submit(spec, int(need_gib * GIB), "user", gpus=gpus, priority=priority).id


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


def test_a_job_whose_supervisor_was_killed_says_so_and_names_its_worker_left_running(tmp_path: Path):
    # It read "run ended running": the state its supervisor last wrote, taken for how the run ended.
    d = make(tmp_path, [GpuReading(0, 80 * GIB, 0, "fake")], script=WITH_WORKER)
    a = submit(d, 10)
    d.tick()
    wait_for(lambda: status(d, a).get("worker_pid") is not None)
    supervisor, worker = d.queue.get(a).pid, status(d, a)["worker_pid"]
    try:
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: (d.tick(), d.queue.get(a).state)[1] == "failed")
        reason = d.queue.get(a).reason
        assert f"its supervisor (pid {supervisor}) died while its run was running" in reason
        assert f"its worker (pid {worker}) still runs: stop it (kill {worker})" in reason
        assert "run ended running" not in reason
    finally:
        os.kill(worker, signal.SIGKILL)


def test_a_failed_job_says_why_its_run_failed(tmp_path: Path):
    # It said only "run ended failed; see LOG": the reason was in the run's events, one step away.
    d = make(tmp_path, [GpuReading(0, 80 * GIB, 0, "fake")])
    a = submit(d, 10)
    d.tick()
    wait_for(lambda: status(d, a).get("state") == "running")
    why = "the worker exited with code 3 before the first step of the attempt"
    end = Event(
        ts=1.0, kind="lifecycle", name="run_failed", severity="critical", message=f"run failed: {why}"
    )
    EventLog(Path(d.queue.get(a).run_dir) / "events.jsonl", run_id="t").append(end)
    open_gate(tmp_path, a, "failed")
    wait_for(lambda: (d.tick(), d.queue.get(a).state)[1] == "failed")
    reason = d.queue.get(a).reason
    assert reason.startswith("run ended failed: the worker exited with code 3 before the first step")
    assert str(d.paths.log(a)) in reason


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
    # Its stand-in writes no status before the stop: stopped while starting, whenever the stop comes.
    d = make(tmp_path, [GpuReading(0, 20 * GIB, 0, "fake")], script=STARTING)
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
    # Its run wrote no status: stopped while starting, which is what the reason says.
    assert d.queue.get(running).reason == "cancelled (while starting: its run had written no status yet)"


def test_a_running_job_cancelled_says_what_its_run_said_last(tmp_path: Path):
    d = make(tmp_path, [GpuReading(0, 20 * GIB, 0, "fake")])
    running = submit(d, 15)
    d.tick()
    wait_for(lambda: status(d, running).get("state") == "running")  # past its start: it has a status
    assert d.act("cancel", running).cancel_requested
    wait_for(lambda: (d.tick(), d.queue.get(running).state)[1] == "cancelled")
    assert d.queue.get(running).reason == "cancelled (run running)"


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


def test_a_grow_is_reserved_on_a_gpu_with_room_or_refused_with_the_reason_and_a_shrink_releases(
    tmp_path: Path,
):
    readings = [
        GpuReading(0, 24 * GIB, 0, "fake"),
        GpuReading(1, 24 * GIB, 0, "fake"),
        GpuReading(2, 24 * GIB, 20 * GIB, "fake"),
    ]
    d = make(tmp_path, readings)
    a = submit(d, 10)
    d.tick()
    assert d.queue.get(a).gpus == (0,)
    grown = d.resize(a, 2, "GPU util 95% > 85%")
    assert grown.gpus == (0, 1)  # its own first, then the roomiest that fits; GPU 2 has 3 GiB left
    assert d.ledger[1].reserved_bytes == 10 * GIB and a in d.ledger[1].jobs
    b = submit(d, 10)
    d.tick()
    assert d.queue.get(b).gpus == (0,) or d.queue.get(b).gpus == (1,)
    with pytest.raises(
        QueueError, match=r"no room to grow j1 by 1 GPU\(s\): it needs 10.0 GiB on each.*GPU 2 3.0 GiB"
    ):
        d.resize(a, 3, "busy")
    assert d.queue.get(a).gpus == (0, 1)
    shrunk = d.resize(a, 1, "GPU util 10% < 30%")
    assert shrunk.gpus == (0,) and a not in d.ledger[1].jobs and shrunk.reason == "running on GPU 0"
    assert [(h["kind"], h["from"], h.get("to")) for h in shrunk.history] == [
        ("grow", [0], [0, 1]),
        ("grow_refused", [0, 1], None),
        ("shrink", [0, 1], [0]),
    ]
    with pytest.raises(QueueError, match="only a running job can resize"):
        d.resize("j9", 2)


def test_a_grow_does_not_jump_a_higher_priority_job_waiting_for_room(tmp_path: Path):
    d = make(tmp_path, [GpuReading(0, 24 * GIB, 0, "fake"), GpuReading(1, 24 * GIB, 0, "fake")])
    a = submit(d, 10)
    d.tick()
    submit(d, 30, gpus=1, priority=5)  # never fits, but does not hold the line...
    big = submit(d, 20, gpus=2, priority=5)  # ...this one waits for room on both
    d.tick()
    assert d.queue.get(big).state == "queued"
    with pytest.raises(QueueError, match=rf"no grow for {a}: j2 \(priority 5\) waits for room first"):
        d.resize(a, 2, "busy")


def test_memory_pressure_pauses_the_lower_priority_job_and_resumes_it_when_room_returns(tmp_path: Path):
    from steadytune.protocol import request_names
    from steadytune.rundir import RunDir

    readings = [GpuReading(0, 24 * GIB, 2 * GIB, "fake")]
    d = make(tmp_path, readings)
    hi, lo = submit(d, 8, priority=5), submit(d, 8)
    d.tick()
    wait_for(lambda: status(d, lo).get("state") == "running")
    readings[0] = GpuReading(0, 24 * GIB, int(23.4 * GIB), "fake")  # hi's use rises
    d.tick()
    job = d.queue.get(lo)
    assert job.paused and "GPU 0 has 0.6 GiB free < 1.0 GiB" in job.paused and not d.queue.get(hi).paused
    control = RunDir(Path(job.run_dir)).control
    [name] = request_names(control)
    req = json.loads((control / name).read_text())
    assert (req["command"], req["args"], req["issuer"]) == (
        "pause",
        {"mode": "release"},
        "steadytune server (memory pressure)",
    )
    d.tick()
    assert len(request_names(control)) == 1  # asked once, and nobody else is paused meanwhile
    readings[0] = GpuReading(0, 24 * GIB, 4 * GIB, "fake")  # room again, but its run has not paused yet
    d.tick()
    assert d.queue.get(lo).paused and len(request_names(control)) == 1
    run = Path(job.run_dir)
    (run / "status.tmp").write_text(json.dumps({"state": "paused", "supervisor_pid": job.pid}))
    (run / "status.tmp").replace(run / "status.json")
    d.tick()
    job = d.queue.get(lo)
    assert job.paused is None and [h["kind"] for h in job.history] == ["pause", "resume"]
    names = request_names(control)
    assert json.loads((control / names[-1]).read_text())["command"] == "resume"
    for j in (hi, lo):
        open_gate(tmp_path, j)


def test_under_pressure_a_job_that_may_shrink_is_asked_to_and_paused_if_it_does_not(tmp_path: Path):
    readings = [GpuReading(0, 24 * GIB, 0, "fake"), GpuReading(1, 24 * GIB, 0, "fake")]
    d = make(tmp_path, readings)
    now = [1000.0]
    d.clock = lambda: now[0]
    hi = submit(d, 8, priority=5)
    spec = {"kind": "supervise", "cmd": ["stand-in"], "label": "t", "cwd": str(tmp_path), "scale_min_gpus": 1}
    lo = d.queue.submit(spec, 8 * GIB, "user", gpus=2).id
    d.tick()
    assert d.queue.get(hi).gpus == (0,) and d.queue.get(lo).gpus == (0, 1)
    readings[0] = GpuReading(0, 24 * GIB, int(23.5 * GIB), "fake")
    d.tick()
    job = d.queue.get(lo)
    assert job.shrink_to == (1,) and job.paused is None  # off GPU 0, the one under pressure
    assert job.history[-1]["kind"] == "shrink_asked" and job.history[-1]["to"] == [1]
    # Its supervisor shrinks onto what the server asked to keep, which clears the request.
    shrunk = d.resize(lo, 1, "the server asks for room")
    assert shrunk.gpus == (1,) and shrunk.shrink_to is None and lo not in d.ledger[0].jobs
    # Asked again (another pressure) and never taken up: after the wait it is paused instead.
    d.queue.record(lo, {"kind": "shrink_asked"}, shrink_to=(1,))
    d.tick()
    now[0] += 121
    d.tick()
    job = d.queue.get(lo)
    assert job.shrink_to is None and job.history[-1]["kind"] == "shrink_refused"
    for j in (hi, lo):
        open_gate(tmp_path, j)


def test_process_trees_from_one_reading_match_each_tree_asked_alone(tmp_path: Path):
    procs = ProcessTable()
    # A job whose process starts a child that starts a grandchild, as a supervisor starts torchrun's ranks.
    script = tmp_path / "nest.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "if int(sys.argv[1]):\n"
        "    subprocess.Popen([sys.executable, __file__, str(int(sys.argv[1]) - 1)])\n"
        "time.sleep(30)\n"
    )
    jobs = [
        procs.start([sys.executable, str(script), "2"], {}, str(tmp_path), tmp_path / f"l{i}")
        for i in range(2)
    ]
    try:
        wait_for(lambda: all(len(procs.tree(j.pid)) == 3 for j in jobs))
        gone = 2**22 + 17  # above the kernel's pid_max: no such process
        trees = procs.trees([j.pid for j in jobs] + [gone])
        assert trees == {**{j.pid: procs.tree(j.pid) for j in jobs}, gone: set()}
        assert procs.trees([]) == {}
    finally:
        for j in jobs:
            procs.signal(j.pid, 9, group=True)
            j.handle.wait()


def test_a_pass_with_many_waiting_jobs_says_each_reason_once_and_then_writes_nothing(tmp_path: Path):
    d = make(tmp_path, [GpuReading(0, 24 * GIB, 0, "fake")])
    first = submit(d, 20)
    behind = [submit(d, 20) for _ in range(50)]
    d.tick()
    assert d.queue.get(first).state == "running"
    assert d.queue.get(behind[0]).reason.startswith("waits for room")
    assert {d.queue.get(j).reason for j in behind[1:]} == {f"waits behind {behind[0]} (priority 0)"}
    changes = d.queue._db.total_changes
    d.tick()
    d.tick()
    assert d.queue._db.total_changes == changes  # nothing new to say: no write, no commit to disk
    assert [w.id for w in d.queue.waiting()] == behind


def test_a_jobs_environment_places_it_and_keeps_its_log_live(tmp_path: Path):
    from steadytune.server.jobs import job_env

    d = make(tmp_path, [GpuReading(0, 20 * GIB, 0, "fake"), GpuReading(1, 20 * GIB, 0, "fake")])
    job = d.queue.get(submit(d, 15))
    assert job is not None
    env = job_env(job, (1,), base={"PATH": "/bin"})
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], env["PATH"]) == ("1", "PCI_BUS_ID", "/bin")
    # The log is a file: unbuffered, a starting job's lines show as they are written.
    assert env["PYTHONUNBUFFERED"] == "1"
