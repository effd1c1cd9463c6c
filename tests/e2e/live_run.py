"""A fake live run: a background thread that writes a run directory the way the supervisor does.

It appends StepRecords (telemetry/rank-0.jsonl, with per-layer gradient flow
every ``gradflow_every`` steps), SystemSamples (system.jsonl),
a plan revision, an anomaly and its resolution (events.jsonl), checkpoints with
manifests and pointers, and rewrites status.json atomically, so the dashboard,
/metrics and `top` can be tested against a run that moves, without the real
supervisor. ``test_live_demo.py`` drives the real supervisor and worker instead.
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


LAYER_LIMITS = {"vanish_norm": 2e-3, "explode_norm": 100.0, "zero_frac": 0.95}
LAYER_LIMITS_YAML = (
    "detect:\n  grad:\n"
    f"    layer_vanish_norm: {LAYER_LIMITS['vanish_norm']}\n"
    f"    layer_explode_norm: {LAYER_LIMITS['explode_norm']}\n"
    f"    layer_dead_zero_frac: {LAYER_LIMITS['zero_frac']}\n"
)
LAYERS = ["embeddings", *(f"layers.{i}" for i in range(6)), "final_norm", "lm_head"]


def gradflow_at(step: int) -> dict:
    """Per-layer gradient stats as the worker records them, with a dead, a vanishing and an exploding layer.

    ``lm_head`` explodes where the fake loss spikes (step % 40 == 20), ``layers.1`` is dead
    (mostly exact zeros) every 60 steps and ``layers.5`` vanishes every 50.
    """
    norm = [0.8 * 0.7**i * (1 + 0.2 * math.sin(step / 30 + i)) for i in range(len(LAYERS))]
    zero = [0.6 if name == "embeddings" else 0.01 for name in LAYERS]
    if step % 40 == 20:
        norm[-1] = 250.0
    if step % 60 == 0:
        zero[2] = 0.97
    if step % 50 == 0:
        norm[6] = 4e-4
    return {"layers": LAYERS, "norm": norm, "zero_frac": zero, "hist": [[0, 3, 5, 1]] * len(LAYERS),
            "bins": [-3.0, -2.0, -1.0, 0.0, 1.0]}  # fmt: skip


def step_record(step: int, ts: float, attempt: int = 0, rank: int = 0, gradflow_every: int = 0) -> StepRecord:
    flow = gradflow_every > 0 and (step == 1 or step % gradflow_every == 0)
    return StepRecord(
        step=step,
        ts=ts,
        rank=rank,
        attempt=attempt,
        loss=loss_at(step),
        grad_norm=1.0 + 0.3 * math.sin(step / 5),
        lr=2e-4 * min(1.0, step / 50),
        tokens=8192,
        step_time_s=0.25,
        mem_allocated_bytes=int(9.5 * GIB),
        mem_reserved_bytes=int(11 * GIB + (step % 50) * (1 << 24)),
        mem_peak_bytes=int(12 * GIB),
        eval_loss=loss_at(step) + 0.08 if step % 50 == 0 and step else None,
        extra={"gradflow": gradflow_at(step)} if flow else {},
    )


def system_sample(ts: float, i: int) -> SystemSample:
    gpu = GpuSample(
        index=0,
        name="NVIDIA A100-SXM4-40GB",
        util_ratio=0.9 + 0.05 * math.sin(i / 3),
        mem_used_bytes=int(12.5 * GIB),
        mem_total_bytes=40 * GIB,
        temperature_c=64 + 3 * math.sin(i / 9),
        power_w=310 + 20 * math.sin(i / 4),
    )
    return SystemSample(
        ts=ts,
        cpu_ratio=0.35 + 0.1 * math.sin(i / 6),
        ram_used_bytes=40 * GIB,
        ram_total_bytes=128 * GIB,
        disk_free_bytes=600 * GIB - i * (1 << 20),
        disk_total_bytes=1800 * GIB,
        worker_rss_bytes=7 * GIB,
        gpus=(gpu,),
    )


def write_checkpoint(run: RunDir, step: int, ts: float) -> str:
    name = f"checkpoint-{step}"
    d = run.checkpoints / name
    d.mkdir(parents=True, exist_ok=True)
    blob = f"weights at {step}".encode()
    (d / "adapter.safetensors").write_bytes(blob)
    manifest = {
        "step": step,
        "ts": ts,
        "files": [
            {"path": "adapter.safetensors", "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        ],
    }
    atomic_write_text(d / "MANIFEST.json", json.dumps(manifest))
    atomic_write_text(run.latest_pointer, name)
    atomic_write_text(run.last_good_pointer, name)
    return name


class LiveRun:
    """Writes a run that advances ``rate`` steps per second until :meth:`stop`."""

    def __init__(
        self, runs_dir: Path, run_id: str = "live-run", rate: float = 10.0, max_steps: int = 100000,
        start_step: int = 0, with_events: bool = True, gradflow_every: int = 10,
    ) -> None:  # fmt: skip
        self.run = RunDir(Path(runs_dir) / run_id).create()
        self.rate = rate
        self.max_steps = max_steps
        self.step = start_step
        self.with_events = with_events
        # The worker records gradient flow every 50 steps; 10 here so a test sees the heat map grow.
        self.gradflow_every = gradflow_every
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
        # As a supervisor would, the resolved config beside the telemetry; layer limits of its own (the
        # flagged layers above stay flagged) so the page must show this run's, not the defaults.
        atomic_write_text(self.run.config, LAYER_LIMITS_YAML)
        self._plans.write(PlanRevision(revision=0, ts=now, reason="initial", per_device_train_batch_size=8,
                                       gradient_accumulation_steps=4))  # fmt: skip
        self.events.append(Event(ts=now, kind="lifecycle", name="started", message="run started"))
        self._status("running")
        self._thread.start()
        return self

    def _status(self, state: str) -> None:
        now = time.time()
        status = {
            "run_id": self.run.run_id,
            "state": state,
            "step": self.step,
            "max_steps": self.max_steps,
            "loss": loss_at(self.step),
            "tokens_per_s": 32768.0,
            "eta_s": (self.max_steps - self.step) / self.rate,
            "attempt": 0,
            "restarts": 0,
            "last_checkpoint": self.last_checkpoint,
            "supervisor_pid": 0,
            "worker_pid": 0,
            "updated_ts": now,
            "dashboard_url": None,
        }
        atomic_write_text(self.run.status, json.dumps(status))

    def write_step(self) -> StepRecord:
        self.step += 1
        rec = step_record(self.step, time.time(), gradflow_every=self.gradflow_every)
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
