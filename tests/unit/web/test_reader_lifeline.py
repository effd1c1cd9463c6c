"""The dashboard's background reader dies with the dashboard, even while it is not reading its stdin.

A reader that only ended when its stdin closed lived on, orphaned, as long as a read took: for
good on a FIFO or ``/dev/zero``. Here a real dashboard stand-in starts the real reader with a stdin
that outlives it (the test holds it open, as a stuck read would), then is killed: once the reader
has answered a request (so it runs, its parent-death signal asked for), and straight after its start
(the reader may find its parent gone before it asks for the signal, and must end then too).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]

# The stand-in dies at once, or ("wait") sits until the test kills it. The reader shares its stdin and
# stdout, which are the test's pipes: the test talks to the reader through them, and holds them open.
PARENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    argv = [sys.executable, "-m", "steadytune.web.warm", sys.argv[1], sys.argv[2], str(os.getpid())]
    child = subprocess.Popen(argv, start_new_session=True)
    print(child.pid, flush=True)
    if sys.argv[3] == "wait":
        while True:
            signal.pause()
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


def start_parent(tmp_path: Path, when: str) -> tuple[subprocess.Popen[bytes], int]:
    """The dashboard stand-in and the pid of the reader it started."""
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    runs.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(runs), str(cache), when],
        stdin=subprocess.PIPE,  # the reader inherits it: it never sees end of file while this is open
        stdout=subprocess.PIPE,
        env=env,
    )
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def outlives_nothing(parent: subprocess.Popen[bytes], reader: int) -> None:
    """Wait for the orphaned ``reader`` to end (killing it if it does not), then let go of the pipes."""
    try:
        wait_for(lambda: gone(reader), timeout=60, what="the orphaned reader to end")
    finally:
        if not gone(reader):
            os.kill(reader, signal.SIGKILL)
        for pipe in (parent.stdin, parent.stdout):
            if pipe is not None:
                pipe.close()


def test_the_background_reader_dies_with_its_parent(tmp_path: Path) -> None:
    parent, reader = start_parent(tmp_path, "wait")
    assert parent.stdin is not None and parent.stdout is not None
    try:
        # An answer says the reader runs: past its start-up check, its parent-death signal asked for.
        parent.stdin.write(b"no-such-run\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == b"failed no-such-run\n"
        assert parent.poll() is None and not gone(reader)
    except BaseException:
        parent.kill()
        parent.wait(timeout=60)
        outlives_nothing(parent, reader)
        raise
    # Back in a read of a stdin that stays open: only the kernel's signal can end it now.
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=60)
    outlives_nothing(parent, reader)


def test_a_reader_whose_parent_died_before_it_started_ends_too(tmp_path: Path) -> None:
    parent, reader = start_parent(tmp_path, "now")
    parent.wait(timeout=60)
    outlives_nothing(parent, reader)
