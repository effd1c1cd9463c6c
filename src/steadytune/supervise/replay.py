"""A restart's detection replay: the detectors rebuilt from the kept history, from a saved state on.

A restart (a new attempt after a crash, a hang or a rollback) goes on judging the run with the
detectors it had at the resume step: their baselines, levels and open episodes are rebuilt by
feeding them the step records of the run's timeline up to that step, the latest attempt of each
step (a later attempt may go back to any checkpoint). Fed from the run's start, that cost grew with
the run: ~8 s of CPU per 100k steps, a minute and a half at 1M steps before the worker started.

So every replay leaves the state it built beside the run (``replay-state/``, JSON:
:mod:`.detector_state`), with where it stopped reading each stream: just after the last record it
fed. The next replay starts from the newest state at or before its resume step that it can trust,
and reads only what the streams gained after those places. That is the whole-run replay, not an
approximation of it: every rule keeps what it knew of the whole run (its counts since the start,
its fit from the first step). A state is not used, and the one before it (or the run's start)
is, where

- its file fails :func:`~.detector_state.load`'s checks (another version of the detectors,
  another detection config, damage);
- it names a stream the replay does not read (a job that shrank), or
- a stream has, after its place, a step record at or before the state's step: a later attempt went
  back before it (a rollback), so the timeline the state was built on is no longer the run's.

The steps after a state are those the attempts after it wrote: an attempt that resumes logs every
step it passes again, so a step's latest attempt is found there (in one case the whole-run rule
decided otherwise: an attempt that logs other steps than the one it replaced, whose old records of
the steps the new one does not log the whole-run rule went on feeding).

The ranks' records are fed merged by step (ties in the streams' order), as the live supervisor
takes them in (:func:`~.intake.in_step`): the records of a state's steps all come before those
after it, so a replay from a state is the replay from the start.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steadytune.detect.live import LiveDetector
from steadytune.records import StepRecord, from_dict, step_head
from steadytune.rundir import RunDir, atomic_write_text
from steadytune.supervise import detector_state
from steadytune.supervise.detector_state import StateError
from steadytune.telemetry.jsonl import JsonlReader, parse_line

log = logging.getLogger(__name__)

STATE_DIR = "replay-state"
KEEP_STATES = 8  # the newest states kept (a rollback to an older checkpoint starts from one of them)
# The supervisor keeps the state only past this step: before it a restart's whole replay costs under
# ~2 s of CPU, less than keeping the state up (each step replayed once more, ~0.1 ms) would.
KEEP_FROM_STEP = 20_000
# Nor does it catch up further than this in one go (~20 s of CPU in its thread): a long run it has no
# state of (a supervisor that adopted it) is replayed whole by its first restart, once.
KEEP_UP_MAX_STEPS = 200_000
# Nor more often than every this many steps: a catch-up loads and writes the state (~0.07 s of CPU)
# besides replaying its steps (~0.1 ms each), so with a save every 300 steps the state's own load and
# write cost twice its steps. A restart then replays at most this many steps more (~0.2 s).
KEEP_EVERY_STEPS = 2_000
Position = tuple[int, int]  # a stream's (segment, offset): JsonlReader.position
_START: Position = (1, 0)


@dataclass
class Replay:
    """What a replay built, and from where: ``from_step`` is the saved state's step (None: the start)."""

    detector: LiveDetector
    from_step: int | None
    fed: int  # step records fed to the detector


def replay_detector(run: RunDir, config: Any, upto_step: int, world_size: int | None = None) -> LiveDetector:
    """A detector fed the run's step records up to ``upto_step``, latest attempt of each step
    (:func:`replay`)."""
    return replay(run, config, upto_step, world_size).detector


def replay(run: RunDir, config: Any, upto_step: int, world_size: int | None = None) -> Replay:
    """The detectors rebuilt up to ``upto_step``: from the newest saved state they can trust (the
    module's docstring), else from the run's start; the state they end with is saved for the next.

    With ``world_size``, ranks at or past it are left out: a job that shrank no longer has them, and
    a rank that is gone must not read as one that trails (a straggler).
    """
    paths = [p for p in run.telemetry_files() if world_size is None or int(p.stem.split("-")[1]) < world_size]
    for path, step in saved_states(run, upto_step):
        loaded = _from_state(path, config, paths)
        if loaded is None:
            continue
        start, det = loaded
        done = feed(det, paths, start, upto_step, after=step)
        if done is None:
            log.info("%s: a later attempt went back before step %d; an older state is used", path.name, step)
            continue
        save_state(run, det, config, upto_step, done[0])
        return Replay(det, step, done[1])
    fresh = LiveDetector(config)
    done = feed(fresh, paths, {}, upto_step)
    assert done is not None  # only a state's own steps can be rewritten
    save_state(run, fresh, config, upto_step, done[0])
    return Replay(fresh, None, done[1])


def _from_state(
    path: Path, config: Any, paths: list[Path]
) -> tuple[dict[str, Position], LiveDetector] | None:
    """A saved state's detector and the place of each stream it read, or None (logged) if untrusted."""
    try:
        det, meta = detector_state.load(path.read_bytes(), config, LiveDetector)
        places = meta.get("streams")
        if not isinstance(places, dict):
            raise StateError("no stream places")
        start = {str(k): _position(v) for k, v in places.items()}
        gone = set(start) - {p.name for p in paths}
        if gone:
            raise StateError(f"built on streams this replay does not read: {', '.join(sorted(gone))}")
    except (OSError, StateError) as e:
        log.warning("detector state %s not used (%s): replaying from an older one or the start", path, e)
        return None
    return start, det


def _position(v: Any) -> Position:
    if not (isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= 0 for x in v)):
        raise StateError(f"bad stream place {v!r}")
    return v[0], v[1]


def feed(
    det: LiveDetector, paths: list[Path], start: dict[str, Position], upto_step: int, after: int | None = None
) -> tuple[dict[str, Position], int] | None:
    """Feed ``det`` the latest attempt of each step in ``(after, upto_step]`` that the streams hold after
    their ``start`` places (a stream not named there: from its beginning), merged by step.

    Returns each stream's place just after the last record fed (its start where none was) and the
    records fed, or None
    where, with ``after``, a stream holds a step record at or before ``after`` past its start.
    """
    latest: list[dict[int, int]] = []
    for path in paths:
        found = latest_attempts(path, upto_step, start.get(path.name, _START), after)
        if found is None:
            return None
        latest.append(found)
    ends = {path.name: start.get(path.name, _START) for path in paths}
    streams = [
        _records(path, start.get(path.name, _START), want, i)
        for i, (path, want) in enumerate(zip(paths, latest, strict=True))
    ]
    fed = 0
    for _, i, rec, place in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
        det.observe_step(rec)
        ends[paths[i].name] = place
        fed += 1
    return ends, fed


def _records(
    path: Path, start: Position, want: dict[int, int], index: int
) -> Iterator[tuple[int, int, StepRecord, Position]]:
    """The records ``want`` names (step: attempt) in ``path`` after ``start``, each with its end."""
    reader = JsonlReader(path, start[1], segment=start[0])
    for raw in reader.raw_lines():
        if raw is None:
            continue
        head = step_head(raw)
        if head is not None and (not head or want.get(head[0]) != head[-1]):
            continue  # no step record, or not the step's latest attempt: not parsed
        rec = _step_record(raw)
        if rec is not None and want.get(rec.step) == rec.attempt:
            yield rec.step, index, rec, reader.position


def _step_record(raw: bytes) -> StepRecord | None:
    """The line's step record if it is one and no eval."""
    value = parse_line(raw)
    try:
        rec = from_dict(value) if isinstance(value, dict) else None
    except (ValueError, TypeError):
        return None
    return rec if isinstance(rec, StepRecord) and not rec.extra.get("eval") else None


def latest_attempts(
    path: Path, upto_step: int, start: Position = _START, after: int | None = None
) -> dict[int, int] | None:
    """The latest attempt of each (non-eval) step in ``(after, upto_step]`` in the stream ``path`` after
    ``start``; None where, with ``after``, a step record at or before ``after`` is found there.

    Most lines are step records as :func:`~steadytune.records.to_json` writes them, whose step and
    attempt are read off the line's head (:func:`~steadytune.records.step_head`) without parsing
    the rest: parsed whole, this look cost as much as the replay's own parse. Any other line is
    parsed, so the answer is that of reading every record.
    """
    latest: dict[int, int] = {}
    for raw in JsonlReader(path, start[1], segment=start[0]).raw_lines():
        if raw is None:
            continue
        head = step_head(raw)
        if head is None:
            rec = _step_record(raw)
            if rec is None:
                continue
            head = rec.step, rec.attempt
        elif not head:
            continue  # surely no step record
        step, attempt = head
        if after is not None and step <= after:
            return None
        if step <= upto_step:
            latest[step] = max(attempt, latest.get(step, -1))
    return latest


def state_dir(run: RunDir) -> Path:
    return run.root / STATE_DIR


def saved_states(run: RunDir, upto_step: int) -> list[tuple[Path, int]]:
    """The saved states of steps at or before ``upto_step``, newest first."""
    found = []
    try:
        names = list(state_dir(run).glob("detector-*.json"))
    except OSError:
        return []
    for path in names:
        digits = path.stem.removeprefix("detector-")
        if digits.isdigit() and int(digits) <= upto_step:
            found.append((path, int(digits)))
    return sorted(found, key=lambda x: -x[1])


def save_state(run: RunDir, det: LiveDetector, config: Any, step: int, ends: dict[str, Position]) -> None:
    """Save ``det`` as the state at ``step``; states after it (a timeline left behind) and all but the
    newest :data:`KEEP_STATES` are removed. A state that cannot be written is only logged: the next
    replay starts from an older one."""
    folder = state_dir(run)
    try:
        text = detector_state.dump(
            det, config, {"step": step, "streams": {k: list(v) for k, v in ends.items()}}
        )
        atomic_write_text(folder / f"detector-{step:010d}.json", text, durable=False)
    except (OSError, StateError, RecursionError) as e:
        log.warning(
            "the detectors' state at step %d was not saved (%s): the next restart replays more", step, e
        )
        return
    kept = 0
    for path, s in sorted(
        ((p, int(p.stem.removeprefix("detector-"))) for p in folder.glob("detector-*.json")
         if p.stem.removeprefix("detector-").isdigit()),
        key=lambda x: -x[1],
    ):  # fmt: skip
        kept += s <= step
        if s > step or kept > KEEP_STATES:
            path.unlink(missing_ok=True)


class StateKeeper:
    """Brings the run's saved state up to a step, in a thread of its own, one catch-up at a time."""

    def __init__(
        self,
        run: RunDir,
        config: Any,
        from_step: int = KEEP_FROM_STEP,
        max_steps: int = KEEP_UP_MAX_STEPS,
        every: int = KEEP_EVERY_STEPS,
    ) -> None:
        self.run, self.config = run, config
        self.from_step, self.max_steps, self.every = from_step, max_steps, every
        self._thread: threading.Thread | None = None

    def keep_up(self, step: int) -> bool:
        """Start a catch-up to ``step``; False where none is needed (the state is newer, or fewer than
        ``every`` steps older), one is under way, or it is too far."""
        if (self._thread is not None and self._thread.is_alive()) or step < self.from_step:
            return False
        newest = saved_states(self.run, 1 << 62)
        since = newest[0][1] if newest else 0
        if since >= step or step - since > self.max_steps or (newest and step - since < self.every):
            return False
        self._thread = threading.Thread(target=self._catch_up, args=(step,), name="replay-state", daemon=True)
        self._thread.start()
        return True

    def _catch_up(self, step: int) -> None:
        try:
            replay(self.run, self.config, step)
        except Exception:  # the next restart replays from an older state: nothing is lost but time
            log.exception("keeping the detectors' state up to step %d failed", step)

    def wait(self) -> None:
        """Until the catch-up under way (if any) is over: a replay starting now starts from its state."""
        if self._thread is not None:
            self._thread.join()
