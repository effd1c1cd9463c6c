"""The server's part in a resize, for real: a config job with ``scale:`` asks the server for a second
GPU before it grows (refused while that GPU is full, with the reason; granted once it has room), runs
on both under torchrun with gloo, and, when someone else's process squeezes that GPU, is asked by the
server to shrink off it and gives it back. The GPU memory the server sees and the utilisation the
rules see are fake files; the rest is real."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from steadytune.records import Event, PlanRevision, StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import iter_records

from .runs import write_config
from .test_scale import write_snapshot
from .test_server_daemon import GIB, REPO, cli, queue, start_server, wait_for

pytestmark = pytest.mark.slow
MAX_STEPS = 40


def write_gpus(path: Path, gpu1_used: int) -> None:
    gpus = [{"index": 0, "name": "fake", "total_bytes": 8 * GIB, "used_bytes": 0},
            {"index": 1, "name": "fake", "total_bytes": 8 * GIB, "used_bytes": gpu1_used,
             "processes": [{"pid": 1, "used_bytes": gpu1_used}] if gpu1_used else []}]  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpus": gpus}))
    os.replace(tmp, path)


def events(run: RunDir) -> list[Event]:
    return [e for e in iter_records(run.events) if isinstance(e, Event)]


def test_a_grow_is_reserved_by_the_server_or_refused_and_a_shrink_gives_the_gpu_back(
    tmp_path: Path, demo_assets: Path
) -> None:
    util = tmp_path / "util.json"
    write_snapshot(util, 0.95)  # busy: the grow rule holds
    gpus = tmp_path / "gpus.json"
    write_gpus(gpus, int(7.5 * GIB))  # GPU 1 is taken by someone else: no room to grow onto
    cfg = write_config(
        tmp_path,
        demo_assets,
        train={"max_steps": MAX_STEPS, "save_steps": MAX_STEPS, "per_device_train_batch_size": 2,
               "gradient_accumulation_steps": 2, "logging_steps": 1},
        run={"sample_interval_s": 0.3},
        scale={"min_gpus": 1, "max_gpus": 2, "grow": {"gpu_util_above": 85, "for_s": 1.5},
               "shrink": {"gpu_util_below": 30, "for_s": 1.5}, "cooldown_s": 2, "undo_if_slower": False,
               "compare_steps": 2},
    )  # fmt: skip
    env = {
        **os.environ,
        "STEADYTUNE_SERVER_DIR": str(tmp_path / "srv"),
        "PYTHONPATH": f"{REPO / 'src'}:{REPO}",
        "STEADYTUNE_SYSTEM_SNAPSHOT": str(util),
        "STEADYTUNE_FAULTS": json.dumps({"step_sleep_s": 0.25, "fault_attempts": 0}),
    }
    server = start_server(env, tmp_path, "server.log")
    try:
        wait_for(lambda: queue(env)["ok"], 60, "the server's socket")
        cli(env, "submit", str(cfg), "--skip-check")
        job = lambda: queue(env)["jobs"][0]  # noqa: E731
        wait_for(lambda: any(h["kind"] == "grow_refused" for h in job()["history"]), 200, "a refused grow")
        assert job()["gpus"] == [0]
        write_gpus(gpus, 0)  # GPU 1 is free again
        wait_for(lambda: job()["gpus"] == [0, 1], 120, "the grow onto GPU 1")
        run = RunDir(Path(job()["run_dir"]))
        wait_for(
            lambda: any(e.name == "resized" and e.data["world"] == 2 for e in events(run)), 120, "2 processes"
        )
        write_snapshot(util, 0.50)  # neither busy nor idle: from here on no rule of its own moves it
        write_gpus(gpus, int(7.6 * GIB))  # a foreign process takes GPU 1: 0.4 GiB free, under pressure
        wait_for(lambda: job()["gpus"] == [0], 120, "the shrink off GPU 1")
        wait_for(lambda: job()["state"] == "done", 300, "the job done")
        final = job()
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()

    assert final["gpus"] == [0]  # given back
    # The server's request (the GPU under pressure, the GPUs to keep), then the job's shrink onto them.
    kinds = [(h["kind"], h.get("from", h.get("gpu")), h.get("to")) for h in final["history"]
             if h["kind"] != "grow_refused"]  # fmt: skip
    assert kinds == [("grow", [0], [0, 1]), ("shrink_asked", 1, [0]), ("shrink", [0, 1], [0])]
    asked = next(h for h in final["history"] if h["kind"] == "shrink_asked")
    assert asked["reason"].startswith("GPU 1 has 0.4 GiB free < 1.0 GiB") and final["shrink_to"] is None
    evs = events(run)
    refused = [e for e in evs if e.name == "resize_refused"]
    assert refused and "the server refused: no room to grow" in refused[0].data["refused"]
    plans = [p for p in iter_records(run.plan) if isinstance(p, PlanRevision)]
    assert [(p.reason, p.nproc_per_node) for p in plans] == [
        ("start", 1),
        ("scale_grow", 2),
        ("scale_shrink", 1),
    ]
    rank0 = [
        r for r in iter_records(run.telemetry(0)) if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]
    assert [r.step for r in rank0] == list(range(1, MAX_STEPS + 1))
    # Each new size ran on the GPUs the server gave it (its CUDA_VISIBLE_DEVICES).
    assert [(e.data["world"], e.data["gpus"]) for e in evs if e.name == "resized"] == [(2, [0, 1]), (1, [0])]
