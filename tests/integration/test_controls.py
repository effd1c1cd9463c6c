"""Operator controls, --policy observe and --safe-mode, on real supervised runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from steadytune.checkpoint.manifest import verify
from steadytune.protocol import operator_issuer, send_control
from steadytune.records import Heartbeat
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

from .runs import STEADYTUNE, finish, run_dir, start_run, status, steps, wait_for, write_config

pytestmark = pytest.mark.slow


def ctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([STEADYTUNE, *args], capture_output=True, text=True, timeout=180)


def paused_beats(run) -> list[Heartbeat]:
    return [r for r in iter_records(run.telemetry(0)) if isinstance(r, Heartbeat) and r.phase == "paused"]


def test_checkpoint_pause_resume_stop(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 400, "save_steps": 200})
    proc = start_run(cfg, "ops", faults={"step_sleep_s": 0.1})
    run = run_dir(cfg, "ops")
    wait_for(lambda: len(steps(run)) >= 5, what="step 5")

    out = ctl("checkpoint", str(run.root))
    assert out.returncode == 0, out.stderr
    wait_for(lambda: any(verify(p).ok for p in run.checkpoints.glob("checkpoint-*")), what="a checkpoint")

    snap = ctl("memory-snapshot", str(run.root))
    assert (
        snap.returncode == 0 and "acknowledged" in snap.stdout
    )  # on CPU the worker says there is nothing to dump

    assert ctl("pause", str(run.root), "--hold").returncode == 0
    beats = wait_for(lambda: paused_beats(run), what="the worker holding in memory")
    held = steps(run)[-1].step
    assert beats[0].step == held
    # The next periodic heartbeat (every 5 s) comes from the same, still-holding worker: alive, no step since.
    wait_for(lambda: len(paused_beats(run)) >= 2, timeout=60, what="a second heartbeat while held")
    assert steps(run)[-1].step == held  # the worker is holding at a step boundary
    assert ctl("resume", str(run.root)).returncode == 0
    wait_for(lambda: steps(run)[-1].step > held, what="progress after resume")

    assert ctl("pause", str(run.root)).returncode == 0  # --release: checkpoint and exit the worker
    wait_for(lambda: status(run).get("state") == "paused", what="paused state")
    paused_at = status(run)["step"]
    assert status(run)["worker_pid"] is None
    assert verify(run.checkpoints / f"checkpoint-{paused_at}").ok
    assert ctl("resume", str(run.root)).returncode == 0
    wait_for(lambda: any(r.attempt == 1 for r in steps(run)), what="the resumed worker's first step")
    assert min(r.step for r in steps(run) if r.attempt == 1) == paused_at + 1

    assert ctl("stop", str(run.root)).returncode == 0
    rc, out = finish(proc)
    assert rc == 0, out
    assert status(run)["state"] == "stopped"
    controls = [e for e in read_events(run.events) if e.kind == "control" and not e.name.startswith("ack_")]
    assert [e.name for e in controls] == [
        "checkpoint",
        "memory_snapshot",
        "pause",
        "resume",
        "pause",
        "resume",
        "stop",
    ]
    assert all("(cli)" in e.data["issuer"] for e in controls)


def acks(run, ids: list[str]) -> list:
    return [
        e for e in read_events(run.events) if e.name.startswith("ack_") and e.data.get("request_id") in ids
    ]


def test_back_to_back_requests_are_all_honoured_in_order(tmp_path: Path, demo_assets: Path) -> None:
    """Two dashboard clicks within a millisecond, then a checkpoint asked for while the worker is held:
    none overwrites another, and each is carried out once, in the order sent."""
    cfg = write_config(tmp_path, demo_assets, train={"max_steps": 400, "save_steps": 200})
    proc = start_run(cfg, "burst", faults={"step_sleep_s": 0.1})
    run = run_dir(cfg, "burst")
    wait_for(lambda: len(steps(run)) >= 3, what="step 3")
    issuer = operator_issuer("alice", "dashboard, 127.0.0.1")
    burst = [send_control(run, "checkpoint", issuer)["id"] for _ in range(2)]
    wait_for(lambda: len(acks(run, burst)) == 2, what="both checkpoints acknowledged")

    hold = send_control(run, "pause", issuer, args={"mode": "hold"})["id"]
    wait_for(lambda: paused_beats(run), what="the worker holding in memory")
    held = [send_control(run, c, issuer)["id"] for c in ("checkpoint", "resume", "stop")]
    rc, out = finish(proc)
    assert rc == 0, out
    assert status(run)["state"] == "stopped"

    sent = [*burst, hold, *held]
    events = read_events(run.events)
    filed = [e.data["request_id"] for e in events if e.kind == "control" and not e.name.startswith("ack_")]
    assert filed == sent  # the supervisor filed each request once, in the order sent
    got = [(e.name, e.data["request_id"], e.step) for e in acks(run, sent)]
    first, at = got[0][2], got[2][2]
    assert got == [
        ("ack_checkpoint", burst[0], first),
        ("ack_checkpoint", burst[1], first + 1),  # one request per step boundary
        ("ack_pause", hold, at),
        ("ack_resume", held[1], at),
        ("ack_checkpoint", held[0], at + 1),  # asked for while held: taken once resumed
        ("ack_stop", held[2], at + 2),
    ]
    saved = [e.step for e in events if e.name == "checkpoint_saved"]
    assert saved == [first, first + 1, at + 1, at + 2]
    assert all(verify(run.checkpoints / f"checkpoint-{n}").ok for n in saved)


def test_policy_observe_alerts_but_does_not_act(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(
        tmp_path,
        demo_assets,
        train={"max_steps": 40, "save_steps": 10, "max_grad_norm": 0.0},
        policy={"spike_confirm_points": 1},
    )
    rc, out = finish(
        start_run(
            cfg,
            "observe",
            faults={"lr_burst_at_step": 25, "lr_burst_factor": 1000.0},
            extra_args=["--policy", "observe"],
        )
    )
    assert rc == 0, out
    events = read_events(run_dir(cfg, "observe").events)
    assert any(e.kind == "anomaly" and e.severity in {"warning", "critical"} for e in events)
    assert any(e.name == "alert_only" and "observe mode" in e.message for e in events)
    assert not any(e.name in {"rollback", "restart"} for e in events)


def test_safe_mode_refuses_a_far_too_high_lr(tmp_path: Path, demo_assets: Path) -> None:
    cfg = write_config(tmp_path, demo_assets, method="lora", train={"learning_rate": 0.1})
    proc = subprocess.run(
        [STEADYTUNE, "run", str(cfg), "--safe-mode", "--skip-check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "train.learning_rate" in proc.stderr and "policy.max_lr=0.005" in proc.stderr
    assert not (tmp_path / "runs").exists()
