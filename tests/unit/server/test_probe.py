"""The memory probe of a command without --need-gib: a real process feeds the snapshot-file GPU source
(as NVML would show it: its own pid, its memory rising, then level), the daemon watches it through
the ledger's source, stops it once level, and queues the job with the peak plus the margin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psutil

from steadytune.server.daemon import Daemon, ServerPaths
from steadytune.server.gpus import SnapshotFileSource
from steadytune.server.jobs import run_id
from steadytune.server.ledger import GIB
from steadytune.server.probe import MARGIN, Probe
from steadytune.server.queue import JobQueue
from tests.waiting import wait_for

from .test_daemon import JOB

# What a training command looks like to NVML: its memory rises for a while, then stays level. It writes
# itself into the GPU file the server reads, and records its pid so the test can see it was stopped.
FEED = """
import json, os, pathlib, sys, time
snap, steps = pathlib.Path(sys.argv[1]), [1, 2, 3, 3]
pathlib.Path(sys.argv[2]).write_text(str(os.getpid()))
for n in range(10_000):
    used = steps[min(n, len(steps) - 1)] * (1 << 30)
    tmp = snap.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpus": [
        {"index": 0, "total_bytes": 24 << 30, "used_bytes": used,
         "processes": [{"pid": os.getpid(), "used_bytes": used}]},
        {"index": 1, "total_bytes": 24 << 30, "used_bytes": 20 << 30}]}))
    os.replace(tmp, snap)
    time.sleep(0.2)
"""


def daemon(tmp_path: Path) -> Daemon:
    snap = tmp_path / "gpus.json"
    snap.write_text(
        json.dumps(
            {
                "gpus": [
                    {"index": 0, "total_bytes": 24 * GIB, "used_bytes": 0},
                    {"index": 1, "total_bytes": 24 * GIB, "used_bytes": 20 * GIB},
                ]
            }
        )
    )
    paths = ServerPaths(tmp_path / "server", tmp_path / "runs")
    (tmp_path / "gates").mkdir()

    def command(job, runs_dir):  # the job itself, once measured: the stand-in supervisor of test_daemon
        return [sys.executable, "-c", JOB, str(runs_dir / run_id(job)), str(tmp_path / "gates" / job.id)]

    return Daemon(JobQueue(paths.queue), paths, SnapshotFileSource(snap), command=command)


def test_a_command_without_a_need_is_probed_stopped_when_level_and_queued_with_peak_plus_margin(
    tmp_path: Path,
):
    d = daemon(tmp_path)
    spec = {"kind": "supervise", "cmd": [sys.executable, "-c", FEED, str(tmp_path / "gpus.json"),
                                         str(tmp_path / "probe.pid")],
            "label": "feed", "cwd": str(tmp_path), "probe_s": 60}  # fmt: skip
    jid = d.queue.submit(spec, 0, "probe").id
    d.tick()
    assert (
        d.queue.get(jid).state == "queued" and "probing its memory need on GPU 0" in d.queue.get(jid).reason
    )
    assert d.queue.get(jid).pid is not None  # recorded, so a restarted server can stop it
    wait_for(
        lambda: (d.tick(), d.queue.get(jid))[1].need_source != "probe" or d.queue.get(jid).state != "queued",
        timeout=60,
    )
    job = d.queue.get(jid)
    assert (job.state, job.need_source) == ("queued", "measured")
    assert job.need_bytes == int(3 * GIB * (1 + MARGIN)) + (1 if (3 * GIB * (1 + MARGIN)) % 1 else 0)
    assert (
        job.spec["need"].startswith("measured: peak 3.0 GiB on GPU 0")
        and "stopped rising" in job.spec["need"]
    )
    assert job.pid is None
    pid = int((tmp_path / "probe.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # Measured, it is admitted like any job: GPU 0 has room for 3.45 GiB, GPU 1 does not.
    wait_for(lambda: (d.tick(), d.queue.get(jid).state)[1] == "running", timeout=20)
    assert d.queue.get(jid).gpus == (0,)
    (tmp_path / "gates" / jid).write_text("completed")
    wait_for(lambda: (d.tick(), d.queue.get(jid).state)[1] == "done", timeout=20)


def test_the_probe_verdicts():
    p = Probe("j1", 0, 1, started=0.0, bound_s=30, plateau_s=5)
    assert p.done(1.0, exited=False) is None
    assert p.need("x", 1.0)[0] is None and "saw no GPU memory" in p.need("x", 1.0)[1]
    assert p.done(30.0, exited=False) == "the probe's bound of 30s"
    assert p.done(2.0, exited=True) == "the command ended during the probe"
    p.peak, p.last_rise = GIB, 10.0
    assert (
        p.done(14.0, exited=False) is None
        and p.done(15.0, exited=False) == "its memory stopped rising for 5s"
    )
    p.unknown = True
    assert p.need("x", 15.0)[0] is None and "N/A" in p.need("x", 15.0)[1]


def test_a_probe_left_by_a_server_that_died_is_stopped_and_measured_again(tmp_path: Path):
    d = daemon(tmp_path)
    spec = {
        "kind": "supervise",
        "cmd": [sys.executable, "-c", FEED, str(tmp_path / "gpus.json"), str(tmp_path / "probe.pid")],
        "label": "feed",
        "cwd": str(tmp_path),
    }
    jid = d.queue.submit(spec, 0, "probe").id
    d.tick()
    wait_for(lambda: (tmp_path / "probe.pid").exists() and (tmp_path / "probe.pid").read_text() != "")
    orphan = psutil.Process(int((tmp_path / "probe.pid").read_text()))
    d.queue.close()  # the server dies; its probe lives on in a session of its own
    again = Daemon(JobQueue(d.paths.queue), d.paths, d.source, command=d.command)
    again.adopt()
    orphan.wait(10)  # stopped
    d._probe_handle.wait()
    assert again.queue.get(jid).pid is None and again.queue.get(jid).need_source == "probe"
    again.tick()  # measured again from the start
    assert "probing its memory need" in again.queue.get(jid).reason
    again._stop_probe(again._probe)
