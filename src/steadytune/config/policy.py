"""Policy as config: per anomaly kind, the action and its budget; recovery knobs.

The main config embeds :class:`PolicyConfig` under ``policy:``. ``--policy observe``
(or ``policy.mode: observe``) turns every action into an alert.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ActionName = Literal[
    "alert", "checkpoint", "skip_step", "rollback", "restart", "reduce_microbatch", "pause", "stop"
]
ACTIONS: tuple[str, ...] = (
    "alert",
    "checkpoint",
    "skip_step",
    "rollback",
    "restart",
    "reduce_microbatch",
    "pause",
    "stop",
)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: ActionName = Field(
        description="alert, checkpoint, skip_step, rollback, restart, reduce_microbatch, pause or stop"
    )
    budget: int | None = Field(
        None, ge=0, description="how many times per run; leave out for the action's default"
    )
    min_severity: Literal["info", "warning", "critical"] = Field(
        "warning", description="act only on anomalies at least this severe"
    )


def default_rules() -> dict[str, Rule]:
    """What steadytune does about each kind unless told otherwise."""
    r = Rule
    return {
        # In-process: the guard already skipped the update; K in a row escalate (nan_rollback_after).
        "nan_loss": r(action="skip_step"),
        "nonfinite_grad": r(action="skip_step"),
        # A NaN evaluation spoils the judgement of the weights, not the weights: told, never rolled back.
        "nan_eval": r(action="alert"),
        # A loss spike is acted on once confirmed (it persisted spike_confirm_points logged points).
        "loss_spike": r(action="rollback"),
        "divergence": r(action="rollback", min_severity="critical"),
        "grad_explosion": r(action="rollback", min_severity="critical"),
        # RL and preference runs: the "hard reset" to the last good checkpoint at a lower LR. A run
        # without a learning signal is told, not restarted: a restart cannot fix a reward function, nor
        # a DPO run's swapped chosen/rejected labels (its loss above ln 2, detect/preference.py).
        "reward_collapse": r(action="rollback"),
        "kl_blowup": r(action="rollback"),
        "no_learning_signal": r(action="alert"),
        "stall": r(action="restart"),
        "memory_leak": r(action="reduce_microbatch"),
        "memory_headroom": r(action="checkpoint"),
        "disk_low": r(action="alert"),
        "gpu_error": r(action="checkpoint", min_severity="critical"),
    }


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["act", "observe"] = Field("act", description="act, or observe (only alert)")
    rules: dict[str, Rule] = Field(
        default_factory=default_rules, description="per anomaly kind: {action, budget}"
    )
    max_rollbacks: int = Field(3, ge=0, description="rollbacks per run")
    rollback_lr_scale: float = Field(0.5, gt=0, le=1, description="LR multiplier applied at each rollback")
    spike_confirm_points: int = Field(
        3, ge=1, description="logged points a loss spike must persist before a rollback (1 = act at once)"
    )
    nan_rollback_after: int = Field(
        3, ge=1, description="consecutive skipped (non-finite) updates that escalate to a rollback"
    )
    setup_timeout_s: float = Field(
        1800.0, gt=0, description="time allowed to load the model and data before the first step"
    )
    max_microbatch_split: int = Field(
        16, ge=1, description="the most chunks an OOM may split a micro-batch into"
    )
    checkpoint_every_s: float | None = Field(
        None, gt=0, description="also checkpoint when this many seconds passed since the last save"
    )
    max_lr: float | None = Field(None, gt=0, description="refuse to start with a learning rate above this")

    @field_validator("rules", mode="before")
    @classmethod
    def _merge_over_defaults(cls, value: object) -> object:
        """User rules merge over the defaults: ``rules: {loss_spike: {action: alert}}`` keeps the rest."""
        if not isinstance(value, dict):
            return value
        from steadytune.config.detect import DetectConfig

        kinds = DetectConfig.kind_names()
        unknown = sorted(k for k in value if k not in kinds)
        if unknown:
            import difflib

            hints = [
                f"{k} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(k, kinds, 1)) else k
                for k in unknown
            ]
            raise ValueError(f"unknown anomaly kind(s): {', '.join(hints)}")
        return {**default_rules(), **value}

    def rule(self, kind: str) -> Rule:
        return self.rules.get(kind) or Rule(action="alert")
