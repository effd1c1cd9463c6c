"""The supervisor: the parent process of a run. It never imports torch.

One supervisor serves ``run`` and ``supervise``: a :mod:`source <steadytune.supervise.source>`
starts each attempt (steadytune's own worker, or a command it watches) and makes its
progress appear in the per-rank streams. The supervisor tails them, samples the
system, runs the detectors and the policy, files events, keeps ``status.json``
fresh, and when the worker dies, hangs or diverges stops its whole process tree and
restarts it from the newest *verified* checkpoint with a new plan revision, within
a budget.

The run's state is one :class:`~steadytune.supervise.runstate.RunState` (the attempt in progress,
a stop under way, the history later decisions read, the plan revisions), and everything the run
says goes through its :class:`~steadytune.supervise.outbox.Outbox`. The :class:`Supervisor` owns
the loop (read what came in, handle each record, tick, carry out the restart decision) and hands
its parts the state and the outbox, never itself: ``worker_events`` (what a worker reports),
``actions`` (detection to policy to action: the one place a policy ``Action`` is carried out),
``controls`` (signals and operator requests), ``books`` (``status.json``, LAST_GOOD), ``resumes``
(where a restart resumes, and the detection rewind), ``publishes`` (checkpoints on their way, and a
rollback waiting for one), ``in_process`` (rollbacks in the live worker) and ``scaling`` (resizes).
A part that decides an action returns it (``worker_events.on_event``, ``scaling.on_sample``,
``publishes.tick``) and the supervisor hands it to ``actions``.
"""

from __future__ import annotations

import signal
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
)
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.supervise.actions import Actions
from steadytune.supervise.inprocess import InProcessRollbacks
from steadytune.supervise.intake import Intake
from steadytune.supervise.logparse import FOLLOWED, last_exception, last_lines
from steadytune.supervise.next_attempt import NextAttempt, RestartPlanner
from steadytune.supervise.observers import Observer
from steadytune.supervise.operator import OperatorControls, paused_line
from steadytune.supervise.outbox import Outbox
from steadytune.supervise.process import ProcessTree
from steadytune.supervise.publishing import Publishes
from steadytune.supervise.ranks import failed_rank
from steadytune.supervise.restarts import first_plan
from steadytune.supervise.resuming import Resumes
from steadytune.supervise.runstate import Attempt, History, Plans, RunState, Stopping
from steadytune.supervise.samples import SampleLog
from steadytune.supervise.scaling import SCALE_ACTIONS, Autoscaler
from steadytune.supervise.source import PLAN, NativeSource, WorkerSource, run_worker_env
from steadytune.supervise.standby import Standby
from steadytune.supervise.status import RunBooks
from steadytune.supervise.worker_events import WorkerEvents
from steadytune.telemetry.progress import RunProgress, progress_line
from steadytune.telemetry.runenv import config_sources
from steadytune.telemetry.sampler import SystemSampler
from steadytune.telemetry.snapshot import sampler_from_env
from steadytune.telemetry.stream import latest_plan


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
        poll_s: float | None = None,
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
        self.cfg = cfg
        self.run = run.create()
        self.poll_s = cfg.run.poll_s if poll_s is None else poll_s
        self.out = Outbox(self.run, clock, console)
        planner = RestartPlanner(cfg.run, cfg.train, clock)  # restart budgets, backoff, next plans
        worker_env = run_worker_env(cfg, worker_env)
        source = source or NativeSource(
            self.run, cfg.run.nproc_per_node, worker_env, standby=cfg.recover.standby_worker, early=early
        )
        self.state = RunState(
            cfg=cfg,
            run=self.run,
            source=source,
            clock=clock,
            plans=Plans(first_plan(cfg, clock()), planner, self.run.plan, self.out.record),
            # A command steadytune does not run trains to its own max_steps, which it may print (the
            # train_begin the log adapter writes); the config's is not the job's.
            progress=RunProgress(
                max_steps=cfg.train.max_steps
                if cfg.train.max_steps > 0 and PLAN in source.abilities
                else None
            ),
            detector=LiveDetector(cfg.detect),
            policy=Policy(cfg.policy),
            attempt=Attempt(phase_since=clock()),
            stop=Stopping(grace_s=stop_grace_s),
            history=History(samples_by_step=SampleLog(self.run)),  # older steps' samples read back
            started_ts=clock(),
            launch=dict(launch or {}),
        )
        for obs in observers if observers is not None else self.default_observers():
            self.out.observers.append(obs)
        sampler = sampler or sampler_from_env(self.run.root, clock=clock)
        self.intake = Intake(
            self.run, source, sampler, cfg.run.sample_interval_s, cfg.run.telemetry_segment_bytes
        )
        # The parts, each handed what it reads and the parts it hands work to (none holds the supervisor).
        self.scaling = Autoscaler.for_run(self.state, self.out, worker_env)  # None without scale:
        self.publishes = Publishes(self.state, self.out)
        self.resumes = Resumes(self.state, self.out, self.publishes)
        self.in_process = InProcessRollbacks(self.state, self.out, self.resumes, self.publishes)
        self.books = RunBooks(self.state)
        self.controls = OperatorControls(self.state, self.out)  # signals and the control queue
        self.worker_events = WorkerEvents(
            self.state, self.out, self.publishes, self.resumes, self.in_process, self.books, self.scaling
        )
        self.actions = Actions(self.state, self.out, self.publishes, self.in_process)

    def default_observers(self) -> list[Observer]:
        """The run index (``run.db``) and the alert router, as the config asks."""
        from steadytune.alerts.router import AlertRouter
        from steadytune.supervise.observers import AlertObserver, StoreObserver
        from steadytune.supervise.outbox import said_on_console

        out: list[Observer] = [StoreObserver(self.run)]
        alerts = self.cfg.alerts
        # What the supervisor prints on its console a console sink leaves to it (no line said
        # twice), yet counts delivered: the alert reached the console.
        said = said_on_console if self.out.console is not None else None
        if alerts.enabled and alerts.sinks:
            router = AlertRouter(
                alerts, self.out.events, clock=self.state.clock, run_id=self.run.run_id, console_said=said
            )
            out.append(AlertObserver(router))
        return out

    # -- the run -------------------------------------------------------------
    def prepare(self) -> None:
        atomic_write_text(self.run.config, dump_config(self.cfg))
        self.state.source.write_env(config_sources(self.cfg))  # env.json
        self.state.started_ts = self.state.clock()
        what = "" if PLAN in self.state.source.abilities else f": supervising {self.state.source.describe()}"
        self.out.emit(
            "lifecycle",
            "run_started",
            f"run {self.run.run_id} started{what}",
            data={
                "method": self.cfg.method,
                "source": self.state.source.label,
                **({"launch": self.state.launch} if self.state.launch else {}),
            },
        )

    def start_worker(self, plan: PlanRevision) -> None:
        st, source = self.state, self.state.source
        st.stop.sent_at = None
        self.controls.drop_stale_requests()
        self.publishes.on_worker_start()
        worker = st.attempt.worker = source.start(plan, self.run.logs / f"worker-{plan.attempt}.log")
        st.attempt.tree = ProcessTree(worker)
        st.status = "running"
        st.attempt.heartbeats = {0: st.clock()}
        st.attempt.setup(st.clock())
        resume = Path(plan.resume_checkpoint) if plan.resume_checkpoint else None
        self.resumes.expect(resume)
        self.out.emit(
            "lifecycle",
            "worker_started",
            f"{source.label} attempt {plan.attempt} started (pid {worker.pid}, {worker.kind})"
            + (f", resuming from {resume.name}" if resume else "")
            + ("" if PLAN in source.abilities else f": {' '.join(worker.cmd)}")
            + f"; {worker.how}",
            data={"pid": worker.pid, "attempt": plan.attempt, "cmd": worker.cmd, **worker.origin()},
        )

    def pump(self) -> None:
        """Read everything new from the worker's streams and act on it."""
        for rec in self.intake.read():
            self.handle(rec)
        now = self.state.clock()
        if (sample := self.intake.sample(self.state.attempt, now)) is not None:
            self.handle(sample)
        self.tick(now)

    def tick(self, now: float | None = None) -> None:
        """A turn of the loop besides the records: operator requests, the rollbacks waiting (for a
        publish, or in the worker), the pace, the books, the observers' batches."""
        st, attempt = self.state, self.state.attempt
        now = st.clock() if now is None else now
        self.controls.take_signals()
        self.controls.poll()
        if (released := self.publishes.tick()) is not None:
            self.actions.stop_for(released)
        self.in_process.tick()
        # Loading (and resuming), saving and evaluating are judged by setup_timeout_s, not by step pace;
        # a paused worker is not judged at all.
        slow_phase = attempt.phase == "paused" or (
            (attempt.phase != "train" or not attempt.stepped)
            and now - attempt.phase_since < self.cfg.policy.setup_timeout_s
        )
        if attempt.running() and st.pending is None and not slow_phase:
            last_beat = max(attempt.heartbeats.values()) if attempt.heartbeats else None
            for t in st.detector.observe_time(now, last_beat, st.progress.step or None):
                self.actions.on_transition(t)
        self.books.update_last_good()
        self.books.write_status()
        self.out.observers.tick(now)

    def handle(self, rec: Record) -> None:
        st, attempt = self.state, self.state.attempt
        if isinstance(rec, StepRecord):
            stale = self.in_process.stale(rec)
            if not stale:
                st.progress.add(rec)
            attempt.heartbeats[rec.rank] = st.clock()
            if rec.rank == 0 and rec.attempt == attempt.number and not rec.extra.get("eval"):
                if not attempt.stepped:
                    st.source.training()  # a spare for the next attempt starts now, not beside this one's
                    self.resumes.on_first_step(rec)
                attempt.phase, attempt.stepped = "train", True
                self.resumes.on_first_loss(rec)
                if self.scaling is not None and (undo := self.scaling.on_step(rec)) is not None:
                    self.actions.execute(undo)
            if rec.batch is not None and rec.batch.indices:
                st.history.samples_by_step.add(rec.step, rec.batch.indices)
            if st.pending is None and not stale:
                for t in st.detector.observe_step(rec):
                    self.actions.on_transition(t)
            # An anomaly of this very record may have stopped the worker (a gradient explosion beside a
            # spike that persisted): a spike confirmed now belongs to that incident, not to a second one.
            if st.pending is None and not stale and rec.rank == 0 and not rec.extra.get("eval"):
                for action in st.policy.on_step(rec.step):
                    self.actions.execute(action)
        elif isinstance(rec, Heartbeat):
            attempt.heartbeats[rec.rank] = st.clock()
            if rec.rank == 0 and rec.attempt == attempt.number and rec.phase != attempt.phase:
                attempt.phase = rec.phase
                if attempt.stepped:  # the setup clock runs from the worker's start until its first step
                    attempt.phase_since = st.clock()
        elif isinstance(rec, SystemSample):
            self.intake.keep(rec)
            if st.pending is None:
                for t in st.detector.observe_system(rec):
                    self.actions.on_transition(t)
            if self.scaling is not None and st.pending is None and (resize := self.scaling.on_sample(rec)):
                self.actions.execute(resize)
        elif isinstance(rec, WorkerExit):
            st.history.exits.append(rec)
            if rec.rank == 0 and rec.attempt == attempt.number and attempt.phase != "paused":
                self._finishing()
        elif isinstance(rec, Event):
            for act in self.worker_events.on_event(rec):
                self.actions.execute(act.action, cause=act.cause)
        self.out.record(rec)

    def _finishing(self) -> None:
        """Training is over (rank 0's last words, or the Trainer's closing summary), the process not yet:
        it winds down (a final save, a merge, a process group torn down) without a step or a heartbeat,
        judged by setup_timeout_s as loading and saving are. By the step pace, torch's launcher taking
        6 s to end two ranks was a hang, and a finished run was restarted to finish again."""
        attempt = self.state.attempt
        if attempt.phase != "finish":
            attempt.phase, attempt.phase_since = "finish", self.state.clock()

    # -- main loop ------------------------------------------------------------
    def supervise_attempt(self, live: Any = None) -> ExitInfo:
        st, stop, worker = self.state, self.state.stop, self.state.attempt.worker
        assert worker is not None
        exits_before = len(st.history.exits)
        while True:
            rc = worker.poll()
            self.pump()
            if live is not None:
                live.update(progress_line(st.progress, st.planner.total, st.status))
            if rc is not None:
                break
            if stop.sent_at is not None and st.clock() - stop.sent_at > stop.grace_s:
                self.out.say(f"the {st.source.label} did not stop in time: killing it", style="bold red")
                worker.kill()
                stop.killed = True
            if not self.intake.behind:  # a backlog is taken a budget a turn, without a pause between
                worker.wait_exit(self.poll_s)
        # Asked to stop, the rest of the tree gets the grace period too: a launcher dies of SIGTERM at
        # once while its trainer is still saving the checkpoint it was asked for.
        tree = st.attempt.tree
        while (
            stop.sent_at is not None
            and tree is not None
            and tree.alive()
            and st.clock() - stop.sent_at <= stop.grace_s
            and stop.interrupts < 2
        ):
            self.pump()
            time.sleep(self.poll_s)
        self.reap()
        st.source.settle()
        self.pump()  # the last words arrive after the exit
        mine = [e for e in st.history.exits[exits_before:] if e.attempt == st.attempt.number]
        last = next((e for e in mine if e.status == "error"), mine[-1] if mine else None)
        tail = worker.log_tail()
        found = last_exception(tail) if last is None and rc else None
        status = last.status if last else None
        outside = last is None and stop.pause_requested
        if outside:
            status, stop.pause_requested = "paused", False  # stopped from outside on an operator's pause
        elif last is None and rc == 0 and PLAN not in st.source.abilities:
            # A job's own exit status is all it says; asked to stop, a clean exit is a stop.
            status = "stopped" if stop.sent_at is not None else "completed"
        stopping = stop.sent_at is not None or (st.pending is not None and st.pending.name == "stop")
        return ExitInfo(
            returncode=rc,
            status=status,
            error_type=last.error_type if last else (found[0] if found else None),
            error_message=last.error_message if last else (found[1] if found else None),
            step=last.step if last else st.progress.step,
            # Without last words, an error exit (not a signal) before any step would fail the same way again.
            deterministic=bool(last and last.deterministic)
            or (last is None and rc is not None and rc > 0 and not st.attempt.stepped and not stopping),
            stderr_tail=tail,
            interrupted=stop.sent_at is not None and status not in {"stopped", "paused", "completed"},
            stopped_outside=outside,
            where=failed_rank(tail) if rc else None,
        )

    def reap(self) -> None:
        """The attempt's whole tree goes before anything restarts.

        A launcher (trl, accelerate, torchrun) that died leaves its trainer running, and two
        trainers on one output folder overwrite each other's checkpoints.
        """
        st = self.state
        if st.attempt.tree is None:
            return
        left = st.stop.reaped = st.attempt.tree.reap()
        if left:
            self.out.emit(
                "action",
                "tree_killed",
                f"killed {len(left)} process(es) the {st.source.label} left behind: "
                + ", ".join(map(str, left)),
                severity="warning",
                step=st.progress.step,
                data={"pids": left},
            )

    def reopen(self, was: str) -> None:
        """A run that ended before its last step (``was``: stopped, failed, crashed) goes on in its own
        folder: a new attempt from its newest verified checkpoint, under the plan in force when it
        ended, found and rewound to as a restart's is (:class:`~.resuming.Resumes`)."""
        st = self.state
        self.state.started_ts = st.clock()
        st.plans.current = latest_plan(self.run)
        st.attempt.number = st.plan.attempt + 1
        self.intake.skip_backlog()  # the earlier attempts' records are history: the rewind replays them
        resume = self.resumes.resume_point()
        where = Path(resume).name if resume else "the start: no verified checkpoint was left"
        event = self.out.emit(
            "lifecycle",
            "run_resumed",
            f"run {self.run.run_id} resumed after it {was}: attempt {st.attempt.number} from {where}",
            step=(checkpoint_step(Path(resume)) or 0) if resume else 0,
            data={"after": was, "attempt": st.attempt.number, "resume_checkpoint": resume},
        )
        st.plans.revise(
            reason="resume",
            cause=event,
            attempt=st.attempt.number,
            resume_checkpoint=resume,
            notes=f"resumed by an operator after the run {was}",
        )
        self.resumes.rewind(resume)

    def run_to_end(self, live: Any = None, resume_after: str | None = None) -> RunResult:
        """Supervise the run to its end; ``resume_after`` (stopped, failed, crashed): continue a run that
        ended so (:meth:`reopen`) instead of starting it."""
        st = self.state
        t0 = st.clock()
        if resume_after is None:
            self.prepare()
            st.plans.write()
        else:
            self.reopen(resume_after)
        self.start_worker(st.plan)
        while True:
            info = self.supervise_attempt(live)
            if st.pending is None and not st.stop.interrupts and (bad := self.resumes.nonfinite_end(info)):
                # A run whose loss ended NaN/Inf holds unusable weights: it is never "completed".
                action = st.policy.instead(bad, st.progress.step, "rollback", "the run ended non-finite")
                if action is None or action.name != "rollback":
                    why = (
                        f"the run ended with a non-finite loss ({bad.kind} from step {bad.start_step}) and "
                        "no rollback is allowed: its final weights are not usable"
                    )
                    return self.finish(Decision("stop", "nonfinite", why), info, t0)
                self.actions.execute(action)
            if st.pending is not None and not st.stop.interrupts:
                action, st.pending = st.pending, None
                if action.name in {"stop", "pause"}:  # a job stopped from outside, on the policy's word
                    return self.finish(
                        Decision("done", "stopped", f"{action.name}: {action.reason}"), info, t0
                    )
                changes, reason, why = self.plan_after_action(action, info)
                if changes is None:
                    return self.finish(Decision("stop", action.name, why), info, t0)
                nxt = st.planner.after_action(st.plan, changes, reason, why)
            else:
                decision = st.planner.decide(info)
                if decision.classification == "paused" and not st.stop.interrupts:
                    if not self.pause(info, live):
                        return self.finish(
                            Decision("stop", "user_interrupt", "stopped while paused"), info, t0
                        )
                    continue
                failed_resume = self.resumes.failed_resume(info, decision)
                if failed_resume is not None:
                    decision = failed_resume
                elif decision.action != "restart":
                    return self.finish(decision, info, t0)
                elif st.stop.interrupts:
                    return self.finish(self._stopped_anyway(info, decision), info, t0)
                changes, reason, why = self.resumes.plan_after_crash(decision)
                if changes is None:
                    return self.finish(Decision("stop", decision.classification, why), info, t0)
                nxt = st.planner.after_crash(st.plan, changes, reason, why, decision.delay_s)
            if not self.restart(nxt, info):
                return self.finish(Decision("stop", "user_interrupt", "stopped on request"), info, t0)

    def _stopped_anyway(self, info: ExitInfo, decision: Decision) -> Decision:
        """Asked to stop, the run stops, however its worker ended on the way (the stop's last words not
        read yet, a signal of the stop's own in its exit status): never a restart, nor a crash."""
        how = f"{info.error_type}: {info.error_message or ''}" if info.error_type else decision.classification
        label = self.state.source.label
        return Decision("stop", "user_interrupt", f"stopped on request; the {label} ended with {how.strip()}")

    def pause(self, info: ExitInfo, live: Any = None) -> bool:
        """The worker checkpointed and exited on ``pause``: hold the run until ``resume``, then start the
        next attempt from the newest checkpoint (True), or stop while paused (False)."""
        st = self.state
        self.out.emit("lifecycle", "run_paused", f"run paused at step {info.step}", step=info.step)
        if not self.wait_while_paused(live):
            return False
        st.attempt.number += 1
        event = self.out.emit("lifecycle", "run_resumed", "run resumed", step=info.step)
        st.plans.revise(
            reason="resume",
            cause=event,
            attempt=st.attempt.number,
            resume_checkpoint=self.resumes.resume_point(),
            notes="resumed by an operator",
        )
        self.start_worker(st.plan)
        return True

    def wait_while_paused(self, live: Any = None) -> bool:
        """Hold the paused run, reading what comes in, until ``resume`` (True) or a stop (False)."""
        st = self.state
        self.controls.paused()
        self.books.write_status(force=True)
        self.out.say(
            paused_line(st.progress.step, str(self.run.root), st.source.standby_pid()), style="yellow"
        )
        while not self.controls.resume_requested:
            if st.stop.interrupts:
                return False
            self.pump()
            if live is not None:
                live.update(progress_line(st.progress, st.planner.total, st.status))
            time.sleep(self.poll_s)
        return True

    def restart(self, nxt: NextAttempt, info: ExitInfo) -> bool:
        """File the restart, wait its backoff and start the next attempt; False: stopped while waiting."""
        st = self.state
        event = self.out.emit(
            "action",
            "restart",
            nxt.message(st.source.label),
            severity="warning",
            step=info.step,
            data=nxt.event_data(info.returncode),
        )
        st.status = "restarting"
        self.books.write_status(force=True)
        time.sleep(nxt.delay_s)
        if st.stop.interrupts:
            return False
        st.attempt.number += 1
        st.plans.revise(
            reason=nxt.reason, cause=event, attempt=st.attempt.number, notes=nxt.why, **nxt.changes
        )
        self.resumes.rewind(nxt.changes.get("resume_checkpoint"))
        self.start_worker(st.plan)
        return True

    def compact_index(self) -> None:
        """An index grown past ``run.compact_index_bytes`` is compacted once the run has completed (its
        status says so and its store is closed): the summaries stay, the raw rows no chart needs go."""
        from steadytune.telemetry.store.compact import CompactError, compact

        limit = self.cfg.run.compact_index_bytes
        try:
            size = self.run.db.stat().st_size
        except FileNotFoundError:
            return
        if not limit or size <= limit:
            return
        try:
            done = compact(self.run, clock=self.state.clock)
        except (CompactError, OSError, sqlite3.Error) as exc:
            # The run is over and its streams hold every step: an index left whole loses nothing.
            self.out.say(f"run.db left as it is ({size / (1 << 20):.0f} MB): {exc}", style="yellow")
            return
        self.out.say(f"compacted the run's index (run.compact_index_bytes): {done.summary()}")

    def plan_after_action(self, action: Action, info: ExitInfo) -> tuple[dict[str, Any] | None, str, str]:
        """The restart plan for a worker the supervisor stopped on purpose."""
        if action.name in SCALE_ACTIONS and self.scaling is not None:
            return self.scaling.plan_after_resize(self.resumes.resume_point())
        planned = self.in_process.take_fallback()  # a rollback planned for in process, done by a restart
        return planned if planned is not None else self.resumes.plan_after_action(action)

    def finish(self, decision: Decision, info: ExitInfo, t0: float) -> RunResult:
        st = self.state
        state = {
            "done": decision.classification,
            "stop": "stopped" if decision.classification == "user_interrupt" else "failed",
        }[decision.action]
        # The episodes whose condition cleared end with the run (one still holding stays open, as it is).
        for t in st.detector.close():
            self.actions.on_transition(t)
        # Set before books.update_last_good: a completed run's last checkpoint needs no window after it.
        st.status = state
        if state == "completed":
            self.books.update_last_good()
        severity = "info" if state in {"completed", "stopped", "paused"} else "critical"
        data: dict[str, Any] = {"classification": decision.classification}
        detail = ""
        reason = decision.reason
        if state == "completed" and PLAN not in st.source.abilities and not st.progress.steps_seen:
            # A job whose log is in no followed format "completes at step 0": nothing was judged.
            severity, data["no_steps_read"] = "warning", True
            reason += (
                f"; but no training step was ever read from the job's output, so nothing was watched "
                f"(formats followed: {FOLLOWED}; see docs/recovery.md)"
            )
        if state == "failed" and st.attempt.worker is not None:
            # The cause itself, where to read more, and how the log ends: a stop that says only
            # "see the log" sends the user digging.
            lines = last_lines(info.stderr_tail)
            data.update(log=str(st.attempt.worker.log_path), last_lines=lines)
            detail = f"\n  log: {st.attempt.worker.log_path}" + "".join(f"\n  | {ln}" for ln in lines)
        if state == "stopped" and st.stop.signal is not None:
            data["signal"] = signal.Signals(st.stop.signal).name
            data["graceful"] = not st.stop.killed and not st.stop.reaped
            data["killed_pids"] = list(st.stop.reaped)
        self.out.emit(
            "lifecycle",
            f"run_{state}",
            f"run {state}: {reason}",
            severity=severity,
            step=info.step,
            data=data,
        )
        if detail:
            self.out.say(detail.lstrip("\n"))
        st.source.close()
        self.books.write_status(force=True)
        self.intake.close()
        self.out.observers.close()
        if state == "completed":  # a stopped or failed run may be resumed: its raw rows stay (docs/scale.md)
            self.compact_index()
        ckpts = [p.name for p in reversed(st.source.checkpoints())]  # in step order
        return RunResult(
            self.run, state, decision.reason, st.progress, st.planner.total, ckpts, st.clock() - t0
        )
