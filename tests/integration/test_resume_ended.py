"""``steadytune resume`` of a run that was stopped: it trains on in its folder from the stop's checkpoint."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from steadytune.goodput.load import run_account
from steadytune.records import PlanRevision, from_json
from steadytune.telemetry.events import read_events

from .runs import STEADYTUNE, finish, run_dir, start_run, status, steps, wait_for, write_config

pytestmark = pytest.mark.slow


def test_a_stopped_run_resumes_from_its_checkpoint_to_the_end(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 40, "save_steps": 40})
    proc = start_run(cfg, "stopped", faults={"step_sleep_s": 0.1})
    run = run_dir(cfg, "stopped")
    wait_for(lambda: len(steps(run)) >= 5, what="step 5")
    proc.send_signal(signal.SIGTERM)
    rc, out = finish(proc)
    assert rc == 0 and status(run)["state"] == "stopped", out
    stopped_at = steps(run)[-1].step
    assert stopped_at < 40
    assert f"steadytune resume {run.root}" in out  # the summary says how to go on

    # From another folder: the run is found where it is, not under ./runs.
    resumed = subprocess.run(
        [STEADYTUNE, "resume", str(run.root)], capture_output=True, text=True, timeout=240, cwd=demo_assets
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert status(run)["state"] == "completed"
    again = [r for r in steps(run) if r.attempt == 1]
    assert again and min(r.step for r in again) == stopped_at + 1  # not step 1: it continued
    assert max(r.step for r in again) == 40
    names = [e.name for e in read_events(run.events) if e.kind == "lifecycle" and e.name.startswith("run_")]
    assert names == ["run_started", "run_stopped", "run_resumed", "run_completed"]
    plans = [from_json(line) for line in run.plan.read_text().splitlines() if line.strip()]
    last = plans[-1]
    assert isinstance(last, PlanRevision) and (last.reason, last.attempt) == ("resume", 1)
    assert Path(last.resume_checkpoint or "").name == f"checkpoint-{stopped_at}"

    # Between the stop and the resume the run did not run: neither an operator's pause nor lost.
    acct = run_account(run)
    assert acct.seconds["pause"] == 0 and acct.stopped_s > 0
    assert acct.wall_s == pytest.approx(acct.end_ts - acct.start_ts - acct.stopped_s)

    refused = subprocess.run(
        [STEADYTUNE, "resume", str(run.root)], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1 and "completed" in refused.stderr and "nothing left" in refused.stderr
