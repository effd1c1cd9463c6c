"""The worker's resident memory, from the process tree the supervisor has just read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from steadytune.telemetry.sampler import SystemSampler


class _NoGpus:
    def sample(self) -> tuple:
        return ()


def test_tree_rss_sums_the_given_pids_and_skips_those_gone(tmp_path: Path) -> None:
    sampler = SystemSampler(tmp_path, nvml=_NoGpus())  # type: ignore[arg-type]
    # Read once it has started: a child still starting grows (3 MB to 9 MB) between the sampler's
    # reading and the test's own, and the sum looked short of it.
    script = "import time; print('ready', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        me, kid = psutil.Process(os.getpid()), psutil.Process(child.pid)
        both = sampler.tree_rss(os.getpid(), [os.getpid(), child.pid, gone.pid])
        assert both is not None and both >= me.memory_info().rss + kid.memory_info().rss // 2
        assert sampler.tree_rss(os.getpid(), [gone.pid]) is None  # none of them is there
        sample = sampler.sample(child.pid, [child.pid])
        assert sample.worker_rss_bytes is not None and sample.worker_rss_bytes < both
    finally:
        child.kill()
        child.communicate()
