"""Faults that hold the worker, or a publish, until the supervisor has filed an event: no fixed time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from steadytune.guard.faults import Faults
from steadytune.telemetry.events import EventLog

BACKSTOP_S = 60.0  # a hold that ignored its event would sit it out


def log(tmp_path: Path) -> EventLog:
    return EventLog(tmp_path / "events.jsonl", "run", audit=False)


def held(fn: object, *args: object) -> float:
    start = time.monotonic()
    fn(*args)  # type: ignore[operator]
    return time.monotonic() - start


def test_a_hold_ends_once_the_event_is_filed_however_late(tmp_path: Path) -> None:
    events = log(tmp_path)
    faults = Faults(hold_at_step=22, hold_s=BACKSTOP_S, hold_until_event="publish_awaited")
    filer = threading.Thread(target=lambda: (time.sleep(0.3), events.emit("action", "publish_awaited")))
    filer.start()
    waited = held(faults.after_step, 22, 0, events.path)
    filer.join()
    assert waited < BACKSTOP_S / 2


def test_an_event_filed_before_the_hold_began_ends_it_at_once(tmp_path: Path) -> None:
    # The supervisor may answer while the worker is descheduled between its record and its hold.
    events = log(tmp_path)
    events.emit("control", "rollback")
    faults = Faults(hold_at_step=22, hold_s=BACKSTOP_S, hold_until_event="control:rollback")
    assert held(faults.after_step, 22, 0, events.path) < BACKSTOP_S / 2


def test_kind_and_name_tell_the_request_from_the_decision(tmp_path: Path) -> None:
    # The policy's "rollback" action is filed before the request is queued: it must not end the hold.
    events = log(tmp_path)
    events.emit("action", "rollback")
    faults = Faults(hold_at_step=22, hold_s=0.3, hold_until_event="control:rollback")
    assert held(faults.after_step, 22, 0, events.path) >= 0.3  # sat out its backstop
    events.emit("control", "rollback")
    assert held(faults.after_step, 22, 0, events.path) < 0.3
    # A bare name matches any kind.
    bare = Faults(hold_at_step=22, hold_s=BACKSTOP_S, hold_until_event="rollback")
    assert held(bare.after_step, 22, 0, events.path) < BACKSTOP_S / 2


def test_the_hold_is_only_at_its_step_and_in_its_attempt(tmp_path: Path) -> None:
    events = log(tmp_path)
    faults = Faults(hold_at_step=22, hold_s=BACKSTOP_S, hold_until_event="restart")
    assert held(faults.after_step, 21, 0, events.path) < BACKSTOP_S / 2
    assert held(faults.after_step, 22, 1, events.path) < BACKSTOP_S / 2


def test_a_publish_is_held_in_its_window_until_the_event_then_fails_if_told(tmp_path: Path) -> None:
    events = log(tmp_path)
    faults = Faults(slow_save_step=20, slow_save_until_event="publish_awaited", fail_save_step=20)
    done: list[BaseException] = []

    def publish() -> None:
        try:
            faults.in_save_window(20, 0, events.path)
        except OSError as e:
            done.append(e)

    publisher = threading.Thread(target=publish)
    publisher.start()
    publisher.join(0.3)
    assert publisher.is_alive() and not done  # held: nothing filed yet
    events.emit("action", "publish_awaited")
    publisher.join(BACKSTOP_S)
    assert not publisher.is_alive()
    assert [type(e).__name__ for e in done] == ["InjectedSaveFailure"]
    assert held(faults.in_save_window, 10, 0, events.path) < BACKSTOP_S / 2  # another step's save is not held
