"""Soak: a real supervised run with its dashboard under load, beside the same run without it.

    python benchmarks/soak.py [--steps 600] [--sse 50] [--idle 200] [--scrape-hz 10] [--no-disk-full]

Runs the demo fine-tune twice through `steadytune run --dashboard` (the dashboard
serves from inside the supervisor): once alone, once while, on loopback only,
``--sse`` clients hold the run's live stream, ``--idle`` sockets connect and send
nothing, and a scraper reads /metrics ``--scrape-hz`` times a second. The load stops
with the run (and after ``--max-s`` at the latest). Printed side by side:

- the run's median step time (goal: loaded within 5% of unloaded);
- the supervisor's threads and memory (peak);
- what the server did with the load: streams served or refused (503 past
  ``dashboard.max_streams``), idle sockets closed by its request timeout, scrape
  latency;
- that nothing was lost: every step and event of the JSONL is in run.db, and every
  stream client saw every event.

The dashboard limits are raised here (max_streams 64, max_connections 320) so that
the whole load is admitted; with the defaults (16 / 64) the excess is refused at once.

A second scenario fills the disk: the run directory sits on a small tmpfs, and once
the first checkpoint is there a file takes all but a few MiB. The next save must be
refused with a clear event, no checkpoint without its manifest may be trusted (or
pointed to), and the run goes on, pauses or stops as ``policy.rules.disk_low`` says
(here: the default, alert, and stop). It needs root for the mount, else it says why.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]


def _config(assets: Path, runs: Path, steps: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "src"))
    from steadytune.cli.demo import demo_config

    cfg = demo_config(assets, str(runs), steps, "lora")
    cfg["train"].update({"logging_steps": 1, "save_steps": steps // 3, "eval_steps": None})
    cfg["data"].pop("eval_file", None)
    cfg["dashboard"] = {"max_streams": 64, "max_connections": 320, "request_timeout_s": 10}
    return cfg


class Load:
    """SSE clients, idle sockets and a /metrics scraper against one dashboard, until stopped."""

    def __init__(self, host: str, port: int, run_id: str, sse: int, idle: int, hz: float) -> None:
        self.host, self.port, self.run_id = host, port, run_id
        self.stop = threading.Event()
        self.scraping = threading.Event()
        self.scraping.set()
        self.stream_status: list[int] = []
        self.stream_events: list[set[int]] = [set() for _ in range(sse)]
        self.idle_closed: list[float] = []
        self.scrapes: list[float] = []
        self.scrape_errors = 0
        self.threads = [threading.Thread(target=self._stream, args=(i,), daemon=True) for i in range(sse)]
        self.threads.append(threading.Thread(target=self._scrape, args=(hz,), daemon=True))
        self.sockets: list[socket.socket] = []
        self._idle = idle

    def start(self) -> None:
        for _ in range(self._idle):
            s = socket.create_connection((self.host, self.port), timeout=60)
            self.sockets.append(s)
        threading.Thread(target=self._watch_idle, daemon=True).start()
        for t in self.threads:
            t.start()

    def _watch_idle(self) -> None:
        t0 = time.monotonic()
        for s in self.sockets:
            s.settimeout(0.5)
        open_ = list(self.sockets)
        while open_ and not self.stop.is_set():
            for s in list(open_):
                try:
                    if s.recv(1) == b"":
                        self.idle_closed.append(time.monotonic() - t0)
                        open_.remove(s)
                except TimeoutError:
                    continue
                except OSError:
                    self.idle_closed.append(time.monotonic() - t0)
                    open_.remove(s)

    def _stream(self, i: int) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", f"/api/runs/{self.run_id}/stream")
            resp = conn.getresponse()
            self.stream_status.append(resp.status)
            if resp.status != 200:
                return
            kind = b""
            while not self.stop.is_set():
                line = resp.fp.readline()
                if not line:
                    return
                if line.startswith(b"event:"):
                    kind = line[6:].strip()
                elif line.startswith(b"data:") and kind == b"events":
                    try:
                        payload = json.loads(line[5:])
                    except ValueError:
                        continue
                    for ev in payload if isinstance(payload, list) else []:
                        if isinstance(ev, dict) and isinstance(ev.get("seq"), int):
                            self.stream_events[i].add(ev["seq"])
        except OSError:
            self.stream_status.append(-1)
        finally:
            conn.close()

    def _scrape(self, hz: float) -> None:
        while not self.stop.is_set() and self.scraping.is_set():
            t0 = time.perf_counter()
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                conn.request("GET", "/metrics")
                resp = conn.getresponse()
                resp.read()
                conn.close()
                if resp.status == 200:
                    self.scrapes.append(time.perf_counter() - t0)
                else:
                    self.scrape_errors += 1
            except OSError:
                self.scrape_errors += 1
            self.stop.wait(max(0.0, 1.0 / hz - (time.perf_counter() - t0)))

    def close(self) -> None:
        self.stop.set()
        for s in self.sockets:
            s.close()


def _run(cfg_path: Path, run_id: str, load: dict[str, Any] | None, max_s: float) -> dict[str, Any]:
    runs = Path(yaml.safe_load(cfg_path.read_text())["run"]["runs_dir"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    exe = Path(sys.executable).with_name("steadytune")
    cmd = [str(exe), "run", str(cfg_path), f"run.name={run_id}", "--skip-check", "--dashboard", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    sup = psutil.Process(proc.pid)
    peak_threads, peak_rss, attached = 0, 0, None
    t0 = time.monotonic()
    run_dir = None
    while proc.poll() is None and time.monotonic() - t0 < max_s:
        try:
            peak_threads = max(peak_threads, sup.num_threads())
            peak_rss = max(peak_rss, sup.memory_info().rss)
        except psutil.Error:
            pass
        if run_dir is None:
            found = sorted(runs.glob(f"{run_id}-*"))
            run_dir = found[0] if found else None
        if load is not None and attached is None and run_dir is not None:
            status = run_dir / "status.json"
            url = json.loads(status.read_text()).get("dashboard_url") if status.exists() else None
            if url:
                host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
                attached = Load(host, int(port), run_dir.name, **load)
                attached.start()
        time.sleep(0.2)
    if attached is not None:
        attached.scraping.clear()
    if proc.poll() is None:
        proc.kill()
    proc.communicate()
    if attached is not None:
        attached.scraping.clear()  # the dashboard went with the run: scrapes after it are not failures
        time.sleep(1.0)  # the streams catch up with the last events
        attached.close()
    assert run_dir is not None, "the run directory never appeared"
    return {"run": run_dir, "threads": peak_threads, "rss": peak_rss, "load": attached, "rc": proc.returncode}


def _step_times(run: Path) -> list[float]:
    from steadytune.rundir import RunDir
    from steadytune.telemetry.jsonl import JsonlReader

    times = []
    for path in RunDir(run).telemetry_files():
        for d in JsonlReader(path).dicts():  # its rotated segments too
            if d.get("type") == "step" and d.get("step_time_s") and d.get("step", 0) > 10:
                times.append(d["step_time_s"])
    return times


def _lost(run: Path) -> tuple[int, int, int, int]:
    """(distinct (rank, step) in the JSONL, steps in run.db, events in the JSONL, events in run.db).

    A rollback or restart trains some steps again: run.db keeps the latest attempt of each.
    """
    from steadytune.rundir import RunDir
    from steadytune.telemetry.jsonl import JsonlReader

    steps = len(
        {
            (d.get("rank", 0), d["step"])
            for p in RunDir(run).telemetry_files()
            for d in JsonlReader(p).dicts()
            if d.get("type") == "step" and not (d.get("extra") or {}).get("eval")
        }
    )
    events = sum(1 for line in (run / "events.jsonl").read_text().splitlines() if line.strip())
    db = sqlite3.connect(run / "run.db")
    try:
        db_steps = db.execute("SELECT COUNT(*) FROM steps").fetchone()[0]
        db_events = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        db.close()
    return steps, db_steps, events, db_events


def _disk_full(assets: Path, tmp: Path, steps: int, action: str) -> str:
    """One run on a tmpfs that fills after its first checkpoint; a line saying what happened."""
    mnt = tmp / f"small-{action}"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        return f"skipped: cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode})"
    try:
        cfg = _config(assets, mnt / "runs", steps)
        cfg["train"].update({"save_steps": max(5, steps // 6), "logging_steps": 1})
        cfg["dashboard"] = {"enabled": False}
        cfg["run"]["min_free_disk_bytes"] = 16 << 20
        if action != "alert":
            cfg["policy"] = {"rules": {"disk_low": {"action": action}}}
        cfg_path = tmp / f"disk-{action}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        exe = Path(sys.executable).with_name("steadytune")
        proc = subprocess.Popen([str(exe), "run", str(cfg_path), "--skip-check"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
        deadline = time.monotonic() + 300
        filled = False
        while proc.poll() is None and time.monotonic() < deadline:
            ckpts = list((mnt / "runs").glob("*/checkpoints/checkpoint-*/MANIFEST.json"))
            if ckpts and not filled:
                free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
                with open(mnt / "filler", "wb") as f:
                    f.truncate(0)
                    f.write(b"\0" * max(0, free - (4 << 20)))  # leave 4 MiB: less than a save needs
                filled = True
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        run = next((mnt / "runs").glob("*/events.jsonl")).parent
        events = [
            json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()
        ]
        refused = [e for e in events if e.get("name") == "disk_low"]
        ckpts = sorted((run / "checkpoints").glob("checkpoint-*"))
        untrusted = [c.name for c in ckpts if not (c / "MANIFEST.json").exists()]
        latest = (
            (run / "checkpoints" / "LATEST").read_text().strip()
            if (run / "checkpoints" / "LATEST").exists()
            else None
        )
        status = json.loads((run / "status.json").read_text())
        msg = refused[0]["message"] if refused else "no disk_low event"
        return (
            f"policy {action}: {len(refused)} save(s) refused ({msg[:90]}); checkpoints "
            f"{[c.name for c in ckpts]}, "
            f"without manifest {untrusted or 'none'}, LATEST -> {latest}; run {status.get('state')} at step "
            f"{status.get('step')}, exit {proc.returncode}"
        )
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--sse", type=int, default=50)
    ap.add_argument("--idle", type=int, default=200)
    ap.add_argument("--scrape-hz", type=float, default=10.0)
    ap.add_argument("--max-s", type=float, default=300.0, help="stop a run (and its load) after this long")
    ap.add_argument("--no-disk-full", action="store_true", help="skip the full-disk scenario")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from steadytune.train.assets import ensure_demo_assets

    with tempfile.TemporaryDirectory(prefix="steadytune-soak-") as tmp:
        tmp_path = Path(tmp)
        assets = ensure_demo_assets(Path(os.environ.get("STEADYTUNE_CACHE") or tmp_path / "cache"))
        cfg_path = tmp_path / "soak.yaml"
        cfg_path.write_text(yaml.safe_dump(_config(assets, tmp_path / "runs", args.steps)))
        quiet = _run(cfg_path, "quiet", None, args.max_s)
        load = {"sse": args.sse, "idle": args.idle, "hz": args.scrape_hz}
        loaded = _run(cfg_path, "loaded", load, args.max_s)
        q, lo = _step_times(quiet["run"]), _step_times(loaded["run"])
        mq, ml = statistics.median(q), statistics.median(lo)
        print(
            f"soak: {args.steps} steps of the demo LoRA run; load: {args.sse} live streams, "
            f"{args.idle} idle "
            f"sockets, /metrics at {args.scrape_hz:g} Hz (loopback)"
        )
        print(f"{'':34s}{'unloaded':>14s}{'loaded':>14s}")
        print(
            f"{'median step time (ms)':34s}{1e3 * mq:>14.2f}{1e3 * ml:>14.2f}   ratio {ml / mq:.3f} "
            f"(goal <= 1.05)"
        )
        print(f"{'p90 step time (ms)':34s}{1e3 * sorted(q)[int(0.9 * len(q))]:>14.2f}"
              f"{1e3 * sorted(lo)[int(0.9 * len(lo))]:>14.2f}")  # fmt: skip
        print(f"{'supervisor threads (peak)':34s}{quiet['threads']:>14d}{loaded['threads']:>14d}")
        print(f"{'supervisor RSS MiB (peak)':34s}{quiet['rss'] / 2**20:>14.0f}{loaded['rss'] / 2**20:>14.0f}")
        ld: Load | None = loaded["load"]
        if ld is not None:
            served = sum(1 for s in ld.stream_status if s == 200)
            refused = sum(1 for s in ld.stream_status if s == 503)
            print(f"streams: {served} served, {refused} refused with 503, "
                  f"{len(ld.stream_status) - served - refused} failed")  # fmt: skip
            closed = sorted(ld.idle_closed)
            when = f", median after {statistics.median(closed):.1f} s" if closed else ""
            print(f"idle sockets: {len(closed)}/{args.idle} closed by the server{when}")
            if ld.scrapes:
                sc = sorted(ld.scrapes)
                print(
                    f"/metrics: {len(sc)} scrapes, {ld.scrape_errors} failed; latency p50 "
                    f"{1e3 * sc[len(sc) // 2]:.1f} ms, p99 {1e3 * sc[int(0.99 * (len(sc) - 1))]:.1f} ms"
                )
        for name, r in (("unloaded", quiet), ("loaded", loaded)):
            steps, db_steps, events, db_events = _lost(r["run"])
            print(f"{name}: exit {r['rc']}; steps JSONL {steps} / run.db {db_steps}; "
                  f"events JSONL {events} / run.db {db_events}")  # fmt: skip
        if ld is not None:
            _, _, events, _ = _lost(loaded["run"])
            seen = [len(s) for s, st in zip(ld.stream_events, ld.stream_status, strict=False) if st == 200]
            if seen:
                print(f"events seen by each served stream: min {min(seen)}, max {max(seen)} of {events}")
        if not args.no_disk_full:
            print("\ndisk full during the run (tmpfs of 48 MiB, filled after the first checkpoint):")
            for action in ("alert", "stop"):
                print("  " + _disk_full(assets, tmp_path, 120, action))
    return 0


if __name__ == "__main__":
    sys.exit(main())
