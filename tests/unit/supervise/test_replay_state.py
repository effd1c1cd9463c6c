"""A restart's replay from a saved detector state: it reads only what the streams gained since the
state, decides what the replay from the run's start decides, and never trusts a state it should not
(another timeline, another config, a damaged or hostile file)."""

from __future__ import annotations

import json
import math
import random
import shutil
from array import array
from pathlib import Path

import pytest

from steadytune.config.detect import DetectConfig
from steadytune.detect.episodes import Transition
from steadytune.detect.live import LiveDetector
from steadytune.records import StepRecord
from steadytune.rundir import RunDir
from steadytune.supervise import detector_state
from steadytune.supervise.detector_state import StateError
from steadytune.supervise.replay import Replay, replay, saved_states
from steadytune.telemetry.stream import JsonlWriter


def _loss(n: int) -> float:
    return 2.0 / (1.0 + n / 300) + 0.5 + random.Random(n).gauss(0.0, 0.02)


def _step(n: int, attempt: int, rank: int = 0, loss: float | None = None) -> StepRecord:
    rng = random.Random(n * 7 + attempt + 1000 * rank)
    return StepRecord(
        step=n, ts=100.0 + n, rank=rank, attempt=attempt, loss=_loss(n) if loss is None else loss,
        grad_norm=1.0 + 0.1 * math.sin(n), lr=1e-4, step_time_s=0.5 + 0.01 * rng.random(),
        mem_allocated_bytes=2_000_000_000 + 1000 * n, extra={"batch_fp": f"{n:x}"},
    )  # fmt: skip


def _trouble(n: int, attempt: int, rank: int = 0) -> StepRecord:
    """A spike at 150, and a loss that climbs from 230 on: an episode open across a resume at 240."""
    if n == 150:
        return _step(n, attempt, rank, loss=9.0)
    return _step(n, attempt, rank, loss=_loss(n) * (1.0 + 0.05 * (n - 230)) if n > 230 else None)


def _append(run: RunDir, attempt: int, steps: range, ranks: int = 1) -> None:
    for rank in range(ranks):
        with JsonlWriter(run.telemetry(rank)) as w:
            for n in steps:
                w.write(_trouble(n, attempt, rank))


def _after(upto: int) -> list[StepRecord]:
    out = [_step(n, 9) for n in range(upto + 1, upto + 40)] + [_step(upto + 40, 9, loss=30.0)]
    return out + [_step(n, 9, loss=20.0 + n) for n in range(upto + 41, upto + 80)]


def _decisions(det: LiveDetector, recs: list[StepRecord]) -> list[Transition]:
    return [t for rec in recs for t in det.observe_step(rec)]


def _from_start(run: RunDir, upto: int, tmp: Path) -> Replay:
    """The replay with no saved state: of a copy of the run without its states."""
    copy = RunDir(tmp / f"copy-{upto}")
    shutil.copytree(run.telemetry_dir, copy.telemetry_dir)
    done = replay(copy, DetectConfig(), upto)
    assert done.from_step is None
    return done


def _same(a: LiveDetector, b: LiveDetector, upto: int) -> None:
    assert a.open_anomalies() == b.open_anomalies()
    assert detector_state.encode(a) == detector_state.encode(b)  # every number of every rule
    got, want = _decisions(a, _after(upto)), _decisions(b, _after(upto))
    assert got == want and want


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_restart_replays_only_what_came_after_the_last_state_and_decides_as_from_the_start(
    tmp_path: Path, ranks: int
) -> None:
    run = RunDir(tmp_path / "run")
    _append(run, 0, range(1, 261), ranks)  # crashes at 260
    first = replay(run, DetectConfig(), 240)  # resumed from checkpoint-240
    assert first.from_step is None and first.fed == 240 * ranks
    assert first.detector.open_anomalies()  # the climb from 230 is open at the resume
    _append(run, 1, range(241, 421), ranks)  # crashes at 420
    second = replay(run, DetectConfig(), 400)
    assert (second.from_step, second.fed) == (240, 160 * ranks)  # not 400 per rank
    _same(second.detector, _from_start(run, 400, tmp_path).detector, 400)
    assert [s for _, s in saved_states(run, 10**9)] == [400, 240]


def test_a_rollback_before_the_state_replays_from_an_older_one_or_the_start(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    _append(run, 0, range(1, 201))
    replay(run, DetectConfig(), 100)
    _append(run, 0, range(201, 261))
    replay(run, DetectConfig(), 240)
    _append(run, 1, range(241, 301))
    assert [s for _, s in saved_states(run, 10**9)] == [240, 100]
    _append(run, 2, range(181, 321))  # a rollback to checkpoint-180: the timeline after it is rewritten
    back = replay(run, DetectConfig(), 300)
    assert (back.from_step, back.fed) == (100, 200)  # the state at 240 was built on steps rewritten
    _same(back.detector, _from_start(run, 300, tmp_path).detector, 300)
    _append(run, 3, range(51, 80))  # back before every state
    assert replay(run, DetectConfig(), 70).from_step is None
    assert [s for _, s in saved_states(run, 10**9)] == [70]  # the states of the timeline left are gone


def _one_state(tmp_path: Path) -> tuple[RunDir, Path]:
    run = RunDir(tmp_path / "run")
    _append(run, 0, range(1, 261))
    replay(run, DetectConfig(), 240)
    _append(run, 1, range(241, 301))
    ((path, _),) = saved_states(run, 300)
    return run, path


_LIVE = LiveDetector.__module__


def _rewrite(path: Path, change: object) -> None:
    body = json.loads(path.read_text())
    body.pop("checksum")
    change(body)  # type: ignore[operator]
    path.write_text(json.dumps({**body, "checksum": detector_state._digest(body)}))


@pytest.mark.parametrize(
    "spoil",
    [
        lambda p: p.write_text(p.read_text()[:-200]),  # torn
        lambda p: p.write_text(p.read_text().replace('"level":0.', '"level":1.', 1)),  # a number changed
        lambda p: _rewrite(p, lambda b: b.update(code="0" * 64)),  # another version of the detectors
        lambda p: _rewrite(p, lambda b: b.update(format=99)),
        lambda p: _rewrite(p, lambda b: b["meta"].update(streams={"rank-7.jsonl": [1, 0]})),
        lambda p: _rewrite(p, lambda b: b["meta"].update(streams={"rank-0.jsonl": [1, -5]})),
        # A hostile file with its checksum made good: it names a class no detector holds.
        lambda p: _rewrite(p, lambda b: b["state"]["a"].update(x={"o": "os:system", "a": {}, "i": 99})),
        lambda p: _rewrite(p, lambda b: b.update(state={"fn": "subprocess:run"})),
        lambda p: _rewrite(p, lambda b: b.update(state={"o": f"{_LIVE}:X", "a": [], "i": 0})),
        lambda p: _rewrite(p, lambda b: b.update(state={"o": f"{_LIVE}:LiveDetector", "a": []})),  # no id
    ],
)  # fmt: skip
def test_a_state_that_cannot_be_trusted_is_not_used(tmp_path: Path, spoil: object) -> None:
    run, path = _one_state(tmp_path)
    spoil(path)  # type: ignore[operator]
    done = replay(run, DetectConfig(), 300)
    assert done.from_step is None and done.fed == 300
    _same(done.detector, _from_start(run, 300, tmp_path).detector, 300)


def test_a_state_built_under_another_config_is_not_used(tmp_path: Path) -> None:
    run, _ = _one_state(tmp_path)
    other = DetectConfig.model_validate({"loss": {"spike_z": 9.0}})
    assert replay(run, other, 300).from_step is None
    assert replay(run, other, 300).from_step == 300


def test_what_a_state_may_name_is_the_detection_code() -> None:
    for bad in ({"c": "os:system"}, {"fn": "steadytune.supervise.actions:execute"}, {"o": "builtins:dict"}):
        with pytest.raises(StateError):
            detector_state.decode(bad)
    with pytest.raises(StateError):
        detector_state.encode(lambda: 0)


def test_a_set_encodes_the_same_whatever_its_history_and_arrays_come_back() -> None:
    # A set of strings iterates in an order its hashes and its history choose: the state read
    # back must encode as written, or every restart falls back to a whole replay.
    names = [f"kind_{i}" for i in range(40)]
    grown = set(names)
    shrunk = set(names + [f"gone_{i}" for i in range(200)])
    for i in range(200):
        shrunk.discard(f"gone_{i}")
    assert detector_state.encode(grown) == detector_state.encode(shrunk)
    assert detector_state.encode(frozenset(reversed(names))) == detector_state.encode(frozenset(names))
    values = array("d", [1.5, -2.0, math.inf])
    back = detector_state.decode(detector_state.encode([values, values]))
    assert back[0] == values and back[0] is back[1]
    with pytest.raises(StateError):
        detector_state.decode({"ar": "u", "v": ["x"], "i": 0})


def test_the_supervisor_keeps_the_state_one_checkpoint_behind_so_a_restart_replays_one_interval(
    tmp_path: Path,
) -> None:
    from steadytune.records import Event
    from tests.unit.supervise.build import supervisor

    sup = supervisor(tmp_path)
    run = sup.run
    sup.resumes.keeper.from_step = 1  # from the first save (20,000 steps in a real run)
    sup.resumes.keeper.every = 1  # at every save (every 2,000 steps at most in a real run)
    for save in (100, 200, 300):
        _append(run, 0, range(save - 99, save + 1))
        (run.checkpoints / f"checkpoint-{save}").mkdir(parents=True)
        sup.handle(Event(ts=float(save), kind="lifecycle", name="checkpoint_saved", step=save))
        sup.resumes.keeper.wait()
        # The state is that of the save before: every rank has written its step by now.
        assert [s for _, s in saved_states(run, 10**9)] == list(range(save - 100, 0, -100))
    _append(run, 0, range(301, 321))  # the worker dies at 320
    assert replay(run, DetectConfig(), 300).fed == 100  # from the state at 200, not from the start
    sup.resumes.rewind(str(run.checkpoints / "checkpoint-300"))
    whole = _from_start(run, 300, tmp_path).detector
    whole.settle_episodes()  # as the rewind does: the episodes of the replayed steps were told
    assert detector_state.encode(sup.state.detector) == detector_state.encode(whole)


def test_the_state_is_brought_up_at_most_every_so_many_steps(tmp_path: Path) -> None:
    """A save every 100 steps, the state kept every 250 at most: a catch-up's own load and write are
    paid once per 250 steps, and a restart replays at most 250 + 100 steps from a state."""
    from steadytune.records import Event
    from tests.unit.supervise.build import supervisor

    sup = supervisor(tmp_path)
    run = sup.run
    sup.resumes.keeper.from_step, sup.resumes.keeper.every = 1, 250
    for save in range(100, 1100, 100):
        _append(run, 0, range(save - 99, save + 1))
        (run.checkpoints / f"checkpoint-{save}").mkdir(parents=True)
        sup.handle(Event(ts=float(save), kind="lifecycle", name="checkpoint_saved", step=save))
        sup.resumes.keeper.wait()
    kept = sorted(s for _, s in saved_states(run, 10**9))
    assert kept == [100, 400, 700]  # the first state, then once 250 steps had passed since the last
    assert replay(run, DetectConfig(), 1000).fed == 300  # from the state at 700
