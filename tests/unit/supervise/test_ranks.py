"""A multi-rank job's faults name their rank: the rank a launcher reports dead, the rank that was
stopped in a hang, and each stack dump headed by its pid and rank."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from steadytune.policy.restart import ExitInfo, decide
from steadytune.rundir import RunDir
from steadytune.supervise.command import CommandOptions, CommandSource
from steadytune.supervise.process import ProcessTree, WorkerProcess
from steadytune.supervise.ranks import RankProc, env_ranks, failed_rank, hung_ranks, read_proc


def _fake_proc(root: Path, pid: int, env: dict[str, str], state: str = "S") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    # A process name may hold spaces and parentheses: the state follows the last ")".
    (d / "stat").write_text(f"{pid} (python (x) y) {state} 1 {pid} {pid} 0 -1")


def test_the_rank_and_the_stop_of_a_process_are_read_from_proc(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 11, {"PATH": "/bin", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, "T")
    _fake_proc(tmp_path, 10, {"PATH": "/bin"})
    assert read_proc(11, tmp_path) == RankProc(11, 3, 1, True)
    assert read_proc(10, tmp_path) == RankProc(10, None, None, False)
    assert read_proc(99, tmp_path) == RankProc(99)  # gone: nothing known, nothing raised
    assert env_ranks(b"RANK=x\0LOCAL_RANK=0\0") == (None, 0)
    assert read_proc(11, tmp_path).label() == "pid 11, rank 3 (local rank 1), was stopped (SIGSTOP)"
    assert read_proc(10, tmp_path).label() == "pid 10, no rank (a launcher or a helper process)"


def test_a_hang_names_the_stopped_rank_else_says_how_long_each_was_silent() -> None:
    agent, r0, r1 = RankProc(10), RankProc(11, 0, 0), RankProc(12, 1, 1, stopped=True)
    silent = {0: 40.0, 1: 41.0}
    assert (
        hung_ranks([agent, r0, r1], silent)
        == "rank 1 (pid 12) was stopped (SIGSTOP): the other ranks wait for it"
    )
    r1 = RankProc(12, 1, 1)
    assert hung_ranks([agent, r0, r1], {0: 3.2, 1: 41.0}) == "silent rank 1 for 41s, rank 0 for 3s"
    assert hung_ranks([RankProc(10)], {0: 41.0}) == ""  # one rank: nothing to tell apart


def _elastic_report(rank: int, pid: int) -> str:
    """The end of torch elastic's ChildFailedError, as torchrun prints it when a rank dies."""
    return f"""torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-07_08:00:01
  host      : box
  rank      : {1 - rank} (local_rank: {1 - rank})
  exitcode  : -15 (pid: {pid + 1})
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID {pid + 1}
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_08:00:00
  host      : box
  rank      : {rank} (local_rank: {rank})
  exitcode  : -9 (pid: {pid})
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID {pid}
============================================================
"""


def test_a_killed_rank_is_named_in_the_restart_reason() -> None:
    tail = "step 12 loss 2.1\n" + _elastic_report(1, 9531)
    assert failed_rank(tail) == "rank 1 (local rank 1, pid 9531)"
    assert failed_rank(_elastic_report(0, 7) + "\n...\n" + tail) == "rank 1 (local rank 1, pid 9531)"
    assert failed_rank("Killed\n") is None
    info = ExitInfo(returncode=1, step=12, stderr_tail=tail, where=failed_rank(tail))
    decision = decide(info, [], 0, 3)
    assert decision.reason == "killed on rank 1 (local rank 1, pid 9531) at step 12; restart 1/3"
    assert decide(ExitInfo(returncode=-9, step=12), [], 0, 3).reason == "killed at step 12; restart 1/3"


# Two ranks under a launcher that, as torch elastic does, ends the other ranks as soon as one has ended.
_JOB = """
import os, subprocess, sys, time
rank = "import time\\nprint('up', flush=True)\\nwhile True: time.sleep(0.05)"
env = [{**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(2)]
kids = [subprocess.Popen([sys.executable, "-c", rank], env=e) for e in env]
print("ranks", *[k.pid for k in kids], flush=True)
while True:
    if any(k.poll() is not None for k in kids):
        for k in kids:
            if k.poll() is None:
                k.terminate()
    time.sleep(0.02)
"""


def test_each_stack_dump_is_headed_by_its_pid_and_rank_and_no_rank_is_lost(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    log = tmp_path / "job.log"
    worker = WorkerProcess([sys.executable, "-c", _JOB], log, env={"PYTHONFAULTHANDLER": "1"})
    tree = ProcessTree(worker)
    try:
        deadline = time.monotonic() + 30
        while log.read_text().count("up") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # both ranks in their loop, past their start-up
        m = re.search(r"ranks (\d+) (\d+)", log.read_text())
        assert m, log.read_text()
        r0, r1 = int(m[1]), int(m[2])
        os.kill(r1, signal.SIGSTOP)  # rank 1 hangs
        while not read_proc(r1).stopped and time.monotonic() < deadline:
            time.sleep(0.01)  # the signal takes effect when the kernel next looks at the process
        source = CommandSource(CommandOptions(["job"]), run)
        out = run.stacks / "attempt-0.txt"
        pids = source.dump_stacks(tree, worker, out)
        source.writer.close()
    finally:
        tree.reap(timeout=5)
    assert set(pids) == {worker.pid, r0, r1}
    heads = re.findall(r"^=== (.*) ===$", out.read_text(), re.M)
    assert heads == [
        f"pid {r0}, rank 0 (local rank 0)",
        f"pid {r1}, rank 1 (local rank 1), was stopped (SIGSTOP)",
        f"pid {worker.pid}, no rank (a launcher or a helper process)",
    ]
    # Every section holds its own process's frames: none ended by the launcher before it printed.
    sections = re.split(r"^=== .* ===$", out.read_text(), flags=re.M)[1:]
    assert all('File "<string>"' in s for s in sections), out.read_text()


class _Tree:
    def note(self) -> list[int]:
        return [10, 11, 12]


def test_the_restart_for_a_hang_says_which_rank_was_stopped(tmp_path: Path) -> None:
    from steadytune.policy.engine import Action
    from steadytune.telemetry.events import read_events
    from tests.unit.supervise.build import FakeWorker, supervisor

    proc = tmp_path / "proc"
    _fake_proc(proc, 10, {"PATH": "/bin"})  # torchrun
    _fake_proc(proc, 11, {"RANK": "0", "LOCAL_RANK": "0"})
    _fake_proc(proc, 12, {"RANK": "1", "LOCAL_RANK": "1"}, "T")
    sup = supervisor(tmp_path)
    sup.actions.proc = proc
    st = sup.state
    worker = FakeWorker(pid=10)
    st.attempt.worker, st.attempt.tree = worker, _Tree()  # type: ignore[assignment]
    st.source.dump_stacks = lambda tree, proc, out: [10, 11, 12]  # type: ignore[method-assign]
    sup.actions.stop_for(Action("restart", "stall at step 33", 33))
    hung = "rank 1 (pid 12) was stopped (SIGSTOP): the other ranks wait for it"
    assert st.pending is not None and st.pending.reason == f"stall at step 33 ({hung})"
    (dumped,) = [e for e in read_events(sup.run.events) if e.name == "stacks_dumped"]
    assert dumped.message.endswith(f"; {hung}") and dumped.data["hung"] == hung
    assert worker.signals == [signal.SIGKILL]
