"""The GPU server for real: a daemon process on a fake GPU snapshot file admits two tiny real
fine-tunes, is killed with SIGKILL while both run, comes back, adopts both, and both complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from steadytune.cli.demo import demo_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "steadytune.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert out.returncode == 0, out.stderr + out.stdout
    return out


def start_server(env: dict[str, str], tmp_path: Path, log: str) -> subprocess.Popen:
    args = ["server", "--runs-dir", str(tmp_path / "runs"), "--snapshot-file", str(tmp_path / "gpus.json")]
    return subprocess.Popen(
        [sys.executable, "-m", "steadytune.cli.main", *args, "--interval", "0.3"],
        env=env, stdout=open(tmp_path / log, "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def queue(env: dict[str, str]) -> dict:
    return json.loads(cli(env, "queue", "--json").stdout)


def wait_for(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except (AssertionError, ValueError, OSError, KeyError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def run_status(tmp_path: Path, job: dict) -> dict:
    return json.loads((tmp_path / "runs" / f"{job['id']}-demo" / "status.json").read_text())


def test_daemon_killed_while_two_jobs_run_adopts_both_and_they_complete(tmp_path: Path, demo_assets: Path):
    cfg = demo_config(demo_assets, str(tmp_path / "elsewhere"), 80, "full")
    cfg["train"].update(logging_steps=1, save_steps=20, eval_steps=40)
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(cfg))
    # One 8 GiB GPU that someone else's process already uses 0.5 GiB of.
    snapshot = {"gpus": [{"index": 0, "name": "fake", "total_bytes": 8 * GIB, "used_bytes": GIB // 2,
                          "processes": [{"pid": 1, "used_bytes": GIB // 2}]}]}  # fmt: skip
    (tmp_path / "gpus.json").write_text(json.dumps(snapshot))
    env = {
        **os.environ,
        "STEADYTUNE_SERVER_DIR": str(tmp_path / "srv"),
        "PYTHONPATH": f"{REPO / 'src'}:{REPO}",
    }

    server = start_server(env, tmp_path, "server1.log")
    try:
        wait_for(lambda: queue(env)["ok"], 60, "the server's socket")
        first = cli(env, "submit", str(tmp_path / "demo.yaml"), "--skip-check").stdout
        cli(env, "submit", str(tmp_path / "demo.yaml"), "train.seed=7", "--skip-check", "--priority", "1")
        big = cli(env, "submit", "--need-gib", "6", "--", sys.executable, "-c", "print('ran')").stdout
        assert first.startswith("j1 queued") and "estimated peak" in first and big.startswith("j3 queued")

        wait_for(
            lambda: all(run_status(tmp_path, j).get("step", 0) >= 3 for j in queue(env)["jobs"][:2]),
            240,
            "both jobs to train",
        )
        before = queue(env)
        j1, j2, j3 = before["jobs"]
        assert (j1["state"], j2["state"], j3["state"]) == ("running", "running", "queued")
        assert j1["gpus"] == [0] and j2["gpus"] == [0]  # two jobs share the one GPU
        assert "waits for room" in j3["reason"]  # 8 − 0.5 used − 2 × 0.55 reserved − 1 headroom < 6
        assert before["gpus"][0]["reserved_bytes"] == j1["need_bytes"] + j2["need_bytes"]
        assert [p["pid"] for p in before["gpus"][0]["foreign"]] == [1]

        server.send_signal(signal.SIGKILL)
        server.wait(10)
        assert all(psutil.pid_exists(j["pid"]) for j in (j1, j2)), "the jobs died with the server"
        steps_at_kill = [run_status(tmp_path, j)["step"] for j in (j1, j2)]
    finally:
        if server.poll() is None:
            server.kill()

    server = start_server(env, tmp_path, "server2.log")
    try:
        wait_for(lambda: queue(env)["ok"], 60, "the restarted server")
        after = queue(env)
        assert [(j["id"], j["state"], j["pid"], j["gpus"]) for j in after["jobs"][:2]] == [
            (j["id"], "running", j["pid"], [0]) for j in (j1, j2)
        ]
        assert all(j["reason"] == "adopted after a server restart" for j in after["jobs"][:2])
        assert after["jobs"][2]["state"] == "queued" and after["jobs"][2]["need_bytes"] == 6 * GIB

        wait_for(
            lambda: [j["state"] for j in queue(env)["jobs"][:2]] == ["done", "done"], 300, "both jobs done"
        )
        for j, at_kill in zip((j1, j2), steps_at_kill, strict=True):
            status = run_status(tmp_path, j)
            assert status["state"] == "completed" and status["step"] == 80 and status["step"] > at_kill
            assert status["restarts"] == 0  # the server's death never touched the run
        # With both done, their reservations are returned and the big job fits: it starts and ends.
        wait_for(lambda: queue(env)["jobs"][2]["state"] == "done", 120, "the third job")
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()
