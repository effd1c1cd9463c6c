"""Supervising a command steadytune does not run itself (``steadytune supervise -- CMD``).

Progress comes from what such jobs already write: HF-style log dicts on stdout
(``{'loss': 1.2, 'grad_norm': 3.4, 'learning_rate': 2e-05, 'epoch': 0.5}``),
and, in the output directory, LLaMA-Factory's ``trainer_log.jsonl`` and the
HF ``trainer_state.json`` of each checkpoint. The same detectors and alerts as a
native run watch it; a hang is "no progress"; a restart appends the resume
argument pointing at the newest checkpoint that is complete.
"""

from __future__ import annotations

import ast
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from steadytune.checkpoint.manifest import MANIFEST, checkpoint_step, list_checkpoints, verify
from steadytune.detect.live import LiveDetector, format_transition
from steadytune.policy.restart import ExitInfo, decide
from steadytune.records import PlanRevision, StepRecord, to_dict, to_json
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.progress import RunProgress
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.jsonl import JsonlReader
from steadytune.telemetry.sampler import SystemSampler
from steadytune.telemetry.stream import JsonlWriter

_LOG_DICT = re.compile(r"^\s*(\{.*'(?:loss|train_loss|eval_loss)'.*\})\s*$")
_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")


def parse_log_line(line: str) -> dict[str, float] | None:
    """An HF Trainer log dict printed on stdout, with numbers (v5 prints them as strings)."""
    m = _LOG_DICT.match(line)
    if not m:
        return None
    try:
        raw = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return None
    out = {}
    for k, v in raw.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    return out or None


def _safetensors_header_ok(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > path.stat().st_size - 8:
                return False
            json.loads(f.read(n))
        return True
    except (OSError, ValueError):
        return False


def check_external_checkpoint(ckpt: Path) -> tuple[bool, str]:
    """Whether a checkpoint another tool wrote is complete enough to resume from.

    With a steadytune manifest, the manifest decides. Otherwise: trainer_state.json
    parses and names this step, and the weights file is there, non-empty and (for
    safetensors) has a readable header — the checks that catch a save killed midway.
    """
    if (ckpt / MANIFEST).exists():
        v = verify(ckpt)
        return v.ok, v.reason
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False, "trainer_state.json missing or unreadable (save did not finish)"
    step = checkpoint_step(ckpt)
    if step is not None and state.get("global_step") not in (None, step):
        return False, f"trainer_state.json says step {state.get('global_step')}, folder says {step}"
    weights = [ckpt / w for w in _WEIGHTS if (ckpt / w).exists()]
    shards = list(ckpt.glob("model-*-of-*.safetensors"))
    if not weights and not shards:
        return False, "no model or adapter weights"
    for w in [*weights, *shards]:
        if w.stat().st_size == 0 or (w.suffix == ".safetensors" and not _safetensors_header_ok(w)):
            return False, f"{w.name} is empty or truncated"
    return True, ""


def newest_complete(output_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    skipped = []
    for ckpt in list_checkpoints(output_dir):
        ok, reason = check_external_checkpoint(ckpt)
        if ok:
            return ckpt, skipped
        skipped.append((ckpt, reason))
    return None, skipped


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


class ExternalSupervisor:
    """Runs, watches and restarts an arbitrary training command."""

    def __init__(
        self,
        opts: ExternalOptions,
        run: RunDir,
        detector: LiveDetector | None = None,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.opts, self.run, self.say, self.clock = opts, run.create(), say, clock
        self.events = EventLog(run.events, run.run_id, clock=clock)
        self.detector = detector or LiveDetector()
        self.telemetry = JsonlWriter(run.telemetry(0))
        self.system = JsonlWriter(run.system)
        self.sampler = SystemSampler(run.root, clock=clock)
        self.progress = RunProgress()
        self.attempt = 0
        self._lock = threading.Lock()
        self._last_progress: float | None = None
        self._intervals: list[float] = []
        self._log_step = 0
        self._log_every = (
            1  # HF prints a dict every logging_steps; learnt from a checkpoint's trainer_state.json
        )
        self._log_reader: JsonlReader | None = None

    # -- progress ---------------------------------------------------------------
    def record(self, step: int, values: dict[str, float]) -> None:
        now = self.clock()
        rec = StepRecord(
            step=step,
            ts=now,
            attempt=self.attempt,
            loss=values.get("loss"),
            grad_norm=values.get("grad_norm"),
            lr=values.get("learning_rate", values.get("lr")),
            epoch=values.get("epoch"),
            eval_loss=values.get("eval_loss"),
            extra={"eval": True} if "eval_loss" in values and "loss" not in values else {},
        )
        with self._lock:
            if self._last_progress is not None:
                self._intervals = [*self._intervals[-63:], now - self._last_progress]
            self._last_progress = now
            self.telemetry.write(rec)
            self.progress.add(rec)
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

    def on_stdout(self, line: str) -> None:
        values = parse_log_line(line)
        if values is not None and not (
            self.opts.output_dir and (self.opts.output_dir / "trainer_log.jsonl").exists()
        ):
            self._log_step += self._log_every
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
                k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and k != "current_steps"
            }
            if isinstance(step, int):
                self.record(step, values)

    def _resume_counter(self, checkpoint: Path) -> None:
        """After a resume, stdout log lines count from the checkpoint's step again."""
        try:
            state = json.loads((checkpoint / "trainer_state.json").read_text())
        except (OSError, ValueError):
            state = {}
        self._log_every = int(state.get("logging_steps") or 1)
        self._log_step = int(state.get("global_step") or checkpoint_step(checkpoint) or 0)

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
        self.events.emit("lifecycle", "run_started", f"supervising: {' '.join(self.opts.command)}")
        history: list[ExitInfo] = []
        checkpoint: Path | None = None
        restarts = 0
        while True:
            cmd = self.command_for(checkpoint)
            plan = PlanRevision(
                revision=self.attempt,
                ts=self.clock(),
                reason="start" if not self.attempt else "restart",
                attempt=self.attempt,
                resume_checkpoint=str(checkpoint) if checkpoint else None,
            )
            with open(self.run.plan, "a") as f:
                f.write(to_json(plan) + "\n")
            proc = WorkerProcess(
                cmd,
                self.run.logs / f"worker-{self.attempt}.log",
                env={"STEADYTUNE_ATTEMPT": str(self.attempt), "PYTHONUNBUFFERED": "1"},
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
            while proc.poll() is None:
                self.poll_files()
                now = self.clock()
                if now - last_sample > 2.0:
                    last_sample = now
                    self.system.write(self.sampler.sample(proc.pid))
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
                    proc.kill()
                    break
                time.sleep(0.2)
            reader.join(timeout=5)
            self.poll_files()
            rc = proc.poll()
            tail = proc.log_tail()
            made_progress = self._last_progress is not None and self._last_progress >= started
            info = ExitInfo(
                returncode=rc,
                status="completed" if rc == 0 else None,
                step=self.progress.step,
                stderr_tail=tail,
                hung=hung_for is not None,
                error_type=_last_exception(tail) if rc else None,
                deterministic=bool(rc) and not made_progress and hung_for is None,
            )
            decision = decide(info, history, restarts, self.opts.max_restarts, self.opts.backoff_s)
            history.append(info)
            if decision.action != "restart":
                state = "completed" if decision.action == "done" else "failed"
                self.events.emit(
                    "lifecycle",
                    f"run_{state}",
                    f"run {state}: {decision.reason}",
                    severity="info" if state == "completed" else "critical",
                )
                self.write_status(state, None)
                self.say(f"{state}: {decision.reason}")
                return 0 if state == "completed" else 1
            checkpoint = None
            if self.opts.output_dir is not None:
                checkpoint, skipped = newest_complete(self.opts.output_dir)
                if checkpoint is not None:
                    self._resume_counter(checkpoint)
                for bad, reason in skipped:
                    self.events.emit(
                        "anomaly",
                        "checkpoint_corrupt",
                        f"{bad.name} skipped for resume: {reason}",
                        severity="warning",
                        step=checkpoint_step(bad),
                    )
            self.events.emit(
                "action",
                "restart",
                f"{decision.reason}; resuming from {checkpoint.name if checkpoint else 'the start'}",
                severity="warning",
                step=self.progress.step,
                data={"classification": decision.classification},
            )
            self.say(
                f"restarting ({decision.classification}) from {checkpoint.name if checkpoint else 'the start'}"
            )
            time.sleep(decision.delay_s)
            restarts += 1
            self.attempt += 1
            self._intervals.clear()

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
                    "max_steps": None,
                    "loss": p.last_loss,
                    "tokens_per_s": None,
                    "eta_s": None,
                    "attempt": self.attempt,
                    "restarts": self.attempt,
                    "last_checkpoint": None,
                    "worker_pid": pid,
                    "updated_ts": self.clock(),
                    "external": True,
                }
            ),
        )


def _last_exception(tail: str) -> str | None:
    for line in reversed(tail.splitlines()):
        m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)):", line.strip())
        if m:
            return m.group(1).rsplit(".", 1)[-1]
    return None


def run_external(opts: ExternalOptions, run: RunDir, say: Callable[[str], None] = print) -> int:
    return ExternalSupervisor(opts, run, say=say).run_to_end()


__all__ = [
    "ExternalOptions",
    "ExternalSupervisor",
    "check_external_checkpoint",
    "newest_complete",
    "parse_log_line",
    "run_external",
]
