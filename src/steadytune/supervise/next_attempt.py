"""The next attempt after a worker ends: which budget it spends, how long it waits, what its plan changes.

The supervisor gathers the facts (the exit, the resume point and changes the resume
bookkeeping proposes) and carries the answer out (the event, the wait, the new worker).
This module holds what lies between: the restart budgets, the crash history a repeat is
judged on, the backoff, the smaller micro-batch a memory warning asked for, and the next
plan revision. No processes, no files, and the clock passed in, so that the policy is
tested exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from steadytune.config.schema import RunConfig, TrainConfig
from steadytune.policy.plan import smaller_microbatch
from steadytune.policy.restart import Decision, ExitInfo, decide
from steadytune.records import PlanRevision

# What a restart event shows of the plan it starts, where the plan sets it.
_SHOWN = ("resume_checkpoint", "lr_scale", "nproc_per_node")

# What the resume bookkeeping proposes: the plan's changes (None: no safe restart is left), the
# revision's reason, and why in words.
Planned = tuple[dict[str, Any] | None, str, str]


@dataclass(frozen=True)
class NextAttempt:
    """A restart as planned: what the next plan revision changes, its reason, why, and the wait."""

    changes: dict[str, Any]
    reason: str
    why: str
    delay_s: float = 0.0

    def message(self, label: str) -> str:
        return f"restarting the {label}: {self.why}" + (f" in {self.delay_s:.0f}s" if self.delay_s else "")

    def event_data(self, returncode: int | None) -> dict[str, Any]:
        shown = {k: self.changes[k] for k in _SHOWN if self.changes.get(k) is not None}
        return {"classification": self.reason, "returncode": returncode, **shown}


class RestartPlanner:
    """Counts one run's restarts against their budgets and shapes the plan of each next attempt.

    Crash restarts spend ``run.max_restarts`` and back off; restarts the policy asked for
    (a rollback, a hang, a resize, one done in process) have budgets of their own in the
    policy, so they are counted apart and never wait.
    """

    def __init__(self, run: RunConfig, train: TrainConfig, clock: Callable[[], float]) -> None:
        self.run_cfg = run
        self.train = train
        self.clock = clock
        self.restarts = 0
        self.action_restarts = 0
        self.history: list[ExitInfo] = []  # earlier exits: the same error at the same step twice stops
        self.shrink_next = False  # a memory warning asked the next restart for a smaller micro-batch

    @property
    def total(self) -> int:
        return self.restarts + self.action_restarts

    def budget_left(self) -> bool:
        return self.restarts < self.run_cfg.max_restarts

    def decide(self, info: ExitInfo) -> Decision:
        """Restart, stop or finish after an exit nobody asked for, within the crash budget."""
        r = self.run_cfg
        decision = decide(
            info, self.history, self.restarts, r.max_restarts, r.restart_backoff_s, r.restart_backoff_max_s
        )
        self.history.append(info)
        return decision

    def after_crash(
        self, plan: PlanRevision, changes: dict[str, Any], reason: str, why: str, delay_s: float
    ) -> NextAttempt:
        self.restarts += 1
        return self._shaped(plan, NextAttempt(changes, reason, why, delay_s))

    def after_action(self, plan: PlanRevision, changes: dict[str, Any], reason: str, why: str) -> NextAttempt:
        self.action_restarts += 1
        return self._shaped(plan, NextAttempt(changes, reason, why))

    def _shaped(self, plan: PlanRevision, nxt: NextAttempt) -> NextAttempt:
        """The smaller micro-batch a memory warning asked for, taken once, same effective batch."""
        if not self.shrink_next:
            return nxt
        self.shrink_next = False
        smaller = smaller_microbatch(plan, self.batch(plan), self.train.gradient_accumulation_steps)
        if not smaller:
            return nxt
        why = (
            f"{nxt.why}; micro-batch {smaller['per_device_train_batch_size']} x accumulation "
            f"{smaller['gradient_accumulation_steps']} (same effective batch)"
        )
        return replace(nxt, changes={**nxt.changes, **smaller}, why=why)

    def batch(self, plan: PlanRevision) -> int:
        """The micro-batch the plan runs: the config's, or where it says ``auto``, what the plan found."""
        b = self.train.per_device_train_batch_size
        return b if isinstance(b, int) else (plan.per_device_train_batch_size or 1)

    def revision(
        self, plan: PlanRevision, reason: str, cause_seq: int | None, **changes: Any
    ) -> PlanRevision:
        """The next plan revision, inheriting everything the last one said."""
        return replace(
            plan,
            revision=plan.revision + 1,
            ts=self.clock(),
            reason=reason,
            cause_event_seq=cause_seq,
            **changes,
        )
