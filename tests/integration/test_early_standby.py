"""The first attempt's worker, started while the preflight runs, in real ``steadytune run`` jobs.

A NO-GO (a dataset line that is not UTF-8) must train no step and leave neither the early worker
nor the run folder it was started in. A GO run's attempt 0 must go through that worker and train
bit-identically to a run whose first attempt is a new process (``recover.standby_worker: false``).
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from steadytune.telemetry.events import read_events

from .runs import finish, run_dir, start_run, steps, wait_for, write_config

pytestmark = pytest.mark.slow


def spare_pids(run_root: Path) -> list[int]:
    """Standby workers of the run folder ``run_root`` that still run."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if "--standby" in cmd and str(run_root) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.pid)
    return out


def test_a_no_go_trains_no_step_and_leaves_no_spare_behind(tmp_path: Path, demo_assets: Path) -> None:
    data = tmp_path / "train.jsonl"
    rows = (demo_assets / "train.jsonl").read_bytes().rstrip(b"\n")
    data.write_bytes(rows + b'\n{"instruction": "Name the caf\xe9.", "input": "", "output": "Paris"}\n')
    cfg = write_config(tmp_path, demo_assets, data={"train_file": str(data), "max_seq_length": 96})
    proc = start_run(cfg, "nogo", check=True)
    run = run_dir(cfg, "nogo")
    # Seen while the check runs (it imports torch and scans the data: seconds, not a poll interval).
    seen = wait_for(lambda: spare_pids(run.root) or proc.poll() is not None, what="the early worker or exit")
    rc, out = finish(proc)
    assert rc == 1 and "the run was not started" in out, out[-3000:]
    assert isinstance(seen, list) and seen, "no worker was started during the preflight"
    assert not spare_pids(run.root) and not any(psutil.pid_exists(pid) for pid in seen)
    assert not run.root.exists(), sorted(str(p) for p in run.root.rglob("*"))


def started_first(tmp: Path, assets: Path, name: str, **recover: bool) -> tuple[dict, list]:
    base = tmp / name
    base.mkdir()
    cfg = write_config(base, assets, train={"max_steps": 6, "save_steps": 3}, recover=recover)
    rc, out = finish(start_run(cfg, name, check=True))
    assert rc == 0, out[-3000:]
    run = run_dir(cfg, name)
    (event,) = [e for e in read_events(run.events) if e.name == "worker_started"]
    assert not spare_pids(run.root)  # the spare started behind attempt 0 went with the run
    return {"message": event.message, **event.data}, [(r.step, r.loss, r.grad_norm, r.lr) for r in steps(run)]


def test_a_go_runs_attempt_0_in_the_early_worker_and_trains_what_a_new_process_trains(
    tmp_path: Path, demo_assets: Path
) -> None:
    early, losses = started_first(tmp_path, demo_assets, "early")
    fresh, fresh_losses = started_first(tmp_path, demo_assets, "fresh", standby_worker=False)

    assert early["standby"] and "--standby" in early["cmd"]
    assert "; the standby worker, started during the preflight, " in early["message"]
    assert not fresh["standby"] and "a new process: the run's first attempt" in fresh["message"]
    assert [s for s, *_ in losses] == list(range(1, 7))
    assert losses == fresh_losses  # bit-identical floats: the same training, however the process began
