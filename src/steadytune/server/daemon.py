"""The server loop: sample the GPUs, watch the jobs, admit what fits, start it; adopt after a restart.

One :meth:`Daemon.tick` is one pass; :meth:`Daemon.serve` repeats it. Everything that
varies is injected (GPU source, process table, clock), so a test drives the loop one
pass at a time on fake readings and real or fake processes.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steadytune.protocol import operator_issuer, send_control
from steadytune.records import run_end
from steadytune.rundir import RunDir
from steadytune.server.admission import DEFAULT_HEADROOM_BYTES, JobRequest, admit, gib, place
from steadytune.server.admission import never_fits as never_fits_on
from steadytune.server.admission import order as order_requests
from steadytune.server.gpus import GpuSource
from steadytune.server.jobs import ProcessTable, ended_reason, job_command, job_env, run_id, run_status
from steadytune.server.ledger import GpuState, Reservation, build_ledger
from steadytune.server.pressure import LiveJob, PressureAction, relieve
from steadytune.server.probe import PROBE_S, Probe
from steadytune.server.queue import LIVE, Job, JobQueue, QueueError
from steadytune.telemetry.events import read_events

log = logging.getLogger(__name__)

CANCEL_GRACE_S = 60.0  # a cancelled job's supervisor gets this long to checkpoint and stop
SHRINK_WAIT_S = 120.0  # a job asked to shrink for pressure that has not within this long is paused instead
PROBE_STOP_S = 5.0  # a probe that does not end on SIGTERM within this long is killed
ISSUER = operator_issuer("steadytune server", "memory pressure")  # who paused a job, in its run's events


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
    socket: Path | None = None  # told to each job, whose supervisor asks it for GPUs to grow onto
    pressure_bytes: int | None = None  # free below this on a GPU is pressure (None: the headroom; 0: off)
    clock: Callable[[], float] = time.time
    command: Callable[[Job, Path], list[str]] = job_command  # how a job is started (tests: a stand-in)
    ledger: tuple[GpuState, ...] = ()
    _handles: dict[str, Any] = field(default_factory=dict)
    _stop_sent: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cannot_shrink: set[str] = field(default_factory=set)  # refused a pressure shrink: paused instead
    _seen_paused: set[str] = field(default_factory=set)  # paused for pressure, and its run said so
    _shrink_asked: dict[str, float] = field(default_factory=dict)  # when each pressure shrink was asked
    _probe: Probe | None = None  # the memory probe under way (one at a time)
    _probe_handle: Any = None

    # ---- start-up ------------------------------------------------------------------------

    def adopt(self) -> list[str]:
        """After a (re)start: take back the jobs that kept running, settle those that did not.

        Returns the ids of the jobs adopted.
        """
        adopted = []
        for job in self.queue.jobs(["queued", "held"]):
            if job.pid is not None:  # a probe the last server left: measured again from the start
                if self.procs.alive(job.pid, job.pid_started):
                    self.procs.signal(job.pid, signal.SIGKILL, group=True)
                self.queue.set_probe(job.id, None, None)
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

    def never_fits(self, job: Job) -> str | None:
        """Why ``job`` could never run here, judged on the GPUs of the last pass; None if it can,
        or while that is unknown (no pass yet, or a need still to be measured by a probe).

        Told at submit, not only later in ``queue``: such a job is queued (it does not hold the
        line, and the host may be given bigger GPUs) but the submitter should hear it at once.
        """
        if not self.ledger or job.need_source == "probe":
            return None
        request = JobRequest(job.id, job.need_bytes, job.gpus_wanted, job.priority, job.seq)
        return never_fits_on(request, self.ledger, self.headroom_bytes)

    # ---- one pass ------------------------------------------------------------------------

    def tick(self) -> tuple[GpuState, ...]:
        """Watch the live jobs, rebuild the ledger, admit and start what fits."""
        with self._lock:
            readings = self.source()
            self._watch()
            live = self.queue.jobs(LIVE)
            trees = self.procs.trees(j.pid for j in live if j.pid is not None)
            self.ledger = self._ledger(readings, live, trees)
            self._relieve(live)
            queued = self.queue.waiting()
            # A job whose need is still to be measured is probed, not admitted, and holds no line.
            probing = [self.queue.get(j.id) for j in queued if j.need_source == "probe"]
            self._probe_pass(readings, [j for j in probing if j is not None])
            waiting = [
                JobRequest(j.id, j.need_bytes, j.gpus_wanted, j.priority, j.seq)
                for j in queued
                if j.need_source != "probe"
            ]
            said = {j.id: j.reason for j in queued}
            notes = []
            for d in admit(waiting, self.ledger, self.headroom_bytes):
                if d.admitted:
                    self._start(d.job_id, d.gpus, d.reason)
                elif said.get(d.job_id) != d.reason:
                    notes.append((d.job_id, d.reason))
            # One transaction for the pass: a note each, with a full-sync commit each, took 3 s to
            # tell 1,000 waiting jobs why they wait; and a reason already said is not said again.
            self.queue.note_many(notes)
            if waiting:  # what was just admitted is reserved in what callers see
                self.ledger = self._ledger(readings, self.queue.jobs(LIVE), trees)
            return self.ledger

    def _ledger(
        self, readings: Any, live: list[Job], trees: dict[int, set[int]] | None = None
    ) -> tuple[GpuState, ...]:
        """``trees``: each live job's processes (``ProcessTable.trees``), read here when not given; a job
        started since they were read holds its own pid only, which is all it has started by then."""
        if trees is None:
            trees = self.procs.trees(j.pid for j in live if j.pid is not None)
        reservations = [Reservation(j.id, g, j.need_bytes) for j in live for g in j.gpus]
        pids = {j.id: trees.get(j.pid, {j.pid}) for j in live if j.pid is not None}
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
                argv,
                job_env(job, gpus, socket=self.socket or self.paths.socket),
                str(job.spec.get("cwd") or "."),
                self.paths.log(job.id),
            )
        except OSError as exc:
            self.queue.move(job.id, "failed", reason=f"could not start: {exc}", ended_ts=self.clock())
            return
        self._handles[job.id] = started.handle
        self.queue.move(
            job.id, "running", pid=started.pid, pid_started=started.started, started_ts=self.clock(),
            reason=f"running on GPU {','.join(map(str, gpus))}",
        )  # fmt: skip

    # ---- the memory probe of a command without a need ------------------------------------

    def _probe_pass(self, readings: Any, probing: list[Job]) -> None:
        p = self._probe
        if p is None:
            if probing:
                self._start_probe(order_jobs(probing)[0])
            return
        job = self.queue.get(p.job_id)
        now = self.clock()
        if job is None or job.state != "queued" or job.need_source != "probe":
            self._stop_probe(p)  # cancelled or held meanwhile
            return
        exited = self._probe_handle.poll() is not None if self._probe_handle is not None else True
        p.observe(now, readings, self.procs.tree(p.pid) | {p.pid})
        why = p.done(now, exited)
        if why is None:
            self.queue.note(
                job.id,
                f"probing its memory need on GPU {p.gpu}: peak {gib(p.peak)} so far (up to {p.bound_s:g}s)",
            )
            return
        self._stop_probe(p)
        need, account = p.need(why, now)
        if need is None:
            self.queue.move(job.id, "held", reason=f"held: {account}")
        else:
            self.queue.set_need(job.id, need, "measured", account)
            self.queue.note(job.id, account)

    def _start_probe(self, job: Job) -> None:
        rooms = {g.index: g.available(self.headroom_bytes) for g in self.ledger}
        best = max(rooms, key=lambda i: (rooms[i], -i), default=None)
        if best is None or rooms[best] <= 0:
            self.queue.note(job.id, "waits to be probed: no GPU has room beyond the headroom")
            return
        log_path = self.paths.log(job.id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as out:
            out.write(f"--- memory probe on GPU {best} ---\n")
        try:
            started = self.procs.start(
                list(job.spec["cmd"]),
                job_env(job, (best,), socket=self.socket or self.paths.socket),
                str(job.spec.get("cwd") or "."),
                log_path,
            )
        except OSError as exc:
            self.queue.move(
                job.id, "failed", reason=f"could not start its probe: {exc}", ended_ts=self.clock()
            )
            return
        bound = float(job.spec.get("probe_s") or PROBE_S)
        self._probe = Probe(job.id, best, started.pid, self.clock(), bound_s=bound)
        self._probe_handle = started.handle
        self.queue.set_probe(job.id, started.pid, started.started)
        self.queue.note(job.id, f"probing its memory need on GPU {best} (up to {bound:g}s)")

    def _stop_probe(self, p: Probe) -> None:
        handle, self._probe, self._probe_handle = self._probe_handle, None, None
        if handle is not None and handle.poll() is None:
            self.procs.signal(p.pid, signal.SIGTERM, group=True)
            try:
                handle.wait(PROBE_STOP_S)
            except subprocess.TimeoutExpired:
                pass  # killed below
        self.procs.signal(p.pid, signal.SIGKILL, group=True)  # what it started, too
        if handle is not None:
            handle.wait()
        self.queue.set_probe(p.job_id, None, None)

    # ---- resizes and memory pressure --------------------------------------------------------

    def resize(self, job_id: str, gpus: int, reason: str = "", refused: str | None = None) -> Job:
        """A running job changes size: more GPUs are reserved before it grows; fewer are kept after it shrank.

        ``gpus`` is the size it wants. A grow takes the extra devices where its need per
        device fits (as admission would place a job), and never room that a waiting job of
        higher priority is owed. ``refused`` reports that the job could not carry out a
        shrink the server asked for; it is paused instead on the next pass.

        Raises:
            QueueError: no such running job, or no room (the message says why: the grow is refused).
        """
        with self._lock:
            job = self.queue.get(job_id)
            if job is None or job.state != "running":
                state = job.state if job is not None else "unknown"
                raise QueueError(f"job {job_id!r} is {state}; only a running job can resize")
            if refused is not None:
                self._cannot_shrink.add(job.id)
                self.queue.record(job.id, {"kind": "shrink_refused", "reason": refused}, shrink_to=None)
                return self.queue.get(job.id) or job
            if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
                raise QueueError(f"gpus={gpus!r}: give the number of GPUs the job wants, ≥ 1")
            have = list(job.gpus)
            if gpus > len(have):
                chosen = have + list(self._grant(job, gpus - len(have)))
                kind = "grow"
            else:
                if gpus == len(have):
                    return job  # nothing changes
                keep = list(job.shrink_to) if job.shrink_to and len(job.shrink_to) == gpus else have[:gpus]
                chosen, kind = keep, "shrink"
            entry = {"kind": kind, "from": have, "to": chosen, "reason": reason}
            if self.queue.resize(job.id, chosen, entry):
                self.queue.note(job.id, f"running on GPU {','.join(map(str, chosen))}")
            self.ledger = self._ledger(self.source(), self.queue.jobs(LIVE))
            fresh = self.queue.get(job.id)
            assert fresh is not None
            return fresh

    def _grant(self, job: Job, extra: int) -> tuple[int, ...]:
        live = self.queue.jobs(LIVE)
        ledger = self._ledger(self.source(), live)
        ahead = [q for q in self.queue.jobs(["queued"]) if q.priority > job.priority]
        if ahead:
            first = ahead[0]
            raise QueueError(
                f"no grow for {job.id}: {first.id} (priority {first.priority}) waits for room first"
            )
        available = {g.index: g.available(self.headroom_bytes) for g in ledger if g.index not in job.gpus}
        chosen = place(JobRequest(job.id, job.need_bytes, extra, job.priority, job.seq), available)
        if chosen is None:
            room = ", ".join(f"GPU {i} {gib(b)}" for i, b in sorted(available.items())) or "no other GPU"
            self.queue.record(
                job.id, {"kind": "grow_refused", "from": list(job.gpus), "reason": f"no room; {room}"}
            )
            raise QueueError(
                f"no room to grow {job.id} by {extra} GPU(s): it needs {gib(job.need_bytes)} on each; "
                f"free − reserved − {gib(self.headroom_bytes)} headroom is {room}"
            )
        return chosen

    def _relieve(self, live: list[Job]) -> None:
        """Pause, shrink or resume jobs for memory pressure (server/pressure.py decides which)."""
        threshold = self.headroom_bytes if self.pressure_bytes is None else self.pressure_bytes
        if threshold <= 0:
            return
        running = [j for j in live if j.state == "running" and j.run_dir]
        for j in running:
            if j.paused is None:
                continue
            state = run_status(j.run_dir).get("state")
            if state == "paused":
                self._seen_paused.add(j.id)
            elif j.id in self._seen_paused:  # someone resumed it (steadytune resume): it is no longer ours
                self._seen_paused.discard(j.id)
                self.queue.record(j.id, {"kind": "resumed", "reason": f"run {state} again"}, paused=None)
        running = [j for j in self.queue.jobs(["running"]) if j.run_dir]
        now = self.clock()
        for j in running:
            asked = self._shrink_asked.setdefault(j.id, now) if j.shrink_to is not None else None
            if asked is None:
                self._shrink_asked.pop(j.id, None)
            elif now - asked > SHRINK_WAIT_S:  # its supervisor never took it up: it is paused instead
                self._shrink_asked.pop(j.id, None)
                self._cannot_shrink.add(j.id)
                why = f"no shrink within {SHRINK_WAIT_S:g}s"
                self.queue.record(j.id, {"kind": "shrink_refused", "reason": why}, shrink_to=None)
        running = [j for j in self.queue.jobs(["running"]) if j.run_dir]
        views = [
            LiveJob(
                j.id, j.priority, j.seq, j.gpus, j.need_bytes,
                paused=j.paused is not None,
                min_gpus=None if j.id in self._cannot_shrink else j.spec.get("scale_min_gpus"),
                # A pause takes effect once its run says so (the checkpoint is written, the worker gone).
                stepping_aside=j.shrink_to is not None
                or (j.paused is not None and j.id not in self._seen_paused),
            )
            for j in running
        ]  # fmt: skip
        by_id = {j.id: j for j in running}
        for action in relieve(self.ledger, views, threshold, self.headroom_bytes):
            self._carry_out(by_id[action.job_id], action)

    def _carry_out(self, job: Job, action: PressureAction) -> None:
        assert job.run_dir is not None
        run = RunDir(Path(job.run_dir))
        entry: dict[str, Any] = {"kind": action.kind, "gpu": action.gpu, "reason": action.reason}
        if action.kind == "pause":
            send_control(run, "pause", issuer=ISSUER, args={"mode": "release"}, clock=self.clock)
            self.queue.record(job.id, entry, paused=action.reason)
        elif action.kind == "shrink":
            # Its supervisor asks for it on its next sample and shrinks through its scale rules.
            entry = {**entry, "kind": "shrink_asked", "to": list(action.keep)}
            self.queue.record(job.id, entry, shrink_to=action.keep)
        elif action.kind == "resume" and run_status(job.run_dir).get("state") == "paused":
            # Only once its worker has stopped: a resume before that would be lost.
            send_control(run, "resume", issuer=ISSUER, clock=self.clock)
            self.queue.record(job.id, entry, paused=None)
            self._seen_paused.discard(job.id)

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
            # A supervisor stopped during its start (imports, preflight) has written no status yet.
            how = f"run {state}" if state else "while starting: its run had written no status yet"
            self.queue.move(job.id, "cancelled", reason=f"cancelled ({how})", ended_ts=now)
        elif state == "completed":
            self.queue.move(job.id, "done", reason="completed", ended_ts=now)
        else:
            end = run_end(read_events(RunDir(Path(job.run_dir)).events)) if job.run_dir else None
            why = ended_reason(status, lambda pid: self.procs.alive(pid, None), end.message if end else None)
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


def order_jobs(jobs: list[Job]) -> list[Job]:
    """Jobs in admission order: priority first (higher first), then submission order."""
    ranked = order_requests(JobRequest(j.id, j.need_bytes, j.gpus_wanted, j.priority, j.seq) for j in jobs)
    by_id = {j.id: j for j in jobs}
    return [by_id[r.job_id] for r in ranked]
