"""The supervisor: the parent process of a run. It never imports torch.

One supervisor serves ``run`` and ``supervise``: a :mod:`source <steadytune.supervise.source>`
starts each attempt (steadytune's own worker, or a command it watches) and makes its
progress appear in the per-rank streams. The supervisor tails them, samples the
system, runs the detectors and the policy, files events, keeps ``status.json``
fresh, and when the worker dies, hangs or diverges stops its whole process tree and
restarts it from the newest *verified* checkpoint with a new plan revision, within
a budget.

The :class:`Supervisor` owns the run's state and its loop (pump, handle, the attempt, carrying out the
restart decision); its parts each hold it as ``sup`` and keep only their own bookkeeping:
``worker_events`` (what a worker reports), ``actions`` (detection to policy to action),
``controls`` (signals and operator requests), ``books`` (``status.json``, LAST_GOOD),
``resumes`` (where a restart resumes), ``publishes`` (checkpoints on their way, and a rollback
waiting for one), ``planner`` (restart budgets, backoff and the next plan
revision), ``in_process`` (rollbacks in the live worker) and ``scaling`` (resizes).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from steadytune.checkpoint.manifest import checkpoint_step
from steadytune.config.load import dump_config
from steadytune.config.schema import SteadytuneConfig
from steadytune.detect.live import LiveDetector
from steadytune.policy.engine import Action, Policy
from steadytune.policy.restart import Decision, ExitInfo
from steadytune.records import (
    Event,
    Heartbeat,
    PlanRevision,
    Record,
    StepRecord,
    SystemSample,
    WorkerExit,
    to_json,
)
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.supervise.actions import Actions
from steadytune.supervise.inprocess import InProcessRollbacks
from steadytune.supervise.logparse import last_exception, last_lines
from steadytune.supervise.next_attempt import NextAttempt, RestartPlanner
from steadytune.supervise.operator import OperatorControls
from steadytune.supervise.process import ProcessTree, WorkerProcess
from steadytune.supervise.publishing import Publishes
from steadytune.supervise.restarts import (
    anomaly_event_data,
    first_plan,
    replay_detector,
)
from steadytune.supervise.resuming import Resumes
from steadytune.supervise.scaling import SCALE_ACTIONS, Autoscaler
from steadytune.supervise.source import PLAN, NativeSource, WorkerSource
from steadytune.supervise.standby import Standby
from steadytune.supervise.status import RunBooks
from steadytune.supervise.worker_events import WorkerEvents
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.progress import RunProgress, progress_line
from steadytune.telemetry.runenv import config_sources
from steadytune.telemetry.sampler import SystemSampler
from steadytune.telemetry.snapshot import sampler_from_env
from steadytune.telemetry.stream import JsonlTailer, JsonlWriter


class Observer(Protocol):
    """Something that follows a live run (store, detectors, dashboard feed, alerts)."""

    def on_record(self, record: Record) -> None: ...
    def on_event(self, event: Event) -> None: ...
    def close(self) -> None: ...


@dataclass
class RunResult:
    run: RunDir
    state: str  # completed / stopped / paused / failed
    reason: str
    progress: RunProgress
    restarts: int
    checkpoints: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def new_run_id(cfg: SteadytuneConfig, now: float) -> str:
    base = cfg.run.name or Path(cfg.model.name_or_path.rstrip("/")).name or "run"
    base = "".join(c if c.isalnum() or c in "._-" else "-" for c in base)[:40].strip("-.") or "run"
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{uuid.uuid4().hex[:4]}"


class Supervisor:
    """Runs one fine-tuning job to the end, restarting its worker when it dies."""

    def __init__(
        self,
        cfg: SteadytuneConfig,
        run: RunDir,
        console: Any = None,
        clock: Callable[[], float] = time.time,
        sampler: SystemSampler | None = None,
        poll_s: float = 0.2,
        worker_env: dict[str, str] | None = None,
        observers: list[Observer] | None = None,
        stop_grace_s: float = 120.0,
        source: WorkerSource | None = None,
        early: Standby | None = None,
        launch: dict[str, Any] | None = None,
    ) -> None:
        """``early``: a spare started for the first attempt while the preflight ran (``early_standby``).

        ``launch``: when the run was asked for before this supervisor began (its process's start, the
        preflight's span, a server job's submission), filed in ``run_started`` for the goodput account.
        """
        self.launch = dict(launch or {})
        self.cfg = cfg
        self.run = run.create()
        self.console = console
        self.clock = clock
        self.poll_s = poll_s
        self.source: WorkerSource = source or NativeSource(
            self.run, cfg.run.nproc_per_node, worker_env, standby=cfg.recover.standby_worker, early=early
        )
        self._observers_arg = observers
        self.stop_grace_s = stop_grace_s
        self.sampler = sampler or sampler_from_env(self.run.root, clock=clock)
        self.events = EventLog(self.run.events, self.run.run_id, clock=clock, on_append=self._fan_event)
        self.observers: list[Observer] = (
            list(self._observers_arg) if self._observers_arg is not None else self.default_observers()
        )
        self.progress = RunProgress(max_steps=cfg.train.max_steps if cfg.train.max_steps > 0 else None)
        self.system_writer = JsonlWriter(self.run.system)
        self.tailers: dict[Path, JsonlTailer] = {}
        self.state = "starting"
        self.attempt = 0
        self.planner = RestartPlanner(cfg.run, cfg.train, clock)  # restart budgets, backoff, next plans
        self.worker: WorkerProcess | None = None
        self.tree: ProcessTree | None = None
        self.exits: list[WorkerExit] = []
        self.last_heartbeat: dict[int, float] = {}
        self.worker_phase = "setup"
        self.phase_since = clock()
        self.attempt_stepped = False  # pace is judged only once this attempt has made a step
        self.checkpoint_steps: list[int] = []
        self.trouble_steps: list[int] = []  # steps of warnings/criticals, for LAST_GOOD
        self.detector = LiveDetector(cfg.detect)
        self.policy = Policy(cfg.policy)
        self.plan = first_plan(cfg, clock())
        self.last_save_ts: float | None = None
        self.scaling = Autoscaler.for_run(self, worker_env)  # None without scale: in the config
        self.pending: Action | None = None  # an action that stopped the worker on purpose
        self.samples_by_step: dict[int, list[int]] = {}  # for rollback-and-skip
        self.last_step_ts: float | None = None
        self.started_ts = clock()
        self.leak_snapshot_pending = False  # a leak's checkpoint, once taken, asks for an allocator snapshot
        self.interrupts = 0  # SIGINT/SIGTERM received: the first stops, the second kills
        self.stop_signal: int | None = None
        self.stop_sent_at: float | None = None
        self.resumes = Resumes(self)
        self.publishes = Publishes(self)
        self.in_process = InProcessRollbacks(self)
        self.books = RunBooks(self)
        self.controls = OperatorControls(self)  # signals and the control queue
        self.worker_events = WorkerEvents(self)
        self.actions = Actions(self)  # what the policy decides, carried out
        self._reaped: list[int] = []  # what the last attempt left behind, killed
        self._stop_killed = False
        self.pause_requested = False  # a job that takes no requests was stopped on an operator's pause
        self._last_sample = 0.0
        self.dashboard_url: str | None = None

    def default_observers(self) -> list[Observer]:
        """The run index (``run.db``) and the alert router, as the config asks."""
        from steadytune.alerts.router import AlertRouter
        from steadytune.supervise.observers import AlertObserver, StoreObserver

        out: list[Observer] = [StoreObserver(self.run)]
        alerts = self.cfg.alerts
        if self.console is not None:
            # The supervisor already prints every event on its console: a console sink would say it twice.
            alerts = alerts.model_copy(update={"sinks": [s for s in alerts.sinks if s.type != "console"]})
        if alerts.enabled and alerts.sinks:
            out.append(
                AlertObserver(AlertRouter(alerts, self.events, clock=self.clock, run_id=self.run.run_id))
            )
        return out

    # -- outputs -------------------------------------------------------------
    def _fan_event(self, event: Event) -> None:
        for obs in self.observers:
            obs.on_event(event)

    def say(self, text: str, style: str | None = None) -> None:
        if self.console is not None:
            self.console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)

    def emit(self, kind: str, name: str, message: str = "", severity: str = "info", **fields: Any) -> Event:
        event = self.events.emit(kind, name, message, severity=severity, **fields)
        if severity != "info" or kind in {"lifecycle", "action"}:
            style = {"critical": "bold red", "warning": "yellow"}.get(severity)
            self.say(f"[{kind}] {event.message or name}", style=style)  # as filed: redacted
        return event

    # -- the run -------------------------------------------------------------
    def prepare(self) -> None:
        atomic_write_text(self.run.config, dump_config(self.cfg))
        self.source.write_env(config_sources(self.cfg))  # env.json
        self.started_ts = self.clock()
        what = "" if PLAN in self.source.abilities else f": supervising {self.source.describe()}"
        self.emit(
            "lifecycle",
            "run_started",
            f"run {self.run.run_id} started{what}",
            data={
                "method": self.cfg.method,
                "source": self.source.label,
                **({"launch": self.launch} if self.launch else {}),
            },
        )

    def write_plan(self, plan: PlanRevision) -> None:
        with open(self.run.plan, "a", encoding="utf-8") as f:
            f.write(to_json(plan) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for obs in self.observers:
            obs.on_record(plan)

    def revise(self, reason: str, cause: Event | None = None, **changes: Any) -> PlanRevision:
        """Write the next plan revision, inheriting everything the last one said."""
        self.plan = self.planner.revision(self.plan, reason, cause.seq if cause else None, **changes)
        self.write_plan(self.plan)
        return self.plan

    def resume_point(self) -> str | None:
        """The newest checkpoint that verifies; unusable ones are reported and skipped."""
        return self.resumes.resume_point()

    def start_worker(self, plan: PlanRevision) -> None:
        self.stop_sent_at = None
        self.controls.drop_stale_requests()
        self.publishes.on_worker_start()
        self.worker = self.source.start(plan, self.run.logs / f"worker-{plan.attempt}.log")
        self.tree = ProcessTree(self.worker)
        cmd = self.worker.cmd
        self.state = "running"
        self.last_heartbeat = {0: self.clock()}
        self.worker_phase, self.phase_since = "setup", self.clock()
        self.attempt_stepped = False
        resume = Path(plan.resume_checkpoint) if plan.resume_checkpoint else None
        self.resumes.expect(resume)
        self.emit(
            "lifecycle",
            "worker_started",
            f"{self.source.label} attempt {plan.attempt} started (pid {self.worker.pid}, {self.worker.kind})"
            + (f", resuming from {resume.name}" if resume else "")
            + ("" if PLAN in self.source.abilities else f": {' '.join(cmd)}")
            + f"; {self.worker.how}",
            data={"pid": self.worker.pid, "attempt": plan.attempt, "cmd": cmd, **self.worker.origin()},
        )

    def pump(self) -> None:
        """Read everything new from the worker's streams and act on it."""
        for rec in self.source.poll() or ():  # the engine's own records (ray_source.py), if any
            self.handle(rec)
        for path in self.run.telemetry_files():
            tailer = self.tailers.get(path)
            if tailer is None:
                tailer = self.tailers[path] = JsonlTailer(path)
            for rec in tailer.read():
                self.handle(rec)
        now = self.clock()
        if now - self._last_sample >= self.cfg.run.sample_interval_s:
            self._last_sample = now
            # Every process the attempt started, so none outlives it; the sample's RSS is theirs.
            tree = self.tree.note() if self.tree is not None else None
            running = self.worker is not None and self.worker.poll() is None
            sample = self.sampler.sample(self.worker.pid if running and self.worker else None, tree)
            self.handle(sample)
        self.controls.poll()
        self.publishes.tick()
        self.in_process.tick()
        # Loading (and resuming), saving and evaluating are judged by setup_timeout_s, not by step pace;
        # a paused worker is not judged at all.
        slow_phase = self.worker_phase == "paused" or (
            (self.worker_phase != "train" or not self.attempt_stepped)
            and now - self.phase_since < self.cfg.policy.setup_timeout_s
        )
        if self.worker is not None and self.worker.poll() is None and self.pending is None and not slow_phase:
            last_beat = max(self.last_heartbeat.values()) if self.last_heartbeat else None
            for t in self.detector.observe_time(now, last_beat, self.progress.step or None):
                self.actions.on_transition(t)
        self.books.update_last_good()
        self.books.write_status()
        for obs in self.observers:
            flush = getattr(obs, "flush", None)
            if flush is not None:
                flush()

    def handle(self, rec: Record) -> None:
        if isinstance(rec, StepRecord):
            stale = self.in_process.stale(rec)
            if not stale:
                self.progress.add(rec)
            self.last_heartbeat[rec.rank] = self.clock()
            if rec.rank == 0 and rec.attempt == self.attempt and not rec.extra.get("eval"):
                if not self.attempt_stepped:
                    self.source.training()  # a spare for the next attempt starts now, not beside this one's
                self.worker_phase, self.attempt_stepped = "train", True
                self.resumes.on_first_loss(rec)
                if self.scaling is not None:
                    self.scaling.on_step(rec)
            if rec.batch is not None and rec.batch.indices:
                self.samples_by_step.setdefault(rec.step, []).extend(rec.batch.indices)
            if self.pending is None and not stale:
                for t in self.detector.observe_step(rec):
                    self.actions.on_transition(t)
            # An anomaly of this very record may have stopped the worker (a gradient explosion beside a
            # spike that persisted): a spike confirmed now belongs to that incident, not to a second one.
            if self.pending is None and not stale and rec.rank == 0 and not rec.extra.get("eval"):
                for action in self.policy.on_step(rec.step):
                    self.actions.execute(action)
        elif isinstance(rec, Heartbeat):
            self.last_heartbeat[rec.rank] = self.clock()
            if rec.rank == 0 and rec.attempt == self.attempt and rec.phase != self.worker_phase:
                self.worker_phase = rec.phase
                if self.attempt_stepped:  # the setup clock runs from the worker's start until its first step
                    self.phase_since = self.clock()
        elif isinstance(rec, SystemSample):
            self.system_writer.write(rec)
            if self.pending is None:
                for t in self.detector.observe_system(rec):
                    self.actions.on_transition(t)
            if self.scaling is not None and self.pending is None:
                self.scaling.on_sample(rec)
        elif isinstance(rec, WorkerExit):
            self.exits.append(rec)
            if rec.rank == 0 and rec.attempt == self.attempt and self.worker_phase != "paused":
                self._finishing()
        elif isinstance(rec, Event):
            self.worker_events.on_event(rec)
        for obs in self.observers:
            obs.on_record(rec)

    def _finishing(self) -> None:
        """Training is over (rank 0's last words, or the Trainer's closing summary), the process not yet:
        it winds down (a final save, a merge, a process group torn down) without a step or a heartbeat,
        judged by setup_timeout_s as loading and saving are. By the step pace, torch's launcher taking
        6 s to end two ranks was a hang, and a finished run was restarted to finish again."""
        if self.worker_phase != "finish":
            self.worker_phase, self.phase_since = "finish", self.clock()

    # -- main loop ------------------------------------------------------------
    def supervise_attempt(self, live: Any = None) -> ExitInfo:
        assert self.worker is not None
        exits_before = len(self.exits)
        while True:
            rc = self.worker.poll()
            self.pump()
            if live is not None:
                live.update(progress_line(self.progress, self.planner.total, self.state))
            if rc is not None:
                break
            if self.stop_sent_at is not None and self.clock() - self.stop_sent_at > self.stop_grace_s:
                self.say(f"the {self.source.label} did not stop in time: killing it", style="bold red")
                self.worker.kill()
                self._stop_killed = True
            time.sleep(self.poll_s)
        # Asked to stop, the rest of the tree gets the grace period too: a launcher dies of SIGTERM at
        # once while its trainer is still saving the checkpoint it was asked for.
        while (
            self.stop_sent_at is not None
            and self.tree is not None
            and self.tree.alive()
            and self.clock() - self.stop_sent_at <= self.stop_grace_s
            and self.interrupts < 2
        ):
            self.pump()
            time.sleep(self.poll_s)
        self.reap()
        self.source.settle()
        self.pump()  # the last words arrive after the exit
        mine = [e for e in self.exits[exits_before:] if e.attempt == self.attempt]
        last = next((e for e in mine if e.status == "error"), mine[-1] if mine else None)
        tail = self.worker.log_tail()
        found = last_exception(tail) if last is None and rc else None
        status = last.status if last else None
        outside = last is None and self.pause_requested
        if outside:
            status, self.pause_requested = "paused", False  # stopped from outside on an operator's pause
        elif last is None and rc == 0 and PLAN not in self.source.abilities:
            # A job's own exit status is all it says; asked to stop, a clean exit is a stop.
            status = "stopped" if self.stop_sent_at is not None else "completed"
        stopping = self.stop_sent_at is not None or (self.pending is not None and self.pending.name == "stop")
        return ExitInfo(
            returncode=rc,
            status=status,
            error_type=last.error_type if last else (found[0] if found else None),
            error_message=last.error_message if last else (found[1] if found else None),
            step=last.step if last else self.progress.step,
            # Without last words, an error exit (not a signal) before any step would fail the same way again.
            deterministic=bool(last and last.deterministic)
            or (last is None and rc is not None and rc > 0 and not self.attempt_stepped and not stopping),
            stderr_tail=tail,
            interrupted=self.stop_sent_at is not None and status not in {"stopped", "paused", "completed"},
            stopped_outside=outside,
        )

    def reap(self) -> None:
        """The attempt's whole tree goes before anything restarts.

        A launcher (trl, accelerate, torchrun) that died leaves its trainer running, and two
        trainers on one output folder overwrite each other's checkpoints.
        """
        if self.tree is None:
            return
        left = self.tree.reap()
        self._reaped = left
        if left:
            self.emit(
                "action",
                "tree_killed",
                f"killed {len(left)} process(es) the {self.source.label} left behind: "
                + ", ".join(map(str, left)),
                severity="warning",
                step=self.progress.step,
                data={"pids": left},
            )

    def run_to_end(self, live: Any = None) -> RunResult:
        t0 = self.clock()
        self.prepare()
        self.write_plan(self.plan)
        self.start_worker(self.plan)
        while True:
            info = self.supervise_attempt(live)
            if self.pending is None and not self.interrupts and (bad := self.resumes.nonfinite_end(info)):
                # A run whose loss ended NaN/Inf holds unusable weights: it is never "completed".
                action = self.policy.instead(bad, self.progress.step, "rollback", "the run ended non-finite")
                if action is None or action.name != "rollback":
                    why = (
                        f"the run ended with a non-finite loss ({bad.kind} from step {bad.start_step}) and "
                        "no rollback is allowed: its final weights are not usable"
                    )
                    return self.finish(Decision("stop", "nonfinite", why), info, t0)
                self.actions.execute(action)
            if self.pending is not None and not self.interrupts:
                action, self.pending = self.pending, None
                if action.name in {"stop", "pause"}:  # a job stopped from outside, on the policy's word
                    return self.finish(
                        Decision("done", "stopped", f"{action.name}: {action.reason}"), info, t0
                    )
                changes, reason, why = self.plan_after_action(action, info)
                if changes is None:
                    return self.finish(Decision("stop", action.name, why), info, t0)
                nxt = self.planner.after_action(self.plan, changes, reason, why)
            else:
                decision = self.planner.decide(info)
                if decision.classification == "paused" and not self.interrupts:
                    self.emit("lifecycle", "run_paused", f"run paused at step {info.step}", step=info.step)
                    if not self.controls.wait_while_paused(live):
                        return self.finish(
                            Decision("stop", "user_interrupt", "stopped while paused"), info, t0
                        )
                    self.attempt += 1
                    event = self.emit("lifecycle", "run_resumed", "run resumed", step=info.step)
                    self.revise(
                        reason="resume",
                        cause=event,
                        attempt=self.attempt,
                        resume_checkpoint=self.resume_point(),
                        notes="resumed by an operator",
                    )
                    self.start_worker(self.plan)
                    continue
                failed_resume = self.resumes.failed_resume(info, decision)
                if failed_resume is not None:
                    decision = failed_resume
                elif decision.action != "restart" or self.interrupts:
                    return self.finish(decision, info, t0)
                changes, reason, why = self.resumes.plan_after_crash(decision)
                if changes is None:
                    return self.finish(Decision("stop", decision.classification, why), info, t0)
                nxt = self.planner.after_crash(self.plan, changes, reason, why, decision.delay_s)
            if not self.restart(nxt, info):
                return self.finish(Decision("stop", "user_interrupt", "stopped on request"), info, t0)

    def restart(self, nxt: NextAttempt, info: ExitInfo) -> bool:
        """File the restart, wait its backoff and start the next attempt; False: stopped while waiting."""
        event = self.emit(
            "action",
            "restart",
            nxt.message(self.source.label),
            severity="warning",
            step=info.step,
            data=nxt.event_data(info.returncode),
        )
        self.state = "restarting"
        self.books.write_status(force=True)
        time.sleep(nxt.delay_s)
        if self.interrupts:
            return False
        self.attempt += 1
        self.revise(reason=nxt.reason, cause=event, attempt=self.attempt, notes=nxt.why, **nxt.changes)
        self.rewind_detection(nxt.changes.get("resume_checkpoint"))
        self.start_worker(self.plan)
        return True

    def rewind_detection(self, resume: str | None) -> None:
        """Start detection again from the checkpoint the worker resumes from.

        Open anomalies belong to the abandoned timeline: they are resolved, and the
        detectors are rebuilt by replaying the kept history up to the resume step
        (the latest attempt of each step), so baselines survive the restart.
        """
        for a in self.detector.open_anomalies():
            self.emit(
                "resolved",
                a.kind,
                f"resolved {a.kind}: cleared by the restart",
                step=a.end_step,
                data={**anomaly_event_data(a), "cleared_by": "restart"},
            )
        self.policy.forget_open()
        step = checkpoint_step(Path(resume)) if resume else 0
        self.detector = replay_detector(self.run, self.cfg.detect, step or 0)
        self.progress.rewind(step or 0, self.attempt)

    def plan_after_action(self, action: Action, info: ExitInfo) -> tuple[dict[str, Any] | None, str, str]:
        """The restart plan for a worker the supervisor stopped on purpose."""
        if action.name in SCALE_ACTIONS and self.scaling is not None:
            return self.scaling.plan_after_resize()
        planned = self.in_process.take_fallback()  # a rollback planned for in process, done by a restart
        return planned if planned is not None else self.resumes.plan_after_action(action)

    def finish(self, decision: Decision, info: ExitInfo, t0: float) -> RunResult:
        state = {
            "done": decision.classification,
            "stop": "stopped" if decision.classification == "user_interrupt" else "failed",
        }[decision.action]
        # The episodes whose condition cleared end with the run (one still holding stays open, as it is).
        for t in self.detector.close():
            self.actions.on_transition(t)
        # Set before books.update_last_good: a completed run's last checkpoint needs no window after it.
        self.state = state
        if state == "completed":
            self.books.update_last_good()
        severity = "info" if state in {"completed", "stopped", "paused"} else "critical"
        data: dict[str, Any] = {"classification": decision.classification}
        detail = ""
        if state == "failed" and self.worker is not None:
            # The cause itself, where to read more, and how the log ends: a stop that says only
            # "see the log" sends the user digging.
            lines = last_lines(info.stderr_tail)
            data.update(log=str(self.worker.log_path), last_lines=lines)
            detail = f"\n  log: {self.worker.log_path}" + "".join(f"\n  | {ln}" for ln in lines)
        if state == "stopped" and self.stop_signal is not None:
            data["signal"] = signal.Signals(self.stop_signal).name
            data["graceful"] = not self._stop_killed and not self._reaped
            data["killed_pids"] = list(self._reaped)
        self.emit(
            "lifecycle",
            f"run_{state}",
            f"run {state}: {decision.reason}",
            severity=severity,
            step=info.step,
            data=data,
        )
        if detail:
            self.say(detail.lstrip("\n"))
        self.source.close()
        self.books.write_status(force=True)
        self.system_writer.close()
        for obs in self.observers:
            obs.close()
        ckpts = [p.name for p in reversed(self.source.checkpoints())]  # in step order
        return RunResult(
            self.run,
            state,
            decision.reason,
            self.progress,
            self.planner.total,
            ckpts,
            self.clock() - t0,
        )
