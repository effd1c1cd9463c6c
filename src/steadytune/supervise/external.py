"""Supervising a command steadytune does not run itself (``steadytune supervise -- CMD``).

Progress comes from what such jobs already write: HF-style log dicts on stdout
(``{'loss': 1.2, 'grad_norm': 3.4, 'learning_rate': 2e-05, 'epoch': 0.5}``),
and, in the output directory, LLaMA-Factory's ``trainer_log.jsonl`` and the
HF ``trainer_state.json`` of each checkpoint. The same detectors and alerts as a
native run watch it; a hang is "no progress"; a restart appends the resume
argument pointing at the newest checkpoint that is complete.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.alerts.config import AlertsConfig
from steadytune.checkpoint.external import check_external_checkpoint, newest_complete
from steadytune.checkpoint.manifest import checkpoint_step, list_checkpoints
from steadytune.detect.config import DetectConfig
from steadytune.detect.live import LiveDetector, format_transition
from steadytune.policy.config import PolicyConfig
from steadytune.policy.engine import Action, Policy
from steadytune.policy.plan import choose_rollback_checkpoint
from steadytune.policy.restart import ExitInfo, decide
from steadytune.records import Anomaly, PlanRevision, StepRecord, to_dict, to_json
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.supervise.logparse import (
    as_number,
    is_summary,
    last_exception,
    last_lines,
    logging_steps_from,
    parse_log_line,
    train_bar,
)
from steadytune.supervise.process import ProcessTree, WorkerProcess
from steadytune.supervise.progress import RunProgress
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.jsonl import JsonlReader
from steadytune.telemetry.sampler import SystemSampler
from steadytune.telemetry.stream import JsonlWriter


@dataclass
class ExternalOptions:
    command: Sequence[str]
    output_dir: Path | None = None
    resume_arg: str | None = None  # e.g. "--resume_from_checkpoint {checkpoint}"
    max_restarts: int = 3
    hang_floor_s: float = 60.0
    hang_factor: float = 10.0
    setup_timeout_s: float = 1800.0
    backoff_s: float = 1.0
    stop_grace_s: float = 30.0  # after SIGTERM/SIGINT: how long the job may take to save and exit
    lr_arg: str | None = None  # e.g. "--learning_rate {lr}": how a rollback lowers the job's LR
    base_lr: float | None = None  # the job's configured LR, which a rollback scales


# How each tool takes a resume checkpoint and a learning rate on its command line.
PRESETS: dict[str, dict[str, str]] = {
    # llamafactory-cli train my.yaml key=value ...: after a YAML file, overrides are key=value
    "llamafactory": {"resume_arg": "resume_from_checkpoint={checkpoint}", "lr_arg": "learning_rate={lr}"},
    # trl sft / HF example scripts: HfArgumentParser flags
    "trl": {"resume_arg": "--resume_from_checkpoint {checkpoint}", "lr_arg": "--learning_rate {lr}"},
    "hf": {"resume_arg": "--resume_from_checkpoint {checkpoint}", "lr_arg": "--learning_rate {lr}"},
}
# Actions an external command can be given: it is stopped and restarted, nothing in between.
_EXTERNAL_ACTIONS = frozenset({"rollback", "restart", "stop", "pause"})


class ExternalSupervisor:
    """Runs, watches and restarts an arbitrary training command."""

    def __init__(
        self,
        opts: ExternalOptions,
        run: RunDir,
        detector: LiveDetector | None = None,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
        detect: DetectConfig | None = None,
        policy: PolicyConfig | None = None,
        alerts: AlertsConfig | None = None,
        observers: list[Any] | None = None,
    ) -> None:
        self.opts, self.run, self.say, self.clock = opts, run.create(), say, clock
        self.observers: list[Any] = []
        self.events = EventLog(run.events, run.run_id, clock=clock, on_append=self._fan_event)
        self.observers = observers if observers is not None else self._default_observers(alerts)
        self.detector = detector or LiveDetector(detect)
        self.policy = Policy(policy)
        self.action: Action | None = None  # what the policy asked for; carried out between attempts
        self.lr_scale = 1.0
        self.resumes: list[int | None] = []
        self._bad: set[Path] = set()  # checkpoints a resume failed to load
        self._reported: set[Path] = set()  # incomplete checkpoints already reported
        self.telemetry = JsonlWriter(run.telemetry(0))
        self.system = JsonlWriter(run.system)
        self.sampler = SystemSampler(run.root, clock=clock)
        self.progress = RunProgress()
        self.attempt = 0
        self._lock = threading.Lock()
        self._last_progress: float | None = None
        self._intervals: list[float] = []
        self._log_step = 0
        # HF prints a dict every logging_steps: read from the command (or its YAML), later from a
        # checkpoint's trainer_state.json; unknown, the progress bar's count stands in.
        self._log_every: int | None = logging_steps_from(opts.command)
        self._bar_step: int | None = None
        self._printed: dict[int, dict[str, float]] = {}
        self._rows: dict[int, dict[str, float]] = {}  # trainer_log.jsonl rows waiting for their dict
        self._recorded: set[int] = set()  # steps recorded in this attempt
        self._dicts_seen = False  # the tool prints log dicts beside its trainer_log.jsonl
        self._tokens_seen: float | None = None  # the tool's cumulative token count at the last record
        self._expect: dict[str, float] | None = None  # what the first record after a resume should show
        self._log_reader: JsonlReader | None = None
        self._last_logged_step = 0
        self._stop_signal: int | None = None

    def _default_observers(self, alerts: AlertsConfig | None) -> list[Any]:
        """run.db (the dashboard and /metrics read it) and the alert router: as for a native run."""
        from steadytune.alerts.router import AlertRouter
        from steadytune.supervise.observers import AlertObserver, StoreObserver

        out: list[Any] = [StoreObserver(self.run)]
        if alerts is not None:
            # Every event is already printed on the console: a console sink would say it twice.
            alerts = alerts.model_copy(update={"sinks": [s for s in alerts.sinks if s.type != "console"]})
        if alerts is not None and alerts.enabled and alerts.sinks:
            out.append(
                AlertObserver(AlertRouter(alerts, self.events, clock=self.clock, run_id=self.run.run_id))
            )
        return out

    def _fan_event(self, event: Any) -> None:
        for obs in self.observers:
            obs.on_event(event)

    def _flush(self) -> None:
        for obs in self.observers:
            flush = getattr(obs, "flush", None)
            if flush is not None:
                flush()

    def close(self) -> None:
        for obs in self.observers:
            try:
                obs.close()
            except Exception as e:
                self.say(f"observer {type(obs).__name__} failed to close: {e}")

    # -- policy -----------------------------------------------------------------
    def _consider(self, action: Action | None) -> None:
        if action is None:
            return
        if action.name in _EXTERNAL_ACTIONS and self.action is None:
            self.action = action  # one incident, one action: later ones are recorded only
            return
        why = action.reason
        if action.name not in _EXTERNAL_ACTIONS and action.name != "alert":
            why = f"{action.name} is not available for a command steadytune does not run ({why})"
        self.events.emit(
            "action", "alert_only", why, severity="warning", step=action.step, data=dict(action.params)
        )

    # -- stopping ---------------------------------------------------------------
    def request_stop(self, signum: int) -> None:
        """SIGTERM/SIGINT to the supervisor: the first stops the job gracefully, a second kills it."""
        if self._stop_signal is not None:
            self._stop_now = True
        self._stop_signal = signum

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.request_stop(signum))

    def _stop(self, proc: WorkerProcess, tree: ProcessTree, reader: threading.Thread) -> int:
        signum = self._stop_signal or signal.SIGTERM
        name = signal.Signals(signum).name
        self.events.emit(
            "lifecycle",
            "stop_requested",
            f"{name} received: asking the job to stop (it has {self.opts.stop_grace_s:.0f}s to save and exit)",
            severity="warning",
            step=self.progress.step,
        )
        self.say(f"{name}: stopping the job (a second signal kills it)")
        # The job's own SIGTERM handling (HF's checkpoint-on-SIGTERM where enabled) gets its chance.
        proc.signal_tree(signal.SIGTERM)
        deadline = self.clock() + self.opts.stop_grace_s
        while proc.poll() is None and self.clock() < deadline and not getattr(self, "_stop_now", False):
            self.poll_files()
            time.sleep(0.2)
        graceful = proc.poll() is not None
        left = tree.reap()
        reader.join(timeout=5)
        self.poll_files()
        self._drain_log_rows()
        how = "exited by itself" if graceful else "killed after the grace period"
        self.events.emit(
            "lifecycle",
            "run_stopped",
            f"run stopped by {name} at step {self.progress.step}: the job {how}",
            severity="warning",
            step=self.progress.step,
            data={"signal": name, "graceful": graceful, "killed_pids": left},
        )
        self.write_status("stopped", None)
        self.say(f"stopped at step {self.progress.step} ({how})")
        return 128 + signum

    # -- progress ---------------------------------------------------------------
    def record(self, step: int, values: dict[str, float]) -> None:
        now = self.clock()
        printed = self._printed.pop(step, None)
        if printed:
            values = {**{k: v for k, v in printed.items() if k in ("grad_norm", "num_tokens")}, **values}
        total = values.get("total_steps")  # LLaMA-Factory's trainer_log.jsonl says how far it goes
        if total and total > 0:
            self.progress.max_steps = int(total)
        # Logs come every few steps: per-step time and tokens are the interval's, shared out.
        steps_since = step - self._last_logged_step if step > self._last_logged_step else 0
        step_time = None
        if steps_since and self._last_progress is not None and "loss" in values:
            step_time = (now - self._last_progress) / steps_since
        tokens = self._interval_tokens(values.get("num_tokens")) if "loss" in values else None
        if tokens is not None and steps_since:
            tokens //= steps_since
        if "loss" in values:
            self._last_logged_step = max(self._last_logged_step, step)
        rec = StepRecord(
            step=step,
            ts=now,
            attempt=self.attempt,
            loss=values.get("loss"),
            grad_norm=values.get("grad_norm"),
            lr=values.get("learning_rate", values.get("lr")),
            epoch=values.get("epoch"),
            eval_loss=values.get("eval_loss"),
            tokens=tokens or None,
            step_time_s=step_time,
            extra={"eval": True} if "eval_loss" in values and "loss" not in values else {},
        )
        with self._lock:
            if self.action is not None and self.action.name in _EXTERNAL_ACTIONS:
                return  # the job is being stopped for an action: what it still prints is not counted
            if self._last_progress is not None:
                self._intervals = [*self._intervals[-63:], now - self._last_progress]
            self._last_progress = now
            self.telemetry.write(rec)
            if "loss" in values:
                self._recorded.add(step)
                if self._expect is not None:
                    self._check_resume(step, values, self._expect)
                    self._expect = None
            self.progress.add(rec)
            for obs in self.observers:
                obs.on_record(rec)
            for t in self.detector.observe_step(rec):
                a = t.anomaly
                self.events.emit(
                    "anomaly" if t.state == "raised" else "resolved",
                    a.kind,
                    format_transition(t),
                    severity=a.severity if t.state == "raised" else "info",
                    step=a.start_step,
                    data={k: v for k, v in to_dict(a).items() if k != "type"},
                )
                self.say(format_transition(t))
                if t.state == "raised":
                    act = self.policy.on_raised(a, step)
                    if act is None and self.policy.config.rule(a.kind).action == "skip_step":
                        # The guard skips a NaN update inside a native worker; an external command
                        # has already applied it, so the weights must come from a checkpoint.
                        act = self.policy.instead(a, step, "rollback", "the update cannot be skipped outside")
                    self._consider(act)
                else:
                    self.policy.on_resolved(a)
            for action in self.policy.on_step(step):
                self._consider(action)

    def on_stdout(self, line: str) -> None:
        bar = train_bar(line)
        if bar is not None and bar[1] > 0:
            self.progress.max_steps = bar[1]
            self._bar_step = bar[0]
        values = parse_log_line(line)
        if values is not None and is_summary(values):
            return
        jsonl = self.opts.output_dir is not None and (self.opts.output_dir / "trainer_log.jsonl").exists()
        if values is not None and jsonl and "loss" in values and self._log_every is not None:
            # LLaMA-Factory's trainer_log.jsonl has the real steps but no grad norm; the dict it
            # printed for the same step has it, and joins the record when the file catches up.
            self._log_step += self._log_every
            self._printed[self._log_step] = values
            self._dicts_seen = True
            while len(self._printed) > 256:
                del self._printed[next(iter(self._printed))]
        elif values is not None and not jsonl:
            if "loss" not in values:
                pass  # an evaluation: it belongs to the step just logged
            elif self._log_every is not None:
                self._log_step += self._log_every
            else:  # the bar counts steps done; the dict belongs to the step being logged
                self._log_step = max(self._log_step + 1, (self._bar_step or 0) + 1)
            self.record(self._log_step, values)

    def poll_files(self) -> None:
        """LLaMA-Factory's trainer_log.jsonl carries real step numbers: prefer it when present."""
        if self.opts.output_dir is None:
            return
        if self._log_reader is None:
            self._log_reader = JsonlReader(self.opts.output_dir / "trainer_log.jsonl")
        for row in self._log_reader.dicts():
            step = row.get("current_steps")
            values = {
                k: as_number(v)
                for k, v in row.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "current_steps"
            }
            values = {k: v for k, v in values.items() if v is not None}
            if isinstance(step, int):
                self._from_log_file(step, values)

    def _interval_tokens(self, total: float | None) -> int | None:
        """Tokens trained since the last record, from a cumulative count (TRL's num_tokens)."""
        if total is None:
            return None
        prev, self._tokens_seen = self._tokens_seen, total
        if prev is None or total < prev:
            return None
        return int(total - prev) or None

    def _from_log_file(self, step: int, values: dict[str, float]) -> None:
        """A trainer_log.jsonl row: recorded once the dict printed for its step has joined it.

        The file and stdout race each other; a row waits until its printed dict has come,
        or a later row has (then none will), or the attempt ends (:meth:`_drain_log_rows`).
        """
        self._rows[step] = values
        if not self._dicts_seen:  # the tool prints no log dicts: nothing to wait for
            self._drain_log_rows()
            return
        for s in sorted(self._rows):
            if s in self._printed or s < step:
                self._record_row(s, self._rows.pop(s))

    def _drain_log_rows(self) -> None:
        for s in sorted(self._rows):
            self._record_row(s, self._rows.pop(s))

    def _record_row(self, step: int, values: dict[str, float]) -> None:
        if step in self._recorded:
            return  # recorded from stdout before the file existed
        self.record(step, values)

    def _resume_counter(self, checkpoint: Path) -> None:
        """After a resume, stdout log lines count from the checkpoint's step again."""
        try:
            state = json.loads((checkpoint / "trainer_state.json").read_text())
        except (OSError, ValueError):
            state = {}
        self._log_every = int(state.get("logging_steps") or 0) or self._log_every
        self._log_step = int(state.get("global_step") or checkpoint_step(checkpoint) or 0)
        self._last_logged_step = self._log_step
        self._tokens_seen = None  # a new process counts its tokens from zero

    # -- hangs ----------------------------------------------------------------
    def hang_limit(self) -> float:
        if not self._intervals:
            return self.opts.setup_timeout_s
        p95 = sorted(self._intervals)[int(0.95 * (len(self._intervals) - 1))]
        return max(self.opts.hang_floor_s, self.opts.hang_factor * p95)

    def hung(self, started: float) -> float | None:
        """Seconds without progress, if that is past the limit."""
        last = (
            self._last_progress
            if self._last_progress is not None and self._last_progress >= started
            else None
        )
        idle = self.clock() - (last if last is not None else started)
        limit = self.hang_limit() if last is not None else self.opts.setup_timeout_s
        return idle if idle > limit else None

    # -- the run --------------------------------------------------------------
    def command_for(self, checkpoint: Path | None) -> list[str]:
        cmd = list(self.opts.command)
        if checkpoint is not None and self.opts.resume_arg:
            cmd += [part.replace("{checkpoint}", str(checkpoint)) for part in self.opts.resume_arg.split()]
        lr = self._scaled_lr()
        if self.lr_scale != 1.0 and lr is not None and self.opts.lr_arg:
            cmd += [part.replace("{lr}", f"{lr:.6g}") for part in self.opts.lr_arg.split()]
        return cmd

    def _pipe(self, proc: WorkerProcess) -> threading.Thread:
        def pump() -> None:
            assert proc.proc.stdout is not None
            with open(proc.log_path, "ab") as log:
                for raw in iter(proc.proc.stdout.readline, b""):
                    log.write(raw)
                    log.flush()
                    self.on_stdout(raw.decode("utf-8", "replace"))

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        return t

    def run_to_end(self) -> int:
        try:
            return self._run()
        finally:
            self.write_status(self._final_state, None)
            self.close()

    _final_state = "failed"

    def _finish(self, state: str, reason: str, proc: WorkerProcess | None = None, tail: str = "") -> int:
        detail, data = "", {}
        if state == "failed" and proc is not None:
            # The cause itself, where to read more, and how the log ends: a stop that
            # says only "see the log" sends the user digging.
            data = {"log": str(proc.log_path), "last_lines": last_lines(tail)}
            detail = f"\n  log: {proc.log_path}\n" + "\n".join(f"  | {ln}" for ln in last_lines(tail))
        self.events.emit(
            "lifecycle",
            f"run_{state}",
            f"run {state}: {reason}",
            severity="info" if state == "completed" else ("warning" if state == "stopped" else "critical"),
            step=self.progress.step,
            data=data,
        )
        self._final_state = state
        self.write_status(state, None)
        self.say(f"{state}: {reason}{detail}")
        return 0 if state == "completed" else 1

    def _complete_checkpoints(self, before: int | None = None) -> list[tuple[Path, int]]:
        """Checkpoints another tool wrote that are whole, newest first (a bad one is reported once)."""
        if self.opts.output_dir is None:
            return []
        out = []
        for ckpt in list_checkpoints(self.opts.output_dir):
            step = checkpoint_step(ckpt) or 0
            if before is not None and step >= before:
                continue
            ok, reason = check_external_checkpoint(ckpt)
            if ok and ckpt not in self._bad:
                out.append((ckpt, step))
            elif not ok and ckpt not in self._reported:
                self._reported.add(ckpt)
                self.events.emit(
                    "anomaly",
                    "checkpoint_corrupt",
                    f"{ckpt.name} skipped for resume: {reason}",
                    severity="warning",
                    step=step,
                )
        return out

    def _nonfinite_end(self) -> Anomaly | None:
        """The open NaN/Inf anomaly a run ended with: its weights are not usable."""
        for a in self.detector.open_anomalies():
            if a.kind == "nan_loss" or (a.kind == "nonfinite_grad" and a.severity == "critical"):
                return a
        return None

    def _rollback(self, action: Action) -> tuple[Path | None, str] | None:
        """Where a rollback resumes (None: from the start) and what it changed; None: nowhere left."""
        anomaly = action.anomaly
        start = anomaly.start_step if anomaly is not None else action.step
        complete = {step: ckpt for ckpt, step in self._complete_checkpoints(before=start)}
        target = choose_rollback_checkpoint(start, sorted(complete), self.resumes)
        if target is None:
            return None
        self.resumes.append(target)
        self.lr_scale *= self.policy.config.rollback_lr_scale
        lr_note = f"LR x{self.lr_scale:g}"
        if not (self.opts.lr_arg and self.opts.base_lr):
            lr_note = "LR unchanged (give --lr-arg and --base-lr, or --preset, to lower it)"
        return complete.get(target), lr_note

    def _run(self) -> int:
        self.events.emit("lifecycle", "run_started", f"supervising: {' '.join(self.opts.command)}")
        history: list[ExitInfo] = []
        checkpoint: Path | None = None
        restarts = 0
        reason = "start"
        while True:
            cmd = self.command_for(checkpoint)
            plan = PlanRevision(
                revision=self.attempt,
                ts=self.clock(),
                reason=reason,
                attempt=self.attempt,
                resume_checkpoint=str(checkpoint) if checkpoint else None,
                lr_scale=self.lr_scale,
            )
            with open(self.run.plan, "a") as f:
                f.write(to_json(plan) + "\n")
            proc = WorkerProcess(
                cmd,
                self.run.logs / f"worker-{self.attempt}.log",
                # PYTHONFAULTHANDLER: a Python trainer prints every thread's stack on SIGABRT,
                # which is how a hung one shows where it hangs.
                env={
                    "STEADYTUNE_ATTEMPT": str(self.attempt),
                    "PYTHONUNBUFFERED": "1",
                    "PYTHONFAULTHANDLER": "1",
                },
                pipe_stdout=True,
            )
            self.events.emit(
                "lifecycle",
                "worker_started",
                f"attempt {self.attempt}: {' '.join(cmd)}",
                data={"pid": proc.pid, "cmd": cmd},
            )
            reader = self._pipe(proc)
            started, hung_for = self.clock(), None
            last_sample = 0.0
            tree = ProcessTree(proc)
            while proc.poll() is None and self.action is None:
                if self._stop_signal is not None:
                    self._final_state = "stopped"
                    return self._stop(proc, tree, reader)
                self.poll_files()
                now = self.clock()
                if now - last_sample > 2.0:
                    last_sample = now
                    tree.note()
                    self.system.write(self.sampler.sample(proc.pid))
                self._flush()
                self.write_status("running", proc.pid)
                hung_for = self.hung(started)
                if hung_for is not None:
                    self.events.emit(
                        "anomaly",
                        "stall",
                        f"no progress for {hung_for:.0f}s: killing the job",
                        severity="critical",
                        step=self.progress.step,
                        data={
                            "seconds_without_progress": round(hung_for, 1),
                            "limit_s": round(self.hang_limit(), 1),
                        },
                    )
                    self.say(f"no progress for {hung_for:.0f}s: the job is hung; restarting it")
                    self._dump_stacks(proc, tree)
                    break
                time.sleep(0.2)
            # The command's whole tree goes before anything restarts: a launcher (trl, accelerate,
            # torchrun) that died leaves its trainer running, and two trainers on one output folder
            # overwrite each other's checkpoints.
            left = tree.reap()
            if left:
                self.events.emit(
                    "action",
                    "tree_killed",
                    f"killed {len(left)} process(es) the command left behind: {', '.join(map(str, left))}",
                    severity="warning",
                    step=self.progress.step,
                    data={"pids": left},
                )
            reader.join(timeout=5)
            action, self.action = self.action, None
            if action is None:
                self.poll_files()
                self._drain_log_rows()
            self._rows.clear()
            self._flush()
            rc = proc.poll()
            tail = proc.log_tail()
            if action is None and rc == 0 and (bad := self._nonfinite_end()) is not None:
                # A run whose loss ended NaN/Inf holds unusable weights: it is never "completed".
                action = self.policy.instead(bad, self.progress.step, "rollback", "the run ended non-finite")
                if action is None or action.name != "rollback":
                    return self._finish(
                        "failed",
                        f"the run ended with a non-finite loss ({bad.kind} from step {bad.start_step}) "
                        "and no rollback is allowed: its final weights are not usable",
                        proc,
                        tail,
                    )
            if action is not None:
                if action.name in ("stop", "pause"):
                    return self._finish("stopped", f"{action.name}: {action.reason}")
                where = self._rollback(action) if action.name == "rollback" else (None, "restart")
                if action.name == "restart":
                    found = self._complete_checkpoints()
                    where = (found[0][0] if found else None, "restart")
                if where is None:
                    return self._finish(
                        "failed",
                        f"{action.reason}; no earlier checkpoint is left to roll back to",
                        proc,
                        tail,
                    )
                checkpoint, note = where
                self._restart_detection(checkpoint)
                self.events.emit(
                    "action",
                    action.name,
                    f"{action.reason}: {action.name} to {checkpoint.name if checkpoint else 'the start'}, {note}",
                    severity="warning",
                    step=action.step,
                    data={
                        "checkpoint": checkpoint.name if checkpoint else None,
                        "lr_scale": self.lr_scale,
                        "lr": self._scaled_lr(),
                        **dict(action.params),
                    },
                )
                self.say(f"{action.name}: to {checkpoint.name if checkpoint else 'the start'} ({note})")
                reason = action.name
                self.attempt += 1
                self._intervals.clear()
                continue
            exc = last_exception(tail) if rc else None
            made_progress = self._last_progress is not None and self._last_progress >= started
            info = ExitInfo(
                returncode=rc,
                status="completed" if rc == 0 else None,
                step=self.progress.step,
                stderr_tail=tail,
                hung=hung_for is not None,
                error_type=exc[0] if exc else None,
                error_message=exc[1] if exc else None,
                deterministic=bool(rc) and not made_progress and hung_for is None,
            )
            resume_failed = (
                info.deterministic and checkpoint is not None and restarts < self.opts.max_restarts
            )
            decision = decide(info, history, restarts, self.opts.max_restarts, self.opts.backoff_s)
            history.append(info)
            if resume_failed and checkpoint is not None:
                # It died loading the checkpoint before any step: that checkpoint is the suspect,
                # not the code. The next older whole one gets its chance.
                self._bad.add(checkpoint)
                self.events.emit(
                    "anomaly",
                    "resume_failed",
                    f"resuming from {checkpoint.name} failed before the first step "
                    f"({info.error_type or 'exit ' + str(rc)}: {info.error_message or ''}); "
                    "falling back to an older checkpoint",
                    severity="warning",
                    step=checkpoint_step(checkpoint),
                    data={"checkpoint": checkpoint.name, "error": info.error_message},
                )
            elif decision.action != "restart":
                state = "completed" if decision.action == "done" else "failed"
                return self._finish(state, decision.reason, proc, tail)
            found = self._complete_checkpoints()
            checkpoint = found[0][0] if found else None
            self._restart_detection(checkpoint)
            why = "resume failed" if resume_failed else decision.reason
            self.events.emit(
                "action",
                "restart",
                f"{why}; resuming from {checkpoint.name if checkpoint else 'the start'}",
                severity="warning",
                step=self.progress.step,
                data={"classification": "resume_failed" if resume_failed else decision.classification},
            )
            self.say(f"restarting ({why}) from {checkpoint.name if checkpoint else 'the start'}")
            time.sleep(decision.delay_s)
            reason = "restart"
            restarts += 1
            self.attempt += 1
            self._intervals.clear()

    def _check_resume(self, step: int, values: dict[str, float], expect: dict[str, float]) -> None:
        """The first record after a resume continues the checkpoint: its epoch, its step, its loss.

        A tool that ignored the resume argument starts over from epoch 0; one that resumed
        from elsewhere jumps; either way the run is not what the plan says.
        """
        problems = []
        epoch, exp_epoch = values.get("epoch"), expect.get("epoch")
        if epoch is not None and exp_epoch and epoch < 0.5 * exp_epoch:
            problems.append(
                f"epoch {epoch:g} where checkpoint-{int(expect['step'])} was at epoch {exp_epoch:g}"
            )
        if self._step_source_is_real() and step <= expect["step"]:
            problems.append(f"step {step}, not after the checkpoint's step {int(expect['step'])}")
        loss, exp_loss = values.get("loss"), expect.get("loss")
        if loss is not None and exp_loss and loss > 2.5 * exp_loss and loss - exp_loss > 0.5:
            problems.append(f"loss {loss:.4g} where the curve was at {exp_loss:.4g}: it does not continue")
        if problems:
            self.events.emit(
                "anomaly",
                "resume_mismatch",
                f"the run did not resume from checkpoint-{int(expect['step'])}: " + "; ".join(problems),
                severity="critical" if len(problems) > 1 or "epoch" in problems[0] else "warning",
                step=step,
                data={"expected": expect, "got": {"step": step, **values}},
            )

    def _step_source_is_real(self) -> bool:
        """Steps come from the tool's own counter (trainer_log.jsonl), not from counting its log lines."""
        return self.opts.output_dir is not None and (self.opts.output_dir / "trainer_log.jsonl").exists()

    def _dump_stacks(self, proc: WorkerProcess, tree: ProcessTree) -> None:
        """The Python stacks of a hung command, into ``stacks/``, before it is killed.

        Every Python process of the tree gets SIGCONT (a stopped one cannot answer) and then
        SIGABRT, on which faulthandler (enabled by PYTHONFAULTHANDLER) prints all threads.
        """
        import psutil

        tree.note()
        pids = []
        for pid in sorted(tree.seen):
            try:
                if "python" in psutil.Process(pid).name().lower():
                    pids.append(pid)
            except psutil.Error:
                continue
        start = proc.log_path.stat().st_size if proc.log_path.exists() else 0
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGABRT):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = self.clock() + 5.0
        while self.clock() < deadline and any(psutil.pid_exists(p) for p in pids):
            time.sleep(0.1)
        time.sleep(0.5)  # the pipe's last lines reach the log
        try:
            with open(proc.log_path, "rb") as f:
                f.seek(start)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        if "Fatal Python error" not in text and 'File "' not in text:
            return
        self.run.stacks.mkdir(parents=True, exist_ok=True)
        out = self.run.stacks / f"attempt-{self.attempt}.txt"
        out.write_text(text)
        self.events.emit(
            "action",
            "stacks_dumped",
            f"Python stacks of {len(pids)} process(es) of the hung job written to {out}",
            step=self.progress.step,
            data={"pids": pids, "file": str(out)},
        )

    def _restart_detection(self, checkpoint: Path | None) -> None:
        """The abandoned timeline's anomalies end here; detection resumes from the checkpoint's history."""
        from steadytune.supervise.restarts import replay_detector

        step = checkpoint_step(checkpoint) if checkpoint is not None else 0
        for a in self.detector.open_anomalies():
            self.events.emit(
                "resolved",
                a.kind,
                f"{a.kind} cleared by the restart",
                step=a.start_step,
                data={"metric": a.metric},
            )
        self.policy.forget_open()
        self._recorded.clear()
        self._printed.clear()
        self.detector = replay_detector(self.run, self.detector.config, step or 0)
        self._expect = resume_expectation(checkpoint) if checkpoint is not None else None
        if checkpoint is not None:
            self._resume_counter(checkpoint)
        else:
            self._log_step = self._last_logged_step = 0
            self._tokens_seen = None

    def _scaled_lr(self) -> float | None:
        return self.opts.base_lr * self.lr_scale if self.opts.base_lr else None

    def _last_checkpoint(self) -> str | None:
        if self.opts.output_dir is None:
            return None
        found = list_checkpoints(self.opts.output_dir)
        return found[0].name if found else None

    def write_status(self, state: str, pid: int | None) -> None:
        now = self.clock()
        if state == "running" and now - getattr(self, "_status_ts", 0.0) < 1.0:
            return
        self._status_ts = now
        p = self.progress
        atomic_write_text(
            self.run.status,
            json.dumps(
                {
                    "run_id": self.run.run_id,
                    "state": state,
                    "step": p.step,
                    "max_steps": p.max_steps,
                    "loss": p.last_loss,
                    "tokens_per_s": p.tokens_per_s,
                    "eta_s": p.eta_s,
                    "attempt": self.attempt,
                    "restarts": self.attempt,
                    "last_checkpoint": self._last_checkpoint(),
                    "worker_pid": pid,
                    "updated_ts": self.clock(),
                    "external": True,
                }
            ),
        )


def resume_expectation(checkpoint: Path) -> dict[str, float] | None:
    """Step, epoch, loss and LR of the last log entry a checkpoint's trainer_state.json holds."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    step = state.get("global_step") or checkpoint_step(checkpoint)
    logged = [e for e in state.get("log_history") or [] if isinstance(e, dict) and "loss" in e]
    last = logged[-1] if logged else {}
    out = {
        "step": float(step or 0),
        "epoch": state.get("epoch") or last.get("epoch"),
        "loss": last.get("loss"),
    }
    out["lr"] = last.get("learning_rate")
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}


def run_external(
    opts: ExternalOptions, run: RunDir, say: Callable[[str], None] = print, config: Any = None
) -> int:
    """Supervise ``opts.command`` to its end; ``config`` (a SteadytuneConfig) gives detect/policy/alerts."""
    kw = {} if config is None else {"detect": config.detect, "policy": config.policy, "alerts": config.alerts}
    sup = ExternalSupervisor(opts, run, say=say, **kw)
    sup.install_signal_handlers()
    return sup.run_to_end()


__all__ = [
    "ExternalOptions",
    "ExternalSupervisor",
    "check_external_checkpoint",
    "last_exception",
    "newest_complete",
    "parse_log_line",
    "run_external",
]
