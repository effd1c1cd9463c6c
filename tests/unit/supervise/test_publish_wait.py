"""A rollback waits, within recover.publish_wait_s, for the checkpoint before its trouble that is still
being published, and says why when it goes further back.

The supervisor here runs on an injected clock with a real (idle) worker process and real sealed
checkpoints; the race in real training runs is tests/integration/test_publish_race.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadytune.checkpoint.store import publish
from steadytune.config.load import ConfigError, validate_dict
from steadytune.policy.engine import Action
from steadytune.policy.plan import publish_to_await
from steadytune.records import Anomaly, Event, StepRecord
from steadytune.rundir import RunDir
from steadytune.supervise.process import WorkerProcess
from steadytune.supervise.supervisor import Supervisor
from steadytune.telemetry.events import read_events


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_rollback_waits_only_for_the_checkpoint_it_would_take() -> None:
    # checkpoint-20 is on its way and the spike is at 22: wait for it.
    assert publish_to_await(22, [10], [], {20}) == 20
    # Nothing on its way, or only a checkpoint from the trouble itself or after it: choose now.
    assert publish_to_await(22, [10, 20], [], set()) is None
    assert publish_to_await(22, [10, 20], [], {30}) is None
    assert publish_to_await(20, [10], [], {20}) is None
    # The trouble came back after a rollback to 20: the next one goes further back, so 20 is not awaited.
    assert publish_to_await(22, [10], [20], {20}) is None
    # Of two on their way (an older one a crash left unfinished), only the newest is awaited.
    assert publish_to_await(35, [10], [], {20, 30}) == 30


def supervisor(tmp_path: Path, clock: Clock, **recover: object) -> Supervisor:
    data: dict = {
        "model": {"name_or_path": str(tmp_path / "model")},
        "method": "full",
        "data": {"train_file": str(tmp_path / "train.jsonl")},
        "train": {"learning_rate": 1e-4, "max_steps": 100, "save_steps": 10},
        "run": {"runs_dir": str(tmp_path / "runs")},
        "recover": {"in_process_rollback": False, **recover},
    }
    cfg = validate_dict(data, base=tmp_path, check_paths=False)
    return Supervisor(cfg, RunDir(tmp_path / "runs" / "r"), observers=[], poll_s=0.05, clock=clock)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    proc = WorkerProcess([sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "w.log", env={})
    yield proc
    proc.kill()


def sealed(sup: Supervisor, step: int) -> None:
    """A checkpoint published the way the worker publishes one: staged, sealed, renamed, manifest."""
    staged = sup.run.staging / f"checkpoint-{step}"
    staged.mkdir(parents=True)
    (staged / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    publish(staged, sup.run.checkpoints, step)


def reported(sup: Supervisor, name: str, step: int, **data: object) -> None:
    sup.handle(Event(ts=sup.state.clock(), kind="lifecycle", name=name, step=step, data=dict(data)))


def spike_at_22(sup: Supervisor, worker: WorkerProcess) -> Action:
    """Checkpoint-10 saved, checkpoint-20 still being published when step 22 spikes."""
    sup.state.attempt.worker = worker
    sealed(sup, 10)
    reported(sup, "checkpoint_publishing", 10)
    reported(sup, "checkpoint_saved", 10, path=str(sup.run.checkpoints / "checkpoint-10"))
    reported(sup, "checkpoint_publishing", 20)
    staged = sup.run.checkpoints / "checkpoint-20"  # renamed, its manifest not written yet
    staged.mkdir()
    for n in range(1, 23):
        sup.handle(StepRecord(step=n, ts=float(n), loss=1.0, grad_norm=1.0, batch=None))
    spike = Anomaly("loss_spike", "critical", 22, 22, "loss")
    action = Action("rollback", "loss_spike at step 22", 22, spike)
    sup.actions.execute(action)
    return action


def names(sup: Supervisor) -> list[str]:
    return [e.name for e in read_events(sup.run.events)]


def test_the_rollback_is_held_until_the_checkpoint_is_verified_then_goes_back_to_it(
    tmp_path: Path, worker: WorkerProcess
) -> None:
    clock = Clock()
    sup = supervisor(tmp_path, clock)
    action = spike_at_22(sup, worker)
    assert sup.state.pending is action and sup.publishes.held is not None
    assert "publish_awaited" in names(sup)
    clock.now += 30.0
    sup.tick()
    assert worker.poll() is None, "the worker was killed while its checkpoint was still being published"
    assert "checkpoint_corrupt" not in names(sup), "a checkpoint on its way was reported as corrupt"
    (sup.run.checkpoints / "checkpoint-20").rmdir()
    sealed(sup, 20)
    reported(sup, "checkpoint_saved", 20, path=str(sup.run.checkpoints / "checkpoint-20"))
    sup.tick()
    assert sup.publishes.held is None and sup.state.pending is action
    assert worker.wait(30) is not None  # the restart path's kill, now
    changes, _, why = sup.plan_after_action(action, None)  # type: ignore[arg-type]
    assert changes is not None and Path(changes["resume_checkpoint"]).name == "checkpoint-20"
    assert "not checkpoint-" not in why


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        ("failed", "its publish failed (OSError: No space left on device)"),
        ("timeout", "still being published after 60s (recover.publish_wait_s)"),
        ("exited", "the worker exited before its publish finished"),
    ],
)
def test_a_publish_that_does_not_finish_sends_the_rollback_further_back_and_says_why(
    tmp_path: Path, worker: WorkerProcess, outcome: str, reason: str
) -> None:
    clock = Clock()
    sup = supervisor(tmp_path, clock)
    action = spike_at_22(sup, worker)
    if outcome == "failed":
        reported(sup, "checkpoint_publish_failed", 20, error="OSError: No space left on device")
    elif outcome == "timeout":
        clock.now += 59.0
        sup.tick()
        assert sup.publishes.held is not None
        clock.now += 1.0
    else:
        worker.kill()
    sup.tick()
    assert sup.publishes.held is None and sup.state.pending is action
    assert worker.wait(30) is not None
    changes, _, why = sup.plan_after_action(action, None)  # type: ignore[arg-type]
    assert changes is not None and Path(changes["resume_checkpoint"]).name == "checkpoint-10"
    assert f"not checkpoint-20: {reason}" in why
    # A half-published checkpoint of a worker that is gone is what it is: never a resume point.
    sup.state.attempt.worker = None
    assert Path(sup.resumes.resume_point() or "").name == "checkpoint-10"
    corrupt = [e for e in read_events(sup.run.events) if e.name == "checkpoint_corrupt"]
    assert [e.step for e in corrupt] == [20]


def test_with_no_wait_configured_the_rollback_goes_at_once(tmp_path: Path, worker: WorkerProcess) -> None:
    sup = supervisor(tmp_path, Clock(), publish_wait_s=0)
    spike_at_22(sup, worker)
    assert sup.publishes.held is None and "publish_awaited" not in names(sup)
    assert worker.wait(30) is not None


def test_a_bad_wait_is_a_config_error_naming_key_value_and_fix() -> None:
    data = {"model": {"name_or_path": "m"}, "data": {"train_file": "t"}, "recover": {"publish_wait_s": -5}}
    with pytest.raises(ConfigError) as err:
        validate_dict(data, base=Path("."), check_paths=False)
    text = str(err.value)
    assert "recover.publish_wait_s" in text and "(got -5)" in text
    assert "Fix:" in text and "0: never wait" in text
