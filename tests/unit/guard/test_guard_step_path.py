"""The guard's per-step path: what it writes is what it wrote before, only cheaper."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import psutil

from steadytune.guard.core import Guard, rss_bytes
from steadytune.protocol import send_control
from steadytune.records import (
    _TAGS,
    BatchFingerprint,
    Event,
    GpuSample,
    Heartbeat,
    PlanRevision,
    StepRecord,
    SystemSample,
    from_json,
    json_safe,
    to_dict,
    to_json,
)
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import iter_records
from tests.waiting import wait_for


def reference_dict(record: Any) -> dict[str, Any]:
    """The definition to_dict must keep: asdict, None dropped at the top, non-finite as strings."""
    body = {k: v for k, v in dataclasses.asdict(record).items() if v is not None}
    return {"type": _TAGS[type(record)], **json_safe(body)}


RECORDS = [
    StepRecord(
        step=3,
        ts=1.5,
        loss=math.nan,
        grad_norm=math.inf,
        lr=-math.inf,
        tokens=5,
        skipped=True,
        batch=BatchFingerprint((1, 2), ("a", "b")),
        extra={"gradflow": {"norm": [1.0, math.nan], "names": ("x", "y")}, "eval": True},
    ),
    StepRecord(step=1, ts=0.0),
    SystemSample(ts=2.0, cpu_ratio=0.5, gpus=(GpuSample(0, "H100", util_ratio=None, power_w=math.nan),)),
    Event(ts=1.0, kind="action", name="rollback", data={"to": 40, "nested": [{"a": (1, 2)}]}),
    PlanRevision(revision=2, ts=3.0, reason="rollback", skip_ranges=((10, 12),), lr_groups=(("lora", 1e-4),)),
    Event(ts=1.0, kind="action", name="keys", data={"n": {1: "a", None: 2.5}, "f": [math.inf, -0.0]}),
    Heartbeat(ts=1.25, rank=1, step=7, pid=42, phase="sauvegarde \u00e9 \n"),
]


def test_to_dict_is_asdict_with_non_finite_floats_as_strings_for_every_record_shape() -> None:
    for record in RECORDS:
        assert to_dict(record) == reference_dict(record)
        assert list(to_dict(record)) == list(reference_dict(record))  # same key order, so the same line
        assert from_json(json.dumps(to_dict(record))) == from_json(json.dumps(reference_dict(record)))


def test_to_json_writes_the_line_json_dumps_writes_for_every_record_shape() -> None:
    for record in RECORDS:
        assert to_json(record) == json.dumps(reference_dict(record), separators=(",", ":"))


def test_rss_bytes_reads_what_psutil_reads() -> None:
    mine, theirs = rss_bytes(), psutil.Process().memory_info().rss
    assert mine is not None and abs(mine - theirs) <= 8 * 1024**2  # the two reads are moments apart


def test_a_watched_guard_reads_the_queue_only_after_its_thread_saw_a_new_file(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r").create()
    send_control(run, "checkpoint", "before the watch")
    guard = Guard(run.root, rank=0, attempt=0)
    guard.watch(interval_s=3600)  # woken by step ends only: the test drives every wake-up
    first = guard.poll_control()
    assert first is not None and first["issuer"] == "before the watch"  # queued before: read at once
    assert guard.poll_control() is None
    send_control(run, "stop", "operator")
    assert guard.poll_control() is None  # the thread has not looked since the file landed
    guard.begin_step()
    guard.end_step(1)  # a step end wakes the thread
    wait_for(guard._control_flag.is_set, what="the watch thread to see the new file", interval=0.005)
    got = guard.poll_control()
    assert got is not None and got["command"] == "stop"
    assert guard.poll_control() is None
    guard.close()


def test_after_a_held_boundary_the_queue_is_read_before_the_watch_saw_the_request(tmp_path: Path) -> None:
    """A boundary held for an outside actor (a drill's hold until the supervisor files its request) is
    that actor's step: its request must be taken there, not one step later because the watch thread
    had not looked since the file landed (a rollback taken after step 23 instead of 22)."""
    run = RunDir(tmp_path / "r").create()
    guard = Guard(run.root, rank=0, attempt=0)
    guard.watch(interval_s=3600)
    assert guard.poll_control() is None
    send_control(run, "rollback", "policy:spike")
    assert guard.poll_control() is None  # an ordinary boundary waits for the watch
    got = guard.poll_control(fresh=True)
    assert got is not None and got["command"] == "rollback"
    assert guard.poll_control(fresh=True) is None  # each request once
    guard.close()


def test_a_watched_guard_records_rss_read_after_the_step_before(tmp_path: Path) -> None:
    guard = Guard(tmp_path / "r", rank=0, attempt=0)
    guard.watch(interval_s=3600)
    guard._rss = -1  # a value no reading gives: the next record must show the thread's reading instead
    guard.begin_step()
    assert guard.end_step(1).rss_bytes == -1  # the loop never reads RSS itself
    wait_for(lambda: guard._rss != -1, what="the watch thread to read RSS", interval=0.005)
    guard.begin_step()
    rss = guard.end_step(2).rss_bytes
    assert rss is not None and rss > 0
    guard.close()
    steps = [r for r in iter_records(guard.run.telemetry(0)) if isinstance(r, StepRecord)]
    assert [s.step for s in steps] == [1, 2]


def test_a_forked_child_asks_again_whether_torch_sees_cuda() -> None:
    from steadytune.guard import core

    before = dict(core._CUDA)
    core._CUDA["available"] = True  # what the parent learned: not the child's to trust
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it remembers, then leave without running pytest's exit
            os.write(write, json.dumps(core._CUDA).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            seen_by_child = json.loads(pipe.read())
        os.waitpid(pid, 0)
        assert seen_by_child == {}
        assert core._CUDA == {"available": True}
    finally:
        core._CUDA.clear()
        core._CUDA.update(before)
