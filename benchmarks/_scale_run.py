"""A supervised run over a generated stream, measured from outside (benchmarks/scale.py).

:class:`SupervisedRun` starts ``_scale_supervisor.py`` (the real supervisor, its store and
detectors, over ``_scale_feed.py``) in a process of its own, waits for the prefill to be taken
in, and reads the supervisor's CPU time and memory from ``/proc`` while the feed goes on at
10 steps a second. Orders reach the feed through its orders file.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def system_history(root: Path, seconds: float, interval_s: float = 2.0, gpus: int = 8) -> int:
    """The system samples a run that has gone ``seconds`` already holds: one per ``interval_s`` (the
    sampler's default) with ``gpus`` GPUs, in ``system.jsonl`` and indexed in ``run.db``, as its
    supervisor would have left them. The feed's prefill is written in minutes, not in the days it
    stands for: without them, the dashboard's system and GPU charts would read a few samples."""
    from steadytune.records import GpuSample, SystemSample
    from steadytune.rundir import RunDir
    from steadytune.telemetry.store import RunStore
    from steadytune.telemetry.stream import JsonlWriter

    run = RunDir(root).create()
    n = int(seconds / interval_s)
    t0 = time.time() - n * interval_s
    store = RunStore(run.db)
    with JsonlWriter(run.system) as w:
        for lo in range(0, n, 5000):
            batch = []
            for i in range(lo, min(n, lo + 5000)):
                g = tuple(
                    GpuSample(index=k, name="NVIDIA H100 80GB HBM3", util_ratio=0.9 + 0.05 * ((i + k) % 3),
                              mem_used_bytes=(60 + k) << 30, mem_total_bytes=80 << 30,
                              temperature_c=60.0 + (i % 7), power_w=500.0 + (i % 11))
                    for k in range(gpus)
                )  # fmt: skip
                batch.append(SystemSample(ts=t0 + i * interval_s, cpu_ratio=0.3 + 0.01 * (i % 9),
                                          ram_used_bytes=200 << 30, ram_total_bytes=1 << 40,
                                          disk_free_bytes=(2 << 40) - i * (1 << 20), disk_total_bytes=4 << 40,
                                          worker_rss_bytes=(7 << 30) * gpus, gpus=g))  # fmt: skip
            for rec in batch:
                w.write(rec)
            store.add_system(batch)
    store.close()
    return n


class SupervisedRun:
    """One run: ``ranks`` streams, ``prefill`` steps taken in as fast as it can, then 10 steps/s."""

    def __init__(
        self,
        runs_dir: Path,
        run_id: str,
        prefill: int,
        ranks: int = 1,
        sets: tuple[str, ...] = (),
        save_every: int = 0,
    ) -> None:
        self.root = runs_dir / run_id
        self.prefill = prefill
        self.ranks = ranks
        cmd = [sys.executable, str(HERE / "_scale_supervisor.py"), str(runs_dir), run_id]
        for s in ("policy.mode=observe", *sets):  # every action an alert: the run is measured, not rescued
            cmd += ["--set", s]
        cmd += ["--", "--prefill", str(prefill), "--ranks", str(ranks), "--rate", "10"]
        cmd += ["--save-every", str(save_every)]
        self.started = time.monotonic()
        runs_dir.mkdir(parents=True, exist_ok=True)
        self.samples = system_history(self.root, prefill / 10.0) if prefill else 0
        self.log = runs_dir / f"{run_id}.supervisor.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)

    # -- reading --------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return _json(self.root / "status.json")

    def feed(self) -> dict[str, Any]:
        return _json(self.root / "feed-state.json")

    def step(self) -> int:
        return int(self.status().get("step") or 0)

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def memory(self) -> tuple[int, int]:
        """(resident now, peak resident) of the supervisor, in bytes."""
        rss = hwm = 0
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
        return rss, hwm

    def events(self) -> list[dict[str, Any]]:
        out = []
        try:
            lines = (self.root / "events.jsonl").read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def sizes(self) -> dict[str, int]:
        """Bytes on disk: run.db (with its WAL), and the telemetry streams (their rotated segments too)."""
        db = sum(p.stat().st_size for p in self.root.glob("run.db*"))
        jsonl = sum(p.stat().st_size for p in (self.root / "telemetry").iterdir() if p.is_file())
        return {"run_db": db, "jsonl": jsonl}

    # -- driving --------------------------------------------------------------------------
    def _alive(self) -> None:
        if self.proc.poll() is not None:
            err = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the supervisor exited ({self.proc.returncode}): {err}")

    def wait_prefill(self, timeout: float = 3600.0) -> float:
        """Seconds from the start until the supervisor has taken in every prefill step."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._alive()
            if self.feed().get("phase") == "live" and self.step() >= self.prefill:
                return time.monotonic() - self.started
            time.sleep(0.2)
        raise TimeoutError(f"prefill of {self.prefill} steps not taken in after {timeout:.0f} s")

    def state_step(self) -> int:
        """The step of the newest detector state the supervisor has saved (0: none yet)."""
        steps = [
            int(p.stem.removeprefix("detector-"))
            for p in (self.root / "replay-state").glob("detector-*.json")
            if p.stem.removeprefix("detector-").isdigit()
        ]
        return max(steps, default=0)

    def wait_state(self, step: int, timeout: float = 900.0) -> float:
        """Seconds until the saved detector state reaches ``step``: after a prefill the supervisor's
        first catch-up replays the whole run once (a run it watched all along would not need it)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self._alive()
            if self.state_step() >= step:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise TimeoutError(f"the detectors' state did not reach step {step} in {timeout:.0f} s")

    def cpu_windows(self, windows: int, seconds: float) -> dict[str, float]:
        """The supervisor's CPU in ``windows`` live windows: median s per 1,000 steps, share of a core."""
        per_k, share = [], []
        for _ in range(windows):
            c0, s0, t0 = self.cpu_s(), self.step(), time.monotonic()
            time.sleep(seconds)
            c1, s1, t1 = self.cpu_s(), self.step(), time.monotonic()
            self._alive()
            if s1 > s0:
                per_k.append((c1 - c0) / (s1 - s0) * 1000)
            share.append((c1 - c0) / (t1 - t0))
        return {"cpu_s_per_1k": statistics.median(per_k), "core_share": statistics.median(share)}

    def order(self, word: str) -> None:
        (self.root / "feed-orders").write_text(word)

    def wait_event(self, name: str, after_ts: float, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if e.get("kind") == "anomaly" and e.get("name") == name and e.get("ts", 0) >= after_ts:
                    return e
            time.sleep(0.1)
        return None

    def stop(self, timeout: float = 120.0) -> str:
        self.order("stop")
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.status().get("state", "unknown")
