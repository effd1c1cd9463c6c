"""The worker's process tree is read from the kernel's lists of children of the tree's own processes,
and finds what psutil's walk of the whole process table finds: children, grandchildren, and a child a
thread other than the main one started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from steadytune.supervise.process import WorkerProcess, descendants
from tests.waiting import wait_for

_TREE = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    grand = [sys.executable, "-c", f"import subprocess, time; subprocess.Popen({sleep!r}); time.sleep(60)"]
    subprocess.Popen(sleep)
    subprocess.Popen(grand)
    threading.Thread(target=lambda: subprocess.Popen(sleep)).start()  # its parent is this thread
    time.sleep(60)
    """
)


def test_the_tree_read_from_its_own_processes_is_the_one_psutil_finds() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _TREE])
    try:
        root = psutil.Process(proc.pid)
        wait_for(lambda: len(root.children(recursive=True)) == 4, timeout=30)
        assert sorted(descendants(proc.pid) or []) == sorted(c.pid for c in root.children(recursive=True))
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()
    assert descendants(proc.pid) == []  # gone


def test_a_kernel_without_the_lists_is_told_apart_from_a_process_that_ended(tmp_path: Path) -> None:
    (tmp_path / "7" / "task" / "7").mkdir(parents=True)  # no children file
    assert descendants(7, proc=tmp_path) is None
    (tmp_path / "7" / "task" / "7" / "children").write_text("8 9 ")
    (tmp_path / "8" / "task" / "8").mkdir(parents=True)
    (tmp_path / "8" / "task" / "8" / "children").write_text("7 10")  # a reused pid loops back: once each
    (tmp_path / "8" / "task" / "12").mkdir()
    (tmp_path / "8" / "task" / "12" / "children").write_text("11")
    assert sorted(descendants(7, proc=tmp_path) or []) == [8, 9, 10, 11]  # 9 and 10 ended meanwhile
    assert descendants(99, proc=tmp_path) == []


def test_the_wait_between_turns_ends_when_the_worker_is_killed(tmp_path: Path) -> None:
    """The supervisor's loop waits on its worker between turns: a kill is noticed at once, not at the end
    of the wait; a worker that has ended makes the wait a plain sleep (never a spin)."""
    worker = WorkerProcess([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "w.log")
    t0 = time.monotonic()
    worker.wait_exit(0.3)
    assert worker.poll() is None and time.monotonic() - t0 >= 0.25  # alive: the whole wait
    os.kill(worker.pid, signal.SIGKILL)
    t0 = time.monotonic()
    worker.wait_exit(30.0)
    woke = time.monotonic() - t0
    assert woke < 10.0, woke  # woken by the exit, far sooner than the 30 s asked
    fd = worker._exited
    assert worker.poll() == -signal.SIGKILL
    if fd is not None:  # the exit seen, its descriptor is given back at once, not when the object goes
        assert worker._exited is None
        with pytest.raises(OSError):
            os.fstat(fd)
    t0 = time.monotonic()
    worker.wait_exit(0.3)
    assert time.monotonic() - t0 >= 0.25  # ended: a sleep, not an instant return


def test_a_hung_trees_stacks_are_asked_of_the_deepest_processes_first() -> None:
    """A launcher passes on its trainer's stderr: the trainers are aborted first, the launcher after."""
    from steadytune.supervise.command import deepest_first

    # trl (10) -> accelerate launch (11) -> two ranks (12, 13), one with a data-loader worker (14);
    # 1 is the supervisor, outside the tree.
    tree = {10: 1, 11: 10, 12: 11, 13: 11, 14: 13}
    assert deepest_first(tree) == [[14], [12, 13], [11], [10]]
    assert deepest_first({5: 1}) == [[5]]
    assert deepest_first({}) == []
    assert sorted(p for layer in deepest_first({7: 8, 8: 7}) for p in layer) == [7, 8]  # a loop ends
