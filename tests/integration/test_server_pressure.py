"""Memory pressure for real: a server on a fake GPU snapshot file runs two tiny real fine-tunes; the
higher-priority one's memory rises, the lower-priority one is checkpointed and paused through its
control channel, and it resumes when room returns, its steps continuous."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from steadytune.cli.demo import demo_config
from steadytune.records import Event, StepRecord, run_end
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import iter_records

from .test_server_daemon import GIB, REPO, cli, queue, run_status, start_server, wait_for

pytestmark = pytest.mark.slow
MAX_STEPS = 40


def write_gpus(path: Path, used: int, procs: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "index": 0,
                        "name": "fake",
                        "total_bytes": 8 * GIB,
                        "used_bytes": used,
                        "processes": procs,
                    }
                ]
            }
        )
    )
    os.replace(tmp, path)  # the server never reads a half-written file


def test_the_lower_priority_job_is_paused_under_pressure_and_resumes_when_room_returns(
    tmp_path: Path, demo_assets: Path
) -> None:
    cfg = demo_config(demo_assets, str(tmp_path / "elsewhere"), MAX_STEPS, "full")
    cfg["train"].update(logging_steps=1, save_steps=MAX_STEPS, eval_steps=MAX_STEPS)
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(cfg))
    gpus = tmp_path / "gpus.json"
    write_gpus(gpus, GIB // 2, [])
    env = {
        **os.environ,
        "STEADYTUNE_SERVER_DIR": str(tmp_path / "srv"),
        "PYTHONPATH": f"{REPO / 'src'}:{REPO}",
        "STEADYTUNE_FAULTS": json.dumps(
            {"step_sleep_s": 0.2, "fault_attempts": 99}
        ),  # slow enough to act mid-run
    }
    server = start_server(env, tmp_path, "server.log")
    try:
        wait_for(lambda: queue(env)["ok"], 60, "the server's socket")
        cli(env, "submit", str(tmp_path / "demo.yaml"), "--skip-check", "--priority", "5")
        cli(env, "submit", str(tmp_path / "demo.yaml"), "train.seed=7", "--skip-check")
        wait_for(lambda: all(run_status(tmp_path, j).get("step", 0) >= 3 for j in queue(env)["jobs"]), 240,
                 "both jobs to train")  # fmt: skip
        hi, lo = queue(env)["jobs"]
        # The high-priority job's memory rises until the GPU has 0.3 GiB free (< the 1 GiB headroom).
        write_gpus(gpus, 8 * GIB - int(0.3 * GIB), [{"pid": hi["pid"], "used_bytes": 7 * GIB}])
        wait_for(lambda: run_status(tmp_path, lo).get("state") == "paused", 120, "the low job paused")
        snap = queue(env)
        assert [j["state"] for j in snap["jobs"]] == ["running", "running"]
        assert snap["jobs"][1]["paused"].startswith("GPU 0 has 0.3 GiB free < 1.0 GiB")
        assert snap["jobs"][0]["paused"] is None and run_status(tmp_path, hi)["state"] == "running"
        paused_at = run_status(tmp_path, lo)["step"]
        assert paused_at < MAX_STEPS

        write_gpus(gpus, 2 * GIB, [{"pid": hi["pid"], "used_bytes": int(1.5 * GIB)}])  # room again
        wait_for(lambda: [j["state"] for j in queue(env)["jobs"]] == ["done", "done"], 300, "both jobs done")
        lo_job = queue(env)["jobs"][1]
        assert [h["kind"] for h in lo_job["history"]] == ["pause", "resume"] and lo_job["paused"] is None
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()

    run = RunDir(tmp_path / "runs" / f"{lo['id']}-demo")
    evs = [e for e in iter_records(run.events) if isinstance(e, Event)]
    asked = [e for e in evs if e.kind == "control" and e.name in ("pause", "resume")]
    assert [(e.name, e.data["issuer"]) for e in asked] == [
        ("pause", "steadytune server (memory pressure)"),
        ("resume", "steadytune server (memory pressure)"),
    ]
    assert any(e.name == "run_paused" for e in evs) and run_end(evs).name == "run_completed"
    # It went on from its checkpoint: every step once, in order, over two attempts.
    rank0 = [
        r for r in iter_records(run.telemetry(0)) if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]
    assert [r.step for r in rank0] == list(range(1, MAX_STEPS + 1))
    assert {r.attempt for r in rank0} == {0, 1}
    assert max(r.step for r in rank0 if r.attempt == 0) >= paused_at
