"""A real resize: a native run grows 1 -> 2 processes (torchrun, gloo) and shrinks back, by rules.

The GPU utilisation the rules read is injected through ``$STEADYTUNE_SYSTEM_SNAPSHOT``
(this machine has no GPU); everything else is real: the checkpoint the stop writes,
the relaunch under torchrun, the resume at another world size, the re-derived
gradient accumulation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from steadytune.records import Event, PlanRevision, StepRecord, run_end
from steadytune.telemetry.stream import iter_records

from .runs import finish, run_dir, running, start_run, wait_for, write_config

# Two training processes at once on the grown run: kept off the other heavy tests.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

MAX_STEPS = 36
EFFECTIVE = 4  # micro-batch 2 x accumulation 2 x 1 process, then 2 x 1 x 2


def write_snapshot(path: Path, util: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cpu_ratio": 0.2, "gpus": [{"index": i, "util_ratio": util} for i in (0, 1)]}))
    os.replace(tmp, path)  # the sampler never reads a half-written file


def events(run) -> list[Event]:
    return [e for e in iter_records(run.events) if isinstance(e, Event)]


def resized_to(run, world: int) -> bool:
    return any(e.name == "resized" and e.data.get("world") == world for e in events(run))


def test_rules_resize_a_run_one_to_two_to_one(
    tmp_path: Path, demo_assets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = tmp_path / "gpus.json"
    write_snapshot(snapshot, 0.95)  # busy: the grow rule holds
    monkeypatch.setenv("STEADYTUNE_SYSTEM_SNAPSHOT", str(snapshot))
    cfg = write_config(
        tmp_path,
        demo_assets,
        train={
            "max_steps": MAX_STEPS,
            "save_steps": MAX_STEPS,  # the only checkpoints are the ones the resizes ask for, and the last
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 2,
            "logging_steps": 1,
        },
        run={"sample_interval_s": 0.3},
        scale={
            "min_gpus": 1,
            "max_gpus": 2,
            "grow": {"gpu_util_above": 85, "for_s": 1.5},
            "shrink": {"gpu_util_below": 30, "for_s": 1.5},
            "cooldown_s": 2,
            "undo_if_slower": False,  # gloo on two shared cores is no measure of a GPU's speed-up
            "compare_steps": 2,
        },
    )
    proc = start_run(cfg, "scale", faults={"step_sleep_s": 0.25, "fault_attempts": 0})
    run = run_dir(cfg, "scale")
    wait_for(lambda: running(proc) and resized_to(run, 2), timeout=200, what="the run on 2 processes")
    write_snapshot(snapshot, 0.10)  # idle: the shrink rule holds
    rc, out = finish(proc, timeout=240)
    assert rc == 0, out[-3000:]

    # The plan records each world size, with its cause and the accumulation that keeps the batch.
    plans = [p for p in iter_records(run.plan) if isinstance(p, PlanRevision)]
    assert [(p.reason, p.nproc_per_node, p.gradient_accumulation_steps) for p in plans] == [
        ("start", 1, None),
        ("scale_grow", 2, 1),
        ("scale_shrink", 1, 2),
    ]
    evs = events(run)
    by_seq = {e.seq: e for e in evs}
    for p in plans[1:]:
        assert by_seq[p.cause_event_seq].name == "restart" and p.resume_checkpoint
    actions = [
        (e.name, e.data["world_from"], e.data["world_to"]) for e in evs if e.name in {"grow", "shrink"}
    ]
    assert actions == [("grow", 1, 2), ("shrink", 2, 1)]
    assert [e.data["world"] for e in evs if e.name == "resized"] == [2, 1]
    assert not [e for e in evs if e.name in {"resume_mismatch", "resize_refused"}]
    assert run_end(evs).name == "run_completed"
    # The run on two processes cannot go to the one-process standby worker, and says so; back on one, it can.
    started = [e for e in evs if e.name == "worker_started"]
    assert [e.data["standby"] for e in started] == [False, False, True]
    assert "a new process: the attempt runs several processes (torchrun)" in started[1].message

    # Steps continue from each checkpoint: no gap, no repeat.
    rank0 = [
        r for r in iter_records(run.telemetry(0)) if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]
    assert [r.step for r in rank0] == list(range(1, MAX_STEPS + 1))
    attempts = [r.attempt for r in rank0]
    assert attempts == sorted(attempts) and set(attempts) == {0, 1, 2}
    for p in plans[1:]:
        first = next(r for r in rank0 if r.attempt == p.attempt)
        assert first.step == int(Path(p.resume_checkpoint).name.split("-")[1]) + 1

    # The effective batch is unchanged: the samples of every step, over all its ranks.
    rank1 = [
        r for r in iter_records(run.telemetry(1)) if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]
    assert {r.attempt for r in rank1} == {1}  # only the attempt on 2 processes had a rank 1
    samples: dict[int, int] = {}
    indices: list[int] = []
    for r in rank0 + rank1:
        samples[r.step] = samples.get(r.step, 0) + (r.samples or 0)
        indices.extend(r.batch.indices if r.batch else ())
    assert samples == dict.fromkeys(range(1, MAX_STEPS + 1), EFFECTIVE)
    # ... and the data goes on where it stopped: no sample trained twice, none dropped.
    assert len(indices) == len(set(indices)) == MAX_STEPS * EFFECTIVE
