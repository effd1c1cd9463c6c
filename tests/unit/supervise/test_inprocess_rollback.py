"""When a rollback may stay inside the running worker, and when its process must be restarted.

The rollback itself, in real runs, is tests/integration/test_inprocess_rollback.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from steadytune.policy.engine import Action
from steadytune.protocol import ControlError, check_request
from steadytune.records import Anomaly, PlanRevision
from steadytune.supervise.process import WorkerProcess
from steadytune.train.rollback import refusal
from tests.unit.supervise.build import supervisor


def rollback(kind: str) -> Action:
    return Action("rollback", f"{kind} at step 12", 12, Anomaly(kind, "critical", 12, 12, "loss"))


@pytest.fixture
def live_worker(tmp_path: Path):
    proc = WorkerProcess([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "w.log", env={})
    yield proc
    proc.kill()


def test_a_healthy_single_worker_rolls_back_in_process_and_anything_else_restarts(
    tmp_path: Path, live_worker: WorkerProcess
) -> None:
    sup = supervisor(tmp_path)
    assert sup.in_process.refusal(rollback("loss_spike")) == "no worker is running"
    sup.state.attempt.worker = live_worker
    assert sup.in_process.refusal(rollback("loss_spike")) is None
    assert sup.in_process.refusal(rollback("divergence")) is None
    for kind in ("nan_loss", "nonfinite_grad"):
        assert "non-finite state may have poisoned the process" in sup.in_process.refusal(rollback(kind))
    off = supervisor(tmp_path / "off", recover={"in_process_rollback": False})
    off.worker = live_worker
    assert off.in_process.refusal(rollback("loss_spike")) == "recover.in_process_rollback is off"
    ddp = supervisor(tmp_path / "ddp", run={"nproc_per_node": 2})
    ddp.worker = live_worker
    assert ddp.in_process.refusal(rollback("loss_spike")) == "the worker runs several processes"


def test_with_no_checkpoint_to_reload_the_rollback_is_the_restart_it_was(
    tmp_path: Path, live_worker: WorkerProcess
) -> None:
    sup = supervisor(tmp_path)
    sup.state.attempt.worker = live_worker
    assert sup.in_process.want(rollback("loss_spike")) and sup.state.pending is not None
    sup.in_process.tick()  # no checkpoint before step 12: the run would start over, so a new process does it
    assert sup.state.pending is not None and sup.in_process.awaited is None
    live_worker.wait(30)
    assert live_worker.poll() is not None, "the worker was not stopped for the restart"
    assert sup.in_process.take_fallback() is not None and sup.in_process.take_fallback() is None


def test_only_the_supervisor_may_ask_for_a_rollback() -> None:
    assert check_request("rollback", None, "policy:loss_spike") == {}
    with pytest.raises(ControlError, match=r"command 'rollback' .* is the supervisor's own"):
        check_request("rollback", None, "alice (cli)")
    with pytest.raises(ControlError) as err:
        check_request("reboot", None, "alice (cli)")
    assert "rollback" not in str(err.value)


def test_the_worker_refuses_to_reload_over_non_finite_state_or_a_new_shape() -> None:
    class Trained:
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.AdamW(model.parameters())

    trainer = Trained()
    trainer.model(torch.ones(1, 3)).sum().backward()
    trainer.optimizer.step()
    current = PlanRevision(revision=0, ts=0.0, reason="start", attempt=0)
    new = PlanRevision(
        revision=1, ts=1.0, reason="loss_spike", attempt=1, resume_checkpoint="/c/checkpoint-10"
    )
    policy = {"issuer": "policy:loss_spike"}
    assert refusal(policy, current, new, trainer) is None
    assert "not from the supervisor" in refusal({"issuer": "alice (cli)"}, current, new, trainer)
    assert "no rollback to a checkpoint" in refusal(policy, current, current, trainer)
    wider = PlanRevision(**{**new.__dict__, "per_device_train_batch_size": 2})
    assert refusal(policy, current, wider, trainer) == (
        "the plan changes what only a new process can: per_device_train_batch_size"
    )
    state = next(iter(trainer.optimizer.state.values()))
    state["exp_avg_sq"][0, 0] = float("inf")
    assert (
        refusal(policy, current, new, trainer)
        == "the optimizer state 'exp_avg_sq' is not finite: the process may be poisoned"
    )
    with torch.no_grad():
        trainer.model.weight[0, 0] = float("nan")
    assert (
        refusal(policy, current, new, trainer)
        == "the weight 'weight' is not finite: the process may be poisoned"
    )
