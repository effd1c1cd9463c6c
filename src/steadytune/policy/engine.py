"""The policy: anomalies in, actions out. Pure: no I/O, no clock, no processes.

The supervisor feeds it what the detectors raised and what the worker reported,
and carries out the actions it returns. Budgets live here, so a run can never
loop forever on the same trouble.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from steadytune.config.policy import PolicyConfig
from steadytune.records import SEVERITY_ORDER, Anomaly

# Actions that change the worker (stop it, restart it) need a budget; the rest are cheap.
_DEFAULT_BUDGETS = {"rollback": None, "restart": 3, "reduce_microbatch": 3, "pause": 1, "stop": 1}


@dataclass(frozen=True)
class Action:
    """Something the supervisor should do now, and why."""

    name: str
    reason: str
    step: int
    anomaly: Anomaly | None = None
    params: dict[str, Any] = field(default_factory=dict)


class Policy:
    """Decides, within budgets, what to do about each anomaly.

    Args:
        config: the rules and knobs (``policy:`` in the run config).
        safe_mode: act on the first confirmed spike (no persistence wait).
    """

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self.used: Counter[str] = Counter()
        # Each incident acted on, with the step it began at: one action per incident, on one timeline.
        self._acted: dict[tuple[Any, ...], int] = {}
        self._pending: dict[tuple[Any, ...], Anomaly] = {}

    def budget(self, action: str) -> int | None:
        if action == "rollback":
            return self.config.max_rollbacks
        return _DEFAULT_BUDGETS.get(action)

    def _spend(self, action: str, rule_budget: int | None) -> bool:
        limit = rule_budget if rule_budget is not None else self.budget(action)
        if limit is not None and self.used[action] >= limit:
            return False
        self.used[action] += 1
        return True

    def _act(self, anomaly: Anomaly, step: int, why: str) -> Action | None:
        rule = self.config.rule(anomaly.kind)
        key = (anomaly.kind, anomaly.metric, anomaly.rank, anomaly.start_step)
        if key in self._acted:
            return None
        self._acted[key] = anomaly.start_step
        if rule.action == "alert" or rule.action == "skip_step":
            return None  # the alert is the event itself; skip_step already happened in the worker
        if self.config.mode == "observe":
            return Action("alert", f"observe mode: would {rule.action} ({why})", step, anomaly)
        if not self._spend(rule.action, rule.budget):
            return Action(
                "alert",
                f"{rule.action} budget spent; only alerting ({why})",
                step,
                anomaly,
                {"budget_spent": rule.action},
            )
        return Action(rule.action, why, step, anomaly)

    def instead(self, anomaly: Anomaly, step: int, name: str, why: str) -> Action | None:
        """``name`` in place of the rule's action (which the run cannot carry out), within budget."""
        if self.config.mode == "observe":
            return Action("alert", f"observe mode: would {name} ({why})", step, anomaly)
        if not self._spend(name, None):
            return Action("alert", f"{name} budget spent; only alerting ({why})", step, anomaly)
        return Action(name, f"{anomaly.kind} at step {anomaly.start_step}: {why}", step, anomaly)

    def on_raised(self, anomaly: Anomaly, step: int) -> Action | None:
        """A detector just raised ``anomaly``; ``step`` is the newest step seen."""
        rule = self.config.rule(anomaly.kind)
        if SEVERITY_ORDER[anomaly.severity] < SEVERITY_ORDER[rule.min_severity]:
            return None
        if anomaly.kind == "loss_spike" and self.config.spike_confirm_points > 1:
            # A spike that recovers by itself needs no rollback: wait for it to persist.
            self._pending[(anomaly.kind, anomaly.metric, anomaly.rank)] = anomaly
            return None
        return self._act(anomaly, step, f"{anomaly.kind} at step {anomaly.start_step}")

    def forget_open(self, resume_step: int = 0) -> None:
        """The worker restarted from ``resume_step`` (0: the start): a new timeline from there.

        Anomalies waiting for confirmation belonged to the old timeline. So did the incidents acted on
        that began after ``resume_step``: trouble that begins there again on the new timeline came back
        (from a checkpoint that already held it, or a window the rollback trained on again), and is
        acted on again, within the budgets, so that a rollback goes further back
        (:func:`~steadytune.policy.plan.choose_rollback_checkpoint`) instead of only being told.
        """
        self._pending.clear()
        self._acted = {key: start for key, start in self._acted.items() if start <= resume_step}

    def on_resolved(self, anomaly: Anomaly) -> None:
        self._pending.pop((anomaly.kind, anomaly.metric, anomaly.rank), None)

    def on_step(self, step: int) -> list[Action]:
        """Confirm pending anomalies that persisted long enough by ``step``."""
        out = []
        for key, anomaly in list(self._pending.items()):
            if step - anomaly.start_step + 1 >= self.config.spike_confirm_points:
                del self._pending[key]
                action = self._act(
                    anomaly,
                    step,
                    f"{anomaly.kind} from step {anomaly.start_step} persisted "
                    f"{step - anomaly.start_step + 1} steps",
                )
                if action:
                    out.append(action)
        return out

    def on_skipped_update(self, step: int, consecutive: int) -> Action | None:
        """The worker skipped a non-finite update; too many in a row escalate to a rollback."""
        if consecutive < self.config.nan_rollback_after:
            return None
        anomaly = Anomaly(
            "nan_loss",
            "critical",
            step - consecutive + 1,
            step,
            "loss",
            {"consecutive_skips": consecutive, "threshold": self.config.nan_rollback_after},
            "the update was non-finite several steps in a row: the weights or the data are bad",
            "roll back to the last good checkpoint and skip the data window",
        )
        key = ("nan_escalation", step - consecutive + 1)
        if key in self._acted:
            return None
        self._acted[key] = step - consecutive + 1
        if self.config.mode == "observe":
            return Action(
                "alert", f"observe mode: would roll back after {consecutive} skipped updates", step, anomaly
            )
        if not self._spend("rollback", None):
            return Action(
                "stop",
                f"{consecutive} non-finite updates in a row and the rollback budget is spent",
                step,
                anomaly,
            )
        return Action("rollback", f"{consecutive} non-finite updates in a row", step, anomaly)
