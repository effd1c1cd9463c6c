"""`steadytune supervise` brings a plain HF Trainer script through a SIGKILL and a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.checkpoint.external import check_external_checkpoint
from steadytune.records import run_end
from steadytune.supervise.logparse import parse_log_line
from steadytune.telemetry.events import read_events

from .hfjob import hf_job, supervise_cmd, supervise_hf
from .runs import STEADYTUNE, assert_hung_stacks, wait_for

pytestmark = pytest.mark.slow


def test_parse_hf_log_lines() -> None:
    assert parse_log_line(
        "{'loss': '4.561', 'grad_norm': '1.814', 'learning_rate': '0.002139', 'epoch': '0.06'}"
    ) == {"loss": 4.561, "grad_norm": 1.814, "learning_rate": 0.002139, "epoch": 0.06}
    assert parse_log_line("{'loss': 2.5, 'epoch': 1.0}\n") == {"loss": 2.5, "epoch": 1.0}
    assert parse_log_line("Saving model checkpoint to out/checkpoint-10") is None
    assert parse_log_line("{'train_runtime': '1.0', 'train_loss': '4.8'}") == {
        "train_runtime": 1.0,
        "train_loss": 4.8,
    }


def test_external_checkpoint_checks(tmp_path: Path) -> None:
    ck = tmp_path / "checkpoint-10"
    ck.mkdir()
    assert "trainer_state.json" in check_external_checkpoint(ck)[1]
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    assert "no model" in check_external_checkpoint(ck)[1]
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (ck / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0")
    assert check_external_checkpoint(ck) == (True, "")
    (ck / "model.safetensors").write_bytes(b"\x10\x00")  # a save killed midway
    assert not check_external_checkpoint(ck)[0]


def test_supervise_survives_sigkill_and_hang(tmp_path: Path, demo_assets: Path) -> None:
    out = tmp_path / "out"
    cmd = supervise_hf(
        tmp_path,
        demo_assets,
        50,
        0.05,
        "--resume-arg",
        "--resume_from_checkpoint {checkpoint}",
        "--hang-floor",
        "8",
    )
    # We kill the first attempt; the second one hangs at step 35; the third completes.
    env = {**os.environ, "HANG_AT_STEP": "35", "HANG_ON_ATTEMPT": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    run = tmp_path / "runs" / "ext"
    wait_for(
        lambda: (out / "checkpoint-20" / "trainer_state.json").exists(), timeout=180, what="checkpoint-20"
    )
    status = json.loads((run / "status.json").read_text())
    os.killpg(status["worker_pid"], signal.SIGKILL)
    stdout, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, stdout
    events = read_events(run / "events.jsonl")
    restarts = [e for e in events if e.name == "restart" and "classification" in e.data]
    assert [e.data["classification"] for e in restarts] == ["killed", "stall"]
    assert any(e.name == "stall" for e in events)
    assert all("resuming from checkpoint-" in e.message for e in restarts)
    # A command is started anew at every attempt: no standby worker, and the event says so.
    started = [e for e in events if e.name == "worker_started"]
    assert len(started) == 3 and not any(e.data["standby"] for e in started)
    assert all("a new process: the supervised command is run again as given" in e.message for e in started)
    assert not (run / "logs" / "standby-0.log").exists()
    assert run_end(events).name == "run_completed"
    state = json.loads((out / "checkpoint-50" / "trainer_state.json").read_text())
    assert state["global_step"] == 50


LAUNCHER = """
import subprocess, sys, time
# Like `trl sft` or `accelerate launch`: the trainer is a child process; the launcher waits on it.
child = subprocess.Popen(sys.argv[1:])
with open(sys.argv[sys.argv.index("--output_dir") + 1] + ".children", "a") as f:
    f.write(f"{child.pid}\\n")
sys.exit(child.wait())
"""


def test_a_killed_launcher_never_leaves_a_second_trainer(tmp_path: Path, demo_assets: Path) -> None:
    import psutil

    out = tmp_path / "out"
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    job = [sys.executable, str(launcher), *hf_job(demo_assets, out, 40, 0.05)]
    cmd = supervise_cmd(
        job, out, tmp_path / "runs", "ext", "--resume-arg", "--resume_from_checkpoint {checkpoint}"
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = tmp_path / "runs" / "ext"
    children = Path(str(out) + ".children")
    wait_for(
        lambda: (out / "checkpoint-10" / "trainer_state.json").exists(), timeout=180, what="checkpoint-10"
    )
    first_trainer = int(children.read_text().split()[0])
    os.kill(json.loads((run / "status.json").read_text())["worker_pid"], signal.SIGKILL)  # the launcher only
    stdout, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, stdout
    events = read_events(run / "events.jsonl")
    names = [e.name for e in events]
    killed = next(e for e in events if e.name == "tree_killed")
    assert first_trainer in killed.data["pids"]
    # The orphaned trainer went before the next attempt started, and is gone for good.
    assert names.index("tree_killed") < names.index("restart") < len(names) - 1
    assert not psutil.pid_exists(first_trainer)
    assert len(children.read_text().split()) == 2
    assert json.loads((out / "checkpoint-40" / "trainer_state.json").read_text())["global_step"] == 40


def test_sigterm_to_the_supervisor_stops_the_job_and_says_so(tmp_path: Path, demo_assets: Path) -> None:
    import psutil

    out = tmp_path / "out"
    cmd = supervise_hf(tmp_path, demo_assets, 400, 0.05, "--stop-grace", "20")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = tmp_path / "runs" / "ext"
    wait_for(lambda: (out / "checkpoint-10").exists(), timeout=180, what="checkpoint-10")
    worker = json.loads((run / "status.json").read_text())["worker_pid"]
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stdout
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and status["worker_pid"] is None
    events = read_events(run / "events.jsonl")
    stopped = run_end(events)
    assert stopped.name == "run_stopped" and stopped.data["signal"] == "SIGTERM"
    assert events[events.index(stopped) - 1].name == "stop_requested"
    assert not psutil.pid_exists(worker)


def test_lr_far_too_high_is_rolled_back_with_a_lower_lr_and_alerted(
    tmp_path: Path, demo_assets: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    from tests.servers import Hook

    hook = Hook()
    try:
        cfg = tmp_path / "supervise.yaml"
        cfg.write_text(
            "policy:\n  rollback_lr_scale: 0.001\n"
            "alerts:\n  sinks:\n    - type: webhook\n      format: generic\n      url_env: TEST_HOOK_URL\n"
        )
        out = tmp_path / "out"
        job = hf_job(demo_assets, out, 40, 0.0, "--learning_rate", "3.0")
        cmd = supervise_cmd(
            job, out, tmp_path / "runs", "ext", "--config", str(cfg), "--preset", "hf", "--base-lr", "3.0"
        )
        env = {**os.environ, "TEST_HOOK_URL": hook.url}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        run = tmp_path / "runs" / "ext"
        events = read_events(run / "events.jsonl")
        names = [e.name for e in events]
        first_bad = next(
            e for e in events if e.kind == "anomaly" and e.name in ("loss_spike", "divergence", "nan_loss")
        )
        rollback = next(e for e in events if e.name == "rollback")
        assert names.index(first_bad.name) < names.index("rollback")
        restart = next(e for e in events if e.name == "restart" and e.seq > rollback.seq)
        assert restart.data["lr_scale"] == pytest.approx(0.001)
        restarted = [e for e in events if e.name == "worker_started"][-1]
        assert restarted.data["cmd"][-2:] == ["--learning_rate", "0.003"]
        assert run_end(events).name == "run_completed"
        # The alert reached the local webhook while the run went on.
        wait_for(
            lambda: any(first_bad.name in json.dumps(b) for b in hook.bodies),
            timeout=30,
            what="webhook alert",
        )
        final = load_file(str(out / "checkpoint-40" / "model.safetensors"))
        assert all(torch.isfinite(t).all() for t in final.values())
        assert json.loads((run / "status.json").read_text())["state"] == "completed"
    finally:
        hook.close()


def test_a_stopped_trainer_is_a_hang_its_stacks_are_dumped_and_it_restarts(
    tmp_path: Path, demo_assets: Path
) -> None:
    out = tmp_path / "out"
    cmd = supervise_hf(tmp_path, demo_assets, 60, 0.05, "--preset", "hf", "--hang-floor", "6")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = tmp_path / "runs" / "ext"
    wait_for(
        lambda: (out / "checkpoint-20" / "trainer_state.json").exists(), timeout=180, what="checkpoint-20"
    )
    os.kill(json.loads((run / "status.json").read_text())["worker_pid"], signal.SIGSTOP)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    events = read_events(run / "events.jsonl")
    names = [e.name for e in events]
    restarted = next(i for i, e in enumerate(events) if e.name == "restart" and "classification" in e.data)
    assert names.index("stall") < names.index("stacks_dumped") < restarted
    dump = Path(next(e for e in events if e.name == "stacks_dumped").data["file"])
    text = dump.read_text()
    assert_hung_stacks(text)
    restart = next(e for e in events if e.name == "restart" and "classification" in e.data)
    assert restart.data["classification"] == "stall"
    assert run_end(events).name == "run_completed"


def test_operator_controls_reach_a_job_that_takes_no_requests(tmp_path: Path, demo_assets: Path) -> None:
    """pause stops the job from outside and resume restarts it from its newest checkpoint; checkpoint
    is not available without the guard inside, and says so; the run completes."""
    out = tmp_path / "out"
    cmd = supervise_hf(tmp_path, demo_assets, 60, 0.05, "--preset", "hf")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = tmp_path / "runs" / "ext"
    wait_for(
        lambda: (out / "checkpoint-20" / "trainer_state.json").exists(), timeout=180, what="checkpoint-20"
    )
    control = [STEADYTUNE, "checkpoint", str(run), "--no-wait"]
    assert subprocess.run(control, capture_output=True, text=True, timeout=60).returncode == 0
    paused = subprocess.run(
        [STEADYTUNE, "pause", str(run), "--no-wait"], capture_output=True, text=True, timeout=60
    )
    assert paused.returncode == 0, paused.stdout + paused.stderr
    wait_for(
        lambda: json.loads((run / "status.json").read_text())["state"] == "paused", timeout=60, what="paused"
    )
    first = json.loads((run / "status.json").read_text())
    assert first["worker_pid"] is None
    resumed = subprocess.run(
        [STEADYTUNE, "resume", str(run), "--no-wait"], capture_output=True, text=True, timeout=60
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    events = read_events(run / "events.jsonl")
    names = [e.name for e in events]
    assert names.index("run_paused") < names.index("run_resumed") < len(names) - 1
    unable = [e for e in events if e.name == "alert_only" and "checkpoint requested" in e.message]
    assert unable and "--inject" in unable[0].message
    started = [e for e in events if e.name == "worker_started"]
    assert len(started) == 2 and "--resume_from_checkpoint" in started[1].data["cmd"]
    assert run_end(events).name == "run_completed"
    assert json.loads((out / "checkpoint-60" / "trainer_state.json").read_text())["global_step"] == 60
