"""A released pause says what still runs: the standby worker waiting for the resume, and what it holds."""

from __future__ import annotations

from steadytune.supervise.operator import paused_line


def test_a_pause_with_a_standby_worker_names_it_instead_of_calling_the_machine_free() -> None:
    line = paused_line(54, "runs/r1", standby_pid=4321)
    assert "the GPU is free" not in line
    assert "standby worker (pid 4321) waits" in line and "no model loaded" in line
    assert "CUDA was initialized" in line and line.endswith(
        "`steadytune resume runs/r1` continues from the checkpoint"
    )


def test_a_pause_without_one_says_only_that_the_worker_freed_its_memory() -> None:
    line = paused_line(54, "runs/r1", standby_pid=None)
    assert "paused at step 54: the worker has exited and freed the GPU memory it held" in line
    assert "standby" not in line
