"""run.engine: ray without a cluster: the config, the group decisions, the revisions, the trainer's
arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadytune.checkpoint.manifest import write_manifest
from steadytune.config.load import ConfigError, validate_dict
from steadytune.engines.groups import (
    RESIZE,
    RESTART,
    START,
    Group,
    GroupLog,
    newest_own_checkpoint,
    next_group,
)
from steadytune.engines.ray_driver import cluster_address, passed_env, trainer_kwargs
from steadytune.protocol import WorkerEvent
from steadytune.records import Event, PlanRevision, StepRecord, from_json
from steadytune.rundir import RunDir
from steadytune.supervise.ray_source import RaySource, driver_command, group_revision
from steadytune.supervise.supervisor import Supervisor
from steadytune.telemetry.events import read_events


def config(tmp_path: Path, **ray: object) -> dict:
    return {
        "model": {"name_or_path": str(tmp_path / "model")},
        "method": "full",
        "data": {"train_file": str(tmp_path / "train.jsonl")},
        "train": {"learning_rate": 1e-4, "max_steps": 100, "save_steps": 10},
        "run": {"runs_dir": str(tmp_path / "runs"), "engine": "ray"},
        "ray": ray,
    }


# -- config ----------------------------------------------------------------------------------------


def test_an_elastic_range_and_a_fixed_count_are_both_worker_counts(tmp_path: Path) -> None:
    assert (
        validate_dict(config(tmp_path, num_workers=[2, 8]), base=tmp_path, check_paths=False).ray.max_workers
        == 8
    )
    fixed = validate_dict(config(tmp_path, num_workers=4), base=tmp_path, check_paths=False).ray
    assert (fixed.min_workers, fixed.max_workers) == (4, 4)


@pytest.mark.parametrize("bad", [[3, 2], [0, 2], 0])
def test_a_bad_worker_count_names_the_key_the_value_and_the_fix(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        validate_dict(config(tmp_path, num_workers=bad), base=tmp_path, check_paths=False)
    text = str(err.value)
    assert "ray.num_workers" in text and str(bad).replace(" ", "") in text.replace(" ", "")
    assert "1 <= min <= max" in text


def test_nproc_per_node_with_ray_says_to_use_num_workers(tmp_path: Path) -> None:
    data = config(tmp_path)
    data["run"]["nproc_per_node"] = 2
    with pytest.raises(ConfigError) as err:
        validate_dict(data, base=tmp_path, check_paths=False)
    assert "run.nproc_per_node=2" in str(err.value) and "ray.num_workers: 2" in str(err.value)


def test_an_unknown_engine_is_an_error(tmp_path: Path) -> None:
    data = config(tmp_path)
    data["run"]["engine"] = "slurm"
    with pytest.raises(ConfigError) as err:
        validate_dict(data, base=tmp_path, check_paths=False)
    assert "run.engine" in str(err.value) and "slurm" in str(err.value)


# -- group decisions -------------------------------------------------------------------------------


def test_the_first_group_trains_the_supervisors_plan() -> None:
    g = next_group([], base_attempt=3, base_resume="/r/checkpoint-8", world_size=2, newest_own=None)
    assert (g.group, g.attempt, g.reason, g.resume_checkpoint) == (0, 3, START, "/r/checkpoint-8")


def test_a_bigger_group_is_a_resize_and_a_smaller_or_same_one_a_restart() -> None:
    first = next_group([], 0, None, 1, None)
    grown = next_group([first], 0, None, 2, "/r/checkpoint-4")
    assert (grown.group, grown.attempt, grown.reason, grown.previous_world_size) == (1, 1, RESIZE, 1)
    assert grown.resume_checkpoint == "/r/checkpoint-4"
    lost = next_group([first, grown], 0, None, 1, None)
    assert (lost.attempt, lost.reason, lost.previous_world_size) == (2, RESTART, 2)
    assert next_group([first], 0, None, 1, None).reason == RESTART


def test_without_a_checkpoint_of_its_own_a_group_resumes_where_the_attempt_did() -> None:
    first = next_group([], 5, "/r/checkpoint-20", 2, None)
    assert next_group([first], 5, "/r/checkpoint-20", 2, None).resume_checkpoint == "/r/checkpoint-20"


def ckpt(root: Path, step: int, attempt: int, whole: bool = True) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x" * 16)
    state = {
        "global_step": step,
        "epoch": 0.5,
        "log_history": [{"loss": 1.5, "learning_rate": 1e-4, "step": step}],
    }
    (path / "trainer_state.json").write_text(json.dumps(state))
    write_manifest(path, step, {"attempt": attempt})
    if not whole:
        (path / "model.safetensors").write_bytes(b"x")
    return path


def test_the_newest_own_checkpoint_is_whole_and_of_this_driver(tmp_path: Path) -> None:
    ckpt(tmp_path, 4, attempt=0)
    ckpt(tmp_path, 8, attempt=2)
    ckpt(tmp_path, 12, attempt=3, whole=False)  # cut short by the node that died
    ckpt(tmp_path, 16, attempt=1)  # a timeline the supervisor's rollback left: older than this driver
    assert newest_own_checkpoint(tmp_path, first_attempt=2) == str(tmp_path / "checkpoint-8")
    assert newest_own_checkpoint(tmp_path, first_attempt=4) is None


def test_the_group_log_survives_a_line_cut_short(tmp_path: Path) -> None:
    log = GroupLog(tmp_path, 0)
    log.append(Group(0, 0, 1, START, None))
    with open(log.path, "a") as f:
        f.write('{"group": 1, "att')  # a node died mid-write
    log.append(Group(1, 1, 2, RESIZE, "/c", 1))
    assert [g.group for g in log.read()] == [0, 1]


def test_the_group_log_skips_a_line_no_group_could_be(tmp_path: Path) -> None:
    """Read through the shared JSONL reader: a line nested past any record is skipped, not fatal."""
    log = GroupLog(tmp_path, 0)
    log.append(Group(0, 0, 1, START, None))
    with open(log.path, "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n" + '{"group": 7}\n')  # too deep; not a whole group
    log.append(Group(1, 1, 2, RESIZE, "/c", 1))
    assert [g.group for g in log.read()] == [0, 1]


# -- revisions -------------------------------------------------------------------------------------


def test_the_first_group_records_only_its_size() -> None:
    plan = PlanRevision(revision=0, ts=0.0, reason="start", attempt=0)
    assert group_revision(plan, {"world_size": 2, "attempt": 0}, 0) == {
        "reason": "world_size", "world_size": 2, "notes": "Ray started 2 worker(s)"
    }  # fmt: skip
    assert (
        group_revision(PlanRevision(1, 0.0, "world_size", world_size=2), {"world_size": 2, "attempt": 0}, 0)
        is None
    )


def supervisor(tmp_path: Path) -> Supervisor:
    cfg = validate_dict(config(tmp_path), base=tmp_path, check_paths=False)
    return Supervisor(cfg, RunDir(tmp_path / "runs" / "r"), observers=[], poll_s=0.05)


def group_event(
    attempt: int, world: int, reason: str, resume: str | None, before: int | None = None
) -> Event:
    data = {"rank": 0, "attempt": attempt, "world_size": world, "reason": reason, "group": attempt}
    if resume:
        data["resume_checkpoint"] = resume
    if before:
        data["previous_world_size"] = before
    return Event(ts=1.0, kind="lifecycle", name=WorkerEvent.WORKER_GROUP_STARTED, message="", data=data)


def test_a_resize_and_a_restart_are_plan_revisions_with_their_world_size(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    sup.state.plans.write(sup.state.plan)
    sup.handle(group_event(0, 1, START, None))
    c4 = str(ckpt(sup.run.checkpoints, 4, attempt=0))
    sup.handle(group_event(1, 2, RESIZE, c4, before=1))
    # A new timeline, whose first step is checked against the checkpoint it resumes.
    assert (
        sup.state.attempt.number == 1
        and sup.state.attempt.stepped is False
        and sup.resumes._expect["step"] == 4
    )
    sup.handle(group_event(2, 1, RESTART, c4, before=2))
    revisions = [from_json(x) for x in sup.run.plan.read_text().splitlines()]
    assert [(p.reason, p.attempt, p.world_size) for p in revisions] == [
        ("start", 0, None), ("world_size", 0, 1), (RESIZE, 1, 2), (RESTART, 2, 1)
    ]  # fmt: skip
    assert revisions[2].resume_checkpoint == c4 and "1 → 2" in revisions[2].notes
    filed = [json.loads(x) for x in sup.run.events.read_text().splitlines()]
    assert [e["data"]["world_size"] for e in filed if e["name"] == "worker_group_started"] == [1, 2, 1]


def test_a_group_lost_before_it_announced_itself_still_gets_its_revision(tmp_path: Path) -> None:
    """A node killed while a resized group starts: rank 0 logged the group, which never announced itself;
    the next group's announcement files the lost one's revision first, so the plan skips no attempt."""
    cfg = validate_dict(config(tmp_path), base=tmp_path, check_paths=False)
    run = RunDir(tmp_path / "runs" / "r")
    source = RaySource(run.create())
    source.watch(0)  # the driver of attempt 0, as start() does
    sup = Supervisor(cfg, run, observers=[], poll_s=0.05, source=source)
    sup.state.plans.write(sup.state.plan)
    c4 = str(ckpt(sup.run.checkpoints, 4, attempt=0))
    log = GroupLog(sup.run.root, 0)
    log.append(Group(0, 0, 1, START, None))
    sup.handle(group_event(0, 1, START, None))
    log.append(Group(1, 1, 2, RESIZE, c4, 1))  # decided; its node died before it announced
    log.append(Group(2, 2, 1, RESTART, c4, 2))
    sup.handle(group_event(2, 1, RESTART, c4, before=2))
    revisions = [from_json(x) for x in sup.run.plan.read_text().splitlines()]
    assert [(p.reason, p.attempt, p.world_size) for p in revisions] == [
        ("start", 0, None), ("world_size", 0, 1), (RESIZE, 1, 2), (RESTART, 2, 1)
    ]  # fmt: skip
    assert "lost before it announced itself" in revisions[2].notes
    assert "lost" not in revisions[3].notes and sup.state.attempt.number == 2
    # an announced group is never filed twice
    sup.handle(group_event(2, 1, RESTART, c4, before=2))
    assert len(sup.run.plan.read_text().splitlines()) == 4


def test_the_first_step_of_a_new_group_must_continue_its_checkpoint(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    sup.state.plans.write(sup.state.plan)
    c4 = str(ckpt(sup.run.checkpoints, 4, attempt=0))
    sup.handle(group_event(1, 2, RESTART, c4, before=1))
    sup.handle(StepRecord(step=2, ts=2.0, attempt=1, loss=1.4, epoch=0.5))  # started over, not from step 4
    (mismatch,) = [e for e in read_events(sup.run.events) if e.name == "resume_mismatch"]
    assert "step 2, not after the checkpoint's step 4" in mismatch.message


# -- the driver's arguments --------------------------------------------------------------------------


def test_the_trainer_gets_the_scaling_run_and_failure_config(tmp_path: Path) -> None:
    cfg = validate_dict(
        config(
            tmp_path, num_workers=[2, 4], use_gpu=True, max_failures=5, elastic_resize_monitor_interval_s=7
        ),
        base=tmp_path,
        check_paths=False,
    )
    run = RunDir(tmp_path / "runs" / "job-1")
    kw = trainer_kwargs(cfg.ray, run, PlanRevision(0, 0.0, "start"))
    assert kw["scaling"] == {"num_workers": (2, 4), "use_gpu": True, "elastic_resize_monitor_interval_s": 7}
    assert kw["run"] == {
        "name": "job-1",
        "storage_path": str((run.root / "ray").resolve()),
        "max_failures": 5,
    }
    assert kw["train_loop_config"]["plan"]["type"] == "plan"
    fixed = validate_dict(
        config(tmp_path, num_workers=3, storage_path="s3://b/p"), base=tmp_path, check_paths=False
    ).ray
    assert trainer_kwargs(fixed, run, PlanRevision(0, 0.0, "start"))["run"]["storage_path"] == "s3://b/p"


def test_the_cluster_address_comes_from_the_config_then_the_environment() -> None:
    from steadytune.config.schema import RayConfig

    assert cluster_address(RayConfig(address="ray://h:10001"), {"RAY_ADDRESS": "x:1"}) == "ray://h:10001"
    assert cluster_address(RayConfig(), {"RAY_ADDRESS": "10.0.0.1:6379"}) == "10.0.0.1:6379"
    assert cluster_address(RayConfig(), {}) == "auto"


def test_the_workers_get_steadytunes_and_hfs_environment_only() -> None:
    env = {"HF_HUB_OFFLINE": "1", "STEADYTUNE_FAULTS": "{}", "AWS_SECRET_ACCESS_KEY": "s", "HOME": "/root"}
    assert passed_env(env) == {"HF_HUB_OFFLINE": "1", "STEADYTUNE_FAULTS": "{}"}
    assert driver_command(Path("/r"), python="py") == [
        "py",
        "-m",
        "steadytune.engines.ray_driver",
        "--run-dir",
        "/r",
    ]


def test_a_failed_group_is_an_event_and_the_job_is_forming_not_hung(tmp_path: Path) -> None:
    from steadytune.engines.groups import failures_path
    from steadytune.supervise.ray_source import RaySource

    sup = supervisor(tmp_path)
    source = RaySource(sup.run)
    source.watch(0)  # what start() does for attempt 0
    failures = failures_path(sup.run.root, 0)
    assert source.poll() == []
    failures.parent.mkdir(parents=True)
    line = json.dumps({"ts": 5.0, "ranks": {"1": "ActorDiedError: the node died\nmore"}})
    failures.write_text(line + "\n" + line[:10])  # the second line is still being written
    found = source.poll()
    assert [(e.name, e.data["ranks"]) for e in found] == [
        ("worker_group_failed", {"1": "ActorDiedError: the node died\nmore"})
    ]
    assert "(rank 1: ActorDiedError: the node died);" in found[0].message
    assert source.poll() == []  # read once
    sup.state.attempt.phase, sup.state.attempt.stepped = "train", True
    sup.handle(found[0])
    assert sup.state.attempt.phase == "setup"  # judged by setup_timeout_s until the next group starts
    filed = [json.loads(x) for x in sup.run.events.read_text().splitlines()]
    assert [e["name"] for e in filed] == ["worker_group_failed"]


def test_a_rank_a_smaller_group_no_longer_has_is_not_a_straggler(tmp_path: Path) -> None:
    from steadytune.records import StepRecord
    from steadytune.telemetry.stream import JsonlWriter

    sup = supervisor(tmp_path)
    sup.state.plans.write(sup.state.plan)
    streams = {r: JsonlWriter(sup.run.telemetry(r)) for r in (0, 1)}

    def steps(ranks: tuple[int, ...], attempt: int, numbers: range) -> None:
        for n in numbers:
            for rank in ranks:
                rec = StepRecord(
                    step=n, ts=float(n), rank=rank, attempt=attempt, loss=2.0 + n % 3, step_time_s=1.0
                )
                streams[rank].write(rec)
            sup.pump()

    sup.handle(group_event(0, 2, START, None))
    steps((0, 1), 0, range(1, 7))
    c4 = str(ckpt(sup.run.checkpoints, 4, attempt=0))
    sup.handle(group_event(1, 1, RESTART, c4, before=2))  # the node of rank 1 was lost
    steps((0,), 1, range(5, 30))
    filed = [json.loads(x) for x in sup.run.events.read_text().splitlines()]
    assert [e for e in filed if e["name"] == "straggler"] == []
    assert sup.state.plan.world_size == 1


def test_the_straggler_check_can_fail_here(tmp_path: Path) -> None:
    """The same run without the group's restart: rank 1 trails the leader and is flagged."""
    from steadytune.records import StepRecord

    sup = supervisor(tmp_path)
    for n in range(1, 7):
        sup.handle(StepRecord(step=n, ts=float(n), rank=1, loss=2.0, grad_norm=1.0, step_time_s=1.0))
    for n in range(1, 30):
        sup.handle(StepRecord(step=n, ts=float(n), rank=0, loss=2.0, grad_norm=1.0, step_time_s=1.0))
    filed = [json.loads(x) for x in sup.run.events.read_text().splitlines()]
    assert [e["data"].get("rank", 1) for e in filed if e["name"] == "straggler"]


def test_a_smaller_group_accumulates_more_so_the_effective_batch_stays() -> None:
    from steadytune.engines.groups import accumulation_for

    assert accumulation_for(2, at_world_size=4, world_size=2) == (4, True)
    assert accumulation_for(4, at_world_size=2, world_size=4) == (2, True)
    assert accumulation_for(1, at_world_size=2, world_size=1) == (2, True)
    # 3 micro-batches cannot split in 2
    assert accumulation_for(1, at_world_size=3, world_size=2) == (2, False)


def test_a_groups_accumulation_is_part_of_its_revision() -> None:
    plan = PlanRevision(
        revision=1, ts=0.0, reason="world_size", attempt=0, world_size=1, gradient_accumulation_steps=2
    )
    grown = {
        "world_size": 2,
        "attempt": 1,
        "reason": RESIZE,
        "gradient_accumulation_steps": 1,
        "previous_world_size": 1,
    }
    changes = group_revision(plan, grown, 0)
    assert changes is not None and changes["gradient_accumulation_steps"] == 1 and changes["world_size"] == 2
    assert "gradient accumulation 1" in changes["notes"]
    same = {"world_size": 1, "attempt": 0, "gradient_accumulation_steps": 2}
    assert group_revision(plan, same, 0) is None
