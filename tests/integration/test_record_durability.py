"""The step record of the step a worker dies on is in the file, however the worker dies.

The guard hands each record to the kernel (one ``write(2)``) before ``end_step`` returns, and
keeps nothing buffered in-process, so a process killed at once after it (SIGKILL, ``os._exit``:
no atexit, no flush, no thread gets to run) still leaves it complete in ``rank-0.jsonl``.
Only a crash of the machine can lose it; that needs fsync, which the guard does at checkpoints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from steadytune.records import StepRecord
from steadytune.telemetry.stream import iter_records

WORKER = textwrap.dedent(
    """
    import os, signal, sys
    from steadytune.guard.core import Guard

    guard = Guard(sys.argv[1], rank=0, attempt=0)
    guard.watch()  # the thread the training loop runs with: it must not be what writes records
    for step in range(1, 8):
        guard.begin_step()
        guard.add_microbatch(2.5 / step, tokens=64, sample_ids=[step, step + 100])
        guard.before_update(None, None, grad_norm=1.0 + step)
        guard.end_step(step)
        if step == 7:
            if sys.argv[2] == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
    """
)


@pytest.mark.parametrize("death", ["sigkill", "os_exit"])
def test_the_last_step_record_survives_a_worker_killed_right_after_it(tmp_path: Path, death: str) -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(tmp_path / "run"), death], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == (-signal.SIGKILL if death == "sigkill" else 3), proc.stderr.decode()
    raw = (tmp_path / "run" / "telemetry" / "rank-0.jsonl").read_bytes()
    assert raw.endswith(b"\n")  # no torn last line
    steps = [
        r for r in iter_records(tmp_path / "run" / "telemetry" / "rank-0.jsonl") if isinstance(r, StepRecord)
    ]
    assert [s.step for s in steps] == list(range(1, 8))
    last = steps[-1]
    assert last.grad_norm == 8.0 and last.batch is not None and last.batch.indices == (7, 107)
    assert last.rss_bytes is not None and last.rss_bytes > 0
