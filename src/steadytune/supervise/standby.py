"""The standby worker, from the supervisor's side: one spare kept ready, handed the next attempt.

The spare (``train/standby.py``) is started once an attempt trains, so it never competes with that
attempt's own start-up for the CPU. ``steadytune run`` also starts one while its preflight runs, for
the first attempt (:func:`early_standby`): the imports then overlap the check instead of following it,
and the orders go only after a GO, so a NO-GO still trains no step. When an attempt starts (a restart,
or the first one with an early spare), :meth:`Standby.take`
gives the spare the new attempt's orders if it can train that attempt exactly as a new process would:
the same command (one process, the same Python, the same run) and the same environment, except the
variables a worker reads only once its attempt begins (``protocol.LATE_ENV``), which go with the
orders. Otherwise the spare is stopped and the attempt gets a new process; either way the process
says how it came to be (``WorkerProcess.how``), which the ``worker_started`` event records.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from steadytune.protocol import LATE_ENV, standby_orders
from steadytune.rundir import RunDir
from steadytune.supervise.process import WorkerProcess, worker_command

STANDBY_FLAG = "--standby"


def mismatch(spare: WorkerProcess, cmd: list[str], env: dict[str, str]) -> str | None:
    """Why ``spare`` cannot run the attempt that ``cmd`` with ``env`` would start; None when it can."""
    if [c for c in spare.cmd if c != STANDBY_FLAG] != cmd:
        if "torch.distributed.run" in cmd:
            return "the attempt runs several processes (torchrun), the standby worker is one"
        if cmd[0] != spare.cmd[0]:
            return f"the attempt runs another Python ({cmd[0]}), the standby worker runs {spare.cmd[0]}"
        return f"the attempt's command ({' '.join(cmd)}) is not the standby worker's"
    differ = sorted(
        k for k in set(env) | set(spare.env) if k not in LATE_ENV and env.get(k) != spare.env.get(k)
    )
    if differ:
        return f"the attempt sets {', '.join(differ)} differently, which a worker reads before its imports"
    return None


class Standby:
    """At most one spare worker for a run's next attempt."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.spare: WorkerProcess | None = None
        self.count = 0  # spares started, for their log names
        self.started_at: float | None = None
        self.during = ""  # when the spare was started, in words, for the worker_started line

    def prepare(self, env: dict[str, str], during: str = "") -> None:
        """Start a spare unless one is there; ``env``: what a new attempt gets, the late variables aside.

        ``during``: when it is started (e.g. "during the preflight"), said when it takes an attempt.
        """
        if self.spare is not None and self.spare.poll() is None:
            return
        self.during = during
        cmd = [*worker_command(self.run.root), STANDBY_FLAG]
        log = self.run.logs / f"standby-{self.count}.log"
        self.count += 1
        self.spare = WorkerProcess(cmd, log, env=env, pipe_stdin=True)
        self.started_at = time.time()

    @property
    def pid(self) -> int | None:
        return self.spare.pid if self.spare is not None and self.spare.poll() is None else None

    def take(self, cmd: list[str], env: dict[str, str], log_path: Path) -> tuple[WorkerProcess | None, str]:
        """The spare, sent into the attempt ``cmd`` and ``env`` describe; else None and why not."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None, "no standby worker was started (the attempt before made no step)"
        rc = spare.poll()
        if rc is not None:
            return None, f"the standby worker had exited (exit code {rc}; its log: {spare.log_path})"
        full = {**os.environ, **env}  # what a new process would get
        why = mismatch(spare, cmd, full)
        if why is not None:
            spare.kill()
            return None, why
        late: dict[str, str | None] = {k: full.get(k) for k in LATE_ENV}
        assert spare.proc.stdin is not None
        try:
            spare.proc.stdin.write(standby_orders(log_path, late).encode("utf-8"))
            spare.proc.stdin.close()  # all it will ever be told
        except OSError as exc:  # it died as it was told
            spare.kill()
            return None, f"the standby worker could not take its orders ({exc})"
        waited = time.time() - (self.started_at or time.time())
        spare.log_path, spare.standby, spare.env = log_path, True, full
        when = f" {self.during}," if self.during else ""
        spare.how = f"the standby worker, started{when} {waited:.0f}s before"
        return spare, ""

    @property
    def ready(self) -> bool:
        """A spare was started and not yet taken or stopped (it may have exited: :meth:`take` says)."""
        return self.spare is not None

    def stop(self) -> None:
        """End the spare: it holds nothing of the run, so it is killed outright."""
        spare, self.spare = self.spare, None
        if spare is not None and spare.poll() is None:
            spare.signal_tree(signal.SIGKILL)
            spare.wait(10)
