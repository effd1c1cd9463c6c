"""The standby worker, in real runs: a kill is restarted through it and trains what a new process trains.

Two real ``steadytune run`` jobs on the demo model are killed (SIGKILL) at the same held step, after
the spare worker of the first has reported itself ready: one restarts through the spare (the default),
one in a new process (``recover.standby_worker: false``). From the checkpoint on, the losses, gradient
norms, learning rates, batches and final weights must be bit-identical. A third job's supervisor is
killed with SIGKILL: its spare must go with it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from safetensors.torch import load_file

from steadytune.rundir import RunDir
from steadytune.telemetry.events import read_events

from .runs import finish, kill_worker, run_dir, running, start_run, status, steps, wait_for, write_config

pytestmark = pytest.mark.slow

# The worker waits after step 25, so the kill lands on that boundary in every run.
FAULTS = {"hold_at_step": 25, "hold_s": 120.0}


def standby_ready(run: RunDir) -> bool:
    """The first spare worker has imported everything and waits for its orders."""
    log = run.logs / "standby-0.log"
    return log.exists() and "standby: ready" in log.read_text()


def spares(run: RunDir) -> list[psutil.Process]:
    """The standby workers of ``run`` that still run (a promoted one keeps its command line)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if "--standby" in cmd and str(run.root) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


def killed_run(tmp: Path, assets: Path, name: str, **recover: Any) -> RunDir:
    base = tmp / name
    base.mkdir()
    cfg = write_config(base, assets, train={"max_steps": 30, "save_steps": 10}, recover=recover)
    proc = start_run(cfg, name, faults=FAULTS)
    run = run_dir(cfg, name)
    spare = recover.get("standby_worker", True)
    wait_for(
        lambda: running(proc) and any(r.step == 25 for r in steps(run)) and (standby_ready(run) or not spare),
        timeout=240,
        what="step 25 held, and the spare worker ready",
    )
    kill_worker(run)
    rc, out = finish(proc)
    assert rc == 0, out[-3000:]
    return run


def started(run: RunDir, attempt: int) -> dict[str, Any]:
    (event,) = [
        e for e in read_events(run.events) if e.name == "worker_started" and e.data["attempt"] == attempt
    ]
    return {"message": event.message, **event.data}


def test_a_kill_restarts_through_the_spare_and_trains_what_a_new_process_trains(
    tmp_path: Path, demo_assets: Path
) -> None:
    spare = killed_run(tmp_path, demo_assets, "spare")
    fresh = killed_run(tmp_path, demo_assets, "fresh", standby_worker=False)

    first, restarted = started(spare, 0), started(spare, 1)
    assert not first["standby"] and "a new process: the run's first attempt" in first["message"]
    assert restarted["standby"] and f"(pid {restarted['pid']}, standby worker)" in restarted["message"]
    assert "; the standby worker, started " in restarted["message"]
    assert "--standby" in restarted["cmd"]
    assert not started(fresh, 1)["standby"]
    assert "a new process: recover.standby_worker is false" in started(fresh, 1)["message"]
    assert not (fresh.logs / "standby-0.log").exists()  # switched off, no spare was ever started
    assert status(spare)["worker_start"] == restarted["how"]

    # The spare imported and waited on the CPU alone, then wrote the attempt's output to its log.
    assert "CUDA initialized: False" in (spare.logs / "standby-0.log").read_text()
    assert "standby: orders taken" in (spare.logs / "worker-1.log").read_text()

    ra, rb = [r for r in steps(spare) if r.attempt == 1], [r for r in steps(fresh) if r.attempt == 1]
    assert [r.step for r in ra] == [r.step for r in rb] == list(range(21, 31))
    assert [(r.loss, r.grad_norm, r.lr) for r in ra] == [(r.loss, r.grad_norm, r.lr) for r in rb]
    assert [r.batch.indices for r in ra if r.batch] == [r.batch.indices for r in rb if r.batch]
    wa = load_file(str(spare.root / "final" / "model.safetensors"))
    wb = load_file(str(fresh.root / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # The spare started behind the restarted attempt was stopped with the run.
    assert (spare.logs / "standby-1.log").exists() and not spares(spare)


def test_a_killed_supervisor_takes_its_spare_worker_with_it(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 30, "save_steps": 10})
    proc = start_run(cfg, "orphan", faults=FAULTS)
    run = run_dir(cfg, "orphan")
    worker: psutil.Process | None = None
    try:
        wait_for(lambda: running(proc) and standby_ready(run), timeout=240, what="the spare worker ready")
        (spare,) = spares(run)
        assert status(run)["standby_pid"] == spare.pid
        worker = psutil.Process(status(run)["worker_pid"])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        _, alive = psutil.wait_procs([spare], timeout=60)
        assert not alive, f"the spare worker {spare.pid} outlived its supervisor"
    finally:
        if proc.poll() is None:
            proc.kill()
        if worker is not None and worker.is_running():
            worker.kill()  # the attempt itself is not the spare's business: it is held for two minutes
        for p in spares(run):
            p.kill()
        proc.communicate(timeout=30)


def test_a_spare_exits_quietly_when_its_supervisor_closes_the_pipe(tmp_path: Path) -> None:
    """End of file before any orders: the spare ends with 0 and writes nothing of the run."""
    from steadytune.supervise.standby import Standby

    run = RunDir(tmp_path / "r").create()
    standby = Standby(run)
    standby.prepare({"PYTHONUNBUFFERED": "1"})
    assert standby.spare is not None and standby.spare.proc.stdin is not None
    standby.spare.proc.stdin.close()
    assert standby.spare.proc.wait(240) == 0
    assert not list(run.telemetry_files())
