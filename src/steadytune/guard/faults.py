"""Fault injection for drills and tests: switched on only by ``$STEADYTUNE_FAULTS``.

The variable holds JSON, e.g. ``{"step_sleep_s": 0.05, "nan_at_step": 12}``.
Without it every hook is a no-op. Faults fire in the first attempt only unless
``fault_attempts`` says otherwise, so a drill sees the recovery, not a loop.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steadytune.protocol import WorkerEvent

if TYPE_CHECKING:
    from steadytune.guard.core import Guard


class InjectedCrash(RuntimeError):
    """Raised by the ``crash_at_step`` fault."""


class InjectedSaveFailure(OSError):
    """Raised by the ``fail_save_step`` fault, inside the publish of that step's checkpoint."""


class _Trained:
    """The last optimizer step training ended, for a save held until a later one (off the training thread)."""

    def __init__(self) -> None:
        self.step = 0
        self.changed = threading.Condition()

    def ended(self, step: int) -> None:
        with self.changed:
            self.step = step
            self.changed.notify_all()

    def wait_for(self, step: int, timeout_s: float) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.step >= step, timeout=timeout_s)


def _await_event(events: Path | None, name: str, timeout_s: float, poll_s: float = 0.05) -> None:
    """Return once the run's event log ``events`` holds an event ``name`` (or after ``timeout_s``).

    ``name`` is an event's name, or ``kind:name`` where one name has several kinds (the policy's
    ``action`` ``rollback`` comes before the ``control`` ``rollback`` request is queued). Any such
    event counts, even one filed before the wait began: the supervisor may have answered before a
    descheduled worker got here, and the faults fire in one attempt only. Without a log the wait is
    its timeout.
    """
    from steadytune.telemetry.events import read_events

    deadline = time.monotonic() + timeout_s
    while True:
        if events is not None and any(name in (e.name, f"{e.kind}:{e.name}") for e in read_events(events)):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(poll_s, left))


_HOARD: list[object] = []  # what the leak fault keeps alive, for the life of the process


def _leak(mib: float) -> None:
    """Allocate ``mib`` MiB and never free it: device memory under CUDA, host memory otherwise."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # ones, not empty: every page is written, so a host leak shows in RSS too.
    _HOARD.append(torch.ones(int(mib * 2**20) // 4, dtype=torch.float32, device=device))


@dataclass(frozen=True)
class Faults:
    step_sleep_s: float = 0.0  # slow every step down, so a test can act mid-run
    slow_save_s: float = 0.0  # hold saves in their unsafe window (after rename, before manifest)
    slow_save_step: int | None = None  # ... only the save of this step (default: every save)
    # ... hold the save of slow_save_step there until training has ended this later step (at most 120 s),
    # then slow_save_s more: a save certainly still being published when the steps after it are read
    slow_save_until_step: int | None = None
    # ... or until the run's events.jsonl holds this event (name or kind:name; at most 120 s), then
    # slow_save_s more: a save still being published when the supervisor has filed what a test must see
    slow_save_until_event: str | None = None
    fail_save_step: int | None = None  # the publish of this step's save fails in its unsafe window
    crash_at_step: int | None = None  # raise once this optimizer step has ended
    nan_at_step: int | None = None  # make this step's loss NaN (a poisoned batch)
    nan_steps: int = 1  # ... for this many steps in a row
    oom_at_step: int | None = (
        None  # from this step on, a forward over more than oom_above samples runs out of memory
    )
    oom_above: int = 1
    lr_burst_at_step: int | None = None  # multiply the LR for a few steps: a spike that diverges
    lr_burst_factor: float = 1000.0
    lr_burst_steps: int = 3
    hang_at_step: int | None = None  # stop making progress after this step (the process stays alive)
    hold_at_step: int | None = None  # pause after this step's record, so an outside actor acts on exactly it
    hold_s: float = 0.0  # ... for this long, then go on (the actor may be late or absent)
    # ... or until the run's events.jsonl holds this event (name or kind:name), hold_s then a backstop:
    # the worker waits for the supervisor's answer however late it comes (an event filed only after the
    # worker's end, such as "restart", holds it until it is killed)
    hold_until_event: str | None = None
    leak_mib_per_step: float = 0.0  # keep this many MiB of tensors alive after every step (on the GPU if any)
    fault_attempts: int = 1  # faults fire while attempt < fault_attempts (1: first attempt only)
    _trained: _Trained = field(default_factory=_Trained, init=False, repr=False, compare=False)
    _poisoned: set[int] = field(default_factory=set, init=False, repr=False, compare=False)  # steps said

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Faults:
        raw = (environ if environ is not None else os.environ).get("STEADYTUNE_FAULTS")
        if not raw:
            return cls()
        data = json.loads(raw)
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def active(self, attempt: int) -> bool:
        return attempt < self.fault_attempts

    def save_delay(self, step: int, attempt: int) -> float:
        if not self.active(attempt) or (self.slow_save_step is not None and step != self.slow_save_step):
            return 0.0
        return self.slow_save_s

    def in_save_window(self, step: int, attempt: int, events: Path | None = None) -> None:
        """The save faults, run in the publish of checkpoint-``step`` between its rename and its manifest
        (``events``: the run's event log, for ``slow_save_until_event``)."""
        if not self.active(attempt):
            return
        if self.slow_save_until_step is not None and step == self.slow_save_step:
            self._trained.wait_for(self.slow_save_until_step, timeout_s=120.0)
        if self.slow_save_until_event is not None and step == self.slow_save_step:
            _await_event(events, self.slow_save_until_event, timeout_s=120.0)
        delay = self.save_delay(step, attempt)
        if delay > 0:
            time.sleep(delay)
        if self.fail_save_step is not None and step == self.fail_save_step:
            raise InjectedSaveFailure(f"injected failure publishing checkpoint-{step}")

    def after_step(self, step: int, attempt: int, events: Path | None = None) -> bool:
        """The step faults, run at the boundary after step ``step``'s record (``events``: the run's event
        log, for ``hold_until_event``). True when the boundary was held: what an outside actor queued
        meanwhile is for this very step, so the caller reads the control queue afresh."""
        if self.slow_save_until_step is not None:  # only a held save waits on it: no lock per step otherwise
            self._trained.ended(step)
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        if not self.active(attempt):
            return False
        if self.leak_mib_per_step > 0:
            _leak(self.leak_mib_per_step)
        if self.crash_at_step is not None and step == self.crash_at_step:
            raise InjectedCrash(f"injected crash at step {step}")
        if self.hold_at_step is not None and step == self.hold_at_step:
            if self.hold_until_event is not None:
                _await_event(events, self.hold_until_event, timeout_s=self.hold_s)
            else:
                time.sleep(self.hold_s)
            return True
        if self.hang_at_step is not None and step == self.hang_at_step:
            while True:  # a hung collective: alive, silent, going nowhere
                time.sleep(3600)
        return False

    def poison(self, step: int, attempt: int) -> bool:
        """Whether optimizer step ``step`` (1-based) gets a NaN loss."""
        return (
            self.active(attempt)
            and self.nan_at_step is not None
            and self.nan_at_step <= step < self.nan_at_step + self.nan_steps
        )

    def poison_loss(self, loss: Any, step: int, attempt: int, guard: Guard) -> Any:
        """``loss`` (a tensor, or a tuple led by one) made NaN when step ``step`` is poisoned, which
        ``guard`` files once a step: a drill tells a fault that landed from one that did not."""
        if not self.poison(step, attempt):
            return loss
        if step not in self._poisoned:
            self._poisoned.add(step)
            guard.notify(
                "lifecycle",
                WorkerEvent.FAULT_INJECTED,
                f"drill fault: the loss of step {step} made NaN",
                step=step,
                fault="nan",
            )
        return (loss[0] * float("nan"), *loss[1:]) if isinstance(loss, tuple) else loss * float("nan")

    def lr_factor(self, step: int, attempt: int) -> float:
        if (
            self.active(attempt)
            and self.lr_burst_at_step is not None
            and self.lr_burst_at_step <= step < self.lr_burst_at_step + self.lr_burst_steps
        ):
            return self.lr_burst_factor
        return 1.0

    def check_oom(self, step: int, attempt: int, batch_size: int) -> None:
        if (
            self.active(attempt)
            and self.oom_at_step is not None
            and step >= self.oom_at_step
            and batch_size > self.oom_above
        ):
            import torch

            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (injected: {batch_size} samples > "
                f"{self.oom_above})"
            )
