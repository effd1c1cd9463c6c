"""The background reader: a dashboard's first look at runs it never read, off the request path.

A finished run this dashboard has not read, and whose values are not stored beside it
(``web/stored.py``), costs its index opened, its events counted and every line of its telemetry
read for its goodput account: 0.1-0.3 s a run, minutes for a runs folder of a thousand. A
request never pays that (``RunEntry.memo`` answers ``PENDING`` and *wants* the run): the wanted
runs are read here, the newest first, one at a time, and what is derived of each is stored beside
it, so the next request (and the next dashboard) answers from it. Until then the runs page shows
the run's ``status.json`` and ``/metrics`` leaves its series out: a scraper sees a run's series
whole or not at all, and ``steadytune_runs_pending_index`` says how many are still to come.

The reading is done by a child process (``python -m steadytune.web.warm RUNS_DIR CACHE_DIR``,
at a lower CPU priority), handed one run id a line and answering each once the run's values are
stored. Read in a thread of the dashboard, the reading held the interpreter's lock against every
request: scrapes of 60 runs took up to 0.7 s while the reading went on, against 70 ms after. A run
the child could not store is read here instead; one that fails here too is given back to the
requests, which read it themselves and show it as unreadable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from steadytune.lifeline import die_with
from steadytune.web import api
from steadytune.web.metrics import run_samples
from steadytune.web.runs import RunEntry, RunsIndex

log = logging.getLogger(__name__)
NICE = 5  # below the dashboard: a request comes first; not so low that a busy machine starves the reading


def ready(entry: RunEntry, index: RunsIndex) -> bool:
    """Whether what the pages and the scrape need of ``entry`` is at hand without reading it (what is
    stored is loaded); a run with anything missing is wanted."""
    row = api.run_summary(entry)
    samples = run_samples(entry, index.accounts)
    account = entry.supervisor_live() or index.accounts.known(entry.dir) is not None
    if not account and entry.want is not None:
        entry.want(entry)
    return not row.get("indexing") and samples is not None and account


def _failed(run_id: str, exc: BaseException) -> None:
    """A run that could not be read: one line on the console, as a failed request's; the traceback
    only at debug level (a run folder's bad ``config.yaml`` or ``run.db`` is the reason, not a bug)."""
    said = str(exc).splitlines()[0] if str(exc) else "failed"
    log.warning("reading run %s for the dashboard failed: %s: %s", run_id, type(exc).__name__, said[:300])
    log.debug("dashboard run read failure", exc_info=exc)


def read(entry: RunEntry, index: RunsIndex) -> None:
    """Read ``entry`` whole: its index brought up to its files' ends first, so nothing derived is
    half a run; then its row, its samples and its goodput account (stored as they are derived)."""
    entry.refresh()
    api.run_summary(entry, wait=True)
    run_samples(entry, index.accounts, wait=True)
    index.accounts.account(entry.dir)


class BackgroundReader:
    """Reads the runs a request wanted, newest first, until :meth:`stop`; run by a dashboard's thread.

    ``gate``: a semaphore the reader takes one permit of before each run it reads (``None``, the
    dashboard's: it reads as fast as it can). A test holds the reading back with it, to look at
    the dashboard while a known number of runs is still to come, however fast the machine reads.
    """

    def __init__(
        self,
        index: RunsIndex,
        stopping: threading.Event,
        child: bool = True,
        gate: threading.Semaphore | None = None,
    ) -> None:
        self.index = index
        self.stopping = stopping
        self.gate = gate
        self._child: subprocess.Popen[str] | None = None
        self._may_spawn = child  # started at the first run wanted: a dashboard over stored runs needs none
        self._lock = threading.Lock()

    def _spawn(self) -> subprocess.Popen[str] | None:
        argv = [
            sys.executable,
            "-m",
            "steadytune.web.warm",
            str(self.index.runs_dir),
            str(self.index.cache_dir),
            str(os.getpid()),
        ]
        try:
            # Its own session: a Ctrl-C at the dashboard's terminal is the dashboard's to handle (it
            # kills the child); a dashboard that dies closes the child's stdin, and the child ends,
            # or, stuck in a read or busy, is killed by the kernel (lifeline.die_with).
            pipe = subprocess.PIPE
            return subprocess.Popen(
                argv, stdin=pipe, stdout=pipe, text=True, bufsize=1, start_new_session=True
            )
        except OSError:
            log.warning("the dashboard's background reader did not start: runs are read in a thread")
            return None

    def run(self, idle_s: float = 1.0) -> None:
        index = self.index
        while not self.stopping.is_set():
            index.wanted_event.clear()
            entry = index.newest_wanted()
            if entry is None:
                index.wanted_event.wait(idle_s)
                continue
            if not self._pass_gate(idle_s):
                return
            try:
                if not (self._read_in_child(entry) and ready(entry, index)):
                    read(entry, index)
            except Exception as e:
                _failed(entry.run_id, e)
                entry.want = None  # the requests read it themselves from now on (and show it unreadable)
            finally:
                index.read(entry)

    def _pass_gate(self, idle_s: float) -> bool:
        """Take a permit of :attr:`gate` (none needed without one); ``False``: the dashboard stopped."""
        while self.gate is not None and not self.gate.acquire(timeout=idle_s):
            if self.stopping.is_set():
                return False
        return True

    def _read_in_child(self, entry: RunEntry) -> bool:
        with self._lock:
            if self._child is None and self._may_spawn and not self.stopping.is_set():
                self._may_spawn, self._child = False, self._spawn()
            child = self._child
        if child is None or child.stdin is None or child.stdout is None:
            return False
        try:
            child.stdin.write(entry.run_id + "\n")
            child.stdin.flush()
            answer = child.stdout.readline()
        except (OSError, ValueError):
            answer = ""
        if not answer:  # the child is gone: read in this thread from now on
            self._child = None
        return answer.strip() == f"read {entry.run_id}"

    def stop(self) -> None:
        with self._lock:
            child, self._child, self._may_spawn = self._child, None, False
        if child is not None:
            child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


def serve_reads(runs_dir: Path, cache_dir: Path, lines: IO[str], out: IO[str]) -> None:
    """The child: read each run id of ``lines`` (its values stored beside it), answer ``read <id>``
    or ``failed <id>`` on ``out``, then let the run go (a thousand runs are read once each)."""
    index = RunsIndex(runs_dir, cache_dir=cache_dir)
    try:
        for line in lines:
            run_id = line.strip()
            entry = index.get(run_id)
            verdict = "failed"
            if entry is not None:
                try:
                    read(entry, index)
                    verdict = "read"
                except Exception as e:
                    _failed(run_id, e)
                finally:
                    index.forget(entry)
            out.write(f"{verdict} {run_id}\n")
            out.flush()
    finally:
        index.close()


def main() -> int:
    if len(sys.argv) > 3:
        die_with(int(sys.argv[3]))
    with contextlib.suppress(OSError):
        os.nice(NICE)
    serve_reads(Path(sys.argv[1]), Path(sys.argv[2]), sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["BackgroundReader", "read", "ready", "serve_reads"]
