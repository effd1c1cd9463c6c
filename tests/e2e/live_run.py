"""A fake live run: a background thread that writes a run directory the way the supervisor does.

It appends StepRecords (telemetry/rank-0.jsonl), SystemSamples (system.jsonl),
a plan revision, an anomaly and its resolution (events.jsonl), checkpoints with
manifests and pointers, and rewrites status.json atomically, so the dashboard,
/metrics and `top` can be tested against a run that moves, without the real
supervisor. (A supervisor-driven test will be added once the supervisor lands.)
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from pathlib import Path

from steadytune.records import Event, GpuSample, PlanRevision, StepRecord, SystemSample
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter

GIB = 1 << 30


def loss_at(step: int) -> float:
    return 2.5 * math.exp(-step / 400) + 0.6 + 0.05 * math.sin(step / 7)


def step_record(step: int, ts: float, attempt: int = 0, rank: int = 0) -> StepRecord:
    return StepRecord(
        step=step, ts=ts, rank=rank, attempt=attempt, loss=loss_at(step), grad_norm=1.0 + 0.3 * math.sin(step / 5),
        lr=2e-4 * min(1.0, step / 50), tokens=8192, step_time_s=0.25, mem_allocated_bytes=int(9.5 * GIB),
        mem_reserved_bytes=int(11 * GIB + (step % 50) * (1 << 24)), mem_peak_bytes=int(12 * GIB),
        eval_loss=loss_at(step) + 0.08 if step % 50 == 0 and step else None,
    )  # fmt: skip


def system_sample(ts: float, i: int) -> SystemSample:
    gpu = GpuSample(
        index=0, name="NVIDIA A100-SXM4-40GB", util_ratio=0.9 + 0.05 * math.sin(i / 3), mem_used_bytes=int(12.5 * GIB),
        mem_total_bytes=40 * GIB, temperature_c=64 + 3 * math.sin(i / 9), power_w=310 + 20 * math.sin(i / 4),
    )  # fmt: skip
    return SystemSample(
        ts=ts, cpu_ratio=0.35 + 0.1 * math.sin(i / 6), ram_used_bytes=40 * GIB, ram_total_bytes=128 * GIB,
        disk_free_bytes=600 * GIB - i * (1 << 20), disk_total_bytes=1800 * GIB, worker_rss_bytes=7 * GIB, gpus=(gpu,),
    )  # fmt: skip


def write_checkpoint(run: RunDir, step: int, ts: float) -> str:
    name = f"checkpoint-{step}"
    d = run.checkpoints / name
    d.mkdir(parents=True, exist_ok=True)
    blob = f"weights at {step}".encode()
    (d / "adapter.safetensors").write_bytes(blob)
    manifest = {
        "step": step, "ts": ts,
        "files": [{"path": "adapter.safetensors", "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}],
    }  # fmt: skip
    atomic_write_text(d / "MANIFEST.json", json.dumps(manifest))
    atomic_write_text(run.latest_pointer, name)
    atomic_write_text(run.last_good_pointer, name)
    return name


class LiveRun:
    """Writes a run that advances ``rate`` steps per second until :meth:`stop`."""

    def __init__(
        self, runs_dir: Path, run_id: str = "live-run", rate: float = 10.0, max_steps: int = 100000,
        start_step: int = 0, with_events: bool = True,
    ) -> None:  # fmt: skip
        self.run = RunDir(Path(runs_dir) / run_id).create()
        self.rate = rate
        self.max_steps = max_steps
        self.step = start_step
        self.with_events = with_events
        self.last_checkpoint: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"live-run-{run_id}", daemon=True)
        self._writer = JsonlWriter(self.run.telemetry(0))
        self._system = JsonlWriter(self.run.system)
        self._plans = JsonlWriter(self.run.plan)
        self.events = EventLog(self.run.events, run_id=run_id)
        self.last_write_ts = 0.0

    def start(self) -> LiveRun:
        now = time.time()
        self._plans.write(PlanRevision(revision=0, ts=now, reason="initial", per_device_train_batch_size=8,
                                       gradient_accumulation_steps=4))  # fmt: skip
        self.events.append(Event(ts=now, kind="lifecycle", name="started", message="run started"))
        self._status("running")
        self._thread.start()
        return self

    def _status(self, state: str) -> None:
        now = time.time()
        status = {
            "run_id": self.run.run_id, "state": state, "step": self.step, "max_steps": self.max_steps,
            "loss": loss_at(self.step), "tokens_per_s": 32768.0, "eta_s": (self.max_steps - self.step) / self.rate,
            "attempt": 0, "restarts": 0, "last_checkpoint": self.last_checkpoint, "supervisor_pid": 0,
            "worker_pid": 0, "updated_ts": now, "dashboard_url": None,
        }  # fmt: skip
        atomic_write_text(self.run.status, json.dumps(status))

    def write_step(self) -> StepRecord:
        self.step += 1
        rec = step_record(self.step, time.time())
        self._writer.write(rec)
        self.last_write_ts = rec.ts
        return rec

    def _loop(self) -> None:
        interval = 1.0 / self.rate
        i = 0
        while not self._stop.wait(interval):
            self.write_step()
            i += 1
            if i % max(1, int(self.rate)) == 0:
                self._system.write(system_sample(time.time(), i))
                self._status("running")
            if self.with_events and self.step % 40 == 20:
                self.events.append(Event(
                    ts=time.time(), kind="anomaly", name="loss_spike", severity="warning", step=self.step,
                    message="loss 2.1× the window mean",
                    data={"metric": "loss", "cause": "a batch of unusually long samples",
                          "suggestion": "skip the data window and roll back to LAST_GOOD"},
                ))  # fmt: skip
            if self.with_events and self.step % 40 == 30:
                self.events.append(Event(ts=time.time(), kind="resolved", name="loss_spike", step=self.step,
                                         data={"metric": "loss"}))  # fmt: skip
            if self.step % 100 == 0:
                self.last_checkpoint = write_checkpoint(self.run, self.step, time.time())

    def stop(self, state: str = "completed") -> None:
        self._stop.set()
        self._thread.join(5)
        self._status(state)
        for w in (self._writer, self._system, self._plans):
            w.close()
