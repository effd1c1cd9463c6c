"""`steadytune supervise` brings a plain HF Trainer script through a SIGKILL and a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.supervise.external import check_external_checkpoint, parse_log_line
from steadytune.telemetry.events import read_events

from .runs import STEADYTUNE, wait_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_parse_hf_log_lines() -> None:
    assert parse_log_line("{'loss': '4.561', 'grad_norm': '1.814', 'learning_rate': '0.002139', 'epoch': '0.06'}") == {
        "loss": 4.561, "grad_norm": 1.814, "learning_rate": 0.002139, "epoch": 0.06}
    assert parse_log_line("{'loss': 2.5, 'epoch': 1.0}\n") == {"loss": 2.5, "epoch": 1.0}
    assert parse_log_line("Saving model checkpoint to out/checkpoint-10") is None
    assert parse_log_line("{'train_runtime': '1.0', 'train_loss': '4.8'}") == {"train_runtime": 1.0, "train_loss": 4.8}


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
    cmd = [STEADYTUNE, "supervise", "--output-dir", str(out), "--resume-arg", "--resume_from_checkpoint {checkpoint}",
           "--hang-floor", "8", "--runs-dir", str(tmp_path / "runs"), "--run-id", "ext", "--",
           sys.executable, str(REPO / "examples" / "hf_trainer_script.py"), "--output_dir", str(out),
           "--model", str(demo_assets / "model"), "--data", str(demo_assets / "train.jsonl"),
           "--max_steps", "50", "--save_steps", "10", "--step_sleep", "0.05"]
    # We kill the first attempt; the second one hangs at step 35; the third completes.
    env = {**os.environ, "HANG_AT_STEP": "35", "HANG_ON_ATTEMPT": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    run = tmp_path / "runs" / "ext"
    wait_for(lambda: (out / "checkpoint-20" / "trainer_state.json").exists(), timeout=180, what="checkpoint-20")
    status = json.loads((run / "status.json").read_text())
    os.killpg(status["worker_pid"], signal.SIGKILL)
    stdout, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, stdout
    events = read_events(run / "events.jsonl")
    restarts = [e for e in events if e.name == "restart"]
    assert [e.data["classification"] for e in restarts] == ["killed", "hang"]
    assert any(e.name == "stall" for e in events)
    assert all("resuming from checkpoint-" in e.message for e in restarts)
    assert events[-1].name == "run_completed"
    state = json.loads((out / "checkpoint-50" / "trainer_state.json").read_text())
    assert state["global_step"] == 50
