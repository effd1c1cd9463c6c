"""The server loop: sample the GPUs, watch the jobs, admit what fits, start it; adopt after a restart.

One :meth:`Daemon.tick` is one pass; :meth:`Daemon.serve` repeats it. Everything that
varies is injected (GPU source, process table, clock), so a test drives the loop one
pass at a time on fake readings and real or fake processes.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.server.admission import DEFAULT_HEADROOM_BYTES, JobRequest, admit
from steadytune.server.gpus import GpuSource
from steadytune.server.jobs import ProcessTable, job_command, job_env, run_id, run_status
from steadytune.server.ledger import GpuState, Reservation, build_ledger
from steadytune.server.queue import LIVE, Job, JobQueue, QueueError

log = logging.getLogger(__name__)

CANCEL_GRACE_S = 60.0  # a cancelled job's supervisor gets this long to checkpoint and stop


@dataclass
class ServerPaths:
    """The daemon's own files (the runs themselves live under ``runs_dir``)."""

    root: Path
    runs_dir: Path

    @property
    def queue(self) -> Path:
        return self.root / "queue.db"

    @property
    def socket(self) -> Path:
        return self.root / "server.sock"

    def log(self, job_id: str) -> Path:
        return self.root / "logs" / f"{job_id}.log"


@dataclass
class Daemon:
    queue: JobQueue
    paths: ServerPaths
    source: GpuSource
    procs: ProcessTable = field(default_factory=ProcessTable)
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES
    clock: Callable[[], float] = time.time
    command: Callable[[Job, Path], list[str]] = job_command  # how a job is started (tests: a stand-in)
    ledger: tuple[GpuState, ...] = ()
    _handles: dict[str, Any] = field(default_factory=dict)
    _stop_sent: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- start-up ------------------------------------------------------------------------

    def adopt(self) -> list[str]:
        """After a (re)start: take back the jobs that kept running, settle those that did not.

        Returns the ids of the jobs adopted.
        """
        adopted = []
        for job in self.queue.jobs(LIVE):
            pid, started = job.pid, job.pid_started
            if pid is None:
                # Admitted, and the daemon stopped around the start: its supervisor may be up.
                status = run_status(job.run_dir)
                spid = status.get("supervisor_pid")
                if isinstance(spid, int) and self.procs.alive(spid, None):
                    self.queue.move(job.id, "running", pid=spid, started_ts=job.started_ts or self.clock())
                    pid, started = spid, None
                else:
                    self.queue.move(
                        job.id, "queued", gpus=[], reason="requeued: the server stopped before it started"
                    )
                    continue
            if self.procs.alive(pid, started):
                self.queue.note(job.id, "adopted after a server restart")
                adopted.append(job.id)
            else:
                fresh = self.queue.get(job.id)
                if fresh is not None:
                    self._settle(fresh)
        return adopted

    # ---- one pass ------------------------------------------------------------------------

    def tick(self) -> tuple[GpuState, ...]:
        """Watch the live jobs, rebuild the ledger, admit and start what fits."""
        with self._lock:
            readings = self.source()
            self._watch()
            live = self.queue.jobs(LIVE)
            self.ledger = self._ledger(readings, live)
            waiting = [
                JobRequest(j.id, j.need_bytes, j.gpus_wanted, j.priority, j.seq)
                for j in self.queue.jobs(["queued"])
            ]
            for d in admit(waiting, self.ledger, self.headroom_bytes):
                if d.admitted:
                    self._start(d.job_id, d.gpus, d.reason)
                else:
                    self.queue.note(d.job_id, d.reason)
            if waiting:  # what was just admitted is reserved in what callers see
                self.ledger = self._ledger(readings, self.queue.jobs(LIVE))
            return self.ledger

    def _ledger(self, readings: Any, live: list[Job]) -> tuple[GpuState, ...]:
        reservations = [Reservation(j.id, g, j.need_bytes) for j in live for g in j.gpus]
        pids = {j.id: self.procs.tree(j.pid) for j in live if j.pid is not None}
        return build_ledger(readings, reservations, pids)

    def _start(self, job_id: str, gpus: tuple[int, ...], reason: str) -> None:
        job = self.queue.get(job_id)
        if job is None:
            return
        run_dir = self.paths.runs_dir / run_id(job)
        # The run directory is recorded before the start, so a daemon that dies in between
        # finds the job's supervisor through it (adopt).
        if not self.queue.move(job.id, "admitted", gpus=list(gpus), reason=reason, run_dir=str(run_dir)):
            return  # cancelled or held meanwhile
        job = self.queue.get(job_id)
        assert job is not None
        argv = self.command(job, self.paths.runs_dir)
        try:
            started = self.procs.start(
                argv, job_env(job, gpus), str(job.spec.get("cwd") or "."), self.paths.log(job.id)
            )
        except OSError as exc:
            self.queue.move(job.id, "failed", reason=f"could not start: {exc}", ended_ts=self.clock())
            return
        self._handles[job.id] = started.handle
        self.queue.move(
            job.id, "running", pid=started.pid, pid_started=started.started, started_ts=self.clock(),
            reason=f"running on GPU {','.join(map(str, gpus))}",
        )  # fmt: skip

    # ---- watching --------------------------------------------------------------------------

    def _watch(self) -> None:
        for job in self.queue.jobs(["running"]):
            handle = self._handles.get(job.id)
            if handle is not None:
                handle.poll()  # reap our own child, so that it is not a zombie that looks alive
            if job.pid is None or not self.procs.alive(job.pid, job.pid_started):
                self._settle(job)
                continue
            if job.cancel_requested:
                self._cancel_running(job)

    def _cancel_running(self, job: Job) -> None:
        assert job.pid is not None
        sent = self._stop_sent.get(job.id)
        if sent is None:
            # The supervisor takes SIGTERM as "checkpoint, stop the worker, exit".
            self.procs.signal(job.pid, signal.SIGTERM)
            self._stop_sent[job.id] = self.clock()
        elif self.clock() - sent > CANCEL_GRACE_S:
            self.procs.signal(job.pid, signal.SIGKILL, group=True)

    def _settle(self, job: Job) -> None:
        """The job's process is gone: done, failed or cancelled, from what its run says."""
        self._handles.pop(job.id, None)
        self._stop_sent.pop(job.id, None)
        status = run_status(job.run_dir)
        state = status.get("state")
        now = self.clock()
        if job.cancel_requested:
            self.queue.move(
                job.id, "cancelled", reason=f"cancelled (run {state or 'not started'})", ended_ts=now
            )
        elif state == "completed":
            self.queue.move(job.id, "done", reason="completed", ended_ts=now)
        else:
            why = f"run ended {state}" if state else "exited before its run wrote a status"
            self.queue.move(job.id, "failed", reason=f"{why}; see {self.paths.log(job.id)}", ended_ts=now)

    # ---- requests (socket and HTTP) --------------------------------------------------------

    def act(self, op: str, job_id: str) -> Job:
        """cancel, hold or release a job.

        Raises:
            QueueError: no such job, or its state does not allow it (the message says what does).
        """
        with self._lock:
            job = self.queue.get(job_id)
            if job is None:
                raise QueueError(f"no job {job_id!r}; `steadytune queue` lists them")
            if op == "cancel":
                if job.state == "running":
                    self.queue.request_cancel(job.id)
                elif not self.queue.move(job.id, "cancelled", reason="cancelled", ended_ts=self.clock()):
                    raise QueueError(f"job {job.id} is {job.state}; nothing to cancel")
            elif op == "hold":
                if not self.queue.move(job.id, "held", reason="held"):
                    hint = (
                        " (to pause a running run: steadytune pause RUN_DIR)"
                        if job.state == "running"
                        else ""
                    )
                    raise QueueError(f"job {job.id} is {job.state}; only a queued job can be held{hint}")
            elif op == "release":
                if job.state != "held" or not self.queue.move(job.id, "queued", reason="released"):
                    raise QueueError(f"job {job.id} is {job.state}; only a held job can be released")
            else:
                raise QueueError(f"unknown action {op!r}; one of cancel, hold, release")
            fresh = self.queue.get(job.id)
            assert fresh is not None
            return fresh

    def snapshot(self) -> dict[str, Any]:
        """The ledger and the queue, for ``steadytune queue`` and the dashboard's server page."""
        jobs = []
        for job in self.queue.jobs():
            row = job.to_dict()
            if job.state in LIVE:
                st = run_status(job.run_dir)
                row["run"] = {k: st.get(k) for k in ("state", "step", "max_steps", "loss", "restarts")}
            row["run_id"] = Path(job.run_dir).name if job.run_dir else None
            jobs.append(row)
        return {
            "ts": self.clock(),
            "headroom_bytes": self.headroom_bytes,
            "gpus": [g.to_dict() for g in self.ledger],
            "jobs": jobs,
        }

    # ---- the loop ------------------------------------------------------------------------------

    def serve(self, stopping: threading.Event, interval_s: float = 1.0) -> None:
        """Adopt, then tick until ``stopping`` is set. Jobs keep running after the loop ends."""
        adopted = self.adopt()
        if adopted:
            log.info("adopted %s", ", ".join(adopted))
        while not stopping.is_set():
            try:
                self.tick()
            except Exception:  # one bad pass (a locked file, a vanished run) must not end the server
                log.exception("server pass failed; trying again")
            stopping.wait(interval_s)


def default_dir(environ: dict[str, str] | None = None) -> Path:
    """The server's folder: ``$STEADYTUNE_SERVER_DIR``, else ``~/.local/state/steadytune/server``."""
    import os

    env = os.environ if environ is None else environ
    if env.get("STEADYTUNE_SERVER_DIR"):
        return Path(env["STEADYTUNE_SERVER_DIR"]).expanduser()
    return Path("~/.local/state/steadytune/server").expanduser()
