"""An operator's stop under way is not turned into a kill by a rollback or a restart decided meanwhile.

SIGTERM to the supervisor asks the worker to save at its next step and exit; an anomaly of the
steps it trains before that boundary must not kill it for a new attempt, or the checkpoint the
stop asked for, and the stop's acknowledgement, are lost. Here the worker is a real idle process that,
like a trainer saving before it exits, outlives the stop's SIGTERM: only a kill would end it.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadytune.policy.engine import Action
from steadytune.records import Anomaly, StepRecord
from steadytune.supervise.process import WorkerProcess

from .test_publish_wait import Clock, names, sealed, spike_at_22, supervisor


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    ready = tmp_path / "ignoring-sigterm"
    code = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(120)"
    )
    proc = WorkerProcess([sys.executable, "-c", code, str(ready)], tmp_path / "w.log", env={})
    # Under load the interpreter can take seconds to start: a SIGTERM sent before it ignores
    # the signal would end it, as no trainer that saves before it exits would end.
    deadline = time.monotonic() + 60.0
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the worker never started"
        time.sleep(0.01)
    yield proc
    proc.kill()


@pytest.mark.parametrize("name", ["rollback", "restart"])
def test_an_action_decided_while_stopping_is_filed_not_carried_out(
    tmp_path: Path, worker: WorkerProcess, name: str
) -> None:
    sup = supervisor(tmp_path, Clock())
    sup.state.attempt.worker = worker
    sealed(sup, 10)
    for n in range(1, 23):
        sup.handle(StepRecord(step=n, ts=float(n), loss=1.0, grad_norm=1.0, batch=None))
    sup.controls.on_signal(signal.SIGTERM)
    sup.tick()  # the loop's turn that requests the stop
    bad = Anomaly("grad_explosion", "critical", 22, 22, "grad_norm")
    sup.actions.execute(Action(name, "grad_explosion at step 22", 22, bad))
    assert sup.state.pending is None
    assert worker.poll() is None, "the worker was killed while it saved to stop"
    filed = names(sup)
    # Filed after the stop, whatever else the loop said since (its place among them moved under load).
    assert "alert_only" in filed[filed.index("stop_requested") :] and name not in filed


def test_a_rollback_held_for_a_publish_is_not_released_into_a_stop(
    tmp_path: Path, worker: WorkerProcess
) -> None:
    clock = Clock()
    sup = supervisor(tmp_path, clock)
    spike_at_22(sup, worker)  # held: checkpoint-20 is still being published
    assert sup.publishes.held is not None
    sup.controls.on_signal(signal.SIGTERM)
    sup.tick()  # the loop's turn that requests the stop
    clock.now += 600.0  # past the publish wait: the hold gives the rollback back
    sup.tick()
    assert sup.publishes.held is None
    assert worker.poll() is None, "the held rollback killed the worker while it saved to stop"
