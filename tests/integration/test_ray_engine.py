"""run.engine: ray on a real local multi-node Ray cluster (CPU workers), training the demo model.

Each test starts a cluster of its own (``ray.cluster_utils.Cluster``): a head with no CPUs, so
the driver and Ray's controller live there and every training worker lands on a worker node
of one CPU, which the test adds and removes as a real node would come and go.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steadytune.checkpoint.manifest import verify
from steadytune.records import PlanRevision, from_json
from steadytune.rundir import RunDir
from tests.integration.runs import finish, run_dir, running, start_run, steps, wait_for, write_config

pytest.importorskip("ray.train", reason="Ray Train is an optional extra: pip install 'steadytune[ray]'")
from ray.cluster_utils import Cluster

# A cluster of its own per test, with one busy CPU per node: two at once would starve each other.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

# Long enough that a group of 2 gets to train before the end; short enough for a 2-core machine.
STEPS, SAVE, BATCH = 24, 4, 4
SLOW_STEPS = {"step_sleep_s": 0.6, "fault_attempts": 1000}


@pytest.fixture(autouse=True)
def quick_group_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group Ray cannot place is given up after 10 s, not 60.

    After a node dies, Ray's autoscaling coordinator counts it until its next look at the cluster (every
    20 s), so the restart first asks for a group the dead node would hold and waits on its placement
    group. Ray retries a start that timed out without limit (not against ``max_failures``), with the
    coordinator's view of the moment: a short wait asks again as soon as that view has dropped the dead
    node, where a long one sat out its whole length. A group on live nodes is placed in well under 10 s.
    """
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "10")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    # A killed node is found dead in ~5 s instead of ~30 s: the tests wait on Ray less.
    fast = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": fast})
    try:
        yield c
    finally:
        c.shutdown()


def ray_config(tmp: Path, assets: Path, address: str, steps: int = STEPS, **ray: Any) -> Path:
    return write_config(
        tmp,
        assets,
        train={"max_steps": steps, "save_steps": SAVE, "logging_steps": 1},
        run={"engine": "ray", "max_restarts": 1},
        ray={
            "address": address,
            "num_workers": [1, 2],
            "resources_per_worker": {"CPU": 1},
            "elastic_resize_monitor_interval_s": 2,
            "max_failures": 3,
            **ray,
        },
    )


def plans(run: RunDir) -> list[PlanRevision]:
    return [r for r in map(from_json, run.plan.read_text().splitlines()) if isinstance(r, PlanRevision)]


def groups(run: RunDir) -> list[dict[str, Any]]:
    path = run.root / "ray" / "attempt-0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events(run: RunDir, name: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in run.events.read_text().splitlines()]
    return [e for e in found if e.get("name") == name]


def assert_completed(run: RunDir, rc: int, out: str, last_step: int = STEPS) -> None:
    assert rc == 0, out[-3000:]
    assert json.loads(run.status.read_text())["state"] == "completed", out[-3000:]
    assert (run.root / "final").is_dir()
    final = [s.step for s in steps(run) if s.attempt == max(s.attempt for s in steps(run))]
    assert final[-1] == last_step
    for ckpt in run.checkpoints.glob("checkpoint-*"):
        assert verify(ckpt).ok, ckpt
    # every step: 4 per device x 2 workers, or x 2 accumulated on 1
    assert effective_batches(run) == {BATCH * 2}


def effective_batches(run: RunDir) -> set[int]:
    """Samples per optimizer step over all ranks, on the timeline that completed (latest attempt of each
    step)."""
    latest = {s.step: s.attempt for s in steps(run)}
    total: dict[int, int] = {}
    for rank in (0, 1):
        for s in steps(run, rank) if run.telemetry(rank).exists() else []:
            if latest.get(s.step) == s.attempt:
                total[s.step] = total.get(s.step, 0) + (s.samples or 0)
    return set(total.values())


def test_a_node_killed_restarts_from_the_checkpoint(
    tmp_path: Path, demo_assets: Path, cluster: Cluster
) -> None:
    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    cfg = ray_config(tmp_path, demo_assets, cluster.address)
    proc = start_run(cfg, "kill", faults=SLOW_STEPS)
    run = run_dir(cfg, "kill")
    wait_for(lambda: running(proc) and groups(run) and groups(run)[0]["world_size"] == 2, 300, "a group of 2")
    wait_for(
        lambda: (
            running(proc)
            and any(p.name.startswith("checkpoint-") for p in run.checkpoints.glob("*"))
            and len(steps(run, 1)) >= SAVE + 1
        ),
        300,
        "a checkpoint, then more steps",
    )
    lost_at = steps(run)[-1].step
    cluster.remove_node(cluster.list_all_nodes()[-1], allow_graceful=False)  # a worker node: both train
    rc, out = finish(proc, 600)
    assert_completed(run, rc, out)

    g = groups(run)
    assert [(x["reason"], x["world_size"]) for x in g][:2] == [("ray_start", 2), ("ray_restart", 1)]
    restart = next(p for p in plans(run) if p.reason == "ray_restart")
    assert restart.world_size == 1 and restart.resume_checkpoint is not None
    resumed_at = int(Path(restart.resume_checkpoint).name.split("-")[1])
    assert resumed_at <= lost_at
    assert next(s.step for s in steps(run) if s.attempt == restart.attempt) == resumed_at + 1


def test_a_node_lost_during_a_resize(tmp_path: Path, demo_assets: Path, cluster: Cluster) -> None:
    cluster.add_node(num_cpus=1)
    cfg = ray_config(tmp_path, demo_assets, cluster.address)
    # Ray's controller looks for new nodes every 20 s or so: the steps left after the first checkpoint
    # must outlast that, or the run ends before the group of 2 forms.
    proc = start_run(cfg, "lost", faults={**SLOW_STEPS, "step_sleep_s": 1.5})
    run = run_dir(cfg, "lost")
    wait_for(lambda: running(proc) and len(steps(run)) >= SAVE + 1, 300, "a checkpoint of the first group")
    new = cluster.add_node(num_cpus=1)
    # The resize has begun: rank 0 logged the group of 2, which may not have announced itself yet (a
    # group lost before it does still gets its plan revision); its rank 1 trains little, if anything.
    wait_for(lambda: running(proc) and len(groups(run)) >= 2, 300, "the resized group's start")
    cluster.remove_node(new, allow_graceful=False)
    rc, out = finish(proc, 600)
    assert_completed(run, rc, out)

    g = groups(run)
    assert [(x["reason"], x["world_size"]) for x in g][:2] == [("ray_start", 1), ("ray_resize", 2)]
    assert g[-1]["world_size"] == 1 and g[-1]["reason"] == "ray_restart"
    revisions = [p.reason for p in plans(run)]
    assert "ray_resize" in revisions and revisions[-1] == "ray_restart"
    # the steps go on from the checkpoints without a gap: every step up to the end was trained
    trained = {s.step for s in steps(run)}
    assert trained == set(range(1, STEPS + 1))


def test_a_signal_stops_the_ray_job_after_its_workers_saved(
    tmp_path: Path, demo_assets: Path, cluster: Cluster
) -> None:
    """The driver outlives the supervisor's SIGTERM: the workers take the stop at a step, save, and return."""
    import signal

    cluster.add_node(num_cpus=1)
    cfg = ray_config(tmp_path, demo_assets, cluster.address, num_workers=1)
    proc = start_run(cfg, "stop", faults=SLOW_STEPS)
    run = run_dir(cfg, "stop")
    wait_for(lambda: running(proc) and len(steps(run)) >= 3, 300, "steps")
    proc.send_signal(signal.SIGINT)
    rc, out = finish(proc, 300)
    assert rc == 0, out[-3000:]
    assert json.loads(run.status.read_text())["state"] == "stopped"
    last = steps(run)[-1].step
    assert last < STEPS and verify(run.checkpoints / f"checkpoint-{last}").ok  # saved where it stopped
    assert "stop requested: the workers save and return" in (run.logs / "worker-0.log").read_text()


def test_the_scale_rules_ask_ray_for_workers_and_a_node_added_lets_the_group_grow(
    tmp_path: Path, demo_assets: Path, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scale: with Ray: a busy reading becomes request_resources for 2 workers, an idle one for 1; Ray
    holds each request, and the group grows once a node brings the room."""
    import os

    def utilisation(util: float) -> None:
        tmp = snapshot.with_suffix(".tmp")
        tmp.write_text(json.dumps({"cpu_ratio": 0.2, "gpus": [{"index": 0, "util_ratio": util}]}))
        os.replace(tmp, snapshot)

    snapshot = tmp_path / "gpus.json"
    utilisation(0.95)  # busy: the grow rule holds
    monkeypatch.setenv("STEADYTUNE_SYSTEM_SNAPSHOT", str(snapshot))
    cluster.add_node(num_cpus=1)
    cfg = write_config(
        tmp_path,
        demo_assets,
        train={"max_steps": 60, "save_steps": SAVE, "logging_steps": 1},
        run={"engine": "ray", "max_restarts": 1, "sample_interval_s": 0.5},
        ray={
            "address": cluster.address,
            "num_workers": [1, 3],
            "resources_per_worker": {"CPU": 1},
            "elastic_resize_monitor_interval_s": 2,
        },
        scale={
            "grow": {"gpu_util_above": 85, "for_s": 1},
            "shrink": {"gpu_util_below": 30, "for_s": 1},
            "cooldown_s": 1,
            "undo_if_slower": False,
            "compare_steps": 2,
        },
    )
    proc = start_run(cfg, "rules", faults=SLOW_STEPS)
    run = run_dir(cfg, "rules")
    # The request's event is filed before the plan revision it causes is written: wait for both.
    wait_for(
        lambda: (
            running(proc)
            and run.events.exists()
            and events(run, "resources_requested")
            and any(p.reason == "scale_grow" for p in plans(run))
        ),
        300,
        "the grow's request and its plan revision",
    )
    utilisation(0.5)  # between the rules: nothing more to ask
    [grow] = events(run, "resources_requested")
    assert (grow["data"]["kind"], grow["data"]["workers"]) == ("grow", 2)
    # what Ray holds as the autoscaler's request, read back by the driver just after asking
    assert grow["data"]["recorded"] == [{"CPU": 1.0}, {"CPU": 1.0}]
    asked = next(p for p in plans(run) if p.reason == "scale_grow")
    assert asked.cause_event_seq == grow["seq"] and asked.world_size == 1  # asked; the group is still 1

    cluster.add_node(num_cpus=1)
    wait_for(lambda: running(proc) and any(p.reason == "ray_resize" for p in plans(run)), 300, "Ray's resize")
    wait_for(lambda: running(proc) and run.telemetry(1).exists() and steps(run, 1), 300, "rank 1's steps")
    utilisation(0.05)  # idle: the shrink rule holds
    wait_for(
        lambda: running(proc) and len(events(run, "resources_requested")) >= 2, 300, "the shrink's request"
    )
    shrink = events(run, "resources_requested")[1]["data"]
    assert (shrink["kind"], shrink["workers"], shrink["recorded"]) == ("shrink", 1, [{"CPU": 1.0}])
    rc, out = finish(proc, 600)
    assert rc == 0, out[-3000:]
    assert json.loads(run.status.read_text())["state"] == "completed", out[-3000:]
    reasons = [(p.reason, p.world_size) for p in plans(run)]
    assert (
        reasons.index(("scale_grow", 1))
        < reasons.index(("ray_resize", 2))
        < reasons.index(("scale_shrink", 2))
    )
    # the bigger group resumed from a checkpoint the first one saved, continued its steps, and its
    # new rank trained the same steps as rank 0
    assert events(run, "worker_group_started")
    resized = next(p for p in plans(run) if p.reason == "ray_resize")
    assert resized.resume_checkpoint is not None
    resumed_at = int(Path(resized.resume_checkpoint).name.split("-")[1])
    grown = [s.step for s in steps(run) if s.attempt == resized.attempt]
    assert grown and grown[0] == resumed_at + 1
    assert [s.step for s in steps(run, 1) if s.attempt == resized.attempt] == grown
