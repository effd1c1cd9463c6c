"""`steadytune supervise --inject`: a plain HF Trainer script gets the guard in-process, through the one
supervisor.

What the log adapter cannot give, asserted on a real supervised process tree: the NaN
update skipped before it reaches the weights (no rollback needed), records with the
pre-clip grad norm and batch hashes, and a SIGTERM to the supervisor that makes the
trainer checkpoint where it stands before it stops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from steadytune.records import StepRecord, run_end
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

from .hfjob import supervise_hf
from .runs import wait_for

pytestmark = pytest.mark.slow


def _supervise(tmp_path: Path, demo_assets: Path, steps: int, sleep: float, *extra: str) -> list[str]:
    return supervise_hf(
        tmp_path, demo_assets, steps, sleep, "--inject", "--preset", "hf", *extra, run_id="inj"
    )


def test_an_injected_guard_skips_the_nan_update_and_writes_full_records(
    tmp_path: Path, demo_assets: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    env = {**os.environ, "STEADYTUNE_FAULTS": json.dumps({"nan_at_step": 7})}
    done = subprocess.run(
        _supervise(tmp_path, demo_assets, 20, 0.0), capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "runs" / "inj"
    events = read_events(run / "events.jsonl")
    names = [e.name for e in events]
    assert "guard_injected" in names and run_end(events).name == "run_completed"
    (skip,) = [e for e in events if e.name == "skip_step"]
    assert skip.step == 7
    # The guard kept the NaN from the weights: nothing to roll back, nothing restarted.
    assert not any(e.kind == "action" and e.name in {"rollback", "restart"} for e in events)
    steps = [r for r in iter_records(run / "telemetry" / "rank-0.jsonl") if isinstance(r, StepRecord)]
    assert [r.step for r in steps] == list(range(1, 21))
    assert all(r.batch is not None and r.batch.hashes for r in steps)
    assert all(r.grad_norm is not None and r.grad_norm > 0 for r in steps if r.step != 7)
    weights = load_file(str(tmp_path / "out" / "checkpoint-20" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert json.loads((run / "status.json").read_text())["source"] == "job"
    # The supervisor read the command's torch from its files; the injected rank 0 added torch's own.
    recorded = json.loads((run / "env.json").read_text())["command"]["torch"]
    assert recorded["read_from"] == "files" and recorded["read_by"] == "worker"
    assert recorded["torch"] == torch.__version__ and "cudnn" in recorded


def test_sigterm_to_the_supervisor_makes_the_injected_trainer_checkpoint_where_it_stands(
    tmp_path: Path, demo_assets: Path
) -> None:
    import psutil

    proc = subprocess.Popen(
        _supervise(tmp_path, demo_assets, 400, 0.05, "--stop-grace", "60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = tmp_path / "runs" / "inj"
    wait_for(lambda: _step(run) >= 13, timeout=240, what="step 13")
    worker = json.loads((run / "status.json").read_text())["worker_pid"]
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stdout
    events = read_events(run / "events.jsonl")
    stopped = run_end(events)
    assert stopped.name == "run_stopped" and stopped.data["signal"] == "SIGTERM"
    assert any(e.name == "ack_stop" for e in events)
    saved = [e for e in events if e.name == "checkpoint_saved"]
    assert saved and saved[-1].step == stopped.step  # saved where it stood, on request
    state = json.loads((Path(saved[-1].data["path"]) / "trainer_state.json").read_text())
    assert state["global_step"] == stopped.step
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and status["worker_pid"] is None
    assert not psutil.pid_exists(worker)


def _step(run: Path) -> int:
    try:
        return int(json.loads((run / "status.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0
