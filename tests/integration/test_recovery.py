"""Recovery, end to end: each drill fault in a real supervised run meets its target."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from steadytune.cli.demo import demo_config
from steadytune.drill.faults import DRILL_OVERRIDES, catalogue
from steadytune.drill.runner import final_loss, report, run_one, weights_finite
from steadytune.records import StepRecord
from steadytune.telemetry.events import read_events
from steadytune.telemetry.stream import iter_records

pytestmark = pytest.mark.slow
STEPS, SAVE = 80, 20


@pytest.fixture(scope="module")
def base(demo_assets: Path) -> dict:
    data = demo_config(demo_assets, "runs", STEPS, "full")
    data["train"].update({"max_steps": STEPS, "save_steps": SAVE, "eval_steps": STEPS, "logging_steps": 10})
    return data


@pytest.fixture(scope="module")
def clean_loss(base: dict, tmp_path_factory: pytest.TempPathFactory) -> float:
    result, _ = run_one(base, tmp_path_factory.mktemp("clean"), "clean", None)
    assert result.state == "completed" and weights_finite(result.run)
    loss = final_loss(result.run)
    assert loss is not None
    return loss.value


def check_detection_then_action(kind: str, spec, events: list) -> None:
    """What noticed the fault and what was done about it, as separate events: the detection at the step the
    fault shows, then the action, once (the drill's report counts an action as a detection too)."""
    at = spec.at_step
    anomalies = [e for e in events if e.kind == "anomaly" and e.severity in {"warning", "critical"}]
    acts = [e for e in events if e.kind == "action"]
    decided = [e for e in acts if e.name in spec.act and e.data.get("anomaly")]  # the policy acting on one
    # A worker restarted: a new process, or (a rollback of a healthy worker) inside the running one.
    restarts = [
        e for e in acts if e.name in {"restart", "rollback_in_process"} and "classification" in e.data
    ]
    if kind == "nan":
        # The guard skips the update in the worker as the step happens; the supervisor's detector then
        # raises on that step's record. Both name the poisoned step; nothing is restarted.
        (nan,) = [e for e in anomalies if e.name == "nan_loss"]
        (skip,) = [e for e in acts if e.name == "skip_step"]
        assert nan.step == skip.step == at and not restarts
        return
    if kind == "oom":
        # The out-of-memory error itself is the detection: the action records it, at the step it hit.
        (split,) = [e for e in acts if e.name == "reduce_microbatch"]
        assert (
            split.step == at
            and "out of memory" in split.data["error"]
            and split.data["micro_batch_split"] == 2
        )
        assert not anomalies and not restarts
        return
    (restart,) = restarts  # one restart for one fault
    if kind == "kill":
        # A SIGKILL leaves no anomaly: the supervisor sees the worker die and restarts it.
        assert restart.data["classification"] == "killed" and restart.data["returncode"] == -9
        assert at <= restart.step <= at + 5
        assert not anomalies and not decided
        return
    expected = {
        "spike": (
            {"loss_spike", "divergence", "grad_explosion", "grad_spike"},
            at + 1,
        ),  # the first loss after
        "hang": ({"stall"}, at),  # the last step the hung worker finished
        "kill-during-save": ({"checkpoint_corrupt"}, at),  # the torn checkpoint's step
        "corrupt-checkpoint": ({"checkpoint_corrupt"}, at),
    }
    names, step = expected[kind]
    first = next(e for e in anomalies if e.name in names)
    assert first.step == step, (first.name, first.step, step)
    if kind in {
        "spike",
        "hang",
    }:  # the supervisor stops the worker on purpose: one decision, after the anomaly
        assert [e.name for e in decided] == list(spec.act), [(e.name, e.step, e.message) for e in decided]
        assert first.seq < decided[0].seq < restart.seq and decided[0].step >= first.step
    else:  # a crash: the bad checkpoint is found while planning the restart, and skipped
        assert not decided and first.seq < restart.seq


def check_goodput(kind: str, rep, steps: list[StepRecord], measured_s: float) -> None:
    """The run's goodput account: its parts make up its wall time, and the fault cost what it should."""
    g = rep.goodput
    s, wall = g["seconds"], g["wall_s"]
    assert abs(g["productive_s"] + g["eval_s"] + g["lost_s"] - wall) <= 0.01 * wall, g
    assert 0.9 * measured_s <= wall <= measured_s, (wall, measured_s)  # the supervisor's start to its end
    assert s["unattributed"] <= 0.01 * wall, g
    # What survives is the run's steps, each its last attempt: their own time is productive, or in-process
    # recovery where a step's first try ran out of memory or its update was dropped.
    last: dict[int, StepRecord] = {}
    for r in steps:
        if r.step not in last or r.attempt >= last[r.step].attempt:
            last[r.step] = r
    assert g["steps_kept"] == STEPS == len(last)
    assert g["productive_s"] + s["recovery"] >= sum(r.step_time_s or 0.0 for r in last.values())
    assert g["steps_redone"] == rep.steps_redone  # the drill counts them from plans, the account from records
    assert s["eval"] > 0 and s["startup"] > 0  # the evaluation at the last step; the first load
    if kind in {"nan", "oom"}:
        assert s["recovery"] > 0 and s["redone"] == s["restart"] == 0 and g["interruptions"] == 0, g
        return
    assert g["interruptions"] == 1 and s["redone"] > 0, g
    if kind == "hang":
        assert s["hang"] >= DRILL_OVERRIDES["detect"]["pace"]["hang_floor_s"], g  # never called sooner
    if rep.rolled_back_in_process:
        assert s["recovery"] > 0 and s["restart"] == 0, g
    else:
        assert s["restart"] > 0, g


FAULTS = ["nan", "oom", "spike", "kill", "kill-during-save", "hang", "corrupt-checkpoint"]


@pytest.mark.parametrize("kind", FAULTS)
def test_fault_is_detected_and_recovered(kind: str, base: dict, clean_loss: float, tmp_path: Path) -> None:
    spec = catalogue(SAVE)[kind]
    started = time.time()
    result, ext = run_one(base, tmp_path, kind, spec)
    measured = time.time() - started
    rep = report(spec, result, ext)
    assert rep.detected, rep
    assert rep.recovered, rep  # completed, weights finite
    assert rep.action in spec.act, rep
    # A spike's rollback halves the LR for the rest of the run (policy), and the samples it skips
    # depend on when the incident was decided: the run ends measurably, not randomly, above the clean one.
    tolerance = 0.10 if kind == "spike" else 0.05
    assert abs(rep.final_loss / clean_loss - 1) <= tolerance, (rep.final_loss, clean_loss)
    limit = (
        2 * SAVE if kind == "corrupt-checkpoint" else SAVE
    )  # a corrupt newest checkpoint costs one more interval
    assert rep.steps_redone <= limit, rep
    steps = [
        r
        for r in iter_records(result.run.telemetry(0))
        if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]
    check_detection_then_action(kind, spec, read_events(result.run.events))
    check_goodput(kind, rep, steps, measured)
    if spec.in_process:
        assert rep.restarts == 0, rep  # no process restart for a NaN or a plain OOM
    if kind == "oom":
        # The effective batch never changed: every step still trained on 8 samples.
        assert {r.samples for r in steps} == {8}
        assert any(e.name == "reduce_microbatch" for e in read_events(result.run.events))
    if kind == "nan":
        skipped = [r.step for r in steps if r.skipped]
        assert skipped == [spec.at_step]
    if kind == "spike":
        plan = [line for line in result.run.plan.read_text().splitlines() if '"reason":"' in line][-1]
        assert '"lr_scale":0.5' in plan and '"skip_ranges":[[' in plan
        # And the optimizer really trains at half the LR: not the checkpoint's scheduler's rate.
        resumed = min((r for r in steps if r.attempt > 0), key=lambda r: r.step)
        before = max((r for r in steps if r.attempt == 0 and r.step < resumed.step), key=lambda r: r.step)
        assert resumed.lr is not None and before.lr is not None
        assert 0.4 < resumed.lr / before.lr < 0.6, (before.step, before.lr, resumed.step, resumed.lr)
    if kind == "hang":
        assert next(iter(result.run.stacks.glob("rank-0-attempt-0.txt"))).read_text().strip(), "no stack dump"
    if kind == "corrupt-checkpoint":
        names = [e.name for e in read_events(result.run.events)]
        assert "checkpoint_corrupt" in names
