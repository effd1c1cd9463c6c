"""The supervisor: the parent process of a run. It never imports torch.

It starts the worker, tails its per-rank streams, samples the system, files
events, keeps ``status.json`` fresh, and when the worker dies restarts it from
the newest *verified* checkpoint with a new plan revision, within a budget.
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

from steadytune.checkpoint.manifest import checkpoint_step, newest_verified
from steadytune.checkpoint.store import clean_staging, read_pointer, write_pointer
from steadytune.config.load import dump_config
from steadytune.config.schema import SteadytuneConfig
from steadytune.policy.restart import Decision, ExitInfo, decide
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
from steadytune.supervise.process import WorkerProcess, worker_command
from steadytune.supervise.progress import RunProgress, progress_line
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.sampler import SystemSampler
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
    ) -> None:
        self.cfg = cfg
        self.run = run.create()
        self.console = console
        self.clock = clock
        self.poll_s = poll_s
        self.worker_env = dict(worker_env or {})
        self.observers: list[Observer] = list(observers or [])
        self.stop_grace_s = stop_grace_s
        self.sampler = sampler or SystemSampler(self.run.root, clock=clock)
        self.events = EventLog(self.run.events, self.run.run_id, clock=clock, on_append=self._fan_event)
        self.progress = RunProgress(max_steps=cfg.train.max_steps if cfg.train.max_steps > 0 else None)
        self.system_writer = JsonlWriter(self.run.system)
        self.tailers: dict[Path, JsonlTailer] = {}
        self.state = "starting"
        self.attempt = 0
        self.restarts = 0
        self.worker: WorkerProcess | None = None
        self.exits: list[WorkerExit] = []
        self.last_heartbeat: dict[int, float] = {}
        self.checkpoint_steps: list[int] = []
        self.trouble_steps: list[int] = []  # steps of warnings/criticals, for LAST_GOOD
        self._interrupts = 0
        self._stop_sent_at: float | None = None
        self._last_sample = 0.0
        self._last_status = 0.0
        self.dashboard_url: str | None = None

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
            self.say(f"[{kind}] {message or name}", style=style)
        return event

    def write_status(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_status < 1.0:
            return
        self._last_status = now
        latest = read_pointer(self.run.latest_pointer)
        status = {
            "run_id": self.run.run_id, "state": self.state, "step": self.progress.step,
            "max_steps": self.progress.max_steps, "loss": self.progress.last_loss,
            "eval_loss": self.progress.last_eval_loss, "tokens_per_s": self.progress.tokens_per_s,
            "eta_s": self.progress.eta_s, "attempt": self.attempt, "restarts": self.restarts,
            "last_checkpoint": latest.name if latest else None, "supervisor_pid": os.getpid(),
            "worker_pid": self.worker.pid if self.worker else None, "updated_ts": now,
            "dashboard_url": self.dashboard_url, "started_ts": self.started_ts,
        }
        import json

        atomic_write_text(self.run.status, json.dumps(status, indent=1))

    # -- the run -------------------------------------------------------------
    def prepare(self) -> None:
        atomic_write_text(self.run.config, dump_config(self.cfg))
        self.started_ts = self.clock()
        self.emit("lifecycle", "run_started", f"run {self.run.run_id} started", data={"method": self.cfg.method})

    def write_plan(self, plan: PlanRevision) -> None:
        with open(self.run.plan, "a", encoding="utf-8") as f:
            f.write(to_json(plan) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for obs in self.observers:
            obs.on_record(plan)

    def resume_point(self) -> str | None:
        """The newest checkpoint that verifies; unusable ones are reported and skipped."""
        verdict, skipped = newest_verified(self.run.checkpoints)
        for bad in skipped:
            self.emit("anomaly", "checkpoint_corrupt", f"{bad.path.name} skipped for resume: {bad.reason}",
                      severity="warning", data={"path": str(bad.path), "reason": bad.reason})
        return str(verdict.path) if verdict else None

    def start_worker(self, plan: PlanRevision) -> None:
        clean_staging(self.run.staging)
        self.run.control.unlink(missing_ok=True)
        cmd = worker_command(self.run.root, self.cfg.run.nproc_per_node)
        env = {**self.worker_env, "STEADYTUNE_ATTEMPT": str(plan.attempt), "PYTHONUNBUFFERED": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        self.worker = WorkerProcess(cmd, self.run.logs / f"worker-{plan.attempt}.log", env=env)
        self.state = "running"
        self.last_heartbeat = {0: self.clock()}
        self.emit("lifecycle", "worker_started", f"worker attempt {plan.attempt} started (pid {self.worker.pid})"
                  + (f", resuming from {Path(plan.resume_checkpoint).name}" if plan.resume_checkpoint else ""),
                  data={"pid": self.worker.pid, "attempt": plan.attempt, "cmd": cmd})

    def pump(self) -> None:
        """Read everything new from the worker's streams and act on it."""
        for path in self.run.telemetry_files():
            tailer = self.tailers.get(path)
            if tailer is None:
                tailer = self.tailers[path] = JsonlTailer(path)
            for rec in tailer.read():
                self.handle(rec)
        now = self.clock()
        if now - self._last_sample >= self.cfg.run.sample_interval_s:
            self._last_sample = now
            sample = self.sampler.sample(self.worker.pid if self.worker and self.worker.poll() is None else None)
            self.handle(sample)
        self.update_last_good()
        self.write_status()

    def handle(self, rec: Record) -> None:
        if isinstance(rec, StepRecord):
            self.progress.add(rec)
            self.last_heartbeat[rec.rank] = self.clock()
        elif isinstance(rec, Heartbeat):
            self.last_heartbeat[rec.rank] = self.clock()
        elif isinstance(rec, SystemSample):
            self.system_writer.write(rec)
        elif isinstance(rec, WorkerExit):
            self.exits.append(rec)
        elif isinstance(rec, Event):
            self.on_worker_event(rec)
        for obs in self.observers:
            obs.on_record(rec)

    def on_worker_event(self, ev: Event) -> None:
        if ev.name == "train_begin" and ev.data.get("max_steps"):
            self.progress.max_steps = int(ev.data["max_steps"])
            return
        if ev.name == "checkpoint_saved" and ev.step is not None:
            self.checkpoint_steps.append(ev.step)
        if ev.severity in {"warning", "critical"} and ev.step is not None:
            self.trouble_steps.append(ev.step)
        self.emit(ev.kind, ev.name, ev.message, severity=ev.severity, step=ev.step, data=ev.data)

    def update_last_good(self) -> None:
        """A checkpoint becomes LAST_GOOD once a window of healthy steps has followed it."""
        window = self.cfg.run.good_window_steps
        current = read_pointer(self.run.last_good_pointer)
        current_step = checkpoint_step(current) if current else -1
        for step in sorted(self.checkpoint_steps, reverse=True):
            if step <= (current_step or -1):
                break
            done = self.progress.step >= step + window or self.state == "completed"
            healthy = not any(step < t <= step + window for t in self.trouble_steps)
            target = self.run.checkpoints / f"checkpoint-{step}"
            if done and healthy and target.is_dir():
                write_pointer(self.run.last_good_pointer, target)
                break

    # -- signals ------------------------------------------------------------
    def on_signal(self, signum: int, _frame: Any = None) -> None:
        self._interrupts += 1
        if self._interrupts == 1:
            self.request_stop(f"signal {signal.Signals(signum).name}")
        elif self.worker is not None:
            self.say("second interrupt: killing the worker now", style="bold red")
            self.worker.signal_tree(signal.SIGKILL)

    def request_stop(self, issuer: str) -> None:
        self.state = "stopping"
        self.say("stopping: the worker will checkpoint at the next step and exit (Ctrl-C again to kill)",
                 style="yellow")
        from steadytune.supervise.control import send_control

        send_control(self.run, "stop", issuer=issuer, attempt=self.attempt, log=self.events)
        if self.worker is not None:
            self.worker.signal_tree(signal.SIGTERM)
        self._stop_sent_at = self.clock()

    # -- main loop ------------------------------------------------------------
    def supervise_attempt(self, live: Any = None) -> ExitInfo:
        assert self.worker is not None
        exits_before = len(self.exits)
        while True:
            rc = self.worker.poll()
            self.pump()
            if live is not None:
                live.update(progress_line(self.progress, self.restarts, self.state))
            if rc is not None:
                break
            if self._stop_sent_at is not None and self.clock() - self._stop_sent_at > self.stop_grace_s:
                self.say("worker did not stop in time: killing it", style="bold red")
                self.worker.kill()
            time.sleep(self.poll_s)
        self.pump()  # the last words arrive after the exit
        mine = [e for e in self.exits[exits_before:] if e.attempt == self.attempt]
        last = next((e for e in mine if e.status == "error"), mine[-1] if mine else None)
        return ExitInfo(
            returncode=rc, status=last.status if last else None,
            error_type=last.error_type if last else None, error_message=last.error_message if last else None,
            step=last.step if last else self.progress.step, deterministic=bool(last and last.deterministic),
            stderr_tail=self.worker.log_tail(), interrupted=self._stop_sent_at is not None and not (last and last.status in {"stopped", "paused", "completed"}),
        )

    def run_to_end(self, live: Any = None) -> RunResult:
        t0 = self.clock()
        self.prepare()
        history: list[ExitInfo] = []
        plan = PlanRevision(revision=0, ts=self.clock(), reason="start", attempt=0)
        self.write_plan(plan)
        self.start_worker(plan)
        while True:
            info = self.supervise_attempt(live)
            decision = decide(info, history, self.restarts, self.cfg.run.max_restarts,
                              self.cfg.run.restart_backoff_s, self.cfg.run.restart_backoff_max_s)
            history.append(info)
            if decision.action != "restart" or self._interrupts:
                return self.finish(decision, info, t0)
            event = self.emit("action", "restart", f"worker exited ({decision.reason}); restarting in {decision.delay_s:.0f}s",
                              severity="warning", step=info.step, data={"classification": decision.classification,
                                                                         "returncode": info.returncode})
            self.state = "restarting"
            self.write_status(force=True)
            time.sleep(decision.delay_s)
            if self._interrupts:
                return self.finish(Decision("stop", "user_interrupt", "stopped on request"), info, t0)
            self.restarts += 1
            self.attempt += 1
            resume = self.resume_point()
            plan = PlanRevision(revision=self.attempt, ts=self.clock(), reason=decision.classification, attempt=self.attempt,
                                cause_event_seq=event.seq, resume_checkpoint=resume,
                                notes=f"restart after {decision.reason}")
            self.write_plan(plan)
            self.start_worker(plan)

    def finish(self, decision: Decision, info: ExitInfo, t0: float) -> RunResult:
        state = {"done": decision.classification, "stop": "stopped" if decision.classification == "user_interrupt" else "failed"}[decision.action]
        if state == "completed":
            self.update_last_good()
        self.state = state
        severity = "info" if state in {"completed", "stopped", "paused"} else "critical"
        self.emit("lifecycle", f"run_{state}", f"run {state}: {decision.reason}", severity=severity, step=info.step,
                  data={"classification": decision.classification})
        self.write_status(force=True)
        self.system_writer.close()
        for obs in self.observers:
            obs.close()
        ckpts = sorted(p.name for p in self.run.checkpoints.glob("checkpoint-*"))
        return RunResult(self.run, state, decision.reason, self.progress, self.restarts, ckpts, self.clock() - t0)
