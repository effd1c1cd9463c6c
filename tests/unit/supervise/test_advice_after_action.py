"""An anomaly's line says what steadytune did about it and what that leaves to people, never to do what
was just done: a NaN step the worker's guard skipped, a hang restarted after its stacks were dumped."""

from __future__ import annotations

import math
from pathlib import Path

from steadytune.alerts.message import alert_from_event
from steadytune.detect.build import KINDS
from steadytune.detect.live import Transition
from steadytune.policy.engine import Action
from steadytune.records import Anomaly, Event, StepRecord
from steadytune.supervise.source import SKIP_STEP
from steadytune.supervise.supervisor import Supervisor
from steadytune.telemetry.events import read_events
from tests.unit.supervise.build import FakeWorker, supervisor


def _events(sup: Supervisor, kind: str, name: str) -> list[Event]:
    return [e for e in read_events(sup.run.events) if e.kind == kind and e.name == name]


def test_a_nan_step_the_guard_skipped_is_told_as_done_with_what_is_left(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    for n in range(1, 201):  # long enough quiet after it for the episode to end
        bad = n == 25
        loss = math.nan if bad else 2.0 - 0.01 * n
        sup.handle(
            StepRecord(step=n, ts=float(n), loss=loss, grad_norm=math.nan if bad else 1.0, skipped=bad)
        )
    [raised] = _events(sup, "anomaly", "nan_loss")
    assert "Done: the update was not applied." in raised.message
    assert "Try:" not in raised.message and "skip the update" not in raised.message
    assert "use bf16 or a lower LR" in raised.message  # the part of the fix nobody did yet
    [resolved] = _events(sup, "resolved", "nan_loss")
    fix = alert_from_event(resolved).text()
    assert "fix:" in fix and "skip the update" not in fix and "use bf16 or a lower LR" in fix


def _stall(sup: Supervisor) -> Anomaly:
    sup.state.attempt.worker = FakeWorker()  # type: ignore[assignment]
    for n in range(1, 6):
        sup.handle(StepRecord(step=n, ts=float(n), loss=1.0, grad_norm=1.0))
    stall = Anomaly("stall", "critical", 5, 5, "step", {}, "a hang", "dump the stacks (py-spy dump); restart")
    sup.actions.on_transition(Transition("raised", stall))
    return stall


def test_a_hang_restarted_says_the_stacks_were_dumped_and_leaves_reading_them(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    stall = _stall(sup)
    [raised] = _events(sup, "anomaly", "stall")
    assert "Done:" in raised.message and "restarts from its last checkpoint" in raised.message
    assert "Try:" not in raised.message and "py-spy" not in raised.message
    assert "stacks/ folder for where it hung" in raised.message
    assert [e.name for e in read_events(sup.run.events) if e.kind == "action"] == ["restart"]
    sup.actions.on_transition(Transition("resolved", stall))
    [resolved] = _events(sup, "resolved", "stall")
    text = alert_from_event(resolved).text()
    assert "py-spy" not in text and "fix: read the stacks" in text


def test_where_nothing_is_done_the_kinds_own_fix_stands(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, policy={"mode": "observe"})
    _stall(sup)
    [raised] = _events(sup, "anomaly", "stall")
    assert "Try: dump the stacks (py-spy dump); restart." in raised.message and "Done:" not in raised.message


def _raise(sup: Supervisor, kind: str, rss: bool = True) -> str:
    """Five steps as a CPU worker records them (process memory only), then ``kind`` raised with its
    kind's usual cause: the message filed for it."""
    for n in range(1, 6):
        sup.handle(
            StepRecord(step=n, ts=float(n), loss=1.0, grad_norm=1.0, rss_bytes=1 << 30 if rss else None)
        )
    info = KINDS[kind]
    sup.actions.on_transition(
        Transition("raised", Anomaly(kind, info.severity, 5, 5, "grad_norm", {}, info.cause, info.suggestion))
    )
    [raised] = _events(sup, "anomaly", kind)
    return raised.message


def test_a_nan_norm_on_an_fp32_cpu_run_blames_no_loss_scaler(tmp_path: Path) -> None:
    said = _raise(supervisor(tmp_path, model={"dtype": "float32"}), "nonfinite_grad")
    assert "no loss scaler" in said and "fp16" not in said.split("Done:")[0]


def test_a_nan_norm_of_an_fp16_run_is_the_loss_scalers_skip(tmp_path: Path) -> None:
    said = _raise(supervisor(tmp_path, train={"fp16": True}), "nonfinite_grad")
    assert "fp16 overflow: the loss scaler skipped the step" in said


def test_a_hang_is_told_in_the_words_of_the_run(tmp_path: Path) -> None:
    one = _raise(supervisor(tmp_path / "one"), "stall")
    assert "collective" not in one and "NCCL" not in one.split("Done:")[0]
    two_cpu = _raise(supervisor(tmp_path / "two", run={"nproc_per_node": 2}), "stall")
    assert "a gloo collective a rank never joined" in two_cpu


def test_what_is_not_known_of_a_run_leaves_the_cause_that_holds_for_any(tmp_path: Path) -> None:
    """A command's own config is not steadytune's, and its log tells no device: the usual cause."""
    sup = supervisor(tmp_path)
    sup.state.source.abilities = frozenset({SKIP_STEP})  # type: ignore[misc]
    said = _raise(sup, "nonfinite_grad", rss=False)
    assert KINDS["nonfinite_grad"].cause in said


def test_every_action_the_policy_takes_by_default_in_place_of_a_fix_says_what_it_leaves() -> None:
    """A kind whose fix is the action itself (roll back, restart, skip the update) must say what is left
    once it is done; otherwise its line tells people to do it again."""
    from steadytune.config.policy import default_rules

    acted = {
        k: r.action for k, r in default_rules().items() if r.action in {"rollback", "restart", "skip_step"}
    }
    assert acted, "the default policy takes no such action any more"
    assert [k for k, name in acted.items() if name not in KINDS[k].after] == []


def test_an_action_that_does_not_fix_the_cause_leaves_the_whole_fix(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    done, left = sup.actions.advice("memory_leak", Action("reduce_microbatch", "leak", 5))
    assert done is not None and "smaller micro-batch" in done
    assert left == KINDS["memory_leak"].suggestion  # a smaller micro-batch does not find the leak
    done, left = sup.actions.advice("loss_spike", Action("rollback", "spike", 5))
    assert done is not None and "earlier checkpoint" in done and left is not None and "roll back" not in left
