"""Fault injection for drills and tests: switched on only by ``$STEADYTUNE_FAULTS``.

The variable holds JSON, e.g. ``{"step_sleep_s": 0.05, "crash_at_step": 12}``.
Without it every hook is a no-op, so production runs pay one attribute check.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, fields


class InjectedCrash(RuntimeError):
    """Raised by the ``crash_at_step`` fault."""


@dataclass(frozen=True)
class Faults:
    step_sleep_s: float = 0.0  # slow every step down, so a test can act mid-run
    slow_save_s: float = 0.0  # hold each save of the first attempt in its unsafe window (after rename, before manifest)
    crash_at_step: int | None = None  # raise once this optimizer step has ended (first attempt only)
    crash_attempts: int = 1  # how many attempts the crash repeats in (1: transient, 99: deterministic)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Faults:
        raw = (environ if environ is not None else os.environ).get("STEADYTUNE_FAULTS")
        if not raw:
            return cls()
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def after_step(self, step: int, attempt: int) -> None:
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        if self.crash_at_step is not None and step == self.crash_at_step and attempt < self.crash_attempts:
            raise InjectedCrash(f"injected crash at step {step}")
