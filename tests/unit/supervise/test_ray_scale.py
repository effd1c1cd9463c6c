"""scale: with run.engine: ray: the rules' decisions become resource requests the Ray driver makes.

No cluster here: the driver's side of the channel (engines/requests.py) is what the driver runs,
without the Ray call; tests/integration/test_ray_engine.py makes the call on a real cluster.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steadytune.config.load import ConfigError, validate_dict
from steadytune.engines.groups import RESIZE, START
from steadytune.engines.requests import (
    RequestInbox,
    ResourceRequest,
    request_path,
    worker_bundle,
    write_request,
)
from steadytune.protocol import WorkerEvent
from steadytune.records import Event, GpuSample, PlanRevision, SystemSample, from_json
from steadytune.rundir import RunDir
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.ray_source import RaySource
from steadytune.supervise.supervisor import Supervisor


def config(tmp_path: Path, scale: dict[str, Any] | None = None, **ray: Any) -> dict[str, Any]:
    return {
        "model": {"name_or_path": str(tmp_path / "model")},
        "method": "full",
        "data": {"train_file": str(tmp_path / "train.jsonl")},
        "train": {"learning_rate": 1e-4, "max_steps": 100, "save_steps": 10},
        "run": {"runs_dir": str(tmp_path / "runs"), "engine": "ray"},
        "ray": {"num_workers": [1, 3], "resources_per_worker": {"CPU": 2}, **ray},
        "scale": scale if scale is not None else {"grow": {"for_s": 10}, "shrink": {"for_s": 10}},
    }


def refused(data: dict[str, Any], tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        validate_dict(data, base=tmp_path, check_paths=False)
    return str(err.value)


# -- config ----------------------------------------------------------------------------------------


def test_scale_with_an_elastic_ray_range_is_accepted(tmp_path: Path) -> None:
    cfg = validate_dict(config(tmp_path), base=tmp_path, check_paths=False)
    assert cfg.scale is not None and (cfg.scale.min_gpus, cfg.scale.max_gpus) == (1, 3)  # ray.num_workers'
    again = validate_dict(cfg.model_dump(mode="json"), base=tmp_path, check_paths=False)  # the run dir's copy
    assert again.scale is not None and again.scale.max_gpus == 3
    same = config(tmp_path, scale={"min_gpus": 1, "max_gpus": 3})
    assert validate_dict(same, base=tmp_path, check_paths=False).scale is not None


def test_scale_with_a_fixed_worker_count_says_to_give_a_range(tmp_path: Path) -> None:
    text = refused(config(tmp_path, num_workers=2), tmp_path)
    assert "ray.num_workers=2" in text and "ray.num_workers: [min, max]" in text


def test_a_scale_range_other_than_ray_s_names_both_and_the_fix(tmp_path: Path) -> None:
    text = refused(config(tmp_path, scale={"min_gpus": 1, "max_gpus": 4}), tmp_path)
    assert "scale.max_gpus=4" in text and "ray.num_workers: [1, 3]" in text
    assert "leave scale.min_gpus and scale.max_gpus out" in text


def test_the_cpu_bound_rule_with_ray_is_refused_with_its_reason(tmp_path: Path) -> None:
    text = refused(config(tmp_path, scale={"cpu_bound": {"cpu_util_above": 90}}), tmp_path)
    assert "scale.cpu_bound" in text and "drop scale.cpu_bound" in text


# -- the channel -----------------------------------------------------------------------------------


def test_a_bundle_is_one_workers_resources_as_ray_train_reserves_them() -> None:
    assert worker_bundle({}, use_gpu=False) == {"CPU": 1.0}
    assert worker_bundle({}, use_gpu=True) == {"GPU": 1.0}
    assert worker_bundle({"CPU": 8, "memory": 0}, use_gpu=True) == {"CPU": 8.0, "GPU": 1.0}


def test_the_driver_takes_each_request_once_and_skips_what_it_cannot_read(tmp_path: Path) -> None:
    inbox = RequestInbox(tmp_path, attempt=2)
    assert inbox.new() is None  # nothing asked yet
    request_path(tmp_path, 2).parent.mkdir(parents=True)
    request_path(tmp_path, 2).write_text('{"seq": 1, "kind"')  # not a request the supervisor wrote
    assert inbox.new() is None
    req = ResourceRequest(1, "grow", 2, ({"CPU": 2.0},) * 2, "busy", 5.0)
    write_request(tmp_path, 2, req)
    assert inbox.new() == req
    assert inbox.new() is None  # the same request is made once
    write_request(tmp_path, 2, ResourceRequest(2, "shrink", 1, ({"CPU": 2.0},), "idle", 6.0))
    taken = inbox.new()
    assert taken is not None and (taken.seq, taken.workers) == (2, 1)


# -- the supervisor --------------------------------------------------------------------------------


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    cfg = validate_dict(config(tmp_path), base=tmp_path, check_paths=False)
    run = RunDir(tmp_path / "runs" / "r")
    s = Supervisor(cfg, run, observers=[], poll_s=0.05, source=RaySource(run.create()))
    s.state.plans.write(s.state.plan)
    s.state.source.watch(0)  # type: ignore[attr-defined]  # what starting the driver of attempt 0 does
    # a live process stands for the driver: the rules judge only a job that is running
    s.state.attempt.worker = WorkerProcess(
        [sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "w.log"
    )
    s.state.status, s.state.attempt.phase, s.state.attempt.stepped = "running", "train", True
    try:
        yield s
    finally:
        s.state.attempt.worker.kill()
        s.state.attempt.worker.wait(10)


def group(sup: Supervisor, attempt: int, world: int, reason: str, before: int | None = None) -> None:
    data: dict[str, Any] = {"rank": 0, "attempt": attempt, "world_size": world, "reason": reason}
    if before:
        data["previous_world_size"] = before
    sup.handle(Event(ts=1.0, kind="lifecycle", name=WorkerEvent.WORKER_GROUP_STARTED, message="", data=data))
    sup.state.attempt.phase, sup.state.attempt.stepped = "train", True


def busy(sup: Supervisor, util: float, start: float, seconds: int) -> None:
    for t in range(seconds + 1):
        sup.handle(SystemSample(ts=start + t, cpu_ratio=0.2, gpus=(GpuSample(index=0, util_ratio=util),)))


_inboxes: dict[Path, RequestInbox] = {}


def act_as_driver(sup: Supervisor) -> ResourceRequest | None:
    """What the driver's thread does, less the Ray call; then the supervisor's next tick."""
    inbox = _inboxes.setdefault(sup.run.root, RequestInbox(sup.run.root, 0))  # one driver: one inbox
    req = inbox.new()
    if req is not None:
        inbox.made(req, 50.0)
    for rec in sup.state.source.poll() or ():
        sup.handle(rec)
    return req


def revisions(sup: Supervisor) -> list[PlanRevision]:
    return [r for r in map(from_json, sup.run.plan.read_text().splitlines()) if isinstance(r, PlanRevision)]


def filed(sup: Supervisor, name: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, sup.run.events.read_text().splitlines()) if e["name"] == name]


def test_a_grow_is_a_request_for_more_workers_and_ray_s_resize_follows(sup: Supervisor) -> None:
    group(sup, 0, 1, START)
    busy(sup, 0.95, start=100.0, seconds=5)
    assert act_as_driver(sup) is None  # busy for 5 s of the 10 the rule needs: nothing asked
    busy(sup, 0.95, start=106.0, seconds=5)
    req = act_as_driver(sup)
    assert req is not None and req.kind == "grow" and req.workers == 2
    assert list(req.bundles) == [{"CPU": 2.0}, {"CPU": 2.0}]  # ray.resources_per_worker, per worker
    assert (
        sup.state.pending is None
        and sup.state.attempt.worker is not None
        and sup.state.attempt.worker.poll() is None
    )  # no stop, no relaunch
    [asked] = filed(sup, "resources_requested")
    grown = revisions(sup)[-1]
    assert grown.reason == "scale_grow" and grown.cause_event_seq == asked["seq"]
    assert "asked Ray for 2 worker(s)" in grown.notes and grown.world_size == 1  # the group is still 1
    assert [e["data"]["workers"] for e in filed(sup, "grow")] == [2]
    group(sup, 1, 2, RESIZE, before=1)  # Ray found the room: its own resize is the next revision
    assert [(p.reason, p.world_size) for p in revisions(sup)][-2:] == [("scale_grow", 1), (RESIZE, 2)]


def test_a_shrink_asks_for_fewer_workers_within_the_ray_range(sup: Supervisor) -> None:
    group(sup, 0, 3, START)
    busy(sup, 0.99, start=100.0, seconds=20)
    assert act_as_driver(sup) is None  # at ray.num_workers' max: nothing more to ask for
    busy(sup, 0.05, start=200.0, seconds=11)
    req = act_as_driver(sup)
    assert req is not None and (req.kind, req.workers, len(req.bundles)) == ("shrink", 2, 2)
    assert revisions(sup)[-1].reason == "scale_shrink"
    from steadytune.records import StepRecord

    t0 = sup.state.clock()
    for n in range(1, 26):  # the group of 3 trains on: the shrink is measured
        sup.handle(StepRecord(step=n, ts=t0 + n, rank=0, attempt=0, loss=2.0, step_time_s=1.0))
    assert filed(sup, "resize_measured")
    # still idle past the cool-down, and Ray keeps the group of 3: the same ask again changes nothing
    busy(sup, 0.05, start=t0 + 1000, seconds=11)
    assert act_as_driver(sup) is None and len(filed(sup, "resources_requested")) == 1


def test_a_request_no_driver_took_frees_the_rules(sup: Supervisor) -> None:
    group(sup, 0, 1, START)
    busy(sup, 0.95, start=100.0, seconds=11)
    assert json.loads(request_path(sup.run.root, 0).read_text())["workers"] == 2
    sup.state.clock = lambda: 10**10  # long after the request; no driver ever wrote that it asked
    busy(sup, 0.95, start=300.0, seconds=0)
    assert [e["data"]["refused"] for e in filed(sup, "resize_refused")] == ["not taken"]
    assert sup.scaling is not None and sup.scaling.scaling is None


def test_where_ray_derives_the_accumulation_a_size_that_does_not_divide_is_not_refused() -> None:
    from steadytune.config.scale import ScaleConfig
    from steadytune.policy.scale import Reading, ScaleRules, Shape

    cfg = ScaleConfig(min_gpus=1, max_gpus=3, grow={"for_s": 0})
    three_on_one = Shape(micro_batch=4, accumulation=3, world=1)  # 3 workers' worth: 2 cannot keep it
    exact = ScaleRules(cfg, three_on_one).observe(Reading(1.0, 95.0, None), training=True)
    assert exact is not None and exact.after.world == 3  # the native rules skip 2 for a size that divides
    ray = ScaleRules(cfg, three_on_one, exact_batch=False).observe(Reading(1.0, 95.0, None), training=True)
    assert ray is not None and ray.refused is None and (ray.after.world, ray.after.accumulation) == (2, 2)
