"""The dashboard's background reader dies with the dashboard, even while it is not reading its stdin.

A reader that only ended when its stdin closed lived on, orphaned, as long as a read took: for
good on a FIFO or ``/dev/zero``. Here a real dashboard stand-in starts the real reader with a stdin
that outlives it (the test holds it open, as a stuck read would), then is killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]

PARENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    argv = [sys.executable, "-m", "steadytune.web.warm", sys.argv[1], sys.argv[2], str(os.getpid())]
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    print(child.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped by whoever adopted it counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_the_background_reader_dies_with_its_parent(tmp_path: Path) -> None:
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    runs.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(runs), str(cache)],
        stdin=subprocess.PIPE,  # the reader inherits it: it never sees end of file while this is open
        stdout=subprocess.PIPE,
        env=env,
    )
    assert parent.stdout is not None and parent.stdin is not None
    reader = int(parent.stdout.readline())
    parent.wait(timeout=60)
    try:
        wait_for(lambda: gone(reader), timeout=60, what="the orphaned reader to end")
    finally:
        if not gone(reader):
            os.kill(reader, 9)
        parent.stdin.close()
